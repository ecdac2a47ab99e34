"""bm25s imports JAX where JAX is installed and runs a top-k at import, which on a GPU
machine takes 75% of the GPU's memory (the paper recipe's first step on an H200 ran out
of memory with 105 GiB held by JAX): agentr1 loads bm25s with JAX hidden and selects with
numpy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

CHILD = textwrap.dedent(
    """
    import json, sys
    from agentr1.retrieval.base import Passage
    from agentr1.retrieval.bm25 import BM25Retriever

    preload = sys.argv[1] == "1"
    if preload:
        import jax
    r = BM25Retriever([Passage("a", "Paris", "capital of France"), Passage("b", "Rome", "Italy")])
    hits = [p.id for p in r.search("capital France", 2)]
    print(json.dumps({"hits": hits, "jax": "jax" in sys.modules, "touched": jax_touched()}))
    """
)

FAKE_JAX = """
import os
open(os.environ["FAKE_JAX_LOG"], "a").write("imported\\n")
"""


def run_child(tmp_path: Path, preload: bool) -> dict:
    fake = tmp_path / "site"
    (fake / "jax").mkdir(parents=True, exist_ok=True)
    (fake / "jax" / "__init__.py").write_text(FAKE_JAX)
    (fake / "jax" / "lax.py").write_text(  # each call logged: bm25s's own at import has k=1
        "import os\n"
        "def top_k(x, k):\n"
        "    open(os.environ['FAKE_JAX_LOG'], 'a').write(f'top_k {k}\\n')\n"
        "    return x[:k], list(range(k))\n"
    )
    log = tmp_path / "jax.log"
    log.unlink(missing_ok=True)
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "FAKE_JAX_LOG": str(log)}
    env["PYTHONPATH"] = os.pathsep.join([str(fake), str(root), env.get("PYTHONPATH", "")])
    code = f"def jax_touched():\n    import os\n    return os.path.exists({str(log)!r})\n" + CHILD
    code += f"print(json.dumps(open({str(log)!r}).read().split() if jax_touched() else []))\n"
    out = subprocess.run(
        [sys.executable, "-c", code, "1" if preload else "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    *_, result, calls = out.stdout.strip().splitlines()
    return {**json.loads(result), "log": json.loads(calls)}


def test_bm25s_never_starts_an_installed_jax(tmp_path: Path) -> None:
    got = run_child(tmp_path, preload=False)
    assert got == {"hits": ["a"], "jax": False, "touched": False, "log": []}


def test_a_jax_the_program_imported_is_left_alone_and_unused(tmp_path: Path) -> None:
    """bm25s then sees JAX; agentr1 still asks for numpy's top-k (same hits everywhere)."""
    got = run_child(tmp_path, preload=True)
    # imported, and bm25s's import-time top-k ran (k=1); the search's top-2 did not use it
    assert got == {"hits": ["a"], "jax": True, "touched": True, "log": ["imported", "top_k", "1"]}
