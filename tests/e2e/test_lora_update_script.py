"""benchmarks/lora_update.py: full and LoRA updates on the same batch, side by side."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.benchmark_scripts import benchmark
from tests.integration.test_qa_env import tiny_qa_recipe

lora_update = benchmark("lora_update")


def test_the_script_times_both_updates_on_one_batch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model, recipe = tiny_qa_recipe(tmp_path, 8, tokens_per_turn=6)
    args = ["--model", str(model), "--recipe", str(recipe), "--samples", "3", "--rounds", "2"]
    out = lora_update.main([*args, "--rank", "4"])
    assert out["full"] > 0 and out["lora"] > 0
    assert out["speedup"] == pytest.approx(out["full"] / out["lora"])
    assert out["share_gain"] == pytest.approx(out["lora_unshared"] / out["lora"])
    # LoRA keeps gradients and moments for the adapters only
    assert 0 < out["lora_state_gib"] < out["full_state_gib"] / 4
    assert 0 < out["agent_tokens"] < out["tokens"]
    text = capsys.readouterr().out
    rows = [line.split("|")[1].strip() for line in text.splitlines() if line.startswith("| ")]
    assert rows[-3:] == ["full", "lora", "lora_unshared"] and "faster on the same batch" in text
