"""benchmarks/kept_cache.py runs the real rollout twice per setting and reports both."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.benchmark_scripts import benchmark
from tests.integration.test_qa_env import tiny_qa_recipe

kept_cache = benchmark("kept_cache")


def test_the_script_compares_both_settings_on_the_same_rollout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """On the tiny model (whose episodes end after one turn: it never calls the tool) the
    settings must sample the same tokens and the re-prefill one must keep nothing; the
    kept path itself is checked in tests/integration/test_hf_backend.py."""
    model, recipe = tiny_qa_recipe(tmp_path, 6, tokens_per_turn=5)
    argv = ["--model", str(model), "--recipe", str(recipe), "--questions", "2"]
    runs = kept_cache.main([*argv, "--samples", "2", "--repeats", "1", "--temperature", "0"])
    plain, kept = runs["re-prefill"][0], runs["kept"][0]
    assert len(plain["tokens"]) == 4 and plain["tokens"] == kept["tokens"]
    assert plain["kept"] == 0 and plain["prefilled"] > 0
    out = capsys.readouterr().out
    assert "| re-prefill |" in out and "| kept |" in out and "4/4 episodes" in out
    assert "log-prob difference" in out
