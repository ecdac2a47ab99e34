"""`benchmarks/native_kernels.py` builds the trainer's kernels and times each against
torch's ops, one line per shape."""

from __future__ import annotations

import re

import pytest

from agentr1.backends import native
from tests.benchmark_scripts import benchmark


def test_every_kernel_and_shape_gets_its_times_and_ratio(
    capsys: pytest.CaptureFixture[str],
) -> None:
    if native.compiler() is None:
        pytest.skip("no C++ compiler on this machine: the native kernels cannot be built")
    script = benchmark("native_kernels")
    script.main(["--repeats", "1", "--threads", "1"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("sources ") and "-march=native" in lines[0]
    names = [*script.SHAPES, *script.HEADS]
    assert [line.split(": ")[0] for line in lines[1:]] == names
    timing = r"\d+\.\d{3} ms \(torch ops \d+\.\d{3}, \d+\.\dx\)"
    for line in lines[1:]:
        assert re.search(rf"forward {timing}; backward {timing}$", line), line
