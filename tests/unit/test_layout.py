"""How the package is cut: the loop on two screens, trainer functions that fit one, and no
lab notebook in the product (research lives in experiments/, figures in
benchmarks/RESULTS.md, history in git)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "agentr1"


def _functions(path: Path) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        (f"{path.name}:{n.lineno} {n.name}", n.end_lineno - n.lineno + 1)  # type: ignore[operator]
        for n in ast.walk(tree)
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
    ]


def test_the_loop_is_two_screens_and_no_trainer_function_is_longer_than_one() -> None:
    loop = PACKAGE / "trainer" / "loop.py"
    assert len(loop.read_text().splitlines()) <= 350
    train = dict((name.split()[-1], n) for name, n in _functions(loop))["train"]
    assert train <= 50, f"train() is {train} lines"
    long = [
        (name, n)
        for path in sorted((PACKAGE / "trainer").glob("*.py"))
        for name, n in _functions(path)
        if n > 62
    ]
    assert not long, f"trainer functions over ~60 lines: {long}"


def test_the_product_carries_no_lab_notebook() -> None:
    """No preregistration, no commit hash, no pointer to a line of RESULTS.md."""
    hits = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if re.search(r"prereg|RESULTS\.md[:#]\d|\bcommit [0-9a-f]{7,}\b", line, re.I):
                hits.append(f"{path.relative_to(PACKAGE.parent)}:{i}: {line.strip()}")
    assert not hits, "\n".join(hits)
