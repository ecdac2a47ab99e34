"""The tracker fan-out (agentr1.trackers) with fake trackers, and `log` config checks."""

from __future__ import annotations

import importlib.util
import logging
import math
from typing import Any

import pytest

from agentr1.config import load_config
from agentr1.configutil import ConfigError
from agentr1.trackers import Trackers, eval_table, flatten, make_trackers


class Record:
    """A tracker that keeps what it is given; ``fail`` names a method that raises."""

    name = "record"

    def __init__(self, fail: str = "") -> None:
        self.fail, self.scalars, self.tables, self.texts = fail, [], [], []
        self.config: dict[str, Any] = {}
        self.closed = 0

    def _maybe_fail(self, method: str) -> None:
        if method == self.fail:
            raise OSError(f"{method} failed")

    def log_scalars(self, step: int, scalars: dict[str, float]) -> None:
        self._maybe_fail("log_scalars")
        self.scalars.append((step, scalars))

    def log_table(self, key: str, step: int, columns: list[str], rows: list[list[Any]]) -> None:
        self.tables.append((key, step, columns, rows))

    def log_text(self, key: str, step: int, text: str) -> None:
        self.texts.append((key, step, text))

    def log_config(self, config: dict[str, Any]) -> None:
        self.config = config

    def close(self) -> None:
        self.closed += 1


EVAL = {"greedy": {"test": {"all": {"em": 0.5, "f1": 0.75}, "type=bridge": {"em": 1.0}}}}


def test_rows_become_phase_scalars_at_growing_steps() -> None:
    rec = Record()
    t = Trackers([rec])
    t.log_row({"phase": "sft", "sft/final_loss": 2.0, "time/sft": 1.5, "wall_time": 9.0})
    t.log_row({"phase": "eval_before", **EVAL})
    t.log_row({"phase": "rl", "step": 0.0, "reward": 0.25, "note": "x", "kl": math.nan})
    t.log_row({"phase": "rl", "step": 1.0, "reward": 0.5, "flag": True, "none": None})
    t.log_row({"phase": "eval_after", **EVAL})
    steps = [s for s, _ in rec.scalars]
    assert steps == [0, 0, 0, 1, 1]  # rows without a step get the last one seen
    assert rec.scalars[0][1] == {"sft/final_loss": 2.0, "sft/time/sft": 1.5}
    assert rec.scalars[2][1] == {"rl/reward": 0.25}  # strings, NaN, bools, None left out
    assert rec.scalars[4][1] == {
        "eval_after/greedy/test/all/em": 0.5,
        "eval_after/greedy/test/all/f1": 0.75,
        "eval_after/greedy/test/type=bridge/em": 1.0,
    }
    assert [(k, s) for k, s, *_ in rec.tables] == [
        ("eval_before/table", 0),
        ("eval_after/table", 1),
    ]


def test_eval_table() -> None:
    columns, rows = eval_table(EVAL)
    assert columns == ["mode", "split", "group", "em", "f1"]
    assert rows == [
        ["greedy", "test", "all", 0.5, 0.75],
        ["greedy", "test", "type=bridge", 1.0, None],
    ]


def test_flatten_nested() -> None:
    assert flatten({"a": {"b": {"c": 1}}, "d": 2.5}) == {"a/b/c": 1.0, "d": 2.5}


def test_a_failing_tracker_is_warned_once_and_dropped(caplog: pytest.LogCaptureFixture) -> None:
    bad, good = Record(fail="log_scalars"), Record()
    t = Trackers([bad, good])
    with caplog.at_level(logging.WARNING, logger="agentr1.trackers"):
        for step in range(3):
            t.log_row({"phase": "rl", "step": step, "reward": 1.0})
        t.log_texts("rl/samples", 2, ["a", "b"])
        t.close()
    assert len(caplog.records) == 1 and "log_scalars failed" in caplog.records[0].getMessage()
    assert bad.scalars == [] and bad.closed == 1  # closed once, when dropped
    assert [s for s, _ in good.scalars] == [0, 1, 2] and good.closed == 1
    assert good.texts == [("rl/samples", 2, "a\n\n---\n\nb")]
    t.close()  # idempotent
    assert good.closed == 1


def test_no_trackers_by_default(tmp_path: Any) -> None:
    assert not make_trackers(load_config(None).log, tmp_path)
    assert not any(tmp_path.iterdir())  # nothing written beside the run's own files


def test_unknown_tracker_refused_naming_the_valid_ones() -> None:
    with pytest.raises(
        ConfigError, match=r"unknown tracker 'tensorbord'.*tensorboard, wandb, mlflow"
    ):
        load_config(None, ["log.trackers=[tensorbord]"])


def test_missing_tracker_package_refused_with_the_install_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a)
    )
    with pytest.raises(
        ConfigError, match=r"wandb is not installed here; pip install 'agentr1\[wandb\]'"
    ):
        load_config(None, ["log.trackers=[wandb]"])
