"""Read multi-hop QA files in their published layouts into one normalized `QASample`.

Question formats (`QA_FORMATS`), detected from the keys of a file's first record:

- ``ircot``: IRCoT processing: ``question_id, question_text, answers_objects[].spans,
  contexts[]{title, paragraph_text, is_supporting}``.
- ``hf``: HuggingFace-datasets layout: ``id, question, answer, type, level,
  supporting_facts{title[], sent_id[]}, context{title[], sentences[][]}``.
- ``hotpotqa``: original HotpotQA: ``_id, question, answer, type, level,
  supporting_facts[[title, sent_id]], context[[title, [sentences]]]``.
- ``2wiki``: original 2WikiMultihopQA: as ``hotpotqa`` without ``level``, plus
  ``evidences`` (MIGRES files add ``qa_pairs`` and ``explanation``, ignored here).
- ``musique``: original MuSiQue: ``id, question, answer, answer_aliases, answerable,
  paragraphs[]{idx, title, paragraph_text, is_supporting}, question_decomposition[]``.
- ``qa_only``: ``idx, question, answer`` (R1-Searcher), no context or an empty one;
  ``idx`` is unique only within its file, so the sample id is ``<file stem>:<idx>``.
- ``flashrag``: FlashRAG's benchmark JSONL: ``id, question, golden_answers[],
  metadata{}``. From ``metadata``, when there: ``type``, ``answerable``, and context
  paragraphs in the ``hf`` or ``hotpotqa`` layout (``context`` with ``supporting_facts``).
- ``questions``: any other question-only record: the question under one of
  `QUESTION_KEYS`, the answers (a string or a list of strings) under one of `ANSWER_KEYS`,
  an id under one of `ID_KEYS` (else the record's 0-based position), and a context that is
  absent, null or empty (``""``, ``[]``, ``{}``). Search-o1's JSON arrays
  (``Question, answer[]``) are read this way. ``fields=`` names the keys of a layout no
  rule detects (`parse_fields`: ``question=Question,answers=golden_answers``).

``flashrag`` and ``questions`` ids are ``<folder>/<file stem>:<id>``: FlashRAG names every
file ``dev.jsonl`` or ``test.jsonl``, one folder per dataset, and ids restart per file.

Unanswerable records (MuSiQue's ``answerable: false``, FlashRAG's ``metadata.answerable:
false``): their paragraphs do not support the answer, so by default they are left out and
counted (`LoadResult.unanswerable`, not errors). ``unanswerable="keep"`` keeps them with
the answer the file gives (MuSiQue's: the answer of the question's answerable twin) and
``QASample.answerable`` False, which `QASample.to_task` puts in the metadata.

Corpus-only formats (`CORPUS_FORMATS`), read by `load_corpus_file` into `Passage`s:
``title_sentences`` (dict title -> [sentences]), ``title_text`` (list of {title, text}),
``ovos`` (dict title -> {title, extract, ...}), ``kilt`` (JSONL {wikipedia_title, text[]}).

Normalization, applied by every reader so the same paragraph gets the same id whatever
file it came from: titles, questions and answers are stripped; paragraph text is the
sentences joined with one space, then every whitespace run collapsed to one space (this
reproduces IRCoT's ``paragraph_text`` from HotpotQA's sentence lists exactly).

Errors: a malformed record raises `DataFormatError` naming the file, the JSONL line (1-based)
or the record index (0-based), the field, and what was expected; invalid JSON also names
the column, and bytes that are not UTF-8 the line and the byte offset. Nothing is skipped
silently: ``on_error="skip"`` drops bad records (a bad line, a record with a byte that is not
UTF-8, the unreadable tail of a truncated JSON array) but reports them
(`LoadResult.skipped`) and logs a warning naming each. ``on_error`` is ``"fail"`` (the
default) or ``"skip"``, as the CLI's ``--on-error`` spells it; ``"raise"`` is accepted as
an older name of ``"fail"``.
"""

from __future__ import annotations

import codecs
import dataclasses
import functools
import hashlib
import json
import logging
import os
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from agentr1.retrieval.base import Passage
from agentr1.types import Task

log = logging.getLogger(__name__)

QA_FORMATS = ("ircot", "hf", "hotpotqa", "2wiki", "musique", "qa_only", "flashrag", "questions")
"""Question formats `load_file` reads."""
CORPUS_FORMATS = ("title_sentences", "title_text", "ovos", "kilt")
"""Corpus-only formats `load_corpus_file` reads."""
KNOWN_DATASETS = ("hotpotqa", "2wikimultihopqa", "musique")
"""Dataset names inferred from a file's folder or name (other folders give their own name)."""

QUESTION_KEYS = ("question", "Question", "query", "question_text")
"""Keys a ``questions`` record may hold its question under (the first present is used)."""
ANSWER_KEYS = ("answer", "answers", "golden_answers", "Answer", "gold_answers", "gold_answer")
"""Keys a ``questions`` record may hold its answers under (the first present is used)."""
ID_KEYS = ("id", "_id", "idx", "qid", "question_id")
"""Keys a ``questions`` record may hold its id under (else its 0-based position)."""
CONTEXT_KEYS = ("context", "contexts", "paragraphs", "ctxs")
"""Keys whose non-empty value makes a record something other than question-only."""
FIELD_NAMES = ("question", "answers", "id")
"""The names ``fields=`` maps to a file's keys (``question`` and ``answers`` required)."""

OnError = Literal["fail", "skip", "raise"]
"""``"fail"`` stops at the first bad record or file; ``"skip"`` reports it and goes on;
``"raise"`` is an older name of ``"fail"``."""
Unanswerable = Literal["skip", "keep"]
"""What to do with records the data marks unanswerable (see the module docstring)."""


def check_on_error(value: str, where: str = "on_error") -> bool:
    """True for ``"skip"``, False for ``"fail"`` (or ``"raise"``); ValueError otherwise."""
    if value not in ("fail", "skip", "raise"):
        raise ValueError(f"{where} must be 'fail' or 'skip', got {value!r}")
    return value == "skip"


def parse_fields(spec: str | dict[str, str] | None, where: str = "fields") -> dict[str, str]:
    """A field mapping: ``"question=Question,answers=golden_answers"`` or a dict -> dict.

    Names are `FIELD_NAMES`; a key may be dotted to reach into an object
    (``answers=metadata.answers``).

    >>> parse_fields("question=Question, answers=answer")
    {'question': 'Question', 'answers': 'answer'}

    Raises:
        ValueError: an item that is not NAME=KEY, an unknown name, or no question or answers.
    """
    if not spec:
        return {}
    if isinstance(spec, str):
        pairs = {}
        for item in (x.strip() for x in spec.split(",")):
            name, eq, key = item.partition("=")
            if not eq or not name.strip() or not key.strip():
                raise ValueError(
                    f"{where}: expected NAME=KEY items separated by commas, got {item!r}"
                )
            pairs[name.strip()] = key.strip()
    else:
        pairs = dict(spec)
    unknown = sorted(set(pairs) - set(FIELD_NAMES))
    if unknown:
        raise ValueError(f"{where}: unknown name(s) {unknown}; expected {', '.join(FIELD_NAMES)}")
    missing = [n for n in ("question", "answers") if n not in pairs]
    if missing:
        raise ValueError(f"{where}: {' and '.join(missing)} must be named (e.g. question=Question)")
    bad = [n for n, k in pairs.items() if not isinstance(k, str) or not k]
    if bad:
        raise ValueError(f"{where}: {bad[0]} must map to a key name")
    return pairs


def default_data_dir() -> Path:
    """Where the raw data lives: ``$AGENTR1_DATA`` if set, else ``<repo>/../shared/data/raw``.

    The directory may not exist (callers and tests check ``.is_dir()``).
    """
    env = os.environ.get("AGENTR1_DATA")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2].parent / "shared" / "data" / "raw"


# ---------------------------------------------------------------------------- types


@dataclass(frozen=True)
class Paragraph:
    """One context paragraph of a question.

    Attributes:
        title: title of the Wikipedia article it comes from.
        text: the paragraph, whitespace-normalized (see the module docstring).
        is_supporting: whether the dataset marks it as gold evidence for the question.
    """

    title: str
    text: str
    is_supporting: bool = False

    @property
    def id(self) -> str:
        """The passage id this paragraph gets in any corpus (`paragraph_id`)."""
        return paragraph_id(self.title, self.text)


def paragraph_id(title: str, text: str) -> str:
    """Stable passage id: ``"p:" + sha1(title + "\\n" + text)[:12]``.

    A function of the content only, so the same paragraph has the same id in every corpus
    and in `Task.metadata["supporting"]`.

    >>> paragraph_id("Paris", "Paris is the capital of France.")
    'p:11651935d564'
    """
    digest = hashlib.sha1(f"{title}\n{text}".encode()).hexdigest()
    return f"p:{digest[:12]}"


@dataclass(frozen=True)
class QASample:
    """One question with its answers, normalized across formats.

    Attributes:
        id: unique within a dataset (the dataset's own id; ``<file stem>:<idx>`` for
            ``qa_only`` files, whose ``idx`` restarts in every file).
        question: the question text.
        answers: accepted answers, first canonical, the rest aliases (never empty).
        dataset: "hotpotqa", "2wikimultihopqa", "musique", or the folder name for others
            (e.g. "train_mixed").
        type: question type when the data says it ("bridge", "comparison",
            "compositional", "inference", "bridge_comparison"; MuSiQue: the id prefix
            "2hop", "3hop1", ...), else None.
        hops: reasoning hops: MuSiQue from the id prefix (checked against
            ``question_decomposition``); others the number of distinct supporting titles;
            None when unknown.
        supporting_titles: distinct titles of the gold paragraphs, in evidence order.
        context: the paragraphs given with the question (empty for question-only files).
        source: file name the sample was read from.
        answerable: False only for a record the data marks unanswerable, kept with
            ``unanswerable="keep"`` (its paragraphs do not support ``answers``).
    """

    id: str
    question: str
    answers: tuple[str, ...]
    dataset: str
    type: str | None = None
    hops: int | None = None
    supporting_titles: tuple[str, ...] = ()
    context: tuple[Paragraph, ...] = ()
    source: str = ""
    answerable: bool = True

    @property
    def supporting_ids(self) -> tuple[str, ...]:
        """Passage ids of the supporting paragraphs of `context`, distinct, in order."""
        return tuple(dict.fromkeys(p.id for p in self.context if p.is_supporting))

    def to_task(self) -> Task:
        """The `Task` an episode runs on.

        Metadata keys (those whose value is unknown are left out, so ``metadata.get(k, d)``
        sees the default): ``dataset``, ``source``, ``type``, ``hops``,
        ``supporting_titles``, and ``supporting``, the passage ids of the gold paragraphs,
        which match the ids of `corpus_paragraphs` (process rewards look them up there);
        ``answerable: False`` for an unanswerable record kept on purpose.
        """
        meta: dict[str, Any] = {"dataset": self.dataset, "source": self.source}
        if self.type is not None:
            meta["type"] = self.type
        if self.hops is not None:
            meta["hops"] = self.hops
        if self.supporting_titles:
            meta["supporting_titles"] = list(self.supporting_titles)
        if self.context:
            meta["supporting"] = list(self.supporting_ids)
        if not self.answerable:
            meta["answerable"] = False
        return Task(id=self.id, question=self.question, answers=list(self.answers), metadata=meta)


class DataFormatError(ValueError):
    """A file or record that does not have the expected layout.

    Attributes:
        path: the file.
        line: 1-based line of the record in a JSONL file (or of a JSON syntax error or a
            byte that is not UTF-8).
        index: 0-based index of the record in a JSON array or object.
        field: the offending field, dotted (``contexts[3].title``), when there is one.
        reason: what was expected and what was found.
        column: 1-based column of a JSON syntax error, in characters.
        offset: 0-based byte offset in the file of a byte that is not UTF-8.
    """

    def __init__(
        self,
        path: Path | str,
        reason: str,
        *,
        line: int | None = None,
        index: int | None = None,
        field: str | None = None,
        column: int | None = None,
        offset: int | None = None,
    ) -> None:
        self.path = Path(path)
        self.reason = reason
        self.line = line
        self.index = index
        self.field = field
        self.column = column
        self.offset = offset
        where = [str(self.path)]
        if line is not None:
            where.append(f"line {line}")
        if column is not None:
            where.append(f"column {column}")
        if offset is not None:
            where.append(f"byte offset {offset}")
        if index is not None:
            where.append(f"record {index}")
        prefix = ", ".join(where)
        what = f"field {field!r}: {reason}" if field else reason
        super().__init__(f"{prefix}: {what}")

    def record(self) -> dict[str, Any]:
        """The error as a JSON-ready dict (``file``, ``line``, ``record``, ``field``,
        ``reason``, ``message``; unknown ones None), for reports such as results.json."""
        return {
            "file": str(self.path),
            "line": self.line,
            "record": self.index,
            "field": self.field,
            "reason": self.reason,
            "message": str(self),
        }


@dataclass
class LoadResult:
    """What `load` read from one file.

    Attributes:
        samples: the records that parsed, in file order.
        format: the format used (given or detected).
        dataset: the dataset name given to the samples.
        skipped: the errors of the records dropped with ``on_error="skip"``.
        unanswerable: ids of the records left out because the data marks them
            unanswerable (``unanswerable="skip"``); not errors.
    """

    samples: list[QASample]
    format: str
    dataset: str
    skipped: list[DataFormatError] = field(default_factory=list)
    unanswerable: list[str] = field(default_factory=list)


# ------------------------------------------------------------------- field access


@dataclass(frozen=True)
class _Where:
    """Location of one record, to build errors; ``n`` is its 0-based position in the file."""

    path: Path
    line: int | None = None
    index: int | None = None
    n: int = 0
    prefix: str = ""

    def error(self, reason: str, field: str | None = None) -> DataFormatError:
        name = f"{self.prefix}{field}" if field else self.prefix.rstrip(".") or None
        return DataFormatError(self.path, reason, line=self.line, index=self.index, field=name)


def _clean(s: str) -> str:
    """Strip and collapse whitespace runs to one space."""
    return " ".join(s.split())


def _desc(value: object) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:40]}{'...' if len(text) > 40 else ''}"


def _get(rec: dict[str, Any], key: str, w: _Where, name: str | None = None) -> Any:
    if key not in rec:
        raise w.error("missing", name or key)
    return rec[key]


def _str(rec: dict[str, Any], key: str, w: _Where, name: str | None = None) -> str:
    """A required non-empty string field, stripped."""
    value = _get(rec, key, w, name)
    if not isinstance(value, str) or not value.strip():
        raise w.error(f"expected a non-empty string, got {_desc(value)}", name or key)
    return value.strip()


def _as_str(value: object, w: _Where, name: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise w.error(f"expected a non-empty string, got {_desc(value)}", name)
    return value.strip()


def _list(rec: dict[str, Any], key: str, w: _Where, name: str | None = None) -> list[Any]:
    value = _get(rec, key, w, name)
    if not isinstance(value, list):
        raise w.error(f"expected a list, got {_desc(value)}", name or key)
    return value


def _dict(value: object, w: _Where, name: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise w.error(f"expected an object, got {_desc(value)}", name)
    return value


def _bool(rec: dict[str, Any], key: str, w: _Where, name: str) -> bool:
    value = _get(rec, key, w, name)
    if not isinstance(value, bool):
        raise w.error(f"expected true or false, got {_desc(value)}", name)
    return value


def _int(value: object, w: _Where, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise w.error(f"expected an integer, got {_desc(value)}", name)
    return value


def _opt_str(rec: dict[str, Any], key: str, w: _Where) -> str | None:
    value = rec.get(key)
    if value is None:
        return None
    return _as_str(value, w, key)


def _answers(value: object, w: _Where, name: str) -> list[str]:
    """An answer field: a non-empty string or a non-empty list of non-empty strings."""
    if isinstance(value, str):
        return [_as_str(value, w, name)]
    if isinstance(value, list) and value:
        return [_as_str(a, w, f"{name}[{i}]") for i, a in enumerate(value)]
    raise w.error(
        f"expected a non-empty string or a non-empty list of strings, got {_desc(value)}", name
    )


def _sentences(value: object, w: _Where, name: str) -> str:
    """A list of sentences as one normalized paragraph text."""
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise w.error(f"expected a list of strings (sentences), got {_desc(value)}", name)
    text = _clean(" ".join(value))
    if not text:
        raise w.error("expected at least one non-blank sentence", name)
    return text


def _distinct(items: Sequence[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


# -------------------------------------------------------------------- QA parsers

_Parser = Callable[[dict[str, Any], _Where, str], QASample]


def _from_titles(
    w: _Where,
    dataset: str,
    *,
    sid: str,
    question: str,
    answers: list[str],
    qtype: str | None,
    titled: list[tuple[str, str]],
    support: list[str],
) -> QASample:
    """A sample whose gold paragraphs are given by title (HotpotQA and 2Wiki layouts)."""
    support_t = _distinct(support)
    gold = set(support_t)
    context = tuple(Paragraph(t, text, t in gold) for t, text in titled)
    return QASample(
        id=sid,
        question=question,
        answers=_distinct(answers),
        dataset=dataset,
        type=qtype,
        hops=len(support_t) or None,
        supporting_titles=support_t,
        context=context,
        source=w.path.name,
    )


def _pairs_context(rec: dict[str, Any], w: _Where) -> list[tuple[str, str]]:
    """Original layout ``context: [[title, [sentences]], ...]``."""
    out = []
    for i, item in enumerate(_list(rec, "context", w)):
        if not (isinstance(item, list) and len(item) == 2):
            raise w.error(f"expected [title, [sentences]], got {_desc(item)}", f"context[{i}]")
        title = _as_str(item[0], w, f"context[{i}][0]")
        out.append((_clean(title), _sentences(item[1], w, f"context[{i}][1]")))
    return out


def _pairs_support(rec: dict[str, Any], w: _Where) -> list[str]:
    """Original layout ``supporting_facts: [[title, sent_id], ...]`` -> titles."""
    out = []
    for i, item in enumerate(_list(rec, "supporting_facts", w)):
        name = f"supporting_facts[{i}]"
        if not (isinstance(item, list) and len(item) == 2):
            raise w.error(f"expected [title, sent_id], got {_desc(item)}", name)
        _int(item[1], w, f"{name}[1]")
        out.append(_clean(_as_str(item[0], w, f"{name}[0]")))
    return out


def _parse_original(rec: dict[str, Any], w: _Where, dataset: str) -> QASample:
    """Original HotpotQA and 2WikiMultihopQA records (same core layout)."""
    return _from_titles(
        w,
        dataset,
        sid=_str(rec, "_id", w),
        question=_str(rec, "question", w),
        answers=_answers(_get(rec, "answer", w), w, "answer"),
        qtype=_opt_str(rec, "type", w),
        titled=_pairs_context(rec, w),
        support=_pairs_support(rec, w),
    )


def _columns(rec: dict[str, Any], key: str, cols: tuple[str, str], w: _Where) -> list[Any]:
    """HF layout ``{a: [...], b: [...]}`` -> ``[(a_i, b_i), ...]``, checking equal lengths."""
    obj = _dict(_get(rec, key, w), w, key)
    a, b = (_list(obj, c, w, f"{key}.{c}") for c in cols)
    if len(a) != len(b):
        raise w.error(f"{cols[0]} has {len(a)} items but {cols[1]} has {len(b)}", key)
    return list(zip(a, b, strict=True))


def _hf_context(rec: dict[str, Any], w: _Where) -> list[tuple[str, str]]:
    """HF layout ``context: {title: [...], sentences: [[...], ...]}`` -> (title, text)."""
    return [
        (
            _clean(_as_str(t, w, f"context.title[{i}]")),
            _sentences(s, w, f"context.sentences[{i}]"),
        )
        for i, (t, s) in enumerate(_columns(rec, "context", ("title", "sentences"), w))
    ]


def _hf_support(rec: dict[str, Any], w: _Where) -> list[str]:
    """HF layout ``supporting_facts: {title: [...], sent_id: [...]}`` -> titles."""
    support = []
    for i, (t, k) in enumerate(_columns(rec, "supporting_facts", ("title", "sent_id"), w)):
        _int(k, w, f"supporting_facts.sent_id[{i}]")
        support.append(_clean(_as_str(t, w, f"supporting_facts.title[{i}]")))
    return support


def _parse_hf(rec: dict[str, Any], w: _Where, dataset: str) -> QASample:
    titled = _hf_context(rec, w)
    support = _hf_support(rec, w)
    return _from_titles(
        w,
        dataset,
        sid=_str(rec, "id", w),
        question=_str(rec, "question", w),
        answers=_answers(_get(rec, "answer", w), w, "answer"),
        qtype=_opt_str(rec, "type", w),
        titled=titled,
        support=support,
    )


def _flagged_paragraphs(
    rec: dict[str, Any], key: str, w: _Where
) -> tuple[list[Paragraph], list[str]]:
    """``[{title, paragraph_text, is_supporting}, ...]`` -> paragraphs, gold titles."""
    paragraphs = []
    for i, item in enumerate(_list(rec, key, w)):
        name = f"{key}[{i}]"
        p = _dict(item, w, name)
        paragraphs.append(
            Paragraph(
                title=_clean(_str(p, "title", w, f"{name}.title")),
                text=_clean(_str(p, "paragraph_text", w, f"{name}.paragraph_text")),
                is_supporting=_bool(p, "is_supporting", w, f"{name}.is_supporting"),
            )
        )
    return paragraphs, [p.title for p in paragraphs if p.is_supporting]


def _parse_ircot(rec: dict[str, Any], w: _Where, dataset: str) -> QASample:
    answers: list[str] = []
    objects = _list(rec, "answers_objects", w)
    for i, obj in enumerate(objects):
        o = _dict(obj, w, f"answers_objects[{i}]")
        spans = _list(o, "spans", w, f"answers_objects[{i}].spans")
        answers += [_as_str(s, w, f"answers_objects[{i}].spans[{j}]") for j, s in enumerate(spans)]
        number = o.get("number")
        if isinstance(number, str | int | float) and not isinstance(number, bool) and number != "":
            answers.append(str(number))
    if not answers:
        raise w.error("expected at least one answer span or number", "answers_objects")
    context, gold = _flagged_paragraphs(rec, "contexts", w)
    support = _distinct(gold)
    return QASample(
        id=_str(rec, "question_id", w),
        question=_str(rec, "question_text", w),
        answers=_distinct(answers),
        dataset=dataset,
        type=None,  # IRCoT drops HotpotQA's type and level
        hops=len(support) or None,
        supporting_titles=support,
        context=tuple(context),
        source=w.path.name,
    )


_MUSIQUE_ID = re.compile(r"^(\d+)hop(\d*)__")


def _parse_musique(rec: dict[str, Any], w: _Where, dataset: str) -> QASample:
    sid = _str(rec, "id", w)
    steps = _list(rec, "question_decomposition", w)
    m = _MUSIQUE_ID.match(sid)
    hops = int(m.group(1)) if m else len(steps) or None
    if m and steps and len(steps) != hops:
        raise w.error(
            f"id says {hops} hops but question_decomposition has {len(steps)} steps",
            "question_decomposition",
        )
    aliases = rec.get("answer_aliases", [])
    if not isinstance(aliases, list):
        raise w.error(f"expected a list, got {_desc(aliases)}", "answer_aliases")
    answers = [_str(rec, "answer", w)]
    answers += [_as_str(a, w, f"answer_aliases[{i}]") for i, a in enumerate(aliases)]
    answerable = _bool(rec, "answerable", w, "answerable") if "answerable" in rec else True
    context, gold = _flagged_paragraphs(rec, "paragraphs", w)
    # Gold titles in hop order when the decomposition points at its paragraphs.
    order = []
    for i, step in enumerate(steps):
        k = _dict(step, w, f"question_decomposition[{i}]").get("paragraph_support_idx")
        if isinstance(k, int) and 0 <= k < len(context) and context[k].is_supporting:
            order.append(context[k].title)
    return QASample(
        id=sid,
        question=_str(rec, "question", w),
        answers=_distinct(answers),
        dataset=dataset,
        type=m.group(0).rstrip("_") if m else None,
        hops=hops,
        supporting_titles=_distinct(order + gold),
        context=tuple(context),
        source=w.path.name,
        answerable=answerable,
    )


def _parse_qa_only(rec: dict[str, Any], w: _Where, dataset: str) -> QASample:
    idx = _get(rec, "idx", w)
    if isinstance(idx, bool) or not isinstance(idx, int | str) or idx == "":
        raise w.error(f"expected an integer or a non-empty string, got {_desc(idx)}", "idx")
    return QASample(
        id=f"{w.path.stem}:{idx}",
        question=_str(rec, "question", w),
        answers=_distinct(_answers(_get(rec, "answer", w), w, "answer")),
        dataset=dataset,
        source=w.path.name,
    )


def _empty(value: object) -> bool:
    """An absent, null or empty context (``""``, ``[]``, ``{}``, blank text)."""
    if isinstance(value, str):
        return not value.strip()
    if isinstance(value, list | dict):
        return not value
    return value is None


def _lookup(rec: dict[str, Any], key: str) -> tuple[bool, Any]:
    """(found, value) of ``key``, a plain key or a dotted path into nested objects."""
    if key in rec:
        return True, rec[key]
    value: Any = rec
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return False, None
        value = value[part]
    return True, value


def _record_id(value: object, w: _Where, name: str) -> str:
    """``<folder>/<file stem>:<id>``: FlashRAG-style ids restart in every file."""
    if isinstance(value, bool) or not isinstance(value, int | str) or value == "":
        raise w.error(f"expected an integer or a non-empty string, got {_desc(value)}", name)
    return f"{w.path.parent.name}/{w.path.stem}:{value}"


def _no_context(rec: dict[str, Any], w: _Where) -> None:
    """A question-only record must not carry paragraphs (they would be dropped silently)."""
    for key in CONTEXT_KEYS:
        if not _empty(rec.get(key)):
            raise w.error(
                f"a question-only file's record carries paragraphs ({_desc(rec[key])}); "
                "this file's first record has none, so its format has no place for them",
                key,
            )


def _parse_questions(
    rec: dict[str, Any], w: _Where, dataset: str, fields: dict[str, str] | None = None
) -> QASample:
    """A question-only record: keys from ``fields``, else the first of `QUESTION_KEYS`,
    `ANSWER_KEYS` and `ID_KEYS` the record has."""

    def pick(name: str, keys: tuple[str, ...]) -> tuple[str | None, Any]:
        if fields is not None:
            key = fields.get(name)
            if key is None:
                return None, None
            found, value = _lookup(rec, key)
            if not found:
                raise w.error(f"missing (fields= maps {name} to it)", key)
            return key, value
        key = next((k for k in keys if k in rec), None)
        if key is None and name != "id":
            raise w.error(f"missing: no key of {', '.join(keys)}", name)
        return key, rec.get(key) if key else None

    qkey, question = pick("question", QUESTION_KEYS)
    akey, answers = pick("answers", ANSWER_KEYS)
    ikey, idv = pick("id", ID_KEYS)
    if fields is None:
        _no_context(rec, w)
    return QASample(
        id=_record_id(idv, w, ikey) if ikey else _record_id(w.n, w, "<position>"),
        question=_as_str(question, w, qkey or "question"),
        answers=_distinct(_answers(answers, w, akey or "answers")),
        dataset=dataset,
        source=w.path.name,
    )


def _parse_flashrag(rec: dict[str, Any], w: _Where, dataset: str) -> QASample:
    """FlashRAG: ``id, question, golden_answers[]``; ``metadata`` may add ``type``,
    ``answerable`` and HF- or HotpotQA-layout ``context`` / ``supporting_facts``."""
    meta = rec.get("metadata") or {}
    mw = _Where(w.path, w.line, w.index, w.n, "metadata.")
    meta = _dict(meta, w, "metadata")
    answerable = _bool(meta, "answerable", mw, "answerable") if "answerable" in meta else True
    ctx = meta.get("context")
    titled: list[tuple[str, str]] = []
    support: list[str] = []
    if isinstance(ctx, dict) and ctx:
        titled = _hf_context(meta, mw)
        support = _hf_support(meta, mw) if meta.get("supporting_facts") else []
    elif isinstance(ctx, list) and ctx:
        titled = _pairs_context(meta, mw)
        support = _pairs_support(meta, mw) if meta.get("supporting_facts") else []
    elif not _empty(ctx):
        raise mw.error(f"expected the HF or HotpotQA context layout, got {_desc(ctx)}", "context")
    sample = _from_titles(
        w,
        dataset,
        sid=_record_id(_get(rec, "id", w), w, "id"),
        question=_str(rec, "question", w),
        answers=_answers(_get(rec, "golden_answers", w), w, "golden_answers"),
        qtype=_opt_str(meta, "type", mw),
        titled=titled,
        support=support,
    )
    return dataclasses.replace(sample, answerable=answerable)


_PARSERS: dict[str, _Parser] = {
    "ircot": _parse_ircot,
    "hf": _parse_hf,
    "hotpotqa": _parse_original,
    "2wiki": _parse_original,
    "musique": _parse_musique,
    "qa_only": _parse_qa_only,
    "flashrag": _parse_flashrag,
    "questions": _parse_questions,
}

_FORMAT_DATASET = {"hotpotqa": "hotpotqa", "2wiki": "2wikimultihopqa", "musique": "musique"}
_NAME_TAGS = (("hotpotqa", "hotpot"), ("2wikimultihopqa", "2wiki"), ("musique", "musique"))
"""(dataset, tag): a file whose name contains exactly one tag belongs to that dataset."""


# ------------------------------------------------------------------ file reading


@dataclass(frozen=True)
class _Raw:
    """The records of a file before parsing.

    ``items`` holds one ``(where, record-or-error)`` per record; a JSON object at the top
    level (``mapping``) gives ``(key, value)`` records.
    """

    items: list[tuple[_Where, Any]]
    mapping: bool


_NOT_UTF8 = re.compile("[\udc80-\udcff]")
"""A byte that is not UTF-8, as ``surrogateescape`` decodes it."""
_WS = re.compile(r"[ \t\n\r]*")


@dataclass(frozen=True)
class _BadByte:
    """A byte that is not UTF-8: its character position in the decoded text, its byte
    offset in the file, its 1-based line and its value."""

    pos: int
    offset: int
    line: int
    value: int

    def error(self, path: Path, index: int | None = None) -> DataFormatError:
        return DataFormatError(
            path,
            f"not UTF-8 (byte 0x{self.value:02x}); save the file as UTF-8",
            line=self.line,
            offset=self.offset,
            index=index,
        )


def _decode(data: bytes) -> tuple[str, list[_BadByte]]:
    """UTF-8 text (a leading BOM dropped) and the bytes that are not UTF-8, which the text
    keeps as lone surrogates (``surrogateescape``) so the rest of the file stays readable."""
    base = len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0
    try:
        return data[base:].decode("utf-8"), []
    except UnicodeDecodeError:
        text = data[base:].decode("utf-8", "surrogateescape")
    bad, offset, line, prev = [], base, 1, 0
    for m in _NOT_UTF8.finditer(text):
        seg = text[prev : m.start()]
        offset += len(seg.encode("utf-8", "surrogateescape"))
        line += seg.count("\n")
        bad.append(_BadByte(m.start(), offset, line, ord(text[m.start()]) - 0xDC00))
        prev = m.start()
    return text, bad


def _count_bad(value: Any) -> int:
    """Characters that stand for bytes that are not UTF-8, in every string of ``value``."""
    if isinstance(value, str):
        return len(_NOT_UTF8.findall(value))
    if isinstance(value, dict):
        return sum(_count_bad(k) + _count_bad(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return sum(_count_bad(v) for v in value)
    return 0


def _json_msg(e: json.JSONDecodeError) -> str:
    """The decoder's message without a dangling "at" (the location is in the prefix)."""
    return e.msg.removesuffix(" starting at").removesuffix(" at")


def _json_error(
    path: Path, e: json.JSONDecodeError, text: str, index: int | None = None, then: str = ""
) -> DataFormatError:
    """Invalid JSON at a line and column; says so when the file ends inside the value (an
    unterminated string runs to the end of the text)."""
    reason = f"invalid JSON ({_json_msg(e)})"
    if not text[e.pos :].strip() or e.msg.startswith("Unterminated"):
        reason += ": the file ends before the value is complete (truncated?)"
    return DataFormatError(path, reason + then, line=e.lineno, column=e.colno, index=index)


def _skip_ws(text: str, i: int) -> int:
    """The position of the first non-whitespace character at or after ``i``."""
    m = _WS.match(text, i)
    return m.end() if m else i


def _array_items(path: Path, text: str) -> list[tuple[_Where, Any]]:
    """The records of a JSON array that does not parse as a whole: every complete record
    before the error, then one error item for the record where parsing stopped."""
    decoder = json.JSONDecoder()
    items: list[tuple[_Where, Any]] = []
    i = _skip_ws(text, 0) + 1  # past "["
    while True:
        i = _skip_ws(text, i)
        k = len(items)
        if k == 0 and text.startswith("]", i):
            return items
        try:
            value, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError as e:
            rest = "; this record and any after it cannot be read"
            items.append((_Where(path, index=k, n=k), _json_error(path, e, text, k, rest)))
            return items
        items.append((_Where(path, index=k, n=k), value))
        i = _skip_ws(text, i)
        if text.startswith(",", i):
            i += 1
        elif text.startswith("]", i):
            return items
        else:
            stop = json.JSONDecodeError("Expecting ',' delimiter", text, i)
            items.append((_Where(path, index=k + 1, n=k + 1), _json_error(path, stop, text, k + 1)))
            return items


def _read(path: Path) -> _Raw:
    """Read a JSON array, a JSON object, or JSON lines (by content, not by extension).

    Bad records become `DataFormatError` items (so ``on_error="skip"`` can go on): a JSONL
    line that is not JSON or holds a byte that is not UTF-8, a JSON array's record with such
    a byte, and the unreadable tail of a JSON array cut short. A file that is not JSON at
    all raises.
    """
    text, bad = _decode(path.read_bytes())
    if path.suffix != ".jsonl":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            if e.msg != "Extra data":  # "Extra data": several values, i.e. JSON lines
                at = [b for b in bad if b.pos == e.pos]
                if at:  # outside a string: the byte itself broke the JSON
                    raise at[0].error(path) from e
                if not text.lstrip().startswith("["):
                    raise _json_error(path, e, text) from e
                return _Raw(_mark_bad_records(path, _array_items(path, text), bad), False)
        else:
            if isinstance(data, list):
                records = [(_Where(path, index=i, n=i), r) for i, r in enumerate(data)]
            elif isinstance(data, dict):
                pairs = enumerate(data.items())
                records = [(_Where(path, index=i, n=i), kv) for i, kv in pairs]
            else:
                raise DataFormatError(path, f"expected a JSON array or object, got {_desc(data)}")
            return _Raw(_mark_bad_records(path, records, bad), isinstance(data, dict))
    items: list[tuple[_Where, Any]] = []
    first_bad: dict[int, _BadByte] = {}
    for b in bad:
        first_bad.setdefault(b.line, b)
    for n, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        w = _Where(path, line=n, n=len(items))
        if n in first_bad:
            items.append((w, first_bad[n].error(path)))
            continue
        try:
            items.append((w, json.loads(line)))
        except json.JSONDecodeError as e:
            err = DataFormatError(path, f"invalid JSON ({_json_msg(e)})", line=n, column=e.colno)
            items.append((w, err))
    return _Raw(items, False)


def _mark_bad_records(
    path: Path, items: list[tuple[_Where, Any]], bad: list[_BadByte]
) -> list[tuple[_Where, Any]]:
    """Replace each record holding a byte that is not UTF-8 by an error naming its first
    such byte (records and bad bytes come in the same file order)."""
    if not bad:
        return items
    out: list[tuple[_Where, Any]] = []
    queue = iter(bad)
    for w, rec in items:
        count = _count_bad(rec)
        if not count:
            out.append((w, rec))
            continue
        first = next(queue, None)
        for _ in range(count - 1):
            next(queue, None)
        err = first.error(path, w.index) if first else w.error("not UTF-8")
        out.append((w, err))
    return out


def _candidates(first: Any, mapping: bool) -> list[str]:
    """Every format the first record could be in (QA and corpus formats)."""
    if mapping:
        _, value = first
        if isinstance(value, list):
            return ["title_sentences"]
        if isinstance(value, dict) and "extract" in value:
            return ["ovos"]
        return []
    if not isinstance(first, dict):
        return []
    keys = set(first)
    ctx = first.get("context")
    no_context = all(_empty(first.get(k)) for k in CONTEXT_KEYS)
    # Original HotpotQA and 2Wiki share this core; `level` / `evidences` tell them apart.
    core = {"_id", "question", "answer", "context"} <= keys and isinstance(ctx, list)
    rules = {
        "ircot": {"question_id", "question_text", "contexts"} <= keys,
        "hf": {"id", "question", "answer"} <= keys and isinstance(ctx, dict) and bool(ctx),
        "hotpotqa": core and "level" in keys and "evidences" not in keys,
        "2wiki": core and "evidences" in keys,
        "musique": {"id", "question", "paragraphs", "question_decomposition"} <= keys,
        "qa_only": {"idx", "question", "answer"} <= keys and no_context,
        "flashrag": {"id", "question", "golden_answers"} <= keys,
        "title_text": keys == {"title", "text"},
        "kilt": {"wikipedia_title", "text"} <= keys,
    }
    found = [name for name, ok in rules.items() if ok]
    if core and not found:
        return ["hotpotqa", "2wiki"]  # the shared core, neither marker: ambiguous
    if not found and no_context and keys & set(QUESTION_KEYS) and keys & set(ANSWER_KEYS):
        return ["questions"]  # the fallback: a question and its answers, nothing else known
    return found


def _detect(path: Path, raw: _Raw) -> str:
    if not raw.items:
        raise DataFormatError(path, "no records: cannot detect the format")
    # The first record that is valid JSON decides (bad lines are reported when parsed).
    w, first = next(
        ((w, r) for w, r in raw.items if not isinstance(r, DataFormatError)), raw.items[0]
    )
    if isinstance(first, DataFormatError):
        raise first
    found = _candidates(first, raw.mapping)
    keys = sorted(first) if isinstance(first, dict) else type(first).__name__
    if not found:
        raise w.error(
            f"unknown format (first record keys: {keys}); known formats: "
            f"{', '.join(QA_FORMATS + CORPUS_FORMATS)}; for question-only records name "
            "their keys with fields= (CLI: --fields question=KEY,answers=KEY)"
        )
    if len(found) > 1:
        raise w.error(
            f"ambiguous format: the first record (keys: {keys}) fits {' and '.join(found)}; "
            "pass format= explicitly"
        )
    return found[0]


def detect_format(path: Path | str) -> str:
    """The format of a file (one of `QA_FORMATS` or `CORPUS_FORMATS`), from its first record.

    Raises:
        DataFormatError: no record, or the first record fits no format or several.
    """
    path = Path(path)
    return _detect(path, _read(path))


def infer_dataset(path: Path | str, format: str | None = None) -> str:
    """Dataset name of a file: implied by the format (``musique``, ``2wiki``,
    ``hotpotqa``), else a known folder name, else a known name inside the file name, else
    the folder name.

    >>> infer_dataset("raw/hotpotqa/ircot_dev.jsonl", "ircot")
    'hotpotqa'
    >>> infer_dataset("raw/train_mixed/r1searcher_musique.jsonl", "qa_only")
    'musique'
    >>> infer_dataset("raw/train_mixed/stage1.jsonl", "qa_only")
    'train_mixed'
    """
    path = Path(path)
    if format in _FORMAT_DATASET:
        return _FORMAT_DATASET[format]
    if path.parent.name in KNOWN_DATASETS:
        return path.parent.name
    stem = path.stem.lower()
    named = [d for d, tag in _NAME_TAGS if tag in stem]
    if len(named) == 1:
        return named[0]
    return path.parent.name or "unknown"


# --------------------------------------------------------------------- QA loading


def load(
    path: Path | str,
    format: str | None = None,
    *,
    dataset: str | None = None,
    on_error: OnError = "fail",
    fields: str | dict[str, str] | None = None,
    unanswerable: Unanswerable = "skip",
) -> LoadResult:
    """Read one question file.

    Args:
        path: a JSON array or JSONL file in one of `QA_FORMATS`.
        format: the format; detected from the first record when None.
        dataset: the dataset name of the samples; `infer_dataset` when None.
        on_error: "fail" (default) stops at the first malformed record; "skip" drops it,
            records the error in `LoadResult.skipped` and logs a warning naming it.
            Errors of the file as a whole (not JSON, unknown format) raise either way.
        fields: read the file as ``questions`` with these keys (`parse_fields`), e.g.
            ``"question=Question,answers=golden_answers,id=qid"``.
        unanswerable: "skip" (default) leaves out records the data marks unanswerable and
            lists their ids in `LoadResult.unanswerable`; "keep" keeps them with
            ``answerable=False``.

    Raises:
        DataFormatError: the format is unknown or ambiguous, the file is a corpus-only
            file, or a record is malformed (with ``on_error="fail"``).
        ValueError: a bad ``on_error``, ``fields`` or ``unanswerable``.
    """
    path = Path(path)
    skip = check_on_error(on_error)
    if unanswerable not in ("skip", "keep"):
        raise ValueError(f"unanswerable must be 'skip' or 'keep', got {unanswerable!r}")
    mapping = parse_fields(fields)
    if mapping and format not in (None, "questions"):
        raise ValueError(f"fields= reads a file as 'questions'; got format={format!r} too")
    raw = _read(path)
    fmt = "questions" if mapping else format or _detect(path, raw)
    if fmt in CORPUS_FORMATS:
        raise DataFormatError(
            path, f"a corpus-only file (format {fmt!r}): read it with load_corpus_file"
        )
    if fmt not in _PARSERS:
        raise DataFormatError(path, f"unknown format {fmt!r}; expected one of {QA_FORMATS}")
    if raw.mapping:
        raise DataFormatError(path, f"expected a list of {fmt} records, got a JSON object")
    name = dataset or infer_dataset(path, fmt)
    parse = functools.partial(_parse_questions, fields=mapping) if mapping else _PARSERS[fmt]
    result = LoadResult([], fmt, name)
    for w, rec in raw.items:
        try:
            if isinstance(rec, DataFormatError):
                raise rec
            sample = parse(_dict(rec, w, "<record>"), w, name)
        except DataFormatError as e:
            if not skip:
                raise
            result.skipped.append(e)
            log.warning("skipped %s", e)
            continue
        if not sample.answerable and unanswerable == "skip":
            result.unanswerable.append(sample.id)
        else:
            result.samples.append(sample)
    if result.skipped:
        log.warning(
            "%s: skipped %d malformed record(s), each named above", path, len(result.skipped)
        )
    if result.unanswerable:
        log.info(
            "%s: left out %d record(s) marked unanswerable (unanswerable='keep' keeps them)",
            path,
            len(result.unanswerable),
        )
    return result


def load_file(
    path: Path | str,
    format: str | None = None,
    *,
    dataset: str | None = None,
    on_error: OnError = "fail",
    fields: str | dict[str, str] | None = None,
    unanswerable: Unanswerable = "skip",
) -> list[QASample]:
    """The samples of one question file, in file order (see `load` for the arguments)."""
    return load(
        path, format, dataset=dataset, on_error=on_error, fields=fields, unanswerable=unanswerable
    ).samples


def unreadable(path: Path, e: OSError) -> DataFormatError:
    """An OS error reading ``path`` as a `DataFormatError`, to be skipped like one."""
    return DataFormatError(path, f"cannot read the file ({e.strerror or e})")


def qa_files(
    data_dir: Path | str | None = None,
    dataset: str | None = None,
    *,
    on_error: OnError = "fail",
    skipped: list[DataFormatError] | None = None,
    fields: str | dict[str, str] | None = None,
) -> list[Path]:
    """The question files under ``data_dir`` (default `default_data_dir`), sorted by path.

    Corpus-only files are left out. ``dataset`` keeps only files under that folder. A file
    that cannot be read or whose format is unknown stops the scan with ``on_error="fail"``
    (the error names the file); with "skip" it is left out, logged, and appended to
    ``skipped``. With ``fields`` a file of unknown format counts as a question file (the
    mapping reads it).
    """
    skip = check_on_error(on_error)
    root = Path(data_dir) if data_dir is not None else default_data_dir()
    base = root / dataset if dataset else root
    out = []
    for p in sorted(base.rglob("*.json*")):
        if p.suffix not in (".json", ".jsonl"):
            continue
        try:
            try:
                fmt = detect_format(p)
            except OSError as e:
                raise unreadable(p, e) from e
        except DataFormatError as e:
            if fields and "unknown format" in e.reason:
                out.append(p)
                continue
            if not skip:
                raise
            log.warning("skipped file %s", e)
            if skipped is not None:
                skipped.append(e)
            continue
        if fmt in QA_FORMATS:
            out.append(p)
    return out


def load_dataset_name(
    dataset: str,
    data_dir: Path | str | None = None,
    *,
    with_context: bool = False,
    on_error: OnError = "fail",
) -> list[QASample]:
    """All samples of the question files in folder ``dataset`` (sorted by file name).

    Not deduplicated (files overlap: pass the result to `dedupe`). With ``with_context``,
    only files whose samples carry context paragraphs. ``on_error="skip"`` leaves out bad
    records and files that cannot be read, each logged (`qa_files`, `load`).
    """
    out: list[QASample] = []
    for p in qa_files(data_dir, dataset, on_error=on_error):
        try:
            samples = load_file(p, on_error=on_error)
        except DataFormatError as e:
            if not check_on_error(on_error):
                raise
            log.warning("skipped file %s", e)
            continue
        if with_context and not any(s.context for s in samples):
            continue
        out += samples
    return out


# ------------------------------------------------------------------ corpus files


def _kilt_passages(title: str, paragraphs: list[str]) -> Iterator[str]:
    """KILT page paragraphs -> passage texts.

    The first paragraph repeats the title and ``Section::::`` lines are headings: both
    are dropped. Consecutive ``BULLET::::`` items form one passage.
    """
    bullets: list[str] = []
    for i, para in enumerate(paragraphs):
        text = _clean(para)
        if (i == 0 and text == title) or not text or text.startswith("Section::::"):
            continue
        if text.startswith("BULLET::::"):
            bullets.append(text.removeprefix("BULLET::::").strip())
            continue
        if bullets:
            yield _clean(" ".join(bullets))
            bullets = []
        yield text
    if bullets:
        yield _clean(" ".join(bullets))


def _corpus_record(fmt: str, rec: Any, w: _Where) -> Iterator[tuple[str, str]]:
    """(title, text) pairs of one corpus record."""
    if fmt == "title_sentences":
        title, sentences = rec
        yield _clean(_as_str(title, w, "<key>")), _sentences(sentences, w, str(title))
    elif fmt == "ovos":
        title, value = rec
        v = _dict(value, w, str(title))
        yield _clean(_as_str(title, w, "<key>")), _clean(_str(v, "extract", w, f"{title}.extract"))
    elif fmt == "title_text":
        r = _dict(rec, w, "<record>")
        yield _clean(_str(r, "title", w)), _clean(_str(r, "text", w))
    elif fmt == "kilt":
        r = _dict(rec, w, "<record>")
        title = _clean(_str(r, "wikipedia_title", w))
        paragraphs = _list(r, "text", w)
        for i, p in enumerate(paragraphs):
            if not isinstance(p, str):
                raise w.error(f"expected a string, got {_desc(p)}", f"text[{i}]")
        for text in _kilt_passages(title, paragraphs):
            yield title, text
    else:
        raise ValueError(f"unknown corpus format {fmt!r}; expected one of {CORPUS_FORMATS}")


def load_corpus_file(path: Path | str, format: str | None = None) -> list[Passage]:
    """Passages of a corpus-only file (`CORPUS_FORMATS`), in file order, ids by
    `paragraph_id`. Not deduplicated (`corpus_paragraphs` does that).

    Raises:
        DataFormatError: unknown or ambiguous format, a question file, or a bad record.
    """
    path = Path(path)
    raw = _read(path)
    fmt = format or _detect(path, raw)
    if fmt not in CORPUS_FORMATS:
        raise DataFormatError(path, f"not a corpus-only format ({fmt!r}): read it with load_file")
    out = []
    for w, rec in raw.items:
        if isinstance(rec, DataFormatError):
            raise rec
        for title, text in _corpus_record(fmt, rec, w):
            out.append(Passage(paragraph_id(title, text), title, text))
    return out
