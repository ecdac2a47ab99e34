"""benchmarks/demo_rollout.py samples the same episodes whatever the decode settings."""

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
    Every setting generates the same tokens; the compacting ones feed fewer rows, and
    decoding twins as one row feeds no more than decoding them apart."""
    monkeypatch.setenv("AGENTR1_CACHE", str(tmp_path / "cache"))
    overrides = ["train.tasks_per_step=4", "rollout.n_samples=2", "rollout.max_context=42"]
    out = demo_rollout.main(["--model", "tiny", "--steps", "1", "--rounds", "1", *overrides])
    twins, compact, full = out["default"], out["twins apart"], out["neither"]
    assert twins["tokens"] == compact["tokens"] and twins["row_slots"] <= compact["row_slots"]
    assert compact["tokens"] == full["tokens"] > 0 and compact["live"] == full["live"]
    assert compact["passes"] == full["passes"]
    assert compact["row_slots"] < full["row_slots"]
    assert out["transformers' forward"]["row_slots"] == compact["row_slots"]
    assert out["torch attention"]["tokens"] == compact["tokens"]
    assert "row-slots for" in capsys.readouterr().out
