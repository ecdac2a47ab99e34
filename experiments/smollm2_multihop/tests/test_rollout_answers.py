"""``rollout_answers.py``: a run's training answers per block of steps, yes / no
questions apart."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import rollout_answers as ra


def episode(step: int, group: int, question: str, gold: str, answer: str | None) -> dict[str, Any]:
    em = float(answer is not None and answer.lower() == gold)
    return {
        "step": step,
        "group": group,
        "question": question,
        "gold": [gold],
        "answer": answer,
        "em": em,
        "outcome_reward": em,
        "advantage": 0.0,
    }


def write(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_rows_count_yes_no_answers_and_tied_groups_per_block(tmp_path: Path) -> None:
    yn, other = "Is A older than B?", "Who directed C?"
    records = [
        # step 0: a yes/no group (gold yes) split 2 yes / 1 no / 1 none, an untied group
        *(episode(0, 0, yn, "yes", a) for a in ("yes", "No.", None, "yes")),
        *(episode(0, 1, other, "d", a) for a in ("d", "e", "e", "e")),
        # step 1: the yes/no group all says "no" (tied at 0), the other group tied too
        *(episode(1, 0, yn, "yes", "no") for _ in range(4)),
        *(episode(1, 1, other, "d", "e") for _ in range(4)),
    ]
    records[0]["advantage"], records[1]["advantage"] = 0.5, -0.25
    rows = ra.block_rows(ra.read_rollouts(write(tmp_path / "rollouts.jsonl", records)), 1)
    assert rows[2] == (
        "| 0 | 1 | 4 | 1/1 | 0.50 / 0.25 / 0.25 | 0.50 | 0/1 | 0.188 | 1 | 0.25 | 0/1 | 0.000 |"
    )
    assert rows[3] == (
        "| 1 | 1 | 4 | 1/1 | 0.00 / 1.00 / 0.00 | 0.00 | 1/1 | 0.000 | 1 | 0.00 | 1/1 | 0.000 |"
    )
    (both,) = ra.block_rows(records, 2)[2:]
    assert both.startswith("| 0-1 | 2 | 8 | 2/2 | 0.25 / 0.62 / 0.12 | 0.25 | 1/2 |")


def test_a_bad_rollouts_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="no such file"):
        ra.read_rollouts(tmp_path)
    good = episode(0, 0, "Is A old?", "no", "no")
    bad = {k: v for k, v in good.items() if k != "advantage"}
    path = write(tmp_path / "rollouts.jsonl", [good, bad])
    with pytest.raises(SystemExit, match=r"rollouts\.jsonl:2: no field 'advantage'"):
        ra.read_rollouts(tmp_path)
    path.write_text("{not json\n")
    with pytest.raises(SystemExit, match=r"rollouts\.jsonl:1: not JSON"):
        ra.read_rollouts(path)
    with pytest.raises(ValueError, match="--block must be positive"):
        ra.block_rows([good], 0)
