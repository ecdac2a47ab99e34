"""A Generator that replays scripted turns: for oracles, demonstrations and tests.

It decodes each prompt, asks a ``respond`` function for the next turn's text, and returns
that text tokenized once plus the end-of-turn token, with log-prob 0 (a deterministic
policy). It goes through the same rollout, env, tools and retriever as a model does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from agentr1.backends.base import Completion, SamplingParams


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
        out = []
        for p in prompts:
            ids = [*self.encode(self.respond(self.decode(p))), self.end_of_turn_id]
            finish: str = "stop"
            if len(ids) > params.max_new_tokens:
                ids, finish = ids[: params.max_new_tokens], "length"
            out.append(Completion(ids, [0.0] * len(ids), finish))  # type: ignore[arg-type]
        return out
