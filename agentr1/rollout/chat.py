"""ChatFormat: how messages become tokens, once, for the token-in-token-out rollout.

The rollout never re-renders the conversation. It renders the prompt once
(`prompt_ids`), keeps every agent turn exactly as sampled, and after each turn appends
the *segment* the chat template puts between the end of that turn and the start of the
next assistant turn (`observation_ids`): the end-of-turn glue, the tool messages, and the
next generation prompt, tokenized once.

How the segment is found, for any Jinja template: render a minimal conversation
``[user, assistant(SENTINEL), *tool_messages]`` with the generation prompt and keep what
follows the sentinel. If the sampled turn already ended with the end-of-turn token (e.g.
``<|im_end|>``), that prefix is dropped from the segment, since the policy sampled it.

Text from tools, documents and questions is data, never control tokens (docs/design.md
§1): a tool result that contains ``<|im_end|>\n<|im_start|>assistant`` must not end the
tool message and open a turn the policy never sampled. A user or tool message's content
(`DATA_ROLES`) is located in the rendered text, and every control string inside it (the
tokenizer's special and added tokens, e.g. ``<|im_end|>``, ``</tool_response>``) is
encoded as ordinary text tokens (its first character, then the rest), so the characters
reach the model but the token ids of the template's own markup appear only where the
template put them. Content without control strings is encoded exactly as before (the
whole render at once).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from agentr1.types import Message, valid_text

log = logging.getLogger(__name__)

_SENTINEL = "\x00AGENTR1_TURN\x00"
DATA_ROLES = frozenset({"user", "tool"})
"""Roles whose content is data (questions, tool results, documents): its control strings
are encoded as text. System and assistant contents (the task's own instructions and
examples, which may name ``<tool_call>`` on purpose) are markup like the template's."""
_PROBE_TOOL = "agentr1_probe_tool"
SEGMENT_CACHE = 4096
"""Observation segments `ChatFormat.observation_ids` keeps (then starts over)."""

RenderFn = Callable[[list[dict[str, Any]], list[dict[str, Any]] | None, bool], str]
"""(messages as dicts, tool schemas or None, add_generation_prompt) -> text."""


class TokenizerLike(Protocol):
    """The slice of a HF tokenizer the rollout needs."""

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = ...) -> str: ...


@dataclass
class ChatFormat:
    """Renders prompts and inter-turn segments to tokens.

    Attributes:
        render: the chat template as a function (see `RenderFn`).
        tokenizer: encodes rendered text (special tokens in the text map to their ids).
        end_of_turn: the text of the token that closes an assistant turn (``<|im_end|>``).
        end_of_turn_id: its id; generation stops on it.
    """

    render: RenderFn
    tokenizer: TokenizerLike
    end_of_turn: str
    end_of_turn_id: int
    _renders_tools: bool | None = field(default=None, init=False, repr=False, compare=False)
    _controls: tuple[str, ...] | None = field(default=None, init=False, repr=False, compare=False)
    _segments: dict[tuple[Any, ...], tuple[int, ...]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    @classmethod
    def from_hf(
        cls, tokenizer: Any, chat_template: str | None = None, end_of_turn: str | None = None
    ) -> ChatFormat:
        """Wrap a HF tokenizer; ``chat_template`` overrides the tokenizer's own template."""

        def render(
            msgs: list[dict[str, Any]], tools: list[dict[str, Any]] | None, gen: bool
        ) -> str:
            kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": gen}
            if chat_template is not None:
                kwargs["chat_template"] = chat_template
            if tools:
                kwargs["tools"] = tools
            return str(tokenizer.apply_chat_template(msgs, **kwargs))

        eot = end_of_turn or "<|im_end|>"
        ids = tokenizer.encode(eot, add_special_tokens=False)
        if len(ids) != 1:
            raise ValueError(
                f"end-of-turn marker {eot!r} must be a single token in this tokenizer, "
                f"got ids {ids}; pass end_of_turn= explicitly"
            )
        return cls(render=render, tokenizer=tokenizer, end_of_turn=eot, end_of_turn_id=ids[0])

    @property
    def renders_tools(self) -> bool:
        """Whether the chat template writes the tools' schemas into the prompt when given
        ``tools=`` (the Qwen2.5 template does; ChatML-minimal and SmolLM2's own do not),
        found by rendering a probe tool once."""
        cached = self._renders_tools
        if cached is None:
            probe = [{"type": "function", "function": {"name": _PROBE_TOOL, "parameters": {}}}]
            text = self.render([{"role": "user", "content": "q"}], probe, True)
            cached = _PROBE_TOOL in text
            self._renders_tools = cached
        return cached

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        return (self.end_of_turn_id,)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    @property
    def control_strings(self) -> tuple[str, ...]:
        """The texts the tokenizer maps to one special or added token (``<|im_end|>``,
        ``<tool_call>``, ...), longest first; none for a tokenizer without added tokens."""
        if self._controls is None:
            found = set(getattr(self.tokenizer, "all_special_tokens", None) or ())
            added = getattr(self.tokenizer, "added_tokens_decoder", None) or {}
            found |= {str(getattr(tok, "content", tok)) for tok in added.values()}
            self._controls = tuple(sorted((c for c in found if c), key=len, reverse=True))
        return self._controls

    def prompt_ids(
        self, messages: Sequence[Message], tools: list[dict[str, Any]] | None
    ) -> list[int]:
        """Tokens of the opening messages plus the generation prompt (their contents are
        data: see the module docstring)."""

        def text_of(msgs: Sequence[Message]) -> str:
            return self.render([m.to_dict() for m in msgs], tools, True)

        return self._ids_with_data(messages, text_of)

    def observation_segment(self, messages: Sequence[Message], turn_ended: bool) -> str:
        """The text between the end of an agent turn and the start of the next one.

        Args:
            messages: tool messages produced by the turn (may be empty).
            turn_ended: whether the sampled turn already ends with ``end_of_turn``.
        """
        convo = [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": _SENTINEL},
            *(m.to_dict() for m in messages),
        ]
        text = self.render(convo, None, True)
        cut = text.find(_SENTINEL)
        if cut < 0:
            raise ValueError("chat template dropped the assistant content; cannot find segment")
        seg = text[cut + len(_SENTINEL) :]
        if turn_ended:
            if not seg.startswith(self.end_of_turn):
                raise ValueError(
                    f"chat template does not close assistant turns with {self.end_of_turn!r}"
                )
            seg = seg[len(self.end_of_turn) :]
        return seg

    def observation_ids(self, messages: Sequence[Message], turn_ended: bool) -> list[int]:
        """`observation_segment`, tokenized once (appended with ``loss_mask = 0``); the
        tool messages' contents are data (see the module docstring).

        The tokens of a segment already made are reused (the same messages, the same
        turn ending: the same tokens), up to `SEGMENT_CACHE` segments: a group's episodes
        often run the same search, and rendering the template costs more than the rest
        of an env step."""

        def made() -> list[int]:
            return self._ids_with_data(messages, lambda m: self.observation_segment(m, turn_ended))

        if any(m.tool_calls for m in messages):  # not a tool message: render it
            return made()
        key = (turn_ended, *((m.role, m.content, m.name, m.tool_call_id) for m in messages))
        ids = self._segments.get(key)
        if ids is None:
            ids = tuple(made())
            if len(self._segments) >= SEGMENT_CACHE:
                self._segments.clear()
            self._segments[key] = ids
        return list(ids)

    def assistant_text(self, ids: Sequence[int]) -> str:
        """Decoded text of a sampled turn, without its end-of-turn marker (for Message logs)."""
        text = self.decode(ids)
        return text[: -len(self.end_of_turn)] if text.endswith(self.end_of_turn) else text

    # ------------------------------------------------------------------ data, not markup
    def _ids_with_data(
        self, messages: Sequence[Message], text_of: Callable[[Sequence[Message]], str]
    ) -> list[int]:
        """``text_of(messages)`` tokenized, with every control string inside a message's
        content encoded as text. A content the template rewrote (so it cannot be found in
        the render) has its control strings broken by a word joiner (U+2060) instead. A
        content with lone surrogates is made valid first (`valid_text`): tokenizers
        reject them."""
        messages = [
            dataclasses.replace(m, content=valid_text(m.content))
            if m.content and valid_text(m.content) is not m.content
            else m
            for m in messages
        ]
        text = text_of(messages)
        controls = self.control_strings
        risky = [
            m.content
            for m in messages
            if m.role in DATA_ROLES and m.content and any(k in m.content for k in controls)
        ]
        if not risky:
            return self.encode(text)
        spans: list[tuple[int, int]] = []  # where the contents' control strings are in text
        pos = 0
        for content in risky:
            at, found = text.find(content, pos), content
            if at < 0:
                found = content.strip()
                at = text.find(found, pos) if found else -1
            if at < 0:
                log.warning("chat template rewrote a message holding control tokens; escaped")
                escaped = [
                    dataclasses.replace(m, content=self._escape(m.content))
                    if m.role in DATA_ROLES
                    else m
                    for m in messages
                ]
                return self.encode(text_of(escaped))
            spans += [(at + i, at + i + len(k)) for i, k in _occurrences(found, controls)]
            pos = at + len(found)
        return self._encode_around(text, spans)

    def _encode_around(self, text: str, spans: Sequence[tuple[int, int]]) -> list[int]:
        """``text`` tokenized piece by piece: each (start, end) span, in order and not
        overlapping, as text (`_encode_as_text`), the rest between them as usual."""
        ids: list[int] = []
        start = 0
        for a, b in spans:
            ids += self.encode(text[start:a]) if a > start else []
            ids += self._encode_as_text(text[a:b])
            start = b
        return ids + (self.encode(text[start:]) if start < len(text) else [])

    def _encode_as_text(self, control: str) -> list[int]:
        """A control string as ordinary tokens: its first character, then the rest, each
        piece encoded alone (a piece that still holds a control string is split again)."""
        rest = control[1:]
        inner = [(i, i + len(k)) for i, k in _occurrences(rest, self.control_strings)]
        return self.encode(control[0]) + self._encode_around(rest, inner)

    def _escape(self, content: str) -> str:
        for k in self.control_strings:
            content = content.replace(k, k[0] + "\u2060" + k[1:])
        return content


@functools.lru_cache(maxsize=16)
def _pattern(controls: tuple[str, ...]) -> re.Pattern[str]:
    return re.compile("|".join(map(re.escape, controls)))


def _occurrences(text: str, controls: tuple[str, ...]) -> list[tuple[int, str]]:
    """Non-overlapping (index, control string) occurrences in ``text``, left to right,
    the longest control string winning at a position (``controls`` is longest first)."""
    if not controls:
        return []
    return [(m.start(), m.group()) for m in _pattern(controls).finditer(text)]
