"""``question_kinds.py``: the kind rule and the paired table per kind."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import question_kinds as qk


def test_kind_rule() -> None:
    assert qk.kind("What nationality is the director of film X?", ["American"]) == (
        "nationality / country"
    )
    # yes / no by the gold answer comes before any keyword
    assert qk.kind("Are both from the same country?", ["Yes"]) == "yes / no"
    assert qk.kind("Which film came out first, A or B?", ["A"]) == "date or comparison"
    assert qk.kind("Who directed the film?", ["Jo"]) == "who"
    assert qk.kind("Where did the composer die?", ["Rome"]) == "place"
    assert qk.kind("What is the award?", ["Oscar"]) == "other"
    # whole words: "whoever" is no "who"
    assert qk.kind("What did whoever win?", ["x"]) == "other"


def rec(i: int, question: str, gold: str, answer: str, em: float, calls: int) -> dict[str, Any]:
    return {
        "split": "q_x",
        "task_id": str(i),
        "question": question,
        "gold": [gold],
        "answer": answer,
        "em": em,
        "tool_calls": calls,
    }


def write(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def test_kind_table_pairs_each_question(tmp_path: Path) -> None:
    nat, who = "What nationality is Jo?", "Who directed it?"
    ref = write(
        tmp_path / "ref.jsonl",
        [
            rec(0, nat, "American", "Jo", 0, 2),
            rec(1, nat, "French", "French", 1, 2),
            rec(2, who, "Al", "Al", 1, 2),
            rec(3, "Is it?", "no", "no", 1, 2),
        ],
    )
    new = write(
        tmp_path / "new.jsonl",
        [
            rec(0, nat, "American", "American", 1, 1),
            rec(1, nat, "French", "American", 0, 1),
            rec(2, who, "Al", "Bo", 0, 1),
            rec(3, "Is it?", "no", "no", 1, 0),
        ],
    )
    a, b = qk.read_records(ref), qk.read_records(new)
    rows = qk.kind_table(a, b)
    assert (
        rows[2]
        == "| nationality / country | 2 | 0.500 | 0.500 | 1 / 1 | 2.00 → 1.00 | French (0.500) |"
    )
    assert rows[3] == "| yes / no | 1 | 1.000 | 1.000 | 0 / 0 | 2.00 → 0.00 | no (1.000) |"
    assert rows[4] == "| who | 1 | 1.000 | 0.000 | 0 / 1 | 2.00 → 1.00 | Al (1.000) |"
    assert rows[-1] == "| all | 4 | 0.750 | 0.500 | 1 / 2 | 2.00 → 0.75 | no (0.250) |"
    assert len(rows) == 6  # kinds with no question get no row
    assert qk.top_answers(b, "nationality / country") == "American 2 (1)"
    # a reference with more questions (a larger pool's records) is cut to the model's
    fewer = {k: v for k, v in b.items() if k != "q_x/3"}
    assert qk.kind_table(a, fewer)[-1].startswith("| all | 3 |")
    with pytest.raises(ValueError, match="lack 1 of this model's questions"):
        qk.kind_table(fewer, b)


def test_bad_records_name_the_file_and_line(tmp_path: Path) -> None:
    good = rec(0, "Who?", "Al", "Al", 1, 1)
    bad = write(tmp_path / "bad.jsonl", [good, {k: v for k, v in good.items() if k != "em"}])
    with pytest.raises(ValueError, match=r"bad.jsonl:2: no field 'em'"):
        qk.read_records(bad)
    twice = write(tmp_path / "twice.jsonl", [good, good])
    with pytest.raises(ValueError, match=r"twice.jsonl:2: question 'q_x/0' appears twice"):
        qk.read_records(twice)
    (tmp_path / "torn.jsonl").write_text('{"task_id": 1\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"torn.jsonl:1: not JSON"):
        qk.read_records(tmp_path / "torn.jsonl")


def test_best_constant_is_the_answer_a_habit_would_score_best_with() -> None:
    recs = [rec(i, "What nationality?", g, "", 0, 1) for i, g in enumerate(["American"] * 3)]
    recs += [rec(3, "What nationality?", "the British", "", 0, 1)]
    recs[0]["gold"] = ["American", "USA"]
    assert qk.best_constant(recs) == ("American", 0.75)
    with pytest.raises(ValueError, match="no records"):
        qk.best_constant([])
