"""benchmarks/demo_rollout.py samples the same episodes with and without compaction."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.benchmark_scripts import benchmark

demo_rollout = benchmark("demo_rollout")


def test_both_settings_sample_the_same_tokens_and_compaction_feeds_fewer_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The untrained tiny model runs every turn to its cap; a context of 42 tokens gives
    the episodes (prompts of different lengths) different caps, so rows finish apart.
    Both settings generate the same tokens; the compacting one feeds fewer rows."""
    monkeypatch.setenv("AGENTR1_CACHE", str(tmp_path / "cache"))
    overrides = ["train.tasks_per_step=4", "rollout.n_samples=2", "rollout.max_context=42"]
    out = demo_rollout.main(["--model", "tiny", "--steps", "1", "--rounds", "1", *overrides])
    compact, full = out["compact"], out["keep every row"]
    assert compact["tokens"] == full["tokens"] > 0 and compact["live"] == full["live"]
    assert compact["passes"] == full["passes"]
    assert compact["row_slots"] < full["row_slots"]
    assert "row-slots for" in capsys.readouterr().out
