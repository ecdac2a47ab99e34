"""Question files on disk: resolve a config entry to files, read each file once, sample
questions, and build the corpus of a set of files. Imports no torch.

An entry (a training or eval file in a recipe, ``--data`` of ``serve retriever``) is, in
order: an existing path; a path under the data root; or a dataset folder under the root
(every file of it with context paragraphs).

A `Loader` holds the read policy of a run (``on_error``, ``fields``, ``unanswerable``) and
what it left out: with ``on_error="skip"`` a bad record costs only itself and a file that
cannot be read only itself, each logged with file, line and reason and kept in
`Loader.skipped` for the run's report.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from agentr1.data.formats import (
    DataFormatError,
    OnError,
    QASample,
    Unanswerable,
    check_on_error,
    load,
    parse_fields,
    qa_files,
    unreadable,
)
from agentr1.data.splits import corpus_paragraphs, split
from agentr1.retrieval.base import Passage

log = logging.getLogger(__name__)


def resolve_entry(entry: str, root: Path, where: str, loader: Loader | None = None) -> list[Path]:
    """Files of one config entry: an existing path, a path under ``root``, or a dataset
    folder under ``root`` (its question files that carry context paragraphs).

    The folder scan follows ``loader``'s ``on_error``: with "skip" a file it cannot read is
    left out and recorded in ``loader.skipped``.

    Raises:
        FileNotFoundError: naming the config field (``where``), the entry and ``root``.
    """
    path = Path(entry).expanduser()
    if path.is_file():
        return [path]
    if (root / entry).is_file():
        return [root / entry]
    if (root / entry).is_dir():
        load = loader or Loader()
        found = load.scan(root / entry)
        files = [p for p in found if any(s.context for s in load(p))]
        if files:
            return files
        raise FileNotFoundError(f"{where}: folder {root / entry} has no question file with context")
    raise FileNotFoundError(
        f"{where}: {entry!r} is not a file, nor a file or dataset folder under {root}"
    )


class Loader:
    """`agentr1.data.load` once per path (one file may serve training, eval and the corpus),
    with one read policy, collecting what was left out.

    Args:
        on_error: "fail" (default): the first bad record or unreadable file raises;
            "skip": it is left out, logged, and kept in `skipped`.
        fields: read every file as ``questions`` with these keys (`parse_fields`).
        unanswerable: "skip" (default) or "keep" records marked unanswerable (`load`).
        format: the format of every file (None: detected per file).

    Attributes:
        skipped: the errors of every record and file left out, in reading order.
        unanswerable: file -> ids of the records left out as unanswerable.
    """

    def __init__(
        self,
        on_error: OnError = "fail",
        *,
        fields: str | dict[str, str] | None = None,
        unanswerable: Unanswerable = "skip",
        format: str | None = None,
    ) -> None:
        self.skip = check_on_error(on_error, "on_error")
        self.fields = parse_fields(fields) or None
        self.unanswerable_policy: Unanswerable = unanswerable
        self.format = format
        self.skipped: list[DataFormatError] = []
        self.unanswerable: dict[Path, list[str]] = {}
        self._samples: dict[Path, list[QASample]] = {}

    def __call__(self, path: Path) -> list[QASample]:
        key = path.resolve()
        if key not in self._samples:
            self._samples[key] = self._load(path)
        return self._samples[key]

    def _load(self, path: Path) -> list[QASample]:
        try:
            try:
                res = load(
                    path,
                    self.format,
                    on_error="skip" if self.skip else "fail",
                    fields=self.fields,
                    unanswerable=self.unanswerable_policy,
                )
            except OSError as e:
                raise unreadable(path, e) from e
        except DataFormatError as e:
            if not self.skip:
                raise
            log.warning("skipped file %s", e)
            self.skipped.append(e)
            return []
        self.skipped += res.skipped
        if res.unanswerable:
            self.unanswerable[path] = res.unanswerable
        return res.samples

    def scan(self, folder: Path) -> list[Path]:
        """`qa_files` of ``folder`` under this policy (skipped files go to `skipped`)."""
        return qa_files(
            folder,
            on_error="skip" if self.skip else "fail",
            skipped=self.skipped,
            fields=self.fields,
        )

    def report(self) -> dict[str, Any]:
        """What was left out, JSON-ready: ``skipped`` (one `DataFormatError.record` each)
        and ``unanswerable`` (file -> count)."""
        return {
            "skipped": [e.record() for e in self.skipped],
            "unanswerable": {str(p): len(ids) for p, ids in self.unanswerable.items()},
        }


def sample_questions(samples: list[QASample], n: int, seed: int, name: str) -> list[QASample]:
    """A seeded sample of n deduplicated samples (all, in file order, when n is 0 or covers
    them). Which ones depends only on the ids, the seed and n (`agentr1.data.split`); the
    ``name`` is only a label."""
    if n == 0 or n >= len(samples):
        return samples
    return split(samples, {name: n}, seed=seed)[name]


def wiki_files(root: Path) -> list[Path]:
    """The Wikipedia distractor files (``root/wikipedia/*.json*``), sorted."""
    return sorted(p for p in (root / "wikipedia").glob("*.json*") if p.is_file())


def files_corpus(files: Iterable[Path], root: Path, wiki: bool, load: Loader) -> list[Passage]:
    """Every context paragraph of ``files`` (a file listed twice is read once), plus the
    Wikipedia distractors under ``root`` with ``wiki`` (`agentr1.data.corpus_paragraphs`
    deduplicates and assigns the stable ids)."""
    unique = dict.fromkeys(files)
    extras = wiki_files(root) if wiki else []
    return corpus_paragraphs((s for p in unique for s in load(p)), extras)
