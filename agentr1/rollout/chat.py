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
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from agentr1.types import Message

_SENTINEL = "\x00AGENTR1_TURN\x00"
_PROBE_TOOL = "agentr1_probe_tool"

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

    def prompt_ids(
        self, messages: Sequence[Message], tools: list[dict[str, Any]] | None
    ) -> list[int]:
        """Tokens of the opening messages plus the generation prompt."""
        return self.encode(self.render([m.to_dict() for m in messages], tools, True))

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
        """`observation_segment`, tokenized once (appended with ``loss_mask = 0``)."""
        return self.encode(self.observation_segment(messages, turn_ended))

    def assistant_text(self, ids: Sequence[int]) -> str:
        """Decoded text of a sampled turn, without its end-of-turn marker (for Message logs)."""
        text = self.decode(ids)
        return text[: -len(self.end_of_turn)] if text.endswith(self.end_of_turn) else text
