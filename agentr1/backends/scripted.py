"""A Generator that replays scripted turns: for oracles, demonstrations and tests.

It decodes each prompt, asks a ``respond`` function for the next turn's text, and returns
that text tokenized once plus the end-of-turn token, with log-prob 0 (a deterministic
policy). It goes through the same rollout, env, tools and retriever as a model does.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from agentr1.backends.base import Completion, SamplingParams

_USER = re.compile(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", re.DOTALL)
_RESPONSE = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.DOTALL)


def read_chatml_context(context: str) -> tuple[str | None, list[str]]:
    r"""(first user message, every tool response) of a decoded ChatML context: what a
    scripted policy reads, exactly as a model sees it.

    >>> read_chatml_context(
    ...     "<|im_start|>user\nQ?<|im_end|>\n<|im_start|>user\n<tool_response>\nR\n"
    ...     "</tool_response><|im_end|>"
    ... )
    ('Q?', ['R'])
    """
    m = _USER.search(context)
    return (m.group(1) if m else None), _RESPONSE.findall(context)


@dataclass
class ScriptedGenerator:
    """Attributes:
    respond: decoded context -> the next assistant turn's text.
    encode: text -> token ids (no special tokens added).
    decode: token ids -> text.
    end_of_turn_id: appended to every turn (the policy "samples" it).
    """

    respond: Callable[[str], str]
    encode: Callable[[str], list[int]]
    decode: Callable[[Sequence[int]], str]
    end_of_turn_id: int

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        params.check_rows(len(prompts))
        out = []
        for i, p in enumerate(prompts):
            ids = [*self.encode(self.respond(self.decode(p))), self.end_of_turn_id]
            finish: str = "stop"
            if len(ids) > params.cap(i):
                ids, finish = ids[: params.cap(i)], "length"
            out.append(Completion(ids, [0.0] * len(ids), finish))  # type: ignore[arg-type]
        return out
