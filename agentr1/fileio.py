"""Files written whole or not at all.

Run logs, summaries, checkpoint metadata and result tables are read by resumed runs and by
people while a job may be killed at any moment: each is written beside its final name and
renamed into place, so a reader finds the old file or the new one, never a torn one.
"""

from __future__ import annotations

import os
from pathlib import Path


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
