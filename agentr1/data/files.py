"""Question files on disk: resolve a config entry to files, read each file once, sample
questions, and build the corpus of a set of files. Imports no torch.

An entry (a training or eval file in a recipe, ``--data`` of ``serve retriever``) is, in
order: an existing path; a path under the data root; or a dataset folder under the root
(every file of it with context paragraphs).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from agentr1.data.formats import QASample, load_file, qa_files
from agentr1.data.splits import corpus_paragraphs, split
from agentr1.retrieval.base import Passage


def resolve_entry(entry: str, root: Path, where: str, loader: Loader | None = None) -> list[Path]:
    """Files of one config entry: an existing path, a path under ``root``, or a dataset
    folder under ``root`` (its question files that carry context paragraphs).

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
        files = [p for p in qa_files(root, entry) if any(s.context for s in load(p))]
        if files:
            return files
        raise FileNotFoundError(f"{where}: folder {root / entry} has no question file with context")
    raise FileNotFoundError(
        f"{where}: {entry!r} is not a file, nor a file or dataset folder under {root}"
    )


class Loader:
    """`load_file` once per path (one file may serve training, eval and the corpus)."""

    def __init__(self) -> None:
        self._samples: dict[Path, list[QASample]] = {}

    def __call__(self, path: Path) -> list[QASample]:
        key = path.resolve()
        if key not in self._samples:
            self._samples[key] = load_file(path)
        return self._samples[key]


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
