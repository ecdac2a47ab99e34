"""agentr1.data on the field's other question files and on bad input: FlashRAG, Search-o1,
question-only layouts, a field mapping, MuSiQue's unanswerable records; bad records,
bytes that are not UTF-8, truncated arrays and unreadable files cost only themselves with
``on_error="skip"`` and are named (file, line, reason) either way.

Every fixture is synthetic, written here.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from agentr1.data import (
    DataFormatError,
    Loader,
    Paragraph,
    detect_format,
    load,
    load_file,
    parse_fields,
    qa_files,
)


def jsonl(path: Path, records: list[Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = (r if isinstance(r, str) else json.dumps(r) for r in records)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def array(path: Path, records: list[Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(records, indent=1), encoding="utf-8")
    return path


def two_wiki(i: int, context: bool = True) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "_id": f"w{i}",
        "type": "comparison",
        "question": f"Who is older, A{i} or B{i}?",
        "answer": f"A{i}",
        "supporting_facts": [[f"A{i}", 0], [f"B{i}", 0]],
        "evidences": [],
    }
    if context:
        rec["context"] = [[f"A{i}", [f"A{i} was born in 1900."]], [f"B{i}", ["B was born later."]]]
    return rec


def musique(i: int, answerable: bool) -> dict[str, Any]:
    return {
        "id": f"2hop__{i}_{i + 1}",
        "question": f"Where was the founder of C{i} born?",
        "answer": f"Town {i}",
        "answer_aliases": [],
        "answerable": answerable,
        "paragraphs": [
            {"idx": 0, "title": f"C{i}", "paragraph_text": "Founded by F.", "is_supporting": True},
            {"idx": 1, "title": "F", "paragraph_text": "F is a person.", "is_supporting": False},
        ],
        "question_decomposition": [
            {"id": 1, "question": "q1", "answer": "F", "paragraph_support_idx": 0},
            {"id": 2, "question": "q2", "answer": f"Town {i}", "paragraph_support_idx": None},
        ],
    }


# ---------------------------------------------------------------------- formats


def test_flashrag_jsonl_and_its_metadata(tmp_path: Path) -> None:
    path = jsonl(
        tmp_path / "nq" / "dev.jsonl",
        [
            {"id": "test_0", "question": "Who wrote Hamlet?", "golden_answers": ["Shakespeare"],
             "metadata": {}},
            {"id": "test_1", "question": "Capital of France?",
             "golden_answers": ["Paris", " Paris ", "Paris, France"]},
        ],
    )  # fmt: skip
    assert detect_format(path) == "flashrag"
    res = load(path)
    assert [(s.id, s.answers, s.dataset, s.context) for s in res.samples] == [
        ("nq/dev:test_0", ("Shakespeare",), "nq", ()),
        ("nq/dev:test_1", ("Paris", "Paris, France"), "nq", ()),
    ]
    hotpot = jsonl(
        tmp_path / "hotpotqa" / "dev.jsonl",
        [
            {
                "id": "5a8b",
                "question": "Which magazine was started first?",
                "golden_answers": ["Arthur's Magazine"],
                "metadata": {
                    "type": "comparison",
                    "level": "medium",
                    "supporting_facts": {"title": ["Arthur's Magazine"], "sent_id": [0]},
                    "context": {
                        "title": ["Arthur's Magazine", "First for Women"],
                        "sentences": [["Arthur's Magazine was a  monthly."], ["A magazine."]],
                    },
                },
            }
        ],
    )
    (s,) = load_file(hotpot)
    assert (s.id, s.dataset, s.type, s.hops) == ("hotpotqa/dev:5a8b", "hotpotqa", "comparison", 1)
    assert s.context == (
        Paragraph("Arthur's Magazine", "Arthur's Magazine was a monthly.", True),
        Paragraph("First for Women", "A magazine.", False),
    )
    bad = jsonl(
        tmp_path / "x" / "bad.jsonl",
        [{"id": 1, "question": "Q?", "golden_answers": ["a"], "metadata": {"context": 3}}],
    )
    with pytest.raises(DataFormatError, match=r"line 1: field 'metadata.context': expected"):
        load_file(bad)


def test_search_o1_json_array(tmp_path: Path) -> None:
    path = array(
        tmp_path / "QA_Datasets" / "hotpotqa.json",
        [
            {"id": 0, "Question": "Who directed Jaws?", "answer": ["Steven Spielberg"]},
            {"id": 1, "Question": "Where is Kyoto?", "answer": ["Japan", "Honshu"]},
        ],
    )
    assert detect_format(path) == "questions"
    res = load(path)
    assert res.dataset == "hotpotqa"  # the name says so
    assert [(s.id, s.question, s.answers) for s in res.samples] == [
        ("QA_Datasets/hotpotqa:0", "Who directed Jaws?", ("Steven Spielberg",)),
        ("QA_Datasets/hotpotqa:1", "Where is Kyoto?", ("Japan", "Honshu")),
    ]


@pytest.mark.parametrize(
    "rec, want",
    [
        ({"question": "Q?", "answers": ["A", "B"]}, ("q:0", ("A", "B"))),  # no id: position
        ({"qid": "x7", "query": "Q?", "golden_answers": "A"}, ("q:x7", ("A",))),
        ({"_id": 5, "question": "Q?", "answer": "A", "context": ""}, ("q:5", ("A",))),
        ({"id": "a", "question": "Q?", "gold_answer": "A", "context": None, "ctxs": []},
         ("q:a", ("A",))),
    ],
)  # fmt: skip
def test_question_only_layouts(tmp_path: Path, rec: dict[str, Any], want: tuple) -> None:
    path = jsonl(tmp_path / "open" / "q.jsonl", [rec])
    assert detect_format(path) == "questions"
    (s,) = load_file(path)
    assert (s.id.removeprefix("open/"), s.answers) == want and s.question == "Q?"
    assert s.context == () and s.dataset == "open"


def test_r1searcher_layout_with_an_empty_context_keeps_its_ids(tmp_path: Path) -> None:
    path = jsonl(
        tmp_path / "r1.jsonl", [{"idx": 3, "question": "Q?", "answer": "A", "context": ""}]
    )
    assert detect_format(path) == "qa_only"
    assert [s.id for s in load_file(path)] == ["r1:3"]


def test_question_only_record_with_paragraphs_is_an_error_not_a_silent_drop(
    tmp_path: Path,
) -> None:
    path = jsonl(
        tmp_path / "q.jsonl",
        [{"question": "Q?", "answer": "A", "context": ""},
         {"question": "R?", "answer": "B", "context": "A whole paragraph."}],
    )  # fmt: skip
    with pytest.raises(DataFormatError, match=r"line 2: field 'context': a question-only file"):
        load_file(path)


def test_fields_map_any_layout(tmp_path: Path) -> None:
    path = jsonl(
        tmp_path / "odd" / "f.jsonl",
        [{"Q": "Who?", "meta": {"gold": ["Ann", "Anne"]}, "key": "k1"},
         {"Q": "What?", "meta": {"gold": "Bob"}, "key": "k2"}],
    )  # fmt: skip
    with pytest.raises(DataFormatError, match=r"unknown format.*fields="):
        load_file(path)
    fields = "question=Q,answers=meta.gold,id=key"
    assert [(s.id, s.answers) for s in load_file(path, fields=fields)] == [
        ("odd/f:k1", ("Ann", "Anne")),
        ("odd/f:k2", ("Bob",)),
    ]
    with pytest.raises(DataFormatError, match=r"line 1: field 'Question': missing \(fields="):
        load_file(path, fields="question=Question,answers=meta.gold")
    assert parse_fields({"question": "a", "answers": "b"}) == {"question": "a", "answers": "b"}
    for bad, msg in [
        ("question=Q", "answers must be named"),
        ("question=Q,answers", "NAME=KEY"),
        ("question=Q,answers=a,title=t", r"unknown name\(s\) \['title'\]"),
    ]:
        with pytest.raises(ValueError, match=msg):
            parse_fields(bad)
    # A folder scan with a mapping counts the files no rule detects as question files.
    assert qa_files(tmp_path / "odd", fields=fields) == [path]


def test_musique_unanswerable_records_are_counted_or_kept(tmp_path: Path) -> None:
    path = jsonl(tmp_path / "musique" / "full.jsonl", [musique(1, True), musique(2, False)])
    res = load(path)
    assert [s.id for s in res.samples] == ["2hop__1_2"]
    assert res.unanswerable == ["2hop__2_3"] and res.skipped == []
    kept = load(path, unanswerable="keep")
    assert [(s.id, s.answerable, s.answers) for s in kept.samples] == [
        ("2hop__1_2", True, ("Town 1",)),
        ("2hop__2_3", False, ("Town 2",)),
    ]
    assert kept.samples[1].to_task().metadata["answerable"] is False
    assert "answerable" not in kept.samples[0].to_task().metadata
    with pytest.raises(DataFormatError, match="'answerable': expected true or false"):
        load_file(jsonl(tmp_path / "m2.jsonl", [{**musique(3, True), "answerable": "no"}]))
    flash = jsonl(
        tmp_path / "musique" / "dev.jsonl",
        [{"id": "m", "question": "Q?", "golden_answers": ["A"], "metadata": {"answerable": False}}],
    )
    assert load(flash).unanswerable == ["musique/dev:m"]
    loader = Loader()
    assert loader(path) == res.samples and loader.report()["unanswerable"] == {str(path): 1}


# ------------------------------------------------------------------ bad input


def test_records_without_context_are_skipped_and_named(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """2WikiMultihopQA with a few records missing `context`: skip mode reads the rest."""
    recs = [two_wiki(i, context=i % 5 != 3) for i in range(10)]
    path = jsonl(tmp_path / "2wikimultihopqa" / "dev.jsonl", recs)
    with pytest.raises(DataFormatError, match=r"dev\.jsonl, line 4: field 'context': missing"):
        load_file(path)
    with caplog.at_level(logging.WARNING):
        res = load(path, on_error="skip")
    assert len(res.samples) == 8 and [e.line for e in res.skipped] == [4, 9]
    assert all(e.field == "context" and e.reason == "missing" for e in res.skipped)
    assert "dev.jsonl, line 4: field 'context': missing" in caplog.text
    assert "dev.jsonl, line 9: field 'context': missing" in caplog.text  # every one, not the first
    rec = res.skipped[0].record()
    assert (rec["file"], rec["line"], rec["field"], rec["reason"]) == (
        str(path), 4, "context", "missing"
    )  # fmt: skip
    with pytest.raises(DataFormatError, match="line 4"):
        load(path, on_error="raise")  # the older name of "fail"
    with pytest.raises(ValueError, match="on_error must be 'fail' or 'skip'"):
        load(path, on_error="ignore")  # type: ignore[arg-type]


def test_a_byte_that_is_not_utf8_names_file_line_and_offset(tmp_path: Path) -> None:
    good = [json.dumps({"idx": i, "question": f"Q{i}?", "answer": "A"}) for i in range(3)]
    raw = (good[0] + "\n" + good[1].replace("Q1", "Q\xff1") + "\n" + good[2] + "\n").encode(
        "latin-1"
    )
    path = tmp_path / "enc.jsonl"
    path.write_bytes(raw)
    offset = raw.index(b"\xff")
    with pytest.raises(DataFormatError) as e:
        load_file(path)
    assert (e.value.line, e.value.offset) == (2, offset)
    assert f"enc.jsonl, line 2, byte offset {offset}: not UTF-8 (byte 0xff)" in str(e.value)
    res = load(path, on_error="skip")
    assert [s.id for s in res.samples] == ["enc:0", "enc:2"] and len(res.skipped) == 1
    # In a JSON array the record that holds the byte is the one skipped.
    recs = [{"Question": f"Q{i}?", "answer": ["A"]} for i in range(3)]
    text = json.dumps(recs, indent=1).replace("Q2?", "Q2\xff?")
    arr = tmp_path / "enc.json"
    arr.write_bytes(text.encode("latin-1"))
    res = load(arr, on_error="skip")
    assert [s.question for s in res.samples] == ["Q0?", "Q1?"]
    (err,) = res.skipped
    at = text.index("\xff")
    line = text[:at].count("\n") + 1
    assert (err.index, err.offset, err.line) == (2, at, line)  # one byte per character here
    with pytest.raises(
        DataFormatError, match=rf"enc\.json, line {line}, byte offset {at}, record 2"
    ):
        load_file(arr)


def test_a_truncated_json_array_names_line_and_column_and_keeps_what_is_complete(
    tmp_path: Path,
) -> None:
    recs = [{"question": f"Q{i}?", "answer": "A"} for i in range(3)]
    path = tmp_path / "cut.json"
    text = json.dumps(recs)
    path.write_text(text[:-12])  # inside the last record's answer
    with pytest.raises(DataFormatError) as e:
        load_file(path)
    assert e.value.line == 1 and e.value.column is not None and e.value.index == 2
    assert "truncated?" in str(e.value) and "at at" not in str(e.value)
    res = load(path, on_error="skip")
    assert [s.question for s in res.samples] == ["Q0?", "Q1?"] and res.skipped[0].index == 2
    path.write_text("[")
    with pytest.raises(DataFormatError, match=r"line 1, column 2.*truncated"):
        load_file(path)


def test_json_messages_have_no_doubled_words(tmp_path: Path) -> None:
    path = jsonl(tmp_path / "s.jsonl", ['{"question": "unterminated'])
    with pytest.raises(DataFormatError) as e:
        load_file(path, "questions")
    assert str(e.value).endswith("s.jsonl, line 1, column 14: invalid JSON (Unterminated string)")


def test_an_unreadable_file_in_a_folder_costs_only_itself(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    good = jsonl(tmp_path / "d" / "good.jsonl", [{"question": "Q?", "answer": "A"}])
    bad = jsonl(tmp_path / "d" / "odd.jsonl", [{"foo": 1}])
    (tmp_path / "d" / "broken.json").write_text("{nope")
    with pytest.raises(DataFormatError, match=r"broken\.json"):
        qa_files(tmp_path / "d")
    skipped: list[DataFormatError] = []
    with caplog.at_level(logging.WARNING):
        assert qa_files(tmp_path / "d", on_error="skip", skipped=skipped) == [good]
    assert sorted(e.path.name for e in skipped) == ["broken.json", "odd.jsonl"]
    assert "skipped file" in caplog.text and "odd.jsonl" in caplog.text
    loader = Loader("skip")
    assert loader(bad) == [] and loader.skipped[0].path == bad  # a named file too
    with pytest.raises(DataFormatError, match="unknown format"):
        Loader()(bad)
