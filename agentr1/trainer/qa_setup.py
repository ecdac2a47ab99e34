"""Wire `task.kind: qa` (real multi-hop QA) into a `Setup`: questions, disjoint splits, the
corpus, the retriever, the search env, supporting-facts demonstrations and the policy.

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
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentr1.config import Config, QAConfig
from agentr1.data import (
    QASample,
    corpus_paragraphs,
    dedupe,
    default_data_dir,
    load_file,
    normalize_question,
    qa_files,
    split,
)
from agentr1.envs.qa_env import (
    QA_SYSTEM_PROMPT,
    SearchEnvFactory,
    retriever_from_spec,
    supporting_facts_generator,
)
from agentr1.retrieval.base import Passage
from agentr1.types import Task

if TYPE_CHECKING:
    from agentr1.trainer.setup import Setup

log = logging.getLogger(__name__)


@dataclass
class QAData:
    """Loaded questions and corpus of a QA run.

    Attributes:
        tasks: "train" and one entry per eval split -> tasks (disjoint from "train").
        passages: the retrieval corpus (ids = `agentr1.data.paragraph_id`).
        files: the same keys -> the files they were read from.
    """

    tasks: dict[str, list[Task]]
    passages: list[Passage]
    files: dict[str, list[Path]]


def data_root(qa: QAConfig) -> Path:
    """``qa.data_dir``, or the default raw-data directory when it is empty."""
    return Path(qa.data_dir).expanduser() if qa.data_dir else default_data_dir()


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


def _keys(s: QASample) -> tuple[str, str]:
    return f"id:{s.id}", f"q:{normalize_question(s.question)}"


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


def load_qa_data(qa: QAConfig, load: Loader | None = None) -> QAData:
    """Questions per split and the corpus, by the rules in the module docstring. ``load``
    keeps what it read for the caller (files the caller reads again are not parsed twice).

    Raises:
        FileNotFoundError: an entry that names no file (see `resolve_entry`).
        agentr1.data.DataFormatError: a malformed file (names the file and record).
    """
    root = data_root(qa)
    load = load or Loader()
    files: dict[str, list[Path]] = {}
    tasks: dict[str, list[Task]] = {}
    held_out: set[str] = set()
    for name, entries in qa.eval_files.items():
        files[name] = [
            p for e in entries for p in resolve_entry(e, root, f"task.qa.eval.{name}", load)
        ]
        samples = dedupe(s for p in files[name] for s in load(p))
        chosen = sample_questions(samples, qa.n_eval, qa.split_seed, name)
        held_out.update(k for s in chosen for k in _keys(s))
        tasks[name] = [s.to_task() for s in chosen]
    files["train"] = [p for e in qa.train for p in resolve_entry(e, root, "task.qa.train", load)]
    pool = dedupe(s for p in files["train"] for s in load(p))
    train = [s for s in pool if not any(k in held_out for k in _keys(s))]
    log.info(
        "qa: %d training questions after removing %d eval ones", len(train), len(pool) - len(train)
    )
    train = sample_questions(train, qa.n_train, qa.split_seed, "train")
    tasks = {"train": [s.to_task() for s in train], **tasks}
    if not tasks["train"]:
        raise ValueError(f"task.qa.train: no training question left (files: {files['train']})")
    every = (p for ps in files.values() for p in ps)
    passages = files_corpus(every, root, qa.corpus == "contexts+wiki", load)
    return QAData(tasks, passages, files)


def files_corpus(files: Iterable[Path], root: Path, wiki: bool, load: Loader) -> list[Passage]:
    """Every context paragraph of ``files`` (a file listed twice is read once), plus the
    Wikipedia distractors under ``root`` with ``wiki`` (`agentr1.data.corpus_paragraphs`
    deduplicates and assigns the stable ids)."""
    unique = dict.fromkeys(files)
    extras = wiki_files(root) if wiki else []
    return corpus_paragraphs((s for p in unique for s in load(p)), extras)


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


def _summary(tasks: dict[str, list[Task]], passages: Iterable[Passage]) -> str:
    sizes = ", ".join(f"{k}={len(v)}" for k, v in tasks.items())
    return f"{sizes}; corpus {sum(1 for _ in passages)} passages"


def build_qa_setup(cfg: Config) -> Setup:
    """The `Setup` of a ``task.kind: qa`` run (see the module docstring for the data).

    The model comes from ``cfg.model.path`` (a local directory, a hub id or the
    "smollm2-135m-instruct" alias) with ``cfg.model.chat_template``. Demonstrations for the
    SFT warm start come from `SupportingFactsPolicy` on the training questions only, with at
    most ``rollout.max_turns - 1`` searches so the answer fits in the turn budget;
    ``sft.early_answer_prob`` and ``sft.notes`` are world-only and ignored here.
    """
    from agentr1.rewards import OUTCOME_REWARDS
    from agentr1.trainer.setup import Setup, load_policy

    data = load_qa_data(cfg.task.qa)
    assert_disjoint(data.tasks)
    log.info("qa: %s", _summary(data.tasks, data.passages))
    system = cfg.task.system_prompt
    make_env = SearchEnvFactory(
        retriever_from_spec(cfg.task.qa.retriever, data.passages),
        top_k=cfg.task.top_k,
        system_prompt=QA_SYSTEM_PROMPT if system is None else system,
        outcome_reward=OUTCOME_REWARDS[cfg.task.outcome_reward],
        process_reward=cfg.task.process.build(),
        passage_words=cfg.task.passage_words,
    )
    path = cfg.model.path
    tokenizer, chat, policy, generator, pad_id = load_policy(cfg, path)
    train = data.tasks["train"]
    searches = max(1, cfg.rollout.max_turns - 1)

    def demo_sources(early_answer_prob: float, seed: int, notes: bool = True) -> list[Any]:
        return [(train, make_env, supporting_facts_generator(train, chat, searches))]

    return Setup(
        cfg,
        None,
        data.tasks,
        make_env,
        [],
        tokenizer,
        chat,
        policy,
        generator,
        pad_id,
        Path(path),
        demo_fn=demo_sources,
    )
