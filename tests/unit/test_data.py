"""agentr1.data: every raw data file loads with the counts PROVENANCE.md states; malformed
input fails loudly with file, line and field; dedupe, split and corpus are deterministic.

Tests that read /work/shared/data/raw skip when it is absent (set AGENTR1_DATA to move it).
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
from collections import Counter
from pathlib import Path

import pytest

from agentr1.data import (
    CORPUS_FORMATS,
    QA_FORMATS,
    DataFormatError,
    Paragraph,
    QASample,
    corpus_paragraphs,
    dedupe,
    default_data_dir,
    detect_format,
    load,
    load_corpus_file,
    load_dataset_name,
    load_file,
    normalize_question,
    paragraph_id,
    qa_files,
    split,
)
from agentr1.retrieval import Passage

# path -> (format, dataset, records): counts from PROVENANCE.md.
QA_EXPECTED = {
    "hotpotqa/ircot_hotpotqa_dev_subsampled_500.jsonl": ("ircot", "hotpotqa", 500),
    "hotpotqa/rpt_hotpotqa_devsplit_train_300.jsonl": ("hf", "hotpotqa", 300),
    "hotpotqa/rpt_hotpotqa_devsplit_dev_300.jsonl": ("hf", "hotpotqa", 300),
    "hotpotqa/hipporag_hotpotqa_train_100.json": ("hotpotqa", "hotpotqa", 100),
    "hotpotqa/r1searcher_hotpotqa_dev_500.jsonl": ("qa_only", "hotpotqa", 500),
    "2wikimultihopqa/migres_2wiki_train_500_decomposed.json": ("2wiki", "2wikimultihopqa", 500),
    "2wikimultihopqa/r1searcher_2wiki_dev_500.jsonl": ("qa_only", "2wikimultihopqa", 500),
    "musique/migres_musique_dev_200.jsonl": ("musique", "musique", 200),
    "musique/r1searcher_musique_dev_500.jsonl": ("qa_only", "musique", 500),
    "train_mixed/r1searcher_train_stage1_350.jsonl": ("qa_only", "train_mixed", 350),
    "train_mixed/r1searcher_train_stage2_8148.jsonl": ("qa_only", "train_mixed", 8148),
}
# path -> (format, records = distinct titles: paragraphs, or pages for KILT).
CORPUS_EXPECTED = {
    "hotpotqa/hipporag_hotpotqa_train_100_corpus.json": ("title_sentences", 994),
    "2wikimultihopqa/hipporag_2wiki_dev1000_corpus.json": ("title_text", 6119),
    "wikipedia/ovos_wiki_offline_vital_articles_summaries_en.json": ("ovos", 10033),
    "wikipedia/r1searcher_kilt_wikipedia_sample_99pages.jsonl": ("kilt", 99),
}
WITH_CONTEXT = [p for p, (fmt, _, _) in QA_EXPECTED.items() if fmt != "qa_only"]


# ------------------------------------------------------------------ real data


@pytest.fixture(scope="module")
def data_dir() -> Path:
    d = default_data_dir()
    if not d.is_dir():
        pytest.skip(f"raw data not found at {d} (set AGENTR1_DATA to its location)")
    return d


@pytest.fixture(scope="module")
def loaded(data_dir: Path) -> dict[str, list[QASample]]:
    return {rel: load_file(data_dir / rel) for rel in QA_EXPECTED}


@pytest.fixture(scope="module")
def all_samples(loaded: dict[str, list[QASample]]) -> list[QASample]:
    return [s for rel in sorted(loaded) for s in loaded[rel]]


def test_every_file_is_covered_and_unchanged(data_dir: Path) -> None:
    """The tables above name every file of SHA256SUMS, and the bytes match it."""
    sums = {}
    for line in (data_dir / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split(maxsplit=1)
        sums[name.lstrip("*").removeprefix("./")] = digest
    on_disk = {str(p.relative_to(data_dir)) for p in data_dir.rglob("*") if p.is_file()} - {
        "PROVENANCE.md",
        "SHA256SUMS",
    }
    assert set(sums) == on_disk == set(QA_EXPECTED) | set(CORPUS_EXPECTED)
    for name, digest in sums.items():
        assert hashlib.sha256((data_dir / name).read_bytes()).hexdigest() == digest, name


@pytest.mark.parametrize("rel", list(QA_EXPECTED))
def test_qa_file_loads(data_dir: Path, loaded: dict[str, list[QASample]], rel: str) -> None:
    fmt, dataset, count = QA_EXPECTED[rel]
    assert detect_format(data_dir / rel) == fmt
    samples = loaded[rel]
    assert len(samples) == count
    ids = [s.id for s in samples]
    assert len(set(ids)) == len(ids), "duplicate ids within the file"
    for s in samples:
        assert s.dataset == dataset and s.source == Path(rel).name
        assert s.question and s.answers and all(a.strip() == a and a for a in s.answers)
        assert bool(s.context) == (fmt != "qa_only")


@pytest.mark.parametrize("rel", WITH_CONTEXT)
def test_supporting_titles_are_in_context(loaded: dict[str, list[QASample]], rel: str) -> None:
    """No exception in the raw data: every gold title is among the context titles."""
    for s in loaded[rel]:
        titles = {p.title for p in s.context}
        assert s.supporting_titles, s.id
        assert set(s.supporting_titles) <= titles, (s.id, set(s.supporting_titles) - titles)
        gold = {p.title for p in s.context if p.is_supporting}
        assert gold == set(s.supporting_titles), s.id
        if s.dataset != "musique":
            assert s.hops == len(s.supporting_titles)


def test_musique_hops(loaded: dict[str, list[QASample]]) -> None:
    samples = loaded["musique/migres_musique_dev_200.jsonl"]
    assert Counter(s.hops for s in samples) == {2: 145, 3: 32, 4: 23}
    assert Counter(s.type for s in samples) == {
        "2hop": 145,
        "3hop1": 28,
        "3hop2": 4,
        "4hop1": 18,
        "4hop2": 1,
        "4hop3": 4,
    }
    for s in samples:
        assert len(s.context) == 20
        assert len(s.supporting_ids) == s.hops  # one gold paragraph per hop
    # Known, counted exception: in 10 questions two hops' gold paragraphs come from the
    # same article, so there are fewer distinct supporting titles than hops.
    assert sum(len(s.supporting_titles) < (s.hops or 0) for s in samples) == 10


def test_hotpotqa_and_2wiki_shapes(loaded: dict[str, list[QASample]]) -> None:
    ircot = loaded["hotpotqa/ircot_hotpotqa_dev_subsampled_500.jsonl"]
    assert sum(len(s.context) == 10 for s in ircot) == 489  # PROVENANCE: 10 for 489 of 500
    assert all(s.type is None and s.hops == 2 for s in ircot)
    hp = loaded["hotpotqa/hipporag_hotpotqa_train_100.json"]
    assert Counter(s.type for s in hp) == {"bridge": 78, "comparison": 22}
    wiki = loaded["2wikimultihopqa/migres_2wiki_train_500_decomposed.json"]
    assert Counter((s.type, s.hops) for s in wiki) == {
        ("compositional", 2): 227,
        ("comparison", 2): 162,
        ("bridge_comparison", 4): 92,
        ("inference", 2): 19,
    }
    # Known quirk of 2Wiki: 23 questions repeat a distractor paragraph verbatim (27 extra
    # copies), never a gold one; the loader keeps the context as published.
    repeats = [len(s.context) - len({(p.title, p.text) for p in s.context}) for s in wiki]
    assert sum(r > 0 for r in repeats) == 23 and sum(repeats) == 27
    for s in wiki:
        gold = [(p.title, p.text) for p in s.context if p.is_supporting]
        assert len(gold) == len(set(gold))


@pytest.mark.parametrize("rel", list(CORPUS_EXPECTED))
def test_corpus_file_loads(data_dir: Path, rel: str) -> None:
    fmt, count = CORPUS_EXPECTED[rel]
    assert detect_format(data_dir / rel) == fmt
    passages = load_corpus_file(data_dir / rel)
    assert len({p.title for p in passages}) == count
    assert all(p.text and p.id == paragraph_id(p.title, p.text) for p in passages)
    with pytest.raises(DataFormatError, match="load_corpus_file"):
        load_file(data_dir / rel)


def test_same_paragraph_same_id_across_formats(
    data_dir: Path, loaded: dict[str, list[QASample]]
) -> None:
    """Normalization makes one paragraph one id, whatever layout it was published in."""

    def ids(rel: str) -> set[str]:
        return {p.id for s in loaded[rel] for p in s.context}

    corpus = {
        p.id
        for p in load_corpus_file(data_dir / "hotpotqa/hipporag_hotpotqa_train_100_corpus.json")
    }
    assert corpus == ids("hotpotqa/hipporag_hotpotqa_train_100.json")  # dict vs [[t, [s]]]
    rpt = ids("hotpotqa/rpt_hotpotqa_devsplit_dev_300.jsonl") | ids(
        "hotpotqa/rpt_hotpotqa_devsplit_train_300.jsonl"
    )
    assert len(ids("hotpotqa/ircot_hotpotqa_dev_subsampled_500.jsonl") & rpt) == 482  # text vs HF


def test_dedupe_real_data(all_samples: list[QASample]) -> None:
    kept = dedupe(all_samples)
    assert len(all_samples) == 11898
    assert len(kept) == 11527  # overlaps: stage1/stage2 201, MuSiQue 44, HotpotQA dev ~108, ...
    assert len({s.id for s in kept}) == len(kept)
    assert len({normalize_question(s.question) for s in kept}) == len(kept)
    with_context = {normalize_question(s.question) for s in all_samples if s.context}
    assert all(s.context for s in kept if normalize_question(s.question) in with_context)
    assert sum(bool(s.context) for s in kept) == 1862
    assert load_dataset_name("musique")[0].dataset == "musique"
    assert {p.name for p in qa_files(dataset="musique")} == {
        "migres_musique_dev_200.jsonl",
        "r1searcher_musique_dev_500.jsonl",
    }


def test_corpus_real_data(data_dir: Path, all_samples: list[QASample]) -> None:
    corpus = corpus_paragraphs(all_samples)
    ids = [p.id for p in corpus]
    assert len(corpus) == 17483
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert len({(p.title, p.text) for p in corpus}) == len(corpus)
    known = set(ids)
    for s in all_samples:
        task = s.to_task()
        assert set(task.metadata.get("supporting", [])) <= known
    extras = [data_dir / rel for rel in CORPUS_EXPECTED]
    bigger = corpus_paragraphs(all_samples[::-1], extras[::-1])
    assert len(bigger) == 35893
    assert known <= {p.id for p in bigger}
    assert corpus_paragraphs(all_samples, extras) == bigger  # input order does not matter


# ------------------------------------------------------------- malformed input


def write_jsonl(path: Path, lines: list[str | dict]) -> Path:
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return path


def qa(idx: int, question: str = "Who?", answer: object = "Ann") -> dict:
    return {"idx": idx, "question": question, "answer": answer}


def test_bad_json_line_names_file_and_line(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", [qa(1), "{not json", qa(3)])
    with pytest.raises(DataFormatError, match=r"bad\.jsonl, line 2, column 2: invalid JSON") as e:
        load_file(path)
    assert (e.value.line, e.value.column, e.value.path) == (2, 2, path)


def test_missing_question_names_field(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "q.jsonl", [qa(1), {"idx": 2, "answer": "x", "question_x": 1}])
    with pytest.raises(DataFormatError, match=r"q\.jsonl, line 2: field 'question': missing"):
        load_file(path, "qa_only")


@pytest.mark.parametrize("answer", [3, None, [], ["ok", 4], "  "])
def test_answer_of_wrong_type(tmp_path: Path, answer: object) -> None:
    path = write_jsonl(tmp_path / "a.jsonl", [qa(1), qa(2, answer=answer)])
    with pytest.raises(DataFormatError, match=r"line 2: field 'answer.*expected") as e:
        load_file(path)
    assert e.value.field is not None and e.value.field.startswith("answer")


def test_answer_list_and_aliases(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "a.jsonl", [qa(1, answer=[" Ann ", "Anne", "Ann"])])
    assert load_file(path)[0].answers == ("Ann", "Anne")


def test_json_array_errors_name_the_record_index(tmp_path: Path) -> None:
    good = {
        "_id": "a1",
        "question": "Q?",
        "answer": "A",
        "type": "bridge",
        "level": "easy",
        "supporting_facts": [["T1", 0]],
        "context": [["T1", ["Text one."]], ["T2", ["Text", " two."]]],
    }
    bad = {**good, "_id": "a2", "context": [["T1", "not a list"]]}
    path = tmp_path / "h.json"
    path.write_text(json.dumps([good, bad]))
    with pytest.raises(DataFormatError, match=r"h\.json, record 1: field 'context\[0\]\[1\]'"):
        load_file(path)
    path.write_text(json.dumps([good]))
    (s,) = load_file(path)
    assert s.context == (Paragraph("T1", "Text one.", True), Paragraph("T2", "Text two.", False))
    assert (s.hops, s.type, s.supporting_titles) == (1, "bridge", ("T1",))


def test_nested_field_errors(tmp_path: Path) -> None:
    rec = {
        "question_id": "q1",
        "question_text": "Q?",
        "answers_objects": [{"spans": ["A"], "number": "", "date": {}}],
        "contexts": [{"title": "T", "paragraph_text": "P", "is_supporting": "yes"}],
    }
    path = write_jsonl(tmp_path / "i.jsonl", [rec])
    with pytest.raises(DataFormatError, match=r"'contexts\[0\]\.is_supporting': expected true"):
        load_file(path)
    hf = {
        "id": "h1",
        "question": "Q?",
        "answer": "A",
        "supporting_facts": {"title": ["T"], "sent_id": [0]},
        "context": {"title": ["T", "U"], "sentences": [["s"]]},
    }
    path = write_jsonl(tmp_path / "hf.jsonl", [hf])
    with pytest.raises(DataFormatError, match=r"'context': title has 2 items but sentences has 1"):
        load_file(path)


def test_musique_hops_must_agree(tmp_path: Path) -> None:
    rec = {
        "id": "3hop1__1_2_3",
        "question": "Q?",
        "answer": "A",
        "answer_aliases": ["a"],
        "paragraphs": [{"idx": 0, "title": "T", "paragraph_text": "P", "is_supporting": True}],
        "question_decomposition": [{"id": 1, "question": "q", "answer": "a"}] * 2,
    }
    path = write_jsonl(tmp_path / "m.jsonl", [rec])
    with pytest.raises(DataFormatError, match="id says 3 hops but question_decomposition has 2"):
        load_file(path)


def test_ambiguous_and_unknown_formats(tmp_path: Path) -> None:
    core = {"_id": "x", "question": "Q?", "answer": "A", "supporting_facts": [], "context": []}
    path = write_jsonl(tmp_path / "core.jsonl", [core])
    with pytest.raises(DataFormatError, match=r"core\.jsonl.*ambiguous.*hotpotqa and 2wiki"):
        load_file(path)
    assert load_file(path, "2wiki", dataset="mine")[0].dataset == "mine"
    path = write_jsonl(tmp_path / "odd.jsonl", [{"foo": 1}])
    with pytest.raises(DataFormatError, match=r"odd\.jsonl.*unknown format.*\['foo'\]"):
        load_file(path)
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DataFormatError, match="no records"):
        load_file(tmp_path / "empty.jsonl")
    with pytest.raises(DataFormatError, match="unknown format 'nope'"):
        load_file(write_jsonl(tmp_path / "ok.jsonl", [qa(1)]), "nope")


def test_skip_mode_reports_what_it_dropped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write_jsonl(tmp_path / "s.jsonl", [qa(1), "{", qa(3, answer=7), qa(4)])
    with caplog.at_level(logging.WARNING):
        result = load(path, on_error="skip")
    assert [s.id for s in result.samples] == ["s:1", "s:4"]
    assert [e.line for e in result.skipped] == [2, 3]
    assert "skipped 2 malformed record(s)" in caplog.text
    path = write_jsonl(tmp_path / "first.jsonl", ["{", qa(2)])  # format from the first good one
    assert [s.id for s in load_file(path, on_error="skip")] == ["first:2"]
    with pytest.raises(DataFormatError, match="line 1, column 2: invalid JSON"):
        load_file(path)


def test_default_data_dir_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("AGENTR1_DATA", str(tmp_path))
    assert default_data_dir() == tmp_path
    monkeypatch.delenv("AGENTR1_DATA")
    assert default_data_dir().parts[-3:] == ("shared", "data", "raw")


# ---------------------------------------------------------- dedupe and split


def sample(sid: str, question: str, context: bool = False) -> QASample:
    paras = (Paragraph(f"T{sid}", f"text {sid}", True),) if context else ()
    return QASample(sid, question, ("a",), "toy", context=paras, supporting_titles=())


def test_dedupe_rules() -> None:
    a = sample("1", "Who wrote Hamlet?")
    same_id = sample("1", "Something else")
    same_q = sample("2", "who  wrote: HAMLET")
    with_ctx = sample("3", "Who wrote Hamlet", context=True)
    b = sample("4", "Where is Paris?")
    out = dedupe([a, b, same_id, same_q, with_ctx])
    assert out == [with_ctx, b]  # first kept at its place, replaced by the copy with context
    assert dedupe(out) == out
    assert dedupe([with_ctx, a]) == [with_ctx]  # a copy without context never replaces one


def test_split_is_seeded_disjoint_and_order_free() -> None:
    samples = [sample(f"id{i}", f"question {i}") for i in range(103)]
    parts = split(samples, (0.8, 0.1, 0.1), seed=7)
    assert {k: len(v) for k, v in parts.items()} == {"train": 82, "dev": 11, "test": 10}
    ids = [s.id for v in parts.values() for s in v]
    assert sorted(ids) == sorted(s.id for s in samples)  # disjoint and complete
    shuffled = samples[:]
    random.Random(0).shuffle(shuffled)
    assert split(shuffled, (0.8, 0.1, 0.1), seed=7) == parts
    assert split(samples, (0.8, 0.1, 0.1), seed=8)["test"] != parts["test"]
    counts = split(samples, {"train": 50, "test": 20}, seed=7)
    assert [len(v) for v in counts.values()] == [50, 20]
    assert counts["train"] == parts["train"][:50]  # same hash order, different cuts


@pytest.mark.parametrize(
    "sizes, message",
    [
        ((0.5, 0.5), "train, dev, test"),
        ({"train": 0.9, "test": 0.2}, "sum to"),
        ({"train": 100, "test": 10}, "ask for 110"),
        ({"train": 0.5, "test": 3}, "as fractions or all as counts"),
        ({"train": -0.1}, "non-negative"),
    ],
)
def test_split_rejects_bad_sizes(sizes: object, message: str) -> None:
    samples = [sample(str(i), f"q{i}") for i in range(10)]
    with pytest.raises(ValueError, match=message):
        split(samples, sizes, seed=0)  # type: ignore[arg-type]


def test_split_needs_unique_ids() -> None:
    with pytest.raises(ValueError, match="dedupe"):
        split([sample("1", "a"), sample("1", "b")], (1.0, 0.0, 0.0))


# ---------------------------------------------------------- tasks and corpus


def test_to_task_metadata() -> None:
    gold = Paragraph("A", "Alpha text.", True)
    s = QASample(
        "q1",
        "Q?",
        ("Ann", "Anne"),
        "hotpotqa",
        type="bridge",
        hops=2,
        supporting_titles=("A",),
        context=(gold, Paragraph("B", "Beta.", False)),
        source="f.json",
    )
    task = s.to_task()
    assert (task.id, task.question, task.answers) == ("q1", "Q?", ["Ann", "Anne"])
    assert task.metadata == {
        "dataset": "hotpotqa",
        "source": "f.json",
        "type": "bridge",
        "hops": 2,
        "supporting_titles": ["A"],
        "supporting": [paragraph_id("A", "Alpha text.")],
    }
    bare = QASample("q2", "Q?", ("x",), "train_mixed", source="g.jsonl").to_task()
    assert bare.metadata == {"dataset": "train_mixed", "source": "g.jsonl"}  # no None values


def test_corpus_dedupes_and_reads_extras(tmp_path: Path) -> None:
    s1 = QASample("1", "q1", ("a",), "t", context=(Paragraph("A", "x", True), Paragraph("B", "y")))
    s2 = QASample("2", "q2", ("a",), "t", context=(Paragraph("A", "x", False),))
    extra = tmp_path / "corpus.json"
    extra.write_text(json.dumps([{"title": "C", "text": " z  z "}, {"title": "A", "text": "x"}]))
    corpus = corpus_paragraphs([s2, s1], [extra])
    assert sorted((p.title, p.text) for p in corpus) == [("A", "x"), ("B", "y"), ("C", "z z")]
    assert [p.id for p in corpus] == sorted(p.id for p in corpus)
    assert Passage(paragraph_id("A", "x"), "A", "x") in corpus
    kilt = write_jsonl(
        tmp_path / "k.jsonl",
        [
            {
                "wikipedia_title": "K",
                "text": [
                    "K\n",
                    "Intro.\n",
                    "Section::::H.\n",
                    "BULLET::::- a\n",
                    "BULLET::::- b\n",
                    "End.\n",
                ],
            }
        ],
    )
    assert [p.text for p in load_corpus_file(kilt)] == ["Intro.", "- a - b", "End."]
    assert detect_format(kilt) in CORPUS_FORMATS and "qa_only" in QA_FORMATS
