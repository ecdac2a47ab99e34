"""From loaded samples to what a run uses: deduplicated questions, seeded splits, a corpus.

- `dedupe`: one sample per id and per normalized question (the raw files overlap).
- `split`: disjoint train/dev/test sets that depend only on the ids and the seed.
- `corpus_paragraphs`: the retrieval corpus, the union of every context paragraph (plus
  optional corpus-only files as distractors), with content-derived ids that match
  `QASample.supporting_ids` / ``Task.metadata["supporting"]``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from agentr1.data.formats import (
    CORPUS_FORMATS,
    QASample,
    detect_format,
    load_corpus_file,
    load_file,
    paragraph_id,
)
from agentr1.retrieval.base import Passage

_NON_WORD = re.compile(r"[^\w\s]|_", re.UNICODE)

DEFAULT_FRACTIONS = {"train": 0.8, "dev": 0.1, "test": 0.1}


def normalize_question(question: str) -> str:
    """Lower-case, punctuation removed, whitespace runs collapsed: the dedupe key.

    >>> normalize_question("  Who wrote 'Hamlet'?\\n")
    'who wrote hamlet'
    >>> normalize_question("Who  wrote Hamlet") == normalize_question("who wrote: Hamlet?")
    True
    """
    return " ".join(_NON_WORD.sub(" ", question.lower()).split())


def dedupe(samples: Iterable[QASample]) -> list[QASample]:
    """Drop repeated questions.

    Two samples are duplicates when they share the id or the normalized question
    (`normalize_question`). Rule: the first occurrence is kept, at its position, except
    that a later duplicate with context paragraphs replaces a kept sample without any
    (so question-only copies never hide a copy that can build a corpus and be checked for
    evidence). Answers are not merged: the overlapping raw files agree on them.
    """
    kept: list[QASample] = []
    slot: dict[str, int] = {}  # "id:<id>" / "q:<normalized question>" -> index in kept
    for s in samples:
        keys = (f"id:{s.id}", f"q:{normalize_question(s.question)}")
        hit = next((slot[k] for k in keys if k in slot), None)
        if hit is None:
            hit = len(kept)
            kept.append(s)
        elif s.context and not kept[hit].context:
            kept[hit] = s
        else:
            continue
        for k in keys:
            slot.setdefault(k, hit)
    return kept


def seeded_rank(seed: int, sample_id: str) -> str:
    """The sort key of `split`: samples sorted by it are in the seeded order, which depends
    only on the seed and the id (so any n first ones are the same whatever n is)."""
    return hashlib.sha256(f"{seed}\n{sample_id}".encode()).hexdigest()


def _sizes(sizes: Sequence[float] | Mapping[str, float | int], n: int) -> dict[str, int]:
    """Named split sizes (counts) from fractions or counts; validated."""
    if isinstance(sizes, Mapping):
        named = dict(sizes)
    else:
        if len(sizes) != 3:
            raise ValueError(f"fractions must be (train, dev, test), got {tuple(sizes)}")
        named = dict(zip(("train", "dev", "test"), sizes, strict=True))
    values = list(named.values())
    if not named or any(isinstance(v, bool) or v < 0 for v in values):
        raise ValueError(f"split sizes must be non-negative, got {named}")
    if all(isinstance(v, int) for v in values):
        if sum(values) > n:
            raise ValueError(f"split sizes {named} ask for {sum(values)} of {n} samples")
        return {k: int(v) for k, v in named.items()}
    if any(isinstance(v, int) and v != 0 for v in values):
        raise ValueError(f"give all split sizes as fractions or all as counts, got {named}")
    total = float(sum(values))
    if total > 1 + 1e-9:
        raise ValueError(f"split fractions sum to {total:.4f} > 1: {named}")
    # Cut at rounded cumulative fractions so the counts add up exactly; when the fractions
    # sum to 1 every sample lands somewhere.
    out, cum, start = {}, 0.0, 0
    for name, frac in named.items():
        cum += float(frac)
        end = n if abs(cum - 1) < 1e-9 else round(cum * n)
        out[name] = end - start
        start = end
    return out


def split(
    samples: Sequence[QASample],
    sizes: Sequence[float] | Mapping[str, float | int] = DEFAULT_FRACTIONS,
    *,
    seed: int = 0,
) -> dict[str, list[QASample]]:
    """Seeded, disjoint splits.

    Samples are ordered by ``sha256(seed, id)`` and cut in consecutive runs, so which split
    a sample lands in depends only on the set of ids and the seed, never on input order.

    Args:
        samples: samples with unique ids (`dedupe` first).
        sizes: ``(train, dev, test)`` fractions, or a mapping name -> fraction (all floats
            summing to at most 1) or name -> count (all ints).
        seed: changes the assignment.

    Returns:
        name -> samples, in hash order, in the order ``sizes`` names them.

    >>> from agentr1.data.formats import QASample
    >>> qs = [QASample(str(i), f"q{i}", ("a",), "toy") for i in range(10)]
    >>> {k: len(v) for k, v in split(qs, {"train": 0.8, "test": 0.2}).items()}
    {'train': 8, 'test': 2}
    """
    ids = [s.id for s in samples]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise ValueError(f"duplicate sample id {dup!r}: call dedupe() before split()")
    counts = _sizes(sizes, len(samples))
    ordered = sorted(samples, key=lambda s: seeded_rank(seed, s.id))
    out, start = {}, 0
    for name, count in counts.items():
        out[name] = ordered[start : start + count]
        start += count
    return out


def _extra_passages(path: Path) -> list[Passage]:
    """Passages of one extras file: a corpus-only file, or the contexts of a question file."""
    if detect_format(path) in CORPUS_FORMATS:
        return load_corpus_file(path)
    return [Passage(p.id, p.title, p.text) for s in load_file(path) for p in s.context]


def corpus_paragraphs(
    samples: Iterable[QASample], extras: Iterable[Path | str] = ()
) -> list[Passage]:
    """The retrieval corpus: every context paragraph of ``samples`` plus ``extras``.

    Deduplicated by (title, text) after the loaders' whitespace normalization; each
    passage id is `paragraph_id` (``"p:" + sha1(title + "\\n" + text)[:12]``), the same id
    `QASample.supporting_ids` gives the gold paragraphs. Sorted by id, so the corpus is the
    same whatever order the samples and extras come in.

    Args:
        samples: questions whose context paragraphs make up the corpus.
        extras: more files: corpus-only files (`CORPUS_FORMATS`: the hipporag corpora,
            the ovos summaries, KILT pages) or question files with context.

    Raises:
        ValueError: two different paragraphs share an id (a 48-bit hash collision).
    """
    by_id: dict[str, Passage] = {}

    def add(p: Passage) -> None:
        old = by_id.setdefault(p.id, p)
        if old is not p and (old.title, old.text) != (p.title, p.text):
            raise ValueError(f"passage id collision {p.id!r}: {old.title!r} vs {p.title!r}")

    for s in samples:
        for para in s.context:
            add(Passage(paragraph_id(para.title, para.text), para.title, para.text))
    for path in extras:
        for p in _extra_passages(Path(path)):
            add(p)
    return [by_id[k] for k in sorted(by_id)]
