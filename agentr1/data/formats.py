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
- ``musique``: original MuSiQue: ``id, question, answer, answer_aliases,
  paragraphs[]{idx, title, paragraph_text, is_supporting}, question_decomposition[]``.
- ``qa_only``: ``idx, question, answer`` (R1-Searcher); ``idx`` is unique only within its
  file, so the sample id is ``<file stem>:<idx>``.

Corpus-only formats (`CORPUS_FORMATS`), read by `load_corpus_file` into `Passage`s:
``title_sentences`` (dict title -> [sentences]), ``title_text`` (list of {title, text}),
``ovos`` (dict title -> {title, extract, ...}), ``kilt`` (JSONL {wikipedia_title, text[]}).

Normalization, applied by every reader so the same paragraph gets the same id whatever
file it came from: titles, questions and answers are stripped; paragraph text is the
sentences joined with one space, then every whitespace run collapsed to one space (this
reproduces IRCoT's ``paragraph_text`` from HotpotQA's sentence lists exactly).

Errors: a malformed record raises `DataFormatError` naming the file, the JSONL line (1-based)
or the record index (0-based), the field, and what was expected. Nothing is skipped
silently: ``on_error="skip"`` drops bad records but reports them (`LoadResult.skipped`) and
logs a warning with their count.
"""

from __future__ import annotations

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

QA_FORMATS = ("ircot", "hf", "hotpotqa", "2wiki", "musique", "qa_only")
"""Question formats `load_file` reads."""
CORPUS_FORMATS = ("title_sentences", "title_text", "ovos", "kilt")
"""Corpus-only formats `load_corpus_file` reads."""
KNOWN_DATASETS = ("hotpotqa", "2wikimultihopqa", "musique")
"""Dataset names inferred from a file's folder or name (other folders give their own name)."""

OnError = Literal["raise", "skip"]


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
        context: the paragraphs given with the question (empty for ``qa_only``).
        source: file name the sample was read from.
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

    @property
    def supporting_ids(self) -> tuple[str, ...]:
        """Passage ids of the supporting paragraphs of `context`, distinct, in order."""
        return tuple(dict.fromkeys(p.id for p in self.context if p.is_supporting))

    def to_task(self) -> Task:
        """The `Task` an episode runs on.

        Metadata keys (those whose value is unknown are left out, so ``metadata.get(k, d)``
        sees the default): ``dataset``, ``source``, ``type``, ``hops``,
        ``supporting_titles``, and ``supporting``, the passage ids of the gold paragraphs,
        which match the ids of `corpus_paragraphs` (process rewards look them up there).
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
        return Task(id=self.id, question=self.question, answers=list(self.answers), metadata=meta)


class DataFormatError(ValueError):
    """A file or record that does not have the expected layout.

    Attributes:
        path: the file.
        line: 1-based line of the record in a JSONL file (or of a JSON syntax error).
        index: 0-based index of the record in a JSON array or object.
        field: the offending field, dotted (``contexts[3].title``), when there is one.
        reason: what was expected and what was found.
    """

    def __init__(
        self,
        path: Path | str,
        reason: str,
        *,
        line: int | None = None,
        index: int | None = None,
        field: str | None = None,
    ) -> None:
        self.path = Path(path)
        self.reason = reason
        self.line = line
        self.index = index
        self.field = field
        where = [str(self.path)]
        if line is not None:
            where.append(f"line {line}")
        if index is not None:
            where.append(f"record {index}")
        prefix = ", ".join(where)
        what = f"field {field!r}: {reason}" if field else reason
        super().__init__(f"{prefix}: {what}")


@dataclass
class LoadResult:
    """What `load` read from one file.

    Attributes:
        samples: the records that parsed, in file order.
        format: the format used (given or detected).
        dataset: the dataset name given to the samples.
        skipped: the errors of the records dropped with ``on_error="skip"``.
    """

    samples: list[QASample]
    format: str
    dataset: str
    skipped: list[DataFormatError] = field(default_factory=list)


# ------------------------------------------------------------------- field access


@dataclass(frozen=True)
class _Where:
    """Location of one record, to build errors."""

    path: Path
    line: int | None = None
    index: int | None = None

    def error(self, reason: str, field: str | None = None) -> DataFormatError:
        return DataFormatError(self.path, reason, line=self.line, index=self.index, field=field)


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


def _parse_hf(rec: dict[str, Any], w: _Where, dataset: str) -> QASample:
    titled = [
        (
            _clean(_as_str(t, w, f"context.title[{i}]")),
            _sentences(s, w, f"context.sentences[{i}]"),
        )
        for i, (t, s) in enumerate(_columns(rec, "context", ("title", "sentences"), w))
    ]
    support = []
    for i, (t, k) in enumerate(_columns(rec, "supporting_facts", ("title", "sent_id"), w)):
        _int(k, w, f"supporting_facts.sent_id[{i}]")
        support.append(_clean(_as_str(t, w, f"supporting_facts.title[{i}]")))
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


_PARSERS: dict[str, _Parser] = {
    "ircot": _parse_ircot,
    "hf": _parse_hf,
    "hotpotqa": _parse_original,
    "2wiki": _parse_original,
    "musique": _parse_musique,
    "qa_only": _parse_qa_only,
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


def _read(path: Path) -> _Raw:
    """Read a JSON array, a JSON object, or JSON lines (by content, not by extension).

    Bad JSONL lines become `DataFormatError` items (so ``on_error="skip"`` can go on); a
    file that is not JSON at all raises.
    """
    text = path.read_text(encoding="utf-8")
    if path.suffix != ".jsonl":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            if e.msg != "Extra data":  # "Extra data": several values, i.e. JSON lines
                raise DataFormatError(path, f"invalid JSON ({e.msg})", line=e.lineno) from e
        else:
            if isinstance(data, list):
                return _Raw([(_Where(path, index=i), r) for i, r in enumerate(data)], False)
            if isinstance(data, dict):
                pairs = enumerate(data.items())
                return _Raw([(_Where(path, index=i), kv) for i, kv in pairs], True)
            raise DataFormatError(path, f"expected a JSON array or object, got {_desc(data)}")
    items: list[tuple[_Where, Any]] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        w = _Where(path, line=n)
        try:
            items.append((w, json.loads(line)))
        except json.JSONDecodeError as e:
            items.append((w, w.error(f"invalid JSON ({e.msg} at column {e.colno})")))
    return _Raw(items, False)


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
    # Original HotpotQA and 2Wiki share this core; `level` / `evidences` tell them apart.
    core = {"_id", "question", "answer", "context"} <= keys and isinstance(ctx, list)
    rules = {
        "ircot": {"question_id", "question_text", "contexts"} <= keys,
        "hf": {"id", "question", "answer"} <= keys and isinstance(ctx, dict),
        "hotpotqa": core and "level" in keys and "evidences" not in keys,
        "2wiki": core and "evidences" in keys,
        "musique": {"id", "question", "paragraphs", "question_decomposition"} <= keys,
        "qa_only": {"idx", "question", "answer"} <= keys
        and not keys & {"context", "contexts", "paragraphs"},
        "title_text": keys == {"title", "text"},
        "kilt": {"wikipedia_title", "text"} <= keys,
    }
    found = [name for name, ok in rules.items() if ok]
    if core and not found:
        return ["hotpotqa", "2wiki"]  # the shared core, neither marker: ambiguous
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
            f"{', '.join(QA_FORMATS + CORPUS_FORMATS)}"
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
    on_error: OnError = "raise",
) -> LoadResult:
    """Read one question file.

    Args:
        path: a JSON array or JSONL file in one of `QA_FORMATS`.
        format: the format; detected from the first record when None.
        dataset: the dataset name of the samples; `infer_dataset` when None.
        on_error: "raise" (default) stops at the first malformed record; "skip" drops it,
            records the error in `LoadResult.skipped` and logs a warning with the count.

    Raises:
        DataFormatError: the format is unknown or ambiguous, the file is a corpus-only
            file, or a record is malformed (with ``on_error="raise"``).
    """
    path = Path(path)
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    raw = _read(path)
    fmt = format or _detect(path, raw)
    if fmt in CORPUS_FORMATS:
        raise DataFormatError(
            path, f"a corpus-only file (format {fmt!r}): read it with load_corpus_file"
        )
    if fmt not in _PARSERS:
        raise DataFormatError(path, f"unknown format {fmt!r}; expected one of {QA_FORMATS}")
    if raw.mapping:
        raise DataFormatError(path, f"expected a list of {fmt} records, got a JSON object")
    name = dataset or infer_dataset(path, fmt)
    parse = _PARSERS[fmt]
    result = LoadResult([], fmt, name)
    for w, rec in raw.items:
        try:
            if isinstance(rec, DataFormatError):
                raise rec
            result.samples.append(parse(_dict(rec, w, "<record>"), w, name))
        except DataFormatError as e:
            if on_error == "raise":
                raise
            result.skipped.append(e)
    if result.skipped:
        log.warning(
            "%s: skipped %d malformed record(s); first: %s",
            path,
            len(result.skipped),
            result.skipped[0],
        )
    return result


def load_file(
    path: Path | str,
    format: str | None = None,
    *,
    dataset: str | None = None,
    on_error: OnError = "raise",
) -> list[QASample]:
    """The samples of one question file, in file order (see `load` for the arguments)."""
    return load(path, format, dataset=dataset, on_error=on_error).samples


def qa_files(data_dir: Path | str | None = None, dataset: str | None = None) -> list[Path]:
    """The question files under ``data_dir`` (default `default_data_dir`), sorted by path.

    Corpus-only files are left out. ``dataset`` keeps only files under that folder.
    """
    root = Path(data_dir) if data_dir is not None else default_data_dir()
    base = root / dataset if dataset else root
    out = []
    for p in sorted(base.rglob("*.json*")):
        if p.suffix in (".json", ".jsonl") and detect_format(p) in QA_FORMATS:
            out.append(p)
    return out


def load_dataset_name(
    dataset: str, data_dir: Path | str | None = None, *, with_context: bool = False
) -> list[QASample]:
    """All samples of the question files in folder ``dataset`` (sorted by file name).

    Not deduplicated (files overlap: pass the result to `dedupe`). With ``with_context``,
    only files whose samples carry context paragraphs.
    """
    out: list[QASample] = []
    for p in qa_files(data_dir, dataset):
        samples = load_file(p)
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
