"""``benchmarks/fresh_eval.py``: the fresh questions follow the recipe's eval questions in
the split's seeded order and never include a question the recipe evaluates or trains on."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from agentr1.config import Config, QAConfig, TaskConfig
from agentr1.data import normalize_question
from agentr1.trainer.qa_setup import load_qa_data

from .test_qa_env import ircot_record, write_jsonl

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
try:
    from fresh_eval import fresh_tasks
finally:
    sys.path.pop(0)


def test_fresh_questions_are_new_and_never_trained_on(tmp_path: Path) -> None:
    dev = write_jsonl(tmp_path / "dev.jsonl", [ircot_record(i) for i in range(12)])
    # A shared file: its non-eval questions train, so none of them can be fresh.
    shared = write_jsonl(tmp_path / "shared.jsonl", [ircot_record(i) for i in range(50, 60)])
    # A training question that is dev question 7 or 8 reworded under another id.
    train = write_jsonl(
        tmp_path / "train.jsonl",
        [
            ircot_record(200, "where was PERSON 7 born"),
            ircot_record(201, "Where was person 8 born"),
            ircot_record(300),
        ],
    )
    qa = QAConfig(
        train=[train, shared], eval={"dev": [dev], "shared": [shared]}, n_eval=3, data_dir="/"
    )
    cfg = Config(task=TaskConfig(kind="qa", qa=qa))
    used = load_qa_data(qa).tasks
    fresh, note = fresh_tasks(cfg, 6, ["dev", "shared"])

    wider = load_qa_data(QAConfig(**{**vars(qa), "n_eval": 9})).tasks
    expected = [
        t
        for t in wider["dev"][3:]
        if normalize_question(t.question)
        not in {normalize_question(u.question) for u in used["train"]}
    ]
    assert [t.id for t in fresh["dev"]] == [t.id for t in expected]
    assert 4 <= len(fresh["dev"]) <= 6  # questions 7 and 8 drop out if they came next
    assert fresh["shared"] == []  # every other question of a shared file trains
    assert note.startswith(f"dev: {len(fresh['dev'])} fresh of the next 6; shared: 0 fresh")
    seen = {t.id for ts in used.values() for t in ts}
    assert not seen & {t.id for t in fresh["dev"]}
    # Asking for more than is left takes the rest (the whole-file sample is in file order).
    rest, _ = fresh_tasks(cfg, 50, ["dev"])
    assert {t.id for t in rest["dev"]} == {f"id{i}" for i in range(12)} - {
        t.id for t in used["dev"]
    } - {t.id for t in used["train"]} - {"id7", "id8"}


def test_fresh_tasks_names_a_bad_split(tmp_path: Path) -> None:
    dev = write_jsonl(tmp_path / "dev.jsonl", [ircot_record(i) for i in range(4)])
    qa = QAConfig(train=[dev], eval={"dev": [dev]}, n_eval=2, data_dir="/")
    # Checked before any file is read.
    cfg = Config(task=TaskConfig(kind="qa", qa=qa))
    with pytest.raises(
        ValueError, match=r"'train' is not an eval split of the recipe \(it has dev\)"
    ):
        fresh_tasks(cfg, 2, ["train"])


def test_skip_continues_where_an_earlier_retest_stopped(tmp_path: Path) -> None:
    dev = write_jsonl(tmp_path / "dev.jsonl", [ircot_record(i) for i in range(40)])
    train = write_jsonl(
        tmp_path / "train.jsonl",
        [ircot_record(200 + i, f"where was person {i} born") for i in range(0, 40, 3)]
        + [ircot_record(300)],
    )
    qa = QAConfig(train=[train], eval={"dev": [dev]}, n_eval=5, data_dir="/")
    cfg = Config(task=TaskConfig(kind="qa", qa=qa))
    first, _ = fresh_tasks(cfg, 10, ["dev"])
    # 5 + 35 covers the whole file, whose sample comes back in file order: the fresh ones
    # must still follow the seeded order, or the skipped ones are not the first re-test's.
    both, _ = fresh_tasks(cfg, 35, ["dev"])
    second, note = fresh_tasks(cfg, 35, ["dev"], skip=len(first["dev"]))
    ids = [t.id for t in first["dev"]], [t.id for t in second["dev"]]
    assert ids[0] and ids[1]
    assert not set(ids[0]) & set(ids[1])
    assert ids[0] + ids[1] == [t.id for t in both["dev"]]
    assert note == (
        f"dev: {len(ids[1])} fresh of the next 35 after skipping the first {len(ids[0])}"
    )
    with pytest.raises(ValueError, match="--skip at least 0"):
        fresh_tasks(cfg, 5, ["dev"], skip=-1)
