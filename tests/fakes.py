"""Test doubles: a byte-level tokenizer with ChatML special tokens, and chat formats."""

from __future__ import annotations

import re
from collections.abc import Sequence

from agentr1.rollout.chat import ChatFormat
from agentr1.templates import QWEN25_TOOLS, render_template

SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]


class ByteTokenizer:
    """UTF-8 bytes are ids 0..255; ChatML specials are 256, 257, 258 (pad)."""

    special_ids = {s: 256 + i for i, s in enumerate(SPECIALS)}
    pad_token_id = 258
    _split = re.compile("(" + "|".join(re.escape(s) for s in SPECIALS) + ")")

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids: list[int] = []
        for piece in self._split.split(text):
            if piece in self.special_ids:
                ids.append(self.special_ids[piece])
            elif piece:
                ids.extend(piece.encode("utf-8"))
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        out, buf = [], bytearray()
        for i in ids:
            if i < 256:
                buf.append(i)
                continue
            out.append(buf.decode("utf-8", errors="replace"))
            buf = bytearray()
            if not skip_special_tokens:
                out.append(SPECIALS[i - 256])
        out.append(buf.decode("utf-8", errors="replace"))
        return "".join(out)


def byte_chat() -> ChatFormat:
    """The Qwen2.5 tools template over the byte tokenizer."""
    tok = ByteTokenizer()
    return ChatFormat(
        render=lambda m, t, g: render_template(QWEN25_TOOLS, m, t, g),
        tokenizer=tok,
        end_of_turn="<|im_end|>",
        end_of_turn_id=tok.special_ids["<|im_end|>"],
    )
