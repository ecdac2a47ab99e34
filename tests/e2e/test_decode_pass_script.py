"""benchmarks/decode_pass.py times the three decode settings on the same prompts."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.benchmark_scripts import benchmark
from tests.tiny_models import save_tiny_llama

decode_pass = benchmark("decode_pass")


def test_every_setting_is_timed_and_samples_the_same_tokens(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = save_tiny_llama(tmp_path / "model")
    argv = ["--model", str(model), "--dtype", "float32", "--rows", "3", "--context", "12"]
    out = decode_pass.main([*argv, "--new", "4", "--rounds", "1"])
    # No timing asserts (a tiny model's pass is noise); all three ran and agree.
    assert {"written out", "oneDNN products", "unpacked", "transformers", "floor_ms"} <= set(out)
    assert out["floor_ms"] > 0 and all(out[k] > 0 for k in ("written out", "unpacked"))
    assert out["identical"] == 1.0
    text = capsys.readouterr().out
    assert "written out:" in text and "greedy tokens identical" in text
