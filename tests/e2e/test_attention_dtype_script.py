"""`benchmarks/attention_dtype.py` times torch's CPU attention in bf16 and float32 at each
of its shapes, one line each."""

from __future__ import annotations

import re

import pytest

from tests.benchmark_scripts import benchmark


def test_every_shape_gets_both_dtypes_and_their_ratio(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    script = benchmark("attention_dtype")
    tiny = {"tiny": (1, 2, 1, 6, 9, 32, False), "tiny causal": (2, 2, 2, 5, 5, 32, True)}
    monkeypatch.setattr(script, "SHAPES", tiny)
    script.main(["--repeats", "1", "--threads", "1"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split(": ")[0] for line in lines] == ["tiny", "tiny causal"]
    pair = r"bf16 \d+\.\d\d ms, float32 \d+\.\d\d ms \(\d+\.\d\dx\)"
    for line in lines:
        assert re.search(rf": forward {pair}; backward {pair}$", line), line
