"""The multi-hop QA task's config section and its default files."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

QA_TRAIN_FILES = (
    "hotpotqa/hipporag_hotpotqa_train_100.json",
    "hotpotqa/rpt_hotpotqa_devsplit_train_300.jsonl",
    "hotpotqa/rpt_hotpotqa_devsplit_dev_300.jsonl",
    "2wikimultihopqa/migres_2wiki_train_500_decomposed.json",
)
"""Default training questions: every HotpotQA and 2Wiki file with context paragraphs except
the HotpotQA eval file (RPT's files come from HotpotQA dev: the questions they share with
the eval set are dropped from training; the 2Wiki file is shared with its eval split)."""

QA_EVAL_FILES = {
    "hotpotqa": ["hotpotqa/ircot_hotpotqa_dev_subsampled_500.jsonl"],
    "2wiki": ["2wikimultihopqa/migres_2wiki_train_500_decomposed.json"],
    "musique": ["musique/migres_musique_dev_200.jsonl"],
}
"""Default eval splits: HotpotQA dev (IRCoT), a held-out part of 2Wiki (MIGRES; no 2Wiki dev
file with context ships here) and MuSiQue dev (MIGRES, out of domain)."""


@dataclass(frozen=True)
class QATaskConfig:
    """``task.config`` of the multi-hop QA task: questions, splits, corpus, retriever, and
    the search tool's settings.

    File entries are resolved in order as: an existing path; a path under ``data_dir``; a
    dataset folder name under ``data_dir`` (every file of it with context paragraphs).
    """

    train: list[str] = field(default_factory=lambda: list(QA_TRAIN_FILES))
    """Training question files or dataset names. Every question that is in an eval split
    (same id or same normalized question) is removed from training."""
    eval: dict[str, list[str]] = field(default_factory=dict)
    """Eval split name -> question files or dataset names; empty = `QA_EVAL_FILES`. (Empty,
    not a filled default: a recipe's mapping replaces the default splits instead of being
    merged into them.) A file may also be a training file: its eval questions are held out
    and the rest train."""
    n_train: int = 0
    """Training questions kept (a seeded sample; 0 = all)."""
    n_eval: int = 100
    """Questions per eval split (a seeded sample; 0 = all). Selected before training is
    filtered, so a file shared with training gives n_eval questions to eval."""
    corpus: Literal["contexts", "contexts+wiki"] = "contexts"
    """"contexts" = every context paragraph of every loaded question file (train and eval,
    all records, so the corpus does not change with n_train / n_eval); "contexts+wiki" adds
    the Wikipedia files under ``data_dir/wikipedia`` as distractors."""
    retriever: str = "bm25"
    """"bm25", "dense" (all-MiniLM-L6-v2), "hybrid" (RRF of both) or the http:// URL of an
    ``agentr1 serve retriever`` (which then holds the corpus)."""
    split_seed: int = 0
    """Seed of the eval and training samples (an id-hash order, independent of file order)."""
    data_dir: str = ""
    """Root of the raw data; "" = ``$AGENTR1_DATA`` or ``../shared/data/raw``."""
    top_k: int = 5
    """Passages the search tool returns per call."""
    passage_words: int = 0
    """Words kept of each passage's text in a search result; 0 = the whole passage. The
    real corpus's passages average ~130 tokens (p99 ~380), so two long ones can fill a
    small context; 80 words keep the answer string of 95% of supporting passages."""
    on_error: Literal["fail", "skip"] = "fail"
    """"fail": a malformed record or a file that cannot be read stops the run, naming the
    file, line and field; "skip": it is left out and logged with file, line and reason
    (a bad record costs only itself, an unreadable file in a dataset folder only itself).
    ``agentr1 train --on-error skip`` sets it."""
    fields: dict[str, str] = field(default_factory=dict)
    """Read every train and eval file as question-only records with these keys: name ->
    key, names ``question``, ``answers`` (both required) and ``id``, keys dotted to reach
    into objects, e.g. ``{question: Question, answers: golden_answers}``. Empty = detect
    each file's format. Such files bring no context paragraphs: the corpus must come from
    other files, ``corpus: contexts+wiki`` or a retriever URL."""
    unanswerable: Literal["skip", "keep"] = "skip"
    """Records the data marks unanswerable (MuSiQue's ``answerable: false``): "skip" leaves
    them out, counted in the log; "keep" keeps them, answers as the file gives them and
    ``answerable: False`` in the task metadata (their paragraphs do not support the
    answer, so their EM says what the model knows, not what it read)."""

    @property
    def eval_files(self) -> dict[str, list[str]]:
        """The eval splits in effect: ``eval``, or `QA_EVAL_FILES` when it is empty."""
        return self.eval or {k: list(v) for k, v in QA_EVAL_FILES.items()}

    def validate(self) -> None:
        """Raise ValueError listing every bad value."""
        errors = []
        if not self.train:
            errors.append("train: at least one training file is needed")
        for name, files in self.eval_files.items():
            if (
                not isinstance(files, list)
                or not files
                or not all(isinstance(f, str) for f in files)
            ):
                errors.append(f"eval.{name}: expected a non-empty list of files, got {files!r}")
        if self.n_train < 0 or self.n_eval < 0:
            errors.append("n_train and n_eval must be >= 0 (0 = all)")
        if self.top_k < 1:
            errors.append("top_k must be >= 1: a search that returns nothing teaches nothing")
        if self.passage_words < 0:
            errors.append(f"passage_words={self.passage_words}: expected >= 0 (0 = whole passages)")
        kinds = ("bm25", "dense", "hybrid")
        if self.retriever not in kinds and not self.retriever.startswith(("http://", "https://")):
            errors.append(
                f"retriever={self.retriever!r}: use one of {', '.join(kinds)} or an http:// URL"
            )
        if self.fields:
            from agentr1.data import parse_fields

            try:
                parse_fields(self.fields, "fields")
            except ValueError as e:
                errors.append(str(e))
        if errors:
            raise ValueError("; ".join(errors))
