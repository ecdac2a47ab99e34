"""benchmarks/repeated_rows.py replays the demo's update and reference pass with repeated
rows collapsed and computed as every row."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.benchmark_scripts import benchmark

repeated_rows = benchmark("repeated_rows")


def test_the_script_finds_the_copies_and_times_both_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two RL steps of the tiny model sampling near greedily (so a group's samples
    repeat): each kept batch has fewer distinct rows than rows, and both settings are
    timed for the update and the reference pass."""
    monkeypatch.setenv("AGENTR1_CACHE", str(tmp_path / "cache"))
    overrides = [
        "train.tasks_per_step=2",
        "rollout.n_samples=4",
        "rollout.max_turns=2",
        "rollout.temperature=0.01",
    ]
    out = repeated_rows.main(["--model", "tiny", "--steps", "2", "--rounds", "1", *overrides])
    assert len(out["batches"]) == 2
    for facts in out["batches"]:
        assert facts["rows"] == 8 and 2 <= facts["distinct"] < 8
        assert 0 < facts["copies_real"] < 1 and 0 <= facts["copies_sampled"] < 1
    for name in ("collapsed", "every row"):
        assert out[name]["update"] > 0 and out[name]["reference"] > 0
    assert "distinct" in capsys.readouterr().out
