"""Files written whole or not at all.

Run logs, summaries, checkpoint metadata and result tables are read by resumed runs and by
people while a job may be killed at any moment: each is written beside its final name and
renamed into place, so a reader finds the old file or the new one, never a torn one.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def write_atomic(path: str | Path, text: str, durable: bool = False) -> None:
    """Write ``text`` (UTF-8) to ``path`` through a temporary file in the same folder and
    `os.replace`. ``durable`` also flushes it to disk before the rename (for files a resume
    trusts, such as checkpoint metadata). On any error the temporary file is removed and
    ``path`` keeps its old content; the new file gets the permissions a plain write would."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_jsonl(
    path: str | Path,
    fields: Sequence[str] = (),
    keep: Callable[[dict[str, Any]], bool] | None = None,
) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, record)`` for each non-empty line of the JSONL file ``path`` that
    ``keep`` accepts (every line when None), each checked to hold ``fields``.

    Raises:
        ValueError: naming the file and line of a line that is not JSON or lacks a field.
    """
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec: dict[str, Any] = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not JSON ({e.msg})") from None
            if keep is not None and not keep(rec):
                continue
            for field in fields:
                if field not in rec:
                    raise ValueError(f"{path}:{lineno}: no field {field!r}")
            yield lineno, rec


def remove_partial(root: str | Path) -> list[Path]:
    """Remove what a writer killed mid-write left in ``root``: ``.tmp_step_*`` folders
    (`save_checkpoint`) and ``.*.tmp`` files (`agentr1.fileio.write_atomic`); the paths
    removed. Complete checkpoints are never touched."""
    root = Path(root)
    if not root.is_dir():
        return []
    gone = []
    for p in [*root.glob(".tmp_step_*"), *root.glob(".*.tmp")]:
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
        gone.append(p)
    if gone:
        log.info("removed %d partial file(s) a killed write left in %s", len(gone), root)
    return gone
