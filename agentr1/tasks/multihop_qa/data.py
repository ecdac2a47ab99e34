"""The multi-hop QA task's data: questions per split (disjoint from training) and the corpus.

Split rules (`load_qa_data`):

1. Each eval split reads its files, drops duplicates (`dedupe`) and keeps a seeded sample
   of ``n_eval`` questions (an order given by a hash of seed and id; 0 = all, file order).
2. Training reads its files, drops duplicates, then drops every question that is in any
   eval split, by id or by normalized question, and keeps a seeded sample of ``n_train``.
   So a file that is both a training and an eval file (2Wiki's by default) is split:
   ``n_eval`` questions evaluate, the rest train.
3. The corpus is every context paragraph of every record of every loaded file, train and
   eval (plus the Wikipedia distractors with ``corpus: contexts+wiki``): it does not
   depend on n_train, n_eval or the seed, so dense embeddings are computed once.

Files are read under ``task.config``'s ``on_error``, ``fields`` and ``unanswerable``
(`agentr1.data.Loader`); what was left out is logged, record by record, and kept in
`QAData.skipped`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from agentr1.data import (
    DataFormatError,
    Loader,
    QASample,
    dedupe,
    default_data_dir,
    files_corpus,
    normalize_question,
    resolve_entry,
    sample_questions,
)
from agentr1.retrieval.base import Passage
from agentr1.tasks.multihop_qa.config import QATaskConfig
from agentr1.types import Task

log = logging.getLogger(__name__)


@dataclass
class QAData:
    """Loaded questions and corpus of a QA run.

    Attributes:
        tasks: "train" and one entry per eval split -> tasks (disjoint from "train").
        passages: the retrieval corpus (ids = `agentr1.data.paragraph_id`).
        files: the same keys -> the files they were read from.
        skipped: the records and files left out with ``on_error: skip``.
        unanswerable: file -> ids of the records left out as unanswerable.
    """

    tasks: dict[str, list[Task]]
    passages: list[Passage]
    files: dict[str, list[Path]]
    skipped: list[DataFormatError] = field(default_factory=list)
    unanswerable: dict[Path, list[str]] = field(default_factory=dict)


def data_root(qa: QATaskConfig) -> Path:
    """``qa.data_dir``, or the default raw-data directory when it is empty."""
    return Path(qa.data_dir).expanduser() if qa.data_dir else default_data_dir()


def _keys(s: QASample) -> tuple[str, str]:
    return f"id:{s.id}", f"q:{normalize_question(s.question)}"


def load_qa_data(qa: QATaskConfig, load: Loader | None = None) -> QAData:
    """Questions per split and the corpus, by the rules in the module docstring. ``load``
    keeps what it read for the caller (files the caller reads again are not parsed twice);
    by default a `Loader` with ``qa``'s read policy.

    Raises:
        FileNotFoundError: an entry that names no file (see `resolve_entry`).
        agentr1.data.DataFormatError: a malformed file (names the file and record), with
            ``on_error: fail``.
        ValueError: no training question left, or an empty corpus for a local retriever
            (naming the files and the settings that give one).
    """
    root = data_root(qa)
    load = load or Loader(qa.on_error, fields=qa.fields or None, unanswerable=qa.unanswerable)
    files: dict[str, list[Path]] = {}
    tasks: dict[str, list[Task]] = {}
    held_out: set[str] = set()
    for name, entries in qa.eval_files.items():
        files[name] = [
            p for e in entries for p in resolve_entry(e, root, f"task.config.eval.{name}", load)
        ]
        samples = dedupe(s for p in files[name] for s in load(p))
        chosen = sample_questions(samples, qa.n_eval, qa.split_seed, name)
        held_out.update(k for s in chosen for k in _keys(s))
        tasks[name] = [s.to_task() for s in chosen]
    files["train"] = [
        p for e in qa.train for p in resolve_entry(e, root, "task.config.train", load)
    ]
    pool = dedupe(s for p in files["train"] for s in load(p))
    train = [s for s in pool if not any(k in held_out for k in _keys(s))]
    log.info(
        "qa: %d training questions after removing %d eval ones", len(train), len(pool) - len(train)
    )
    train = sample_questions(train, qa.n_train, qa.split_seed, "train")
    tasks = {"train": [s.to_task() for s in train], **tasks}
    if not tasks["train"]:
        raise ValueError(f"task.config.train: no training question left (files: {files['train']})")
    every = [p for ps in files.values() for p in ps]
    passages = files_corpus(every, root, qa.corpus == "contexts+wiki", load)
    if not passages and not qa.retriever.startswith(("http://", "https://")):
        raise ValueError(
            f"task.config.corpus={qa.corpus!r}: the corpus is the context paragraphs of the "
            f"loaded files ({', '.join(str(p) for p in dict.fromkeys(every))}), and none has "
            "any (question-only files); add a file with context to task.config.train or "
            "eval, set task.config.corpus: contexts+wiki (the Wikipedia files under "
            f"{root / 'wikipedia'}), or task.config.retriever: the http:// URL of an "
            "`agentr1 serve retriever` that holds a corpus"
        )
    if load.skipped:
        log.warning(
            "qa: left out %d malformed record(s) or file(s) (task.config.on_error: skip), "
            "each logged above",
            len(load.skipped),
        )
    return QAData(tasks, passages, files, list(load.skipped), dict(load.unanswerable))


def assert_disjoint(tasks: Mapping[str, Sequence[Task]]) -> None:
    """Raise ValueError if a training task shares an id or normalized question with an
    eval task (the contract of `load_qa_data`, checked again on its output)."""
    train = {k for t in tasks.get("train", []) for k in (t.id, normalize_question(t.question))}
    for name, ts in tasks.items():
        if name == "train":
            continue
        bad = [t.id for t in ts if t.id in train or normalize_question(t.question) in train]
        if bad:
            raise ValueError(
                f"eval split {name!r} shares {len(bad)} questions with train: {bad[:3]}"
            )
