"""``agentr1 serve retriever --data``: the served corpus is the one a QA run builds."""

from __future__ import annotations

import pytest

from agentr1.cli import data_corpus, main
from agentr1.data import corpus_paragraphs, default_data_dir, load_file

FILE = "hotpotqa/hipporag_hotpotqa_train_100.json"
needs_data = pytest.mark.skipif(
    not (default_data_dir() / FILE).is_file(), reason="raw data not on this machine"
)


@needs_data
def test_data_corpus_is_the_files_context_paragraphs() -> None:
    got = data_corpus([FILE], None, wiki=False)
    want = corpus_paragraphs(load_file(default_data_dir() / FILE))
    assert [p.id for p in got] == [p.id for p in want] and len(got) > 500
    assert all(p.id.startswith("p:") for p in got)


@needs_data
def test_a_folder_and_a_file_in_it_give_each_passage_once() -> None:
    one = {p.id for p in data_corpus([FILE], None, wiki=False)}
    folder = [p.id for p in data_corpus(["hotpotqa", FILE], None, wiki=False)]
    assert len(folder) == len(set(folder)) and one < set(folder)


def test_unknown_entry_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["serve", "retriever", "--data", "no/such/file.jsonl"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "--data: 'no/such/file.jsonl' is not a file" in err


def test_corpus_and_data_are_exclusive(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "retriever", "--corpus", "c.jsonl", "--data", FILE])
    assert "not allowed with argument" in capsys.readouterr().err
