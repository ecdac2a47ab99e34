"""`agentr1.fileio.write_atomic`: the old file or the new one, never a torn one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agentr1 import fileio


def test_writes_and_replaces_with_a_plain_files_permissions(tmp_path: Path) -> None:
    path = tmp_path / "summary.json"
    fileio.write_atomic(path, "{}\n")
    fileio.write_atomic(path, '{"steps": 3}\n', durable=True)
    assert path.read_text() == '{"steps": 3}\n'
    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    assert path.stat().st_mode == plain.stat().st_mode
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain.txt", "summary.json"]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "summary.json"
    path.write_text("old\n")

    def full_disk(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    with pytest.raises(OSError, match="No space left"):
        fileio.write_atomic(path, "new\n")
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def test_read_jsonl_checks_only_the_lines_it_keeps_and_names_bad_ones(tmp_path: Path) -> None:
    path = tmp_path / "episodes.jsonl"
    path.write_text('{"label": "before"}\n\n{"label": "after", "em": 1}\n')
    keep = fileio.read_jsonl(path, ["em"], lambda r: r["label"] == "after")
    assert list(keep) == [(3, {"label": "after", "em": 1})]  # line 1 lacks em, but is not kept
    with pytest.raises(ValueError, match=r"episodes\.jsonl:1: no field 'em'"):
        list(fileio.read_jsonl(path, ["em"]))
    path.write_text('{"em": 1}\n{"em": \n')
    with pytest.raises(ValueError, match=r"episodes\.jsonl:2: not JSON"):
        list(fileio.read_jsonl(path))
