"""The multi-hop QA task's data on bad input: ``task.config.on_error`` (what ``agentr1
train --on-error`` sets), ``fields`` and ``unanswerable`` reach every file read; a folder
with an unreadable file and a corpus with no paragraphs say what they are."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import pytest

from agentr1.cli import _on_error_override, data_corpus, main
from agentr1.data import Loader, resolve_entry
from agentr1.tasks.multihop_qa import QATaskConfig, data_report, load_qa_data
from tests.integration.test_qa_env import ircot_record, write_jsonl


def folder_with_a_bad_neighbour(tmp_path: Path) -> Path:
    write_jsonl(tmp_path / "mini" / "a.jsonl", [ircot_record(i) for i in range(4)])
    (tmp_path / "mini" / "b.jsonl").write_bytes(b'{"question_id": "x\xff"}\n')  # not UTF-8
    return tmp_path / "mini"


def test_on_error_skip_reaches_the_folder_scan_and_the_records(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder_with_a_bad_neighbour(tmp_path)
    with pytest.raises(ValueError, match=r"b\.jsonl, line 1, byte offset 18: not UTF-8"):
        resolve_entry("mini", tmp_path, "task.config.train")
    load = Loader("skip")
    assert [p.name for p in resolve_entry("mini", tmp_path, "x", load)] == ["a.jsonl"]
    assert [e.path.name for e in load.skipped] == ["b.jsonl"]

    bad = [ircot_record(i) for i in range(6)]
    del bad[2]["contexts"]
    data = write_jsonl(tmp_path / "d" / "q.jsonl", bad)
    qa = QATaskConfig(train=[data], eval={"a": [data]}, n_eval=2, data_dir=str(tmp_path))
    with pytest.raises(ValueError, match=r"q\.jsonl, line 3: field 'contexts': missing"):
        load_qa_data(qa)
    with caplog.at_level(logging.WARNING):
        out = load_qa_data(QATaskConfig(**{**qa.__dict__, "on_error": "skip"}))
    assert len(out.tasks["a"]) + len(out.tasks["train"]) == 5
    assert [(e.line, e.field) for e in out.skipped] == [(3, "contexts")]
    assert "q.jsonl, line 3: field 'contexts': missing" in caplog.text
    # what a train run's summary shows as "data": every record left out, named
    assert data_report(out) == {"skipped": [str(out.skipped[0])]}
    assert "q.jsonl, line 3" in data_report(out)["skipped"][0]


def test_train_and_eval_on_error_flag_is_the_task_config_override() -> None:
    assert _on_error_override(argparse.Namespace(on_error="skip")) == ["task.config.on_error=skip"]
    assert _on_error_override(argparse.Namespace(on_error=None)) == []
    with pytest.raises(ValueError, match="fields: answers must be named"):
        QATaskConfig(fields={"question": "Q"}).validate()
    cfg = QATaskConfig(fields={"question": "Q", "answers": "A"}, unanswerable="keep")
    cfg.validate()


def test_question_only_training_files_say_where_the_corpus_comes_from(tmp_path: Path) -> None:
    q = write_jsonl(
        tmp_path / "open" / "q.jsonl",
        [{"id": i, "Question": f"Q{i}?", "answer": ["A"]} for i in range(4)],
    )
    qa = QATaskConfig(train=[q], eval={"a": [q]}, n_eval=1, data_dir=str(tmp_path))
    with pytest.raises(ValueError, match=r"q\.jsonl\), and none has any.*contexts\+wiki"):
        load_qa_data(qa)
    served = QATaskConfig(**{**qa.__dict__, "retriever": "http://127.0.0.1:1"})
    assert load_qa_data(served).passages == []  # the server holds the corpus
    mapped = write_jsonl(tmp_path / "open" / "m.jsonl", [{"q": "Who?", "a": "Ann"}] * 2)
    load = Loader(fields={"question": "q", "answers": "a"})
    assert [s.id for s in load(Path(mapped))] == ["open/m:0", "open/m:1"]


def test_serve_data_skips_bad_files_and_names_an_empty_corpus(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder_with_a_bad_neighbour(tmp_path)
    assert len(data_corpus(["mini"], str(tmp_path), wiki=False, on_error="skip")) == 12
    rc = main(["serve", "retriever", "--data", "mini", "--data-dir", str(tmp_path)])
    assert rc == 2 and "b.jsonl, line 1, byte offset 18" in capsys.readouterr().err
    q = write_jsonl(tmp_path / "q.jsonl", [{"question": "Q?", "answer": "A"}])
    rc = main(["serve", "retriever", "--data", q])
    err = capsys.readouterr().err
    assert rc == 2 and "the corpus is empty" in err and "--wiki" in err and "--corpus" in err
