"""The demo's tokenizer and tiny model builder."""

from __future__ import annotations

import pytest

from agentr1.tiny import train_tokenizer

TEXTS = [
    "Velmora is a city in Dranth. Port Azel is a city in Dranth.",
    '<tool_call>{"name": "search", "arguments": {"query": "Velmora"}}</tool_call>',
    "<answer>Port Azel</answer>",
] * 20


@pytest.mark.parametrize("pre", ["words", "bytelevel"])
def test_roundtrip_and_chatml_specials(pre: str) -> None:
    tok = train_tokenizer(TEXTS, 400, pre)
    for text in [*TEXTS[:3], "unseen Zürich 東京 text\n\twith tabs"]:
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>", add_special_tokens=False)
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>")
    assert ids[-1] == tok.convert_tokens_to_ids("<|im_end|>") == tok.eos_token_id


def test_words_pretokenizer_keeps_names_identical_in_every_context() -> None:
    tok = train_tokenizer(TEXTS, 400, "words")

    def name_ids(text: str, name: str) -> list[int]:
        ids = tok.encode(text, add_special_tokens=False)
        target = tok.encode(name, add_special_tokens=False)
        assert any(ids[i : i + len(target)] == target for i in range(len(ids))), text
        return target

    after_space = name_ids("is Velmora.", "Velmora")
    after_quote = name_ids('{"query": "Velmora"}', "Velmora")
    after_tag = name_ids("<answer>Velmora</answer>", "Velmora")
    assert after_space == after_quote == after_tag


def test_unknown_pretokenizer_is_rejected() -> None:
    with pytest.raises(ValueError, match="pretokenizer must be"):
        train_tokenizer(TEXTS, 400, "chars")


@pytest.mark.parametrize("pre", ["words", "bytelevel"])
def test_split_digits_writes_every_number_from_the_ten_digit_tokens(pre: str) -> None:
    texts = ["Mia has 12 apples and 143 coins.", "<tool_response>\n36\n</tool_response>"] * 20
    tok = train_tokenizer(texts, 400, pre, split_digits=True)
    for text in [*texts[:2], "<answer>36</answer>", "unseen 90817 x"]:
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.decode(ids) == text
        pieces = [tok.decode([i]) for i in ids]
        assert all(len(p) == 1 for p in pieces if any(c.isdigit() for c in p)), pieces
    # without it, BPE merges frequent numbers into tokens of their own
    merged = train_tokenizer(texts, 400, pre)
    pieces = [merged.decode([i]) for i in merged.encode(texts[0], add_special_tokens=False)]
    assert any(sum(c.isdigit() for c in p) > 1 for p in pieces), pieces
