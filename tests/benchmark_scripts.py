"""Import a script of ``benchmarks/`` (a folder of scripts, not a package) in a test."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def benchmark(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` as a module (scripts import each other by bare name, so the
    folder is on ``sys.path`` while it loads)."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.pop(0)
