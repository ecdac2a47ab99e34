"""benchmarks/gc_pauses.py times the collector with the setup's objects in its walk and
frozen out of it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.benchmark_scripts import benchmark

gc_pauses = benchmark("gc_pauses")


def test_the_settled_heap_leaves_the_collector_a_fraction_of_the_objects(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """One RL step a setting on the tiny model: the settled setting's collector walks a
    small fraction of what the plain one walks, and each counts its collections."""
    monkeypatch.setenv("AGENTR1_CACHE", str(tmp_path / "cache"))
    overrides = ["train.tasks_per_step=2", "rollout.n_samples=2", "rollout.max_turns=2"]
    out = gc_pauses.main(["--model", "tiny", "--steps", "1", "--rounds", "1", *overrides])
    plain, settled = out["plain"], out["settled"]
    assert plain["tracked"] > 50_000 and settled["tracked"] < plain["tracked"] / 20
    for r in (plain, settled):
        assert r["step_s"] > r["gc_s"] >= r["full_gc_s"] >= 0 and r["collections"] >= r["full"]
    assert "objects tracked" in capsys.readouterr().out
