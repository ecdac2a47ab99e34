"""`benchmarks/demo_seeds.py` runs the demo once per (kernels, seed) in a process of its
own, reads each run's summary and says which pass the EM bar; finished runs are read, not
run again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.benchmark_scripts import benchmark
from tests.e2e.test_train_loop import SMALL

TINY = [*SMALL, "sft.steps=4", "train.steps=1", "eval.sampled_n=1"]


def test_a_tiny_demo_is_run_read_and_judged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AGENTR1_CACHE", str(tmp_path / "cache"))
    script = benchmark("demo_seeds")
    root = tmp_path / "runs"
    argv = ["--seeds", "3", "--kernels", "torch", "--run-root", str(root), "--bar", "0", *TINY]
    assert script.main(argv) == 0  # a bar of 0: every finished run passes
    out = capsys.readouterr().out
    run = root / "torch-seed3"
    assert (run / "summary.json").exists() and Path(f"{run}.log").exists()
    config = (run / "config.yaml").read_text()
    assert "seed: 3" in config and "steps: 4" in config  # the seed and overrides reached it
    row = script.outcome(run)
    assert len(row["before"]) == len(row["after"]) == 3 and row["sampled"] is not None
    assert out.strip().endswith("1 of 1 runs pass (greedy EM >= 0.0 on 2 and 3 hops)")
    assert "| torch | 3 |" in out

    def no_run(*a: Any, **kw: Any) -> Any:
        raise AssertionError("a finished run must be read, not run again")

    monkeypatch.setattr(script.subprocess, "run", no_run)
    assert script.main([*argv[: -len(TINY)], "--bar", "1.01"]) == 1  # read again; fails 1.01
    assert "0 of 1 runs pass" in capsys.readouterr().out


def test_the_bar_is_on_two_and_three_hops_and_a_broken_summary_is_named(tmp_path: Path) -> None:
    script = benchmark("demo_seeds")

    def summary(em: list[float]) -> dict[str, Any]:
        hops = {f"hops={i + 1}": {"em": x} for i, x in enumerate(em)}
        return {
            "sft": {"sft/final_loss": 0.01},
            "eval_before": {"greedy": {"test": hops}},
            "eval_after": {"greedy": {"test": hops}},
            "minutes": 3.0,
        }

    for name, em, passed in [("a", [0.1, 0.8, 0.9], True), ("b", [1.0, 0.79, 1.0], False)]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(json.dumps(summary(em)))
        row = script.outcome(tmp_path / name)
        assert row["passed"] is passed and row["sampled"] is None
    text = script.table([("native", 0, script.outcome(tmp_path / "a"))])
    assert (
        "| native | 0 | 0.0100 | 0.10 / 0.80 / 0.90 | 0.10 / 0.80 / 0.90 | - | 3.0 | yes |" in text
    )
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "summary.json").write_text('{"sft": {}}')
    with pytest.raises(SystemExit, match=r"c/summary\.json: not a finished demo run"):
        script.outcome(tmp_path / "c")
