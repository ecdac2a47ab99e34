"""Every script and test under ``experiments/`` imports only agentr1's public API: the
top-level names (``agentr1.__all__``) and the library packages a user may import, never
``agentr1.trainer`` (its names a script needs are top-level: ``from agentr1 import train``)
and never a ``_``-prefixed name."""

from __future__ import annotations

import ast
from pathlib import Path

import agentr1

EXPERIMENTS = Path(__file__).resolve().parents[2]

PACKAGES = {
    "agentr1.algorithms",
    "agentr1.backends",
    "agentr1.config",
    "agentr1.data",
    "agentr1.envs",
    "agentr1.eval",
    "agentr1.fileio",
    "agentr1.models",
    "agentr1.retrieval",
    "agentr1.rewards",
    "agentr1.rollout",
    "agentr1.tasks",
    "agentr1.templates",
    "agentr1.tiny",
    "agentr1.tools",
}
"""Modules a user may import, with their submodules (``agentr1.tasks.multihop_qa``)."""

STILL_IMPORTED: set[tuple[str, str]] = set()
"""What the scripts still take from outside the public API (module, name), until it is
public: nothing now."""


def public_api_breaches(path: Path) -> list[str]:
    """``file:line: why`` for each import in ``path`` outside agentr1's public API."""
    out: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            imported = [(a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            imported = [(node.module, a.name) for a in node.names]
        else:
            continue
        for module, name in imported:
            why = breach(module, name)
            if why:
                out.append(f"{path}:{node.lineno}: {why}")
    return out


def breach(module: str, name: str | None) -> str:
    """Why ``from module import name`` (``import module`` when name is None) is not public
    API, or "" when it is (or does not import agentr1)."""
    if module != "agentr1" and not module.startswith("agentr1."):
        return ""
    shown = f"{module}.{name}" if name else module
    if module == "agentr1.trainer" or module.startswith("agentr1.trainer."):
        return f"{shown}: agentr1.trainer is internal; take its public names from agentr1"
    if any(part.startswith("_") for part in [*module.split("."), name or ""]):
        return f"{shown}: a _-prefixed name is private"
    if module == "agentr1":
        if name is None or name in agentr1.__all__ or f"agentr1.{name}" in PACKAGES:
            return ""
        return f"{shown}: not in agentr1.__all__"
    if (module, name) in STILL_IMPORTED:
        return ""
    if any(module == p or module.startswith(p + ".") for p in PACKAGES):
        return ""
    return f"{shown}: {module} is not a public agentr1 package"


def test_experiments_import_only_the_public_api() -> None:
    files = sorted(EXPERIMENTS.rglob("*.py"))
    assert Path(__file__) in files
    breaches = [b for f in files for b in public_api_breaches(f)]
    assert not breaches, "imports outside agentr1's public API:\n" + "\n".join(breaches)


def test_the_check_names_each_kind_of_breach(tmp_path: Path) -> None:
    script = tmp_path / "script.py"
    script.write_text(
        "import json\n"
        "from agentr1 import train, build_setup\n"
        "from agentr1.tasks.multihop_qa import load_qa_data\n"
        "from agentr1.trainer.loop import train\n"
        "import agentr1.trainer.setup\n"
        "from agentr1.rollout.loop import _clip\n"
        "from agentr1 import lora\n"
        "from agentr1.configutil import to_dict\n"
        "def f():\n"
        "    from agentr1.trainer.run import metric_records\n"
    )
    found = public_api_breaches(script)
    assert [b.split(":")[1] for b in found] == ["4", "5", "6", "7", "8", "10"]
    assert "agentr1.trainer.loop.train: agentr1.trainer is internal" in found[0]
    assert "agentr1.rollout.loop._clip: a _-prefixed name is private" in found[2]
    assert "agentr1.lora: not in agentr1.__all__" in found[3]
    assert "agentr1.configutil is not a public agentr1 package" in found[4]
