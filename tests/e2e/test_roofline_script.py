"""benchmarks/roofline.py measures the machine's limits and every phase on a tiny model."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.benchmark_scripts import benchmark
from tests.tiny_models import save_tiny_llama

roofline = benchmark("roofline")


@pytest.mark.parametrize("extra", [[], ["--lora", "--dtype", "bfloat16"]])
def test_every_phase_is_measured_against_a_limit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str]
) -> None:
    model = save_tiny_llama(tmp_path / "tiny")
    small = ["--rows", "2", "--context", "12", "--new", "3", "--train-len", "20"]
    sizes = ["--micro-batch", "1", "--repeats", "1", "--matmul-n", "128", "--copy-mib", "8"]
    args = ["--model", str(model), "--dtype", "float32", *small, *sizes, *extra]
    out = roofline.main(args)
    limits, phases = out["limits"], out["phases"]
    assert all(limits[k] > 0 for k in ("matmul_fp32_gflops", "matmul_bf16_gflops", "copy_gbs"))
    assert set(phases) == {"decode", "prefill", "reference", "update"}
    decode = phases["decode"]
    assert decode["floor_ms"] > 0 and decode["ms"] > 0 and decode["of_limit"] > 0
    for name in ("prefill", "reference", "update"):
        assert phases[name]["ms"] > 0 and phases[name]["gflops"] > 0
    text = capsys.readouterr().out
    assert "of the bandwidth floor" in text and text.count("of the matmul peak") == 3
