"""`agentr1 qa-eval` end to end on a tiny random model and a temp JSONL file, its errors, and
the baselines' answer parsing with a scripted generator."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentr1.backends.scripted import ScriptedGenerator
from agentr1.cli import main
from agentr1.retrieval.base import Passage
from agentr1.rollout import RolloutConfig
from agentr1.tasks.multihop_qa.baselines import base_tool_call, naive_rag
from agentr1.types import Task
from tests.fakes import byte_chat
from tests.integration.test_qa_env import (
    FakeRetriever,
    ircot_record,
    save_tiny_chatml_model,
    write_jsonl,
)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_chatml_model(tmp_path_factory.mktemp("tiny"))


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main(["qa-eval", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_eval_writes_a_paper_shaped_report(
    tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = write_jsonl(tmp_path / "hotpotqa" / "dev.jsonl", [ircot_record(i) for i in range(3)])
    out = tmp_path / "out"
    rc, stdout, err = run_cli(
        [
            "--model", str(tiny_model),
            "--data", data,
            "--corpus", "eval",
            "--max-tasks", "2",
            "--max-turns", "2",
            "--max-tokens-per-turn", "8",
            "--top-k", "2",
            "--passage-words", "3",
            "--data-dir", str(tmp_path),
            "--out", str(out),
        ],
        capsys,
    )  # fmt: skip
    assert rc == 0, err
    res = json.loads((out / "results.json").read_text())
    rows = {(r["method"], r["dataset"]): r for r in res["rows"]}
    assert set(rows) == {("naive_rag", "hotpotqa"), ("tool_call", "hotpotqa")}
    for r in rows.values():
        assert r["n"] == 2 and 0.0 <= r["em"] <= r["cover_em"] <= 1.0
        assert abs(sum(r["stop_reasons"].values()) - 1.0) < 1e-9
    assert rows[("naive_rag", "hotpotqa")]["turns"] == 1.0
    assert res["meta"]["corpus_passages"] == 9  # 3 records x 3 paragraphs, not just 2
    assert res["meta"]["passage_words"] == 3
    md = (out / "results.md").read_text()
    assert "| method | hotpotqa | Avg |" in md and "| Naive RAG (" in md and "| Tool Call (" in md
    assert "| method | hotpotqa | Avg |" in stdout
    lines = (out / "episodes.jsonl").read_text().splitlines()
    assert len(lines) == 4 and {"question", "gold", "answer", "text"} <= set(json.loads(lines[0]))


def test_eval_errors_name_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = str(tmp_path / "nope.jsonl")
    rc, _, err = run_cli(["--model", "x", "--data", missing], capsys)
    assert rc == 2 and "nope.jsonl" in err and "no such file" in err

    odd = write_jsonl(tmp_path / "odd.jsonl", [{"foo": 1}])
    rc, _, err = run_cli(["--model", "x", "--data", odd], capsys)
    assert rc == 2 and "odd.jsonl" in err and "unknown format" in err

    ircot = write_jsonl(tmp_path / "q.jsonl", [ircot_record(0)])
    rc, _, err = run_cli(["--model", "x", "--data", ircot, "--format", "musique"], capsys)
    assert rc == 2 and "q.jsonl" in err and "'id'" in err  # names the missing field

    rc, _, err = run_cli(["--model", "x", "--data", ircot, "--retriever", "bm42"], capsys)
    assert rc == 2 and "bm42" in err


def test_eval_data_folder_skips_an_unreadable_file_and_names_it(
    tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`agentr1 eval --data FOLDER --on-error skip` (no recipe: the QA evaluation) evaluates
    the good file and reports the one it cannot read, in the log and results.json."""
    folder = tmp_path / "mine"
    write_jsonl(folder / "good.jsonl", [ircot_record(i) for i in range(3)])
    (folder / "bad.jsonl").write_bytes(b'{"question": "caf\xe9?", "answer": "x"}\n')  # Latin-1
    out = tmp_path / "out"
    args = [
        "eval", "--model", str(tiny_model), "--data", str(folder), "--method", "naive_rag",
        "--max-tokens-per-turn", "4", "--data-dir", str(tmp_path), "--out", str(out),
    ]  # fmt: skip  # the default corpus: the data dir's contexts, whose scan meets bad.jsonl
    rc = main(args)
    _, err = capsys.readouterr()
    assert rc == 2 and "bad.jsonl, line 1, byte offset 17: not UTF-8 (byte 0xe9)" in err
    assert "--on-error skip" in err  # the way past it
    rc = main([*args, "--on-error", "skip"])
    _, err = capsys.readouterr()
    assert rc == 0, err
    assert "running `agentr1 qa-eval`" in err and "skipped: " in err and "bad.jsonl" in err
    res = json.loads((out / "results.json").read_text())
    assert [(r["dataset"], r["n"]) for r in res["rows"]] == [("mine", 3)]
    assert res["meta"]["files"] == {"mine": [str(folder / "good.jsonl")]}
    (skipped,) = res["meta"]["skipped"]
    assert skipped["file"] == str(folder / "bad.jsonl") and skipped["line"] == 1
    assert "not UTF-8" in skipped["reason"]  # once, though both the data and the corpus scan met it
    assert res["meta"]["corpus_passages"] == 9
    assert (
        "Left out: 1 malformed record(s) or unreadable file(s)" in (out / "results.md").read_text()
    )


def test_eval_bad_records_and_empty_corpus_are_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    qonly = write_jsonl(tmp_path / "open" / "q.jsonl", [{"Question": "Q?", "answer": ["A"]}])
    rc, _, err = run_cli(["--model", "x", "--data", qonly, "--corpus", "eval"], capsys)
    assert rc == 2 and "--corpus eval: the corpus is empty" in err and "q.jsonl" in err
    assert "--corpus contexts+wiki" in err and "--retriever http://" in err
    rc, _, err = run_cli(["--model", "x", "--fields", "question=Q", "--data", qonly], capsys)
    assert rc == 2 and "--fields: answers must be named" in err
    rc = main(["eval", "recipe.yaml", "--data", qonly])
    assert rc == 2 and "a recipe's eval takes its questions from the recipe" in (
        capsys.readouterr().err
    )


# ------------------------------------------------------------------ baselines


def scripted(reply: str, seen: list[str]) -> ScriptedGenerator:
    chat = byte_chat()

    def respond(context: str) -> str:
        seen.append(context)
        return reply

    return ScriptedGenerator(respond, chat.encode, chat.decode, chat.end_of_turn_id)


TASK = Task("q1", "Who served as Chief of Protocol?", ["Shirley Temple"], {"hops": 2})
ROLLOUT = RolloutConfig(max_turns=3, max_tokens_per_turn=200, max_context=10_000)


def test_naive_rag_puts_passages_in_the_prompt_and_reads_the_answer_tag() -> None:
    seen: list[str] = []
    res = naive_rag(
        [TASK], FakeRetriever(also={TASK.question: ["Shirley Temple"]}),
        scripted("<answer>Shirley Temple</answer>", seen), byte_chat(), top_k=2, rollout=ROLLOUT,
    )  # fmt: skip
    assert "[1] Shirley Temple\nShirley Temple served as Chief of Protocol." in seen[0]
    assert "<tools>" not in seen[0]  # no tool listing in the prompt
    assert res.score == 1.0 and res.stop_reasons == {"answered": 1.0}
    assert res.by_group["all"]["turns"] == 1.0 and res.by_group["all"]["tool_calls"] == 0.0
    seen.clear()
    naive_rag(
        [TASK], FakeRetriever(also={TASK.question: ["Shirley Temple"]}),
        scripted("<answer>x</answer>", seen), byte_chat(), top_k=1, rollout=ROLLOUT,
        passage_words=2,
    )  # fmt: skip
    assert "[1] Shirley Temple\nShirley Temple ...\n" in seen[0]


def test_naive_rag_falls_back_to_the_first_line_without_a_tag() -> None:
    res = naive_rag(
        [TASK], FakeRetriever(), scripted("\nShirley Temple.\nShe was ...", []), byte_chat(),
        rollout=ROLLOUT,
    )  # fmt: skip
    (t,) = res.trajectories
    assert t.answer == "Shirley Temple." and res.score == 1.0
    assert res.stop_reasons == {"no_tool_call": 1.0} and t.metrics["untagged_answer"] == 1.0


def test_base_tool_call_runs_the_multi_turn_search_env() -> None:
    calls = iter(
        ['<tool_call>{"name": "search", "arguments": {"query": "Shirley Temple"}}</tool_call>']
    )
    chat = byte_chat()
    gen = ScriptedGenerator(
        lambda ctx: next(calls, "<answer>Shirley Temple</answer>"),
        chat.encode,
        chat.decode,
        chat.end_of_turn_id,
    )
    res = base_tool_call([TASK], FakeRetriever(), gen, chat, top_k=1, rollout=ROLLOUT)
    assert res.score == 1.0 and res.by_group["all"]["tool_calls"] == 1.0
    assert res.by_group["all"]["turns"] == 2.0 and "hops=2" in res.by_group


def test_passage_type_is_the_retrieval_one() -> None:
    assert FakeRetriever().search("Shirley Temple", 1)[0] == Passage(
        "p2", "Shirley Temple", "Shirley Temple served as Chief of Protocol."
    )


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ("", "model.path is empty"),
        ("/nonexistent/model", "model '/nonexistent/model': no such directory"),
    ],
)
def test_train_with_no_model_is_one_line_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], model: str, message: str
) -> None:
    """``agentr1 train`` without a usable ``model.path`` ended in a traceback from deep in
    transformers (an empty path) or in the model resolver."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f'task:\n  name: world\nmodel:\n  path: "{model}"\ntrain:\n  steps: 1\n')
    assert main(["train", str(recipe), f"train.run_dir={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
