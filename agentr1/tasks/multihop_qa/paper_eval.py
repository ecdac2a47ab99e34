"""`agentr1 qa-eval`: the paper's table. Load QA data, run each method (Naive RAG, Tool
Call) for each model on each dataset, write ``results.json`` and ``results.md``.

The main table is shaped like the paper's: one row per method and model (checkpoint), one
column per dataset, cells ``EM [F1]``, plus the average over datasets. A second table gives
the behaviour behind the numbers: cover-EM, mean turns, tool calls and stop reasons.
``episodes.jsonl`` holds every episode's decoded text, answer and scores.

Questions: every record of each file, deduplicated; ``max_tasks`` keeps a seeded sample
by the same rule as training runs' eval splits (`agentr1.data.sample_questions`),
so ``--max-tasks 100`` evaluates the questions a ``n_eval: 100`` recipe evaluates.
A ``--data`` folder stands for every question file in it, each its own column.

Bad input: with ``on_error="skip"`` a malformed record, or a file that cannot be read
(in a ``--data`` folder or in the corpus scan of the data directory), is left out and
logged with its file, line and reason; ``results.json`` lists each under
``meta.skipped`` and counts the unanswerable records left out under
``meta.unanswerable``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from agentr1.eval.evaluate import EvalResult, episode_record
from agentr1.fileio import write_atomic
from agentr1.retrieval.base import Passage
from agentr1.tasks.multihop_qa.baselines import METHOD_LABELS, METHODS, METRIC_NAMES
from agentr1.tasks.multihop_qa.config import QA_EVAL_FILES
from agentr1.types import Task

log = logging.getLogger(__name__)

CORPORA = ("eval", "contexts", "contexts+wiki")
"""``--corpus``: "eval" = the evaluated files' own context paragraphs; "contexts" = plus
every question file with context under the data directory (the corpus of ``multihop_qa``
recipes); "contexts+wiki" = plus Wikipedia
distractors."""


@dataclass(frozen=True)
class EvalJob:
    """What ``agentr1 eval`` runs.

    Attributes:
        models: local directories, hub ids or aliases; one row group each.
        methods: names in `METHODS`.
        datasets: named eval sets (keys of `QA_EVAL_FILES`), used when ``data`` is empty.
        data: question files or folders of them; the column is a file's dataset (its
            stem on a clash).
        format: the format of every ``data`` file (None: detected per file).
        fields: ``NAME=KEY,...`` to read every ``data`` file as question-only records
            (`agentr1.data.parse_fields`); "" = detect the format.
        on_error: "fail" or "skip" (see the module docstring).
        unanswerable: "skip" or "keep" records marked unanswerable (`agentr1.data.load`).
        retriever: "bm25", "dense", "hybrid" or an http:// URL.
        corpus: one of `CORPORA`.
        top_k: passages per search / in the Naive RAG prompt.
        passage_words: words kept of each passage (0 = all).
        max_tasks: questions per dataset (0 = all).
        max_turns, max_tokens_per_turn, max_context: rollout budgets.
        chat_template: "qwen2.5" (the project's tools template) or "model" (the tokenizer's).
        dtype: "float32" or "bfloat16".
        seed: question sampling and generation seed.
        data_dir: raw-data root ("" = the default).
        out: output directory.
    """

    models: tuple[str, ...]
    methods: tuple[str, ...] = ("naive_rag", "tool_call")
    datasets: tuple[str, ...] = ("hotpotqa", "2wiki", "musique")
    data: tuple[str, ...] = ()
    format: str | None = None
    fields: str = ""
    on_error: Literal["fail", "skip"] = "fail"
    unanswerable: Literal["skip", "keep"] = "skip"
    retriever: str = "bm25"
    corpus: str = "contexts"
    top_k: int = 5
    passage_words: int = 0
    max_tasks: int = 0
    max_turns: int = 5
    max_tokens_per_turn: int = 256
    max_context: int = 4096
    chat_template: str = "qwen2.5"
    dtype: str = "float32"
    seed: int = 0
    data_dir: str = ""
    out: str = "runs/eval"

    def validate(self) -> None:
        """Raise ValueError naming each bad field."""
        errors = [f"unknown method {m!r}" for m in self.methods if m not in METHODS]
        if not self.data:
            errors += [
                f"unknown dataset {d!r} (known: {', '.join(QA_EVAL_FILES)})"
                for d in self.datasets
                if d not in QA_EVAL_FILES
            ]
        local = ("bm25", "dense", "hybrid")
        if self.retriever not in local and not self.retriever.startswith(("http://", "https://")):
            errors.append(f"retriever {self.retriever!r}: use one of {', '.join(local)} or a URL")
        if self.corpus not in CORPORA:
            errors.append(f"corpus {self.corpus!r}: use one of {', '.join(CORPORA)}")
        if self.top_k < 1 or self.max_tasks < 0 or self.passage_words < 0:
            errors.append("top_k must be >= 1, max_tasks >= 0 and passage_words >= 0")
        if self.chat_template not in ("qwen2.5", "model"):
            errors.append(f"chat_template {self.chat_template!r}: use qwen2.5 or model")
        if self.on_error not in ("fail", "skip"):
            errors.append(f"on_error {self.on_error!r}: use fail or skip")
        if self.unanswerable not in ("skip", "keep"):
            errors.append(f"unanswerable {self.unanswerable!r}: use skip or keep")
        if self.fields:
            from agentr1.data import parse_fields

            if not self.data:
                errors.append("fields: applies to --data files; name some with --data")
            try:
                parse_fields(self.fields, "--fields")
            except ValueError as e:
                errors.append(str(e))
        if errors:
            raise ValueError("; ".join(errors))


@dataclass
class ResultRow:
    """One (method, model, dataset) cell group of the report."""

    method: str
    model: str
    dataset: str
    n: int
    em: float
    f1: float
    cover_em: float
    turns: float
    tool_calls: float
    stop_reasons: dict[str, float]
    by_group: dict[str, dict[str, float]]
    seconds: float

    @classmethod
    def from_eval(
        cls, method: str, model: str, dataset: str, res: EvalResult, seconds: float
    ) -> ResultRow:
        a = res.by_group["all"]
        return cls(
            method,
            model,
            dataset,
            int(a["n"]),
            a["em"],
            a["f1"],
            a["cover_em"],
            a["turns"],
            a["tool_calls"],
            dict(res.stop_reasons),
            res.by_group,
            seconds,
        )

    @property
    def label(self) -> str:
        return f"{METHOD_LABELS.get(self.method, self.method)} ({Path(self.model).name})"


# ---------------------------------------------------------------------------- tables


def paper_table(rows: Sequence[ResultRow]) -> str:
    """Rows = method (model), columns = datasets then Avg, cells ``EM [F1]``.

    >>> r = ResultRow("naive_rag", "m", "hotpotqa", 8, 0.25, 0.5, 0.25, 1, 0, {}, {}, 1.0)
    >>> print(paper_table([r]))
    | method | hotpotqa | Avg |
    |---|---|---|
    | Naive RAG (m) | 0.250 [0.500] | 0.250 [0.500] |
    """
    datasets = list(dict.fromkeys(r.dataset for r in rows))
    labels = list(dict.fromkeys(r.label for r in rows))
    cell = {(r.label, r.dataset): r for r in rows}
    lines = [
        "| method | " + " | ".join([*datasets, "Avg"]) + " |",
        "|" + "---|" * (len(datasets) + 2),
    ]
    for label in labels:
        got = [cell[(label, d)] for d in datasets if (label, d) in cell]
        cells = [
            f"{cell[(label, d)].em:.3f} [{cell[(label, d)].f1:.3f}]" if (label, d) in cell else "-"
            for d in datasets
        ]
        em = sum(r.em for r in got) / max(1, len(got))
        f1 = sum(r.f1 for r in got) / max(1, len(got))
        lines.append(f"| {label} | " + " | ".join([*cells, f"{em:.3f} [{f1:.3f}]"]) + " |")
    return "\n".join(lines)


def behaviour_table(rows: Sequence[ResultRow]) -> str:
    """Per row: n, cover-EM, mean turns, tool calls, stop-reason mix, seconds."""
    lines = [
        "| method | dataset | n | cover-EM | turns | tool calls | stop reasons | s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        stops = ", ".join(f"{k} {v:.2f}" for k, v in sorted(r.stop_reasons.items()))
        lines.append(
            f"| {r.label} | {r.dataset} | {r.n} | {r.cover_em:.3f} | {r.turns:.2f} | "
            f"{r.tool_calls:.2f} | {stops} | {r.seconds:.0f} |"
        )
    return "\n".join(lines)


def markdown_report(rows: Sequence[ResultRow], meta: dict[str, Any]) -> str:
    """``results.md``: both tables plus the command, the setting and what was left out."""
    left_out = ""
    if meta.get("skipped") or meta.get("unanswerable"):
        left_out = (
            f"\n\nLeft out: {len(meta.get('skipped', []))} malformed record(s) or unreadable "
            f"file(s), {sum(meta.get('unanswerable', {}).values())} unanswerable record(s) "
            "(listed in results.json, meta.skipped and meta.unanswerable)."
        )
    return "\n\n".join(
        [
            "# Evaluation",
            f"Command: `{meta.get('command', '')}`",
            f"Retriever {meta['retriever']} top-{meta['top_k']} over {meta['corpus_passages']} "
            f"passages (corpus: {meta['corpus']}); greedy; at most {meta['max_turns']} turns "
            f"of {meta['max_tokens_per_turn']} tokens, {meta['max_context']} in all." + left_out,
            "## Exact match [F1]",
            paper_table(rows),
            "## Behaviour",
            behaviour_table(rows),
            "",
        ]
    )


def write_results(
    out_dir: Path, rows: Sequence[ResultRow], meta: dict[str, Any]
) -> tuple[Path, Path]:
    """Write ``results.json`` (meta + rows) and ``results.md``; returns both paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    js, md = out_dir / "results.json", out_dir / "results.md"
    payload = {"meta": meta, "rows": [dataclasses.asdict(r) for r in rows]}
    write_atomic(js, json.dumps(payload, indent=2) + "\n")
    write_atomic(md, markdown_report(rows, meta))
    return js, md


# ---------------------------------------------------------------------------- the job


@dataclass
class EvalData:
    """Questions per dataset column, the files they came from, the corpus, and what was
    left out (`agentr1.data.Loader.report`: ``skipped``, ``unanswerable``)."""

    tasks: dict[str, list[Task]]
    files: dict[str, list[Path]]
    passages: list[Passage] = field(default_factory=list)
    left_out: dict[str, Any] = field(default_factory=dict)


def load_eval_data(job: EvalJob) -> EvalData:
    """Columns -> tasks (see the module docstring) and the corpus of ``job.corpus``.

    Raises:
        FileNotFoundError: a ``data`` entry that does not exist or a folder with no question
            file, or a named dataset's file that does not exist.
        agentr1.data.DataFormatError: a file in no known format or a bad record (names the
            file and the record), with ``on_error="fail"``.
        ValueError: no question left to evaluate, or an empty corpus for a local retriever.
    """
    from agentr1.data import (
        Loader,
        QASample,
        corpus_paragraphs,
        dedupe,
        default_data_dir,
        sample_questions,
        wiki_files,
    )

    root = Path(job.data_dir).expanduser() if job.data_dir else default_data_dir()
    # --format and --fields are about the --data files; the rest is read as detected.
    given = Loader(
        job.on_error, fields=job.fields or None, unanswerable=job.unanswerable, format=job.format
    )
    loader = Loader(job.on_error, unanswerable=job.unanswerable)
    files: dict[str, list[Path]] = {}
    samples_by: dict[str, list[QASample]] = {}
    if job.data:
        for f in job.data:
            path = Path(f).expanduser()
            if path.is_dir():
                paths = given.scan(path)
                if not paths:
                    raise FileNotFoundError(f"--data {f}: no question file in this folder")
            elif path.is_file():
                paths = [path]
            else:
                raise FileNotFoundError(f"--data {f}: no such file or folder")
            for p in paths:
                samples = given(p)
                if not samples:
                    log.warning("--data %s: no question read from %s; no column for it", f, p)
                    continue
                name = samples[0].dataset
                if name in files:
                    name = p.stem
                files[name] = [p]
                samples_by[name] = samples
    else:
        for name in job.datasets:
            paths = [root / rel for rel in QA_EVAL_FILES[name]]
            for p in paths:
                if not p.is_file():
                    raise FileNotFoundError(f"--dataset {name}: {p} is missing")
            files[name] = paths
            samples_by[name] = [s for p in paths for s in loader(p)]
    if not any(samples_by.values()):
        raise ValueError(
            f"no question to evaluate: every record of {', '.join(job.data or job.datasets)} "
            f"was left out ({len(given.skipped)} skipped, see the log)"
        )
    tasks = {}
    for name, samples in samples_by.items():
        chosen = sample_questions(dedupe(samples), job.max_tasks, job.seed, name)
        tasks[name] = [s.to_task() for s in chosen]
    every = [s for ss in samples_by.values() for s in ss]
    extras: list[Path] = []
    if job.corpus != "eval":
        known = {p.resolve() for ps in files.values() for p in ps}
        for p in loader.scan(root) if root.is_dir() else []:
            if p.resolve() not in known:
                every += [s for s in loader(p) if s.context]
    if job.corpus == "contexts+wiki":
        extras = wiki_files(root)
    passages = corpus_paragraphs(every, extras)
    if not passages and not job.retriever.startswith(("http://", "https://")):
        where = ", ".join(str(p) for ps in files.values() for p in ps)
        if job.corpus != "eval":
            where += f" and every question file under --data-dir {root}"
        raise ValueError(
            f"--corpus {job.corpus}: the corpus is empty: it is the context paragraphs of "
            f"{where}, and none has any (question-only files). Use --corpus contexts with "
            "--data-dir holding question files with context, --corpus contexts+wiki "
            f"(the Wikipedia files under {root / 'wikipedia'}), or --retriever "
            "http://HOST:PORT of an `agentr1 serve retriever` that holds a corpus"
        )
    reports = [given.report(), loader.report()]
    # A file the corpus scan meets again is reported once.
    skipped = {r["message"]: r for rep in reports for r in rep["skipped"]}
    left_out = {
        "skipped": list(skipped.values()),
        "unanswerable": {k: v for rep in reports for k, v in rep["unanswerable"].items()},
    }
    return EvalData(tasks, files, passages, left_out)


def _episode_lines(
    row: ResultRow, res: EvalResult, tasks: dict[str, Task], decode: Any
) -> list[str]:
    out = []
    for t in res.trajectories:
        rec = {
            "method": row.method,
            "model": row.model,
            "dataset": row.dataset,
            **episode_record(t, tasks[t.task_id], METRIC_NAMES),
            "text": decode(t.token_ids[t.prompt_len :]),
        }
        out.append(json.dumps(rec, ensure_ascii=False))
    return out


def run_job(job: EvalJob, command: str = "") -> tuple[list[ResultRow], Path, Path]:
    """Run every method for every model on every dataset; write the report.

    Returns:
        (rows, path of results.json, path of results.md).
    """
    import torch

    from agentr1.backends.hf import HFGenerator
    from agentr1.models import load_model, load_tokenizer
    from agentr1.retrieval import retriever_from_spec
    from agentr1.rollout.chat import ChatFormat
    from agentr1.rollout.loop import RolloutConfig
    from agentr1.templates import QWEN25_TOOLS

    job.validate()
    t0 = time.perf_counter()
    data = load_eval_data(job)
    retriever = retriever_from_spec(job.retriever, data.passages)
    log.info(
        "eval data: %s; corpus %d passages (%.1f s)",
        {k: len(v) for k, v in data.tasks.items()},
        len(data.passages),
        time.perf_counter() - t0,
    )
    rollout = RolloutConfig(
        max_turns=job.max_turns,
        max_tokens_per_turn=job.max_tokens_per_turn,
        max_context=job.max_context,
        temperature=0.0,
    )
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if job.dtype == "bfloat16" else torch.float32
    out_dir = Path(job.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows: list[ResultRow] = []
    episodes: list[str] = []
    for model_name in job.models:
        tokenizer = load_tokenizer(model_name)
        model = load_model(model_name, dtype=dtype, device=device)
        template = QWEN25_TOOLS if job.chat_template == "qwen2.5" else None
        chat = ChatFormat.from_hf(tokenizer, chat_template=template)
        generator = HFGenerator(model, tokenizer)
        for method in job.methods:
            for name, tasks in data.tasks.items():
                ts = time.perf_counter()
                res = METHODS[method](
                    tasks,
                    retriever,
                    generator,
                    chat,
                    top_k=job.top_k,
                    passage_words=job.passage_words,
                    rollout=rollout,
                    seed=job.seed,
                )
                row = ResultRow.from_eval(method, model_name, name, res, time.perf_counter() - ts)
                rows.append(row)
                episodes += _episode_lines(row, res, {t.id: t for t in tasks}, chat.decode)
                log.info(
                    "%s / %s: EM %.3f F1 %.3f (%d tasks, %.1f s)",
                    row.label,
                    name,
                    row.em,
                    row.f1,
                    row.n,
                    row.seconds,
                )
    meta = {
        "command": command,
        **dataclasses.asdict(job),
        "files": {k: [str(p) for p in v] for k, v in data.files.items()},
        "corpus_passages": len(data.passages),
        **data.left_out,
        "seconds": time.perf_counter() - t0,
    }
    write_atomic(out_dir / "episodes.jsonl", "".join(e + "\n" for e in episodes))
    js, md = write_results(out_dir, rows, meta)
    return rows, js, md
