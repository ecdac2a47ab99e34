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


def test_a_shaped_model_is_measured_and_recorded(tmp_path: Path) -> None:
    """``--shape`` builds a random model of a known configuration (no weights to load);
    ``--record`` appends the figures as one JSON line."""
    import json

    record = tmp_path / "roofline.jsonl"
    args = ["--shape", "qwen2.5-tiny", "--dtype", "float32", "--rows", "2", "--context", "12"]
    args += ["--new", "3", "--train-len", "20", "--micro-batch", "1", "--repeats", "1"]
    args += ["--matmul-n", "128", "--copy-mib", "8", "--record", str(record), "--name", "toy"]
    roofline.main(args)
    roofline.main(args)
    lines = [json.loads(x) for x in record.read_text().splitlines()]
    assert [x["name"] for x in lines] == ["toy", "toy"]
    assert lines[0]["args"]["shape"] == "qwen2.5-tiny" and lines[0]["phases"]["update"]["ms"] > 0


def test_a_shaped_model_saves_as_a_model_directory(tmp_path: Path) -> None:
    from agentr1.models import is_complete_save, load_model

    shaped = benchmark("shaped_model")
    tok = tmp_path / "tok"
    tok.mkdir()
    with pytest.raises(FileNotFoundError, match=r"--tokenizer .*tok: no tokenizer.json"):
        shaped.main(["qwen2.5-tiny", str(tmp_path / "m"), "--tokenizer", str(tok)])
    for f in shaped.TOKENIZER_FILES:
        (tok / f).write_text("{}")
    out = shaped.main(
        ["qwen2.5-tiny", str(tmp_path / "m"), "--tokenizer", str(tok), "--device", "cpu"]
    )
    assert is_complete_save(out)
    model = load_model(out)
    assert model.config.vocab_size == 151936 and model.config.num_hidden_layers == 2
