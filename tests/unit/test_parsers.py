"""HermesParser on well-formed, malformed, unicode, nested and unclosed input."""

from __future__ import annotations

import pytest

from agentr1.envs.parsers import HermesParser

P = HermesParser()


def kinds(text: str) -> list[str]:
    return [e.kind for e in P.parse(text).errors]


def test_two_calls_in_one_turn() -> None:
    t = P.parse(
        'Let me look. <tool_call>{"name": "search", "arguments": {"query": "A"}}</tool_call>\n'
        '<tool_call>\n{"name": "search", "arguments": {"query": "B"}}\n</tool_call>',
        turn_index=2,
    )
    assert [(c.name, c.arguments, c.id) for c in t.calls] == [
        ("search", {"query": "A"}, "call_2_0"),
        ("search", {"query": "B"}, "call_2_1"),
    ]
    assert t.errors == [] and t.answer is None


def test_unicode_survives() -> None:
    t = P.parse(
        '<tool_call>{"name": "search", "arguments": {"query": "Zürich 東京 🚀"}}</tool_call>'
    )
    assert t.calls[0].arguments == {"query": "Zürich 東京 🚀"}
    assert P.parse("<answer>Škoda — 東京</answer>").answer == "Škoda — 東京"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<tool_call>{not json}</tool_call>", ["malformed_json"]),
        ('<tool_call>{"name": "search", "arguments": {"q": 1}</tool_call>', ["malformed_json"]),
        ("<tool_call>[1, 2]</tool_call>", ["not_an_object"]),
        ('<tool_call>"search"</tool_call>', ["not_an_object"]),
        ('<tool_call>{"arguments": {}}</tool_call>', ["missing_name"]),
        ('<tool_call>{"name": "", "arguments": {}}</tool_call>', ["missing_name"]),
        ('<tool_call>{"name": 3, "arguments": {}}</tool_call>', ["missing_name"]),
        ('<tool_call>{"name": "s", "arguments": [1]}</tool_call>', ["bad_arguments"]),
        ('<tool_call>{"name": "s", "arguments": "not json"}</tool_call>', ["bad_arguments"]),
        ('<tool_call>{"name": "s", "arguments": {}}', ["unclosed_tag"]),
        ("<tool_call>", ["unclosed_tag"]),
        (
            '<tool_call><tool_call>{"name": "s", "arguments": {}}</tool_call></tool_call>',
            ["nested_tag"],
        ),
        ("<answer>Paris", ["unclosed_tag"]),
        ("", []),
        ("plain prose, no tags", []),
    ],
)
def test_malformed(text: str, expected: list[str]) -> None:
    assert kinds(text) == expected
    assert P.parse(text).calls == []


def test_error_messages_say_what_is_expected() -> None:
    (err,) = P.parse("<tool_call>{oops</tool_call>").errors
    assert "not valid JSON" in err.message and '"arguments"' in err.message


def test_string_encoded_arguments_are_decoded() -> None:
    t = P.parse('<tool_call>{"name": "s", "arguments": "{\\"q\\": 1}"}</tool_call>')
    assert t.calls[0].arguments == {"q": 1}


def test_too_many_calls_are_reported() -> None:
    one = '<tool_call>{"name": "s", "arguments": {}}</tool_call>'
    t = HermesParser(max_calls=2).parse(one * 3)
    assert len(t.calls) == 2 and [e.kind for e in t.errors] == ["too_many_calls"]


def test_good_call_after_bad_one_still_parsed() -> None:
    t = P.parse('<tool_call>{bad</tool_call><tool_call>{"name": "s", "arguments": {}}</tool_call>')
    assert [c.name for c in t.calls] == ["s"] and kinds("<tool_call>{bad</tool_call>") == [
        "malformed_json"
    ]


def test_answer_last_one_wins_and_think_is_ignored() -> None:
    t = P.parse(
        "<think>maybe <answer>wrong</answer> or "
        '<tool_call>{"name": "s", "arguments": {}}</tool_call></think>'
        "<answer>first</answer> no, <answer> second </answer>"
    )
    assert t.answer == "second" and t.calls == []
