"""Trajectories to and from JSONL, with decoded text for humans."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from agentr1.types import Trajectory


def write_trajectories(
    path: str | Path,
    trajectories: Iterable[Trajectory],
    decode: Callable[[Sequence[int]], str] | None = None,
    append: bool = False,
) -> int:
    """Write one JSON line per trajectory (plus ``text`` when ``decode`` is given)."""
    n = 0
    with open(path, "a" if append else "w", encoding="utf-8") as f:
        for t in trajectories:
            f.write(t.to_json(decode(t.token_ids) if decode else None) + "\n")
            n += 1
    return n


def read_trajectories(path: str | Path) -> list[Trajectory]:
    """Read trajectories written by `write_trajectories`; errors name the file and line."""
    out = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                out.append(Trajectory.from_json(line))
            except (ValueError, TypeError, KeyError) as e:
                raise ValueError(f"{path}:{lineno}: not a trajectory record: {e}") from None
    return out
