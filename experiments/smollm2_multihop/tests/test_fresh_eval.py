"""``fresh_eval.py``: the fresh questions follow the recipe's eval questions in
the split's seeded order and never include a question the recipe evaluates or trains on."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import fresh_eval
import pytest

from agentr1 import TaskSampler, demo_picks
from agentr1.config import Config, SFTConfig, TaskConfig, TrainConfig
from agentr1.data import normalize_question
from agentr1.tasks import task_config
from agentr1.tasks.multihop_qa import QATaskConfig as QAConfig
from agentr1.tasks.multihop_qa import load_qa_data
from tests.integration.test_qa_env import ircot_record, tiny_qa_recipe, write_jsonl

check_draws, fresh_tasks, outside_tasks, untrained_tasks = (
    fresh_eval.check_draws,
    fresh_eval.fresh_tasks,
    fresh_eval.outside_tasks,
    fresh_eval.untrained_tasks,
)


def qa_task(qa: QAConfig, **changes: Any) -> TaskConfig:
    """The ``task`` section of a multihop_qa run with the task config ``qa`` (+ changes)."""
    return TaskConfig(
        name="multihop_qa", config=dataclasses.asdict(dataclasses.replace(qa, **changes))
    )


def test_fresh_questions_are_new_and_never_trained_on(tmp_path: Path) -> None:
    dev = write_jsonl(tmp_path / "dev.jsonl", [ircot_record(i) for i in range(12)])
    # A shared file: its non-eval questions train, so none of them can be fresh.
    shared = write_jsonl(tmp_path / "shared.jsonl", [ircot_record(i) for i in range(50, 60)])
    # A training question that is dev question 7 or 8 reworded under another id.
    train = write_jsonl(
        tmp_path / "train.jsonl",
        [
            ircot_record(200, "where was PERSON 7 born"),
            ircot_record(201, "Where was person 8 born"),
            ircot_record(300),
        ],
    )
    qa = QAConfig(
        train=[train, shared], eval={"dev": [dev], "shared": [shared]}, n_eval=3, data_dir="/"
    )
    cfg = Config(task=qa_task(qa))
    used = load_qa_data(qa).tasks
    fresh, note = fresh_tasks(cfg, 6, ["dev", "shared"])

    wider = load_qa_data(QAConfig(**{**vars(qa), "n_eval": 9})).tasks
    expected = [
        t
        for t in wider["dev"][3:]
        if normalize_question(t.question)
        not in {normalize_question(u.question) for u in used["train"]}
    ]
    assert [t.id for t in fresh["dev"]] == [t.id for t in expected]
    assert 4 <= len(fresh["dev"]) <= 6  # questions 7 and 8 drop out if they came next
    assert fresh["shared"] == []  # every other question of a shared file trains
    assert note.startswith(f"dev: {len(fresh['dev'])} fresh of the next 6; shared: 0 fresh")
    seen = {t.id for ts in used.values() for t in ts}
    assert not seen & {t.id for t in fresh["dev"]}
    # Asking for more than is left takes the rest (the whole-file sample is in file order).
    rest, _ = fresh_tasks(cfg, 50, ["dev"])
    assert {t.id for t in rest["dev"]} == {f"id{i}" for i in range(12)} - {
        t.id for t in used["dev"]
    } - {t.id for t in used["train"]} - {"id7", "id8"}


def test_fresh_tasks_names_a_bad_split(tmp_path: Path) -> None:
    dev = write_jsonl(tmp_path / "dev.jsonl", [ircot_record(i) for i in range(4)])
    qa = QAConfig(train=[dev], eval={"dev": [dev]}, n_eval=2, data_dir="/")
    # Checked before any file is read.
    cfg = Config(task=qa_task(qa))
    with pytest.raises(
        ValueError, match=r"'train' is not an eval split of the recipe \(it has dev\)"
    ):
        fresh_tasks(cfg, 2, ["train"])


def test_skip_continues_where_an_earlier_retest_stopped(tmp_path: Path) -> None:
    dev = write_jsonl(tmp_path / "dev.jsonl", [ircot_record(i) for i in range(40)])
    train = write_jsonl(
        tmp_path / "train.jsonl",
        [ircot_record(200 + i, f"where was person {i} born") for i in range(0, 40, 3)]
        + [ircot_record(300)],
    )
    qa = QAConfig(train=[train], eval={"dev": [dev]}, n_eval=5, data_dir="/")
    cfg = Config(task=qa_task(qa))
    first, _ = fresh_tasks(cfg, 10, ["dev"])
    # 5 + 35 covers the whole file, whose sample comes back in file order: the fresh ones
    # must still follow the seeded order, or the skipped ones are not the first re-test's.
    both, _ = fresh_tasks(cfg, 35, ["dev"])
    second, note = fresh_tasks(cfg, 35, ["dev"], skip=len(first["dev"]))
    ids = [t.id for t in first["dev"]], [t.id for t in second["dev"]]
    assert ids[0] and ids[1]
    assert not set(ids[0]) & set(ids[1])
    assert ids[0] + ids[1] == [t.id for t in both["dev"]]
    assert note == (
        f"dev: {len(ids[1])} fresh of the next 35 after skipping the first {len(ids[0])}"
    )
    with pytest.raises(ValueError, match="--skip at least 0"):
        fresh_tasks(cfg, 5, ["dev"], skip=-1)


def test_outside_questions_are_in_no_recipe_file_and_answerable_by_a_search(
    tmp_path: Path,
) -> None:
    dev = write_jsonl(tmp_path / "dev.jsonl", [ircot_record(i) for i in range(10)])
    train = write_jsonl(tmp_path / "train.jsonl", [ircot_record(i) for i in range(20, 30)])
    # n_eval 2: dev questions 2-9 are in no split, but in a recipe file: never outside.
    qa = QAConfig(train=[train], eval={"dev": [dev]}, n_eval=2, retriever="bm25", data_dir="/")
    cfg = Config(task=qa_task(qa))
    records = [
        {"idx": 0, "question": "Where was PERSON 5 born", "answer": "town 5"},  # dev file
        {"idx": 1, "question": "Where was person 25 born?", "answer": "town 25"},  # train
        {"idx": 2, "question": "Which town was person 7 born in?", "answer": "born in town 7"},
        {
            "idx": 3,
            "question": "Which town was person 23 born in?",
            "answer": ["Paris", "born in town 23"],
        },
        {"idx": 4, "question": "Which town was person 8 born in?", "answer": "Oslo"},  # not found
        {"idx": 5, "question": "Which town was person 7 born in", "answer": "town 7"},  # repeat
    ]
    outside = write_jsonl(tmp_path / "hotpot_questions.jsonl", records)
    more = write_jsonl(
        tmp_path / "2wiki_questions.jsonl",
        [{"idx": 0, "question": "What poet was person 9?", "answer": "person 9"}],
    )
    tasks, note = outside_tasks(cfg, [outside, more], take=10)
    assert sorted(tasks) == ["q_2wikimultihopqa", "q_hotpotqa"]
    ids = {t.id for ts in tasks.values() for t in ts}
    assert ids == {"hotpot_questions:2", "hotpot_questions:3", "2wiki_questions:0"}
    assert note == (
        "outside questions: 7 in 2 file(s), 6 distinct, 4 in no recipe file, 3 with an answer "
        "in the top 5 passages for the question; taking 3; q_2wikimultihopqa: 1; q_hotpotqa: 2"
    )
    # Passages clipped to one word, as the search tool would show them: only an answer in
    # a title ("Person 9") is still found; "born in town 7" was in a passage's text.
    clipped = Config(task=qa_task(qa, passage_words=1))
    tasks, _ = outside_tasks(clipped, [outside, more], take=10)
    assert {t.id for ts in tasks.values() for t in ts} == {"2wiki_questions:0"}
    # skip / take walk one seeded order.
    first, _ = outside_tasks(cfg, [outside, more], take=1)
    rest, note = outside_tasks(cfg, [outside, more], take=5, skip=1)
    got = [t.id for ts in (*first.values(), *rest.values()) for t in ts]
    assert sorted(got) == sorted(ids) and "after skipping the first 1" in note
    with pytest.raises(ValueError, match="--answer-top-k must be positive"):
        outside_tasks(cfg, [outside], take=1, answer_top_k=0)


def small_recipe(tmp_path: Path, no_in_passage: bool = False) -> Config:
    """A BM25 recipe over 10 dev + 10 train IRCoT questions; ``no_in_passage`` puts the
    word "no" in one passage ("Other 8")."""
    dev_records = [ircot_record(i) for i in range(10)]
    if no_in_passage:
        dev_records[8]["contexts"][2]["paragraph_text"] = "Unrelated, no doubt."
    dev = write_jsonl(tmp_path / "dev.jsonl", dev_records)
    train = write_jsonl(tmp_path / "train.jsonl", [ircot_record(i) for i in range(20, 30)])
    qa = QAConfig(train=[train], eval={"dev": [dev]}, n_eval=2, retriever="bm25", data_dir="/")
    return Config(task=qa_task(qa))


def test_answer_after_gives_a_pool_apart_from_the_top_k_one(tmp_path: Path) -> None:
    cfg = small_recipe(tmp_path)
    # "What is town i near?" ranks "Town i: Born in town i." first, "Person i: Person i is
    # a poet." second and "Other i: Unrelated." third.
    records = [
        {"idx": 0, "question": "Which town was person 7 born in?", "answer": "town 7"},
        {"idx": 1, "question": "What is town 23 near?", "answer": "town 23"},
        {"idx": 2, "question": "What is town 24 near?", "answer": "poet"},
        {"idx": 3, "question": "What is town 8 near?", "answer": "unrelated"},
        {"idx": 4, "question": "Which town was person 8 born in?", "answer": "Oslo"},
    ]
    outside = write_jsonl(tmp_path / "hotpot_questions.jsonl", records)

    def pool(**kw: int) -> set[str]:
        tasks, _ = outside_tasks(cfg, [outside], take=10, **kw)
        return {t.id for ts in tasks.values() for t in ts}

    top5, top1, after1 = pool(), pool(answer_top_k=1), pool(answer_after=1)
    assert top1 == {"hotpot_questions:0", "hotpot_questions:1"}
    assert after1 == {"hotpot_questions:2", "hotpot_questions:3"}
    assert top1 | after1 == top5
    _, note = outside_tasks(cfg, [outside], take=10, answer_after=1)
    assert "in the top 5 passages for the question but not in the top 1;" in note
    for bad in (-1, 5, 6):
        with pytest.raises(ValueError, match="--answer-after must be at least 0 and below"):
            outside_tasks(cfg, [outside], take=1, answer_after=bad)


def test_outside_questions_read_each_file_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import agentr1.data.files as qa_setup

    dev = write_jsonl(tmp_path / "dev.jsonl", [ircot_record(i) for i in range(10)])
    train = write_jsonl(tmp_path / "train.jsonl", [ircot_record(i) for i in range(20, 30)])
    outside = write_jsonl(
        tmp_path / "hotpot_questions.jsonl",
        [{"idx": 0, "question": "Which town was person 7 born in?", "answer": "town 7"}],
    )
    # the eval file serves as a training file too: still one read
    qa = QAConfig(train=[train, dev], eval={"dev": [dev]}, n_eval=2, data_dir="/")
    reads: list[str] = []
    real = qa_setup.load

    def counting(path: Path, *args: Any, **kwargs: Any) -> Any:
        reads.append(Path(path).name)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(qa_setup, "load", counting)
    tasks, _ = outside_tasks(Config(task=qa_task(qa)), [outside], take=5)
    assert sorted(reads) == ["dev.jsonl", "hotpot_questions.jsonl", "train.jsonl"]
    assert [t.id for ts in tasks.values() for t in ts] == ["hotpot_questions:0"]


def pool_config(tmp_path: Path, demos: int = 10, seed: int = 3) -> Config:
    dev = write_jsonl(tmp_path / "dev.jsonl", [ircot_record(i) for i in range(5)])
    # 40 training questions; id 100's question rewords dev question 2.
    train = write_jsonl(
        tmp_path / "train.jsonl",
        [ircot_record(100, "where was PERSON 2 born")] + [ircot_record(i) for i in range(101, 140)],
    )
    qa = QAConfig(train=[train], eval={"dev": [dev]}, n_eval=5, data_dir="/")
    return Config(
        task=qa_task(qa),
        sft=SFTConfig(demos=demos),
        train=TrainConfig(seed=seed, tasks_per_step=4),
    )


def test_the_training_pool_leaves_out_every_question_a_model_trained_on(tmp_path: Path) -> None:
    cfg = pool_config(tmp_path)
    train = load_qa_data(task_config(cfg.task)).tasks["train"]
    assert len(train) == 39 and "id100" not in {t.id for t in train}  # dev's question
    demos = {t.id for t in demo_picks([train], 10, cfg.train.seed)[0]}
    drawn = {t.id for t in TaskSampler(train, cfg.train.seed).sample(12)}
    assert len(demos) == 10 and len(drawn) == 12
    pool, note = untrained_tasks(cfg, 12, take=100)
    (name,) = pool  # one dataset, named after the file's
    assert name.startswith("pool_")
    ids = [t.id for t in pool[name]]
    assert set(ids) == {t.id for t in train} - demos - drawn
    assert len(ids) == 39 - len(demos | drawn)
    assert note.startswith(f"training pool: {len(ids)} of 39 questions untrained on (minus 10")
    # Without a warm start nothing is demonstrated; the draws stay out.
    no_sft = Config(**{**vars(cfg), "sft": SFTConfig(enabled=False, demos=10)})
    more, _ = untrained_tasks(no_sft, 12, take=100)
    assert set(ids) < {t.id for t in more[name]}
    assert not drawn & {t.id for t in more[name]}
    # skip / take walk the same seeded order.
    first, _ = untrained_tasks(cfg, 12, take=5)
    rest, note = untrained_tasks(cfg, 12, take=100, skip=5)
    assert [t.id for t in first[name] + rest[name]] == ids
    assert "after skipping the first 5" in note
    with pytest.raises(ValueError, match="--train-pool at least 0"):
        untrained_tasks(cfg, -1, take=5)


def test_a_model_that_drew_more_than_the_pool_excludes_is_refused(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "final_model").mkdir(parents=True)
    (run / "config.yaml").write_text("train:\n  tasks_per_step: 6\n  seed: 0\n")
    (run / "summary.json").write_text('{"steps": 20}')
    check_draws(run / "final_model", 120, seed=0)  # 20 x 6 = 120: fine
    with pytest.raises(SystemExit, match="120 draws, more than --train-pool 100"):
        check_draws(run / "final_model", 100, seed=0)
    with pytest.raises(SystemExit, match=r"train\.seed=0, the pool assumes 1"):
        check_draws(run / "final_model", 200, seed=1)
    check_draws(tmp_path / "elsewhere" / "model", 0, seed=0)  # not a run: not checked


def test_the_script_tables_models_and_naive_rag_on_the_training_pool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    extra = "sft: {demos: 4}\ntrain: {tasks_per_step: 2}\n"
    model, recipe = tiny_qa_recipe(tmp_path, 14, tokens_per_turn=4, extra=extra)
    out = tmp_path / "out"
    argv = ["fresh_eval.py", "--out", str(out), "--recipe", str(recipe), "--train-pool", "3"]
    argv += ["--model", f"a={model}", "--model", f"b={model}", "--naive-rag", f"rag={model}"]
    monkeypatch.setattr(sys, "argv", [*argv, "--take", "100"])
    import agentr1.tasks.multihop_qa.baselines as baselines

    rag_calls: list[int] = []
    real_rag = baselines.naive_rag

    def counting_rag(tasks: Any, *a: Any, **kw: Any) -> Any:
        rag_calls.append(len(tasks))
        assert kw["top_k"] == 5 and kw["passage_words"] == 0
        return real_rag(tasks, *a, **kw)

    monkeypatch.setattr(baselines, "naive_rag", counting_rag)
    fresh_eval.main()
    # 12 training questions - 4 demonstrated - 3 drawn (overlaps counted once) remain.
    cfg_tasks, note = untrained_tasks(fresh_eval.load_config(str(recipe), []), rl_draws=3, take=100)
    n = sum(len(ts) for ts in cfg_tasks.values())
    assert 5 <= n <= 8
    assert sum(rag_calls) == n  # the rag row, and only it, ran Naive RAG
    for name in ("a", "b", "rag"):
        lines = (out / f"{name}.jsonl").read_text().splitlines()
        assert len(lines) == n
    rag = [json.loads(line) for line in (out / "rag.jsonl").read_text().splitlines()]
    assert {r["turns"] for r in rag} == {1} and {r["tool_calls"] for r in rag} == {0}
    table = (out / "fresh.md").read_text()
    assert table.startswith(f"Fresh questions ({note}); greedy")
    # the same model greedy twice: identical, so no question better or worse
    assert f"| b | all | {n} |" in table and "+0.000 [+0.000, +0.000], 0/0, 1" in table
    assert f"| rag | all | {n} |" in table
    monkeypatch.setattr(sys, "argv", [*argv, "--naive-rag", f"a={model}"])
    with pytest.raises(SystemExit):
        fresh_eval.main()  # two rows named a


# two outside questions whose answers a search of the question finds
TWO_TOWN_QUESTIONS = [
    {"idx": 0, "question": "Which town was person 3 born in?", "answer": "town 3"},
    {"idx": 1, "question": "Which town was person 5 born in?", "answer": "town 5"},
]


def outside_script(tmp_path: Path, records: list[dict[str, Any]]) -> tuple[Path, Path, str, Path]:
    """For a run of the script on outside questions: a tiny model and its 6-question recipe,
    ``records`` as a question-only file, and the output folder."""
    model, recipe = tiny_qa_recipe(tmp_path, 6, tokens_per_turn=4)
    return model, recipe, write_jsonl(tmp_path / "hotpot_outside.jsonl", records), tmp_path / "out"


def test_the_script_tests_on_outside_questions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, recipe, outside, out = outside_script(
        tmp_path,
        [
            {"idx": 0, "question": "Which town was person 3 born in?", "answer": "town 3"},
            {"idx": 1, "question": "Where was person 4 born?", "answer": "town 4"},  # recipe's
            {"idx": 2, "question": "Which town was person 5 born in?", "answer": "Oslo"},
        ],
    )
    argv = ["fresh_eval.py", "--out", str(out), "--recipe", str(recipe), "--model", f"a={model}"]
    # An override after the files is still an override, not a file.
    monkeypatch.setattr(sys, "argv", [*argv, "--questions", outside, "task.config.top_k=2"])
    fresh_eval.main()
    (line,) = (out / "a.jsonl").read_text().splitlines()
    assert json.loads(line)["split"] == "q_hotpotqa"
    assert json.loads(line)["task_id"] == "hotpot_outside:0"
    assert (out / "fresh.md").read_text().startswith("Fresh questions (outside questions: 3 in")
    monkeypatch.setattr(sys, "argv", [*argv, "--questions", outside, "--train-pool", "0"])
    with pytest.raises(SystemExit):
        fresh_eval.main()  # two ways of choosing the questions


def test_drop_yes_no_leaves_out_the_questions_a_passage_word_admits(tmp_path: Path) -> None:
    cfg = small_recipe(tmp_path, no_in_passage=True)
    records = [
        {"idx": 0, "question": "Which town was person 7 born in?", "answer": "town 7"},
        {"idx": 1, "question": "Is town 8 near a poet?", "answer": "no"},
    ]
    outside = write_jsonl(tmp_path / "hotpot_questions.jsonl", records)
    kept, _ = outside_tasks(cfg, [outside], take=10)
    assert {t.id for ts in kept.values() for t in ts} == {
        "hotpot_questions:0",
        "hotpot_questions:1",
    }
    dropped, note = outside_tasks(cfg, [outside], take=10, drop_yes_no=True)
    assert {t.id for ts in dropped.values() for t in ts} == {"hotpot_questions:0"}
    assert "2 in no recipe file, 1 not yes/no, 1 with an answer in the top 5" in note


def test_drop_answer_in_question_leaves_out_the_questions_that_name_their_answer(
    tmp_path: Path,
) -> None:
    assert fresh_eval.answer_in_question("Which came first, Town 7 or Town 8?", ["town 7"])
    assert fresh_eval.answer_in_question("Who wrote it?", ["x", "Who"])  # any alias
    assert not fresh_eval.answer_in_question("Was town 70 first?", ["town 7"])  # whole words
    assert not fresh_eval.answer_in_question("Which town?", [""])
    cfg = small_recipe(tmp_path)
    records = [
        {"idx": 0, "question": "Which town was person 7 born in?", "answer": "town 7"},
        {"idx": 1, "question": "Was person 5 born in town 5 or town 6?", "answer": "town 5"},
    ]
    outside = write_jsonl(tmp_path / "hotpot_questions.jsonl", records)
    kept, _ = outside_tasks(cfg, [outside], take=10)
    assert len(kept["q_hotpotqa"]) == 2
    kept, note = outside_tasks(cfg, [outside], take=10, drop_answer_in_question=True)
    assert {t.id for ts in kept.values() for t in ts} == {"hotpot_questions:0"}
    assert "2 in no recipe file, 1 not naming an answer in the question, 1 with an" in note


def test_records_of_a_larger_pool_are_reused_and_a_smaller_one_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, recipe, outside, out = outside_script(tmp_path, TWO_TOWN_QUESTIONS)
    argv = ["fresh_eval.py", "--out", str(out), "--recipe", str(recipe), "--questions", outside]
    monkeypatch.setattr(sys, "argv", [*argv, "--model", f"a={model}"])
    fresh_eval.main()
    assert len((out / "a.jsonl").read_text().splitlines()) == 2
    # One question of the two: a's records are reused (not re-run), b is evaluated on it.
    monkeypatch.setattr(sys, "argv", [*argv, "--take", "1", "--model", f"a={model}"])
    monkeypatch.setattr(sys, "argv", [*sys.argv, "--model", f"b={model}"])
    fresh_eval.main()
    assert len((out / "a.jsonl").read_text().splitlines()) == 2
    assert len((out / "b.jsonl").read_text().splitlines()) == 1
    assert "| b | all | 1 |" in (out / "fresh.md").read_text()
    # Both questions again: b's file lacks one, so it is refused before a word is generated.
    monkeypatch.setattr(sys, "argv", [*argv, "--model", f"a={model}", "--model", f"b={model}"])
    with pytest.raises(SystemExit, match=r"b\.jsonl: no record for 1 of the 2 questions"):
        fresh_eval.main()


def test_also_against_pairs_every_model_with_a_baseline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, recipe, outside, out = outside_script(tmp_path, TWO_TOWN_QUESTIONS)
    out.mkdir()
    # records already there: nothing is evaluated, only paired
    for name, ems in (("rl", (1, 1)), ("warm", (1, 0)), ("base", (0, 0))):
        rows = [
            {"split": "q_hotpotqa", "task_id": f"hotpot_outside:{i}", "em": em, "f1": em}
            for i, em in enumerate(ems)
        ]
        (out / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = ["fresh_eval.py", "--out", str(out), "--recipe", str(recipe), "--questions", outside]
    argv += ["--model", f"warm={model}", "--model", f"rl={model}", "--model", f"base={model}"]
    # an override after the names is still an override
    monkeypatch.setattr(sys, "argv", [*argv, "--also-against", "base", "task.config.top_k=2"])
    fresh_eval.main()
    md = (out / "fresh.md").read_text()
    block = md.split("Each model paired against `base`, all questions:")[1]
    assert "| warm | 2 | 0.000 | 0.500 | +0.500 [" in block and ", 1/0, 1 |" in block
    assert "| rl | 2 | 0.000 | 1.000 | +1.000 [" in block and ", 2/0, 0.5 |" in block
    assert "| base |" not in block
    monkeypatch.setattr(sys, "argv", [*argv, "--also-against", "naive"])
    with pytest.raises(SystemExit):
        fresh_eval.main()  # not a model of the comparison


def test_max_answer_chance_leaves_out_answers_a_random_top_k_would_show(tmp_path: Path) -> None:
    cfg = small_recipe(tmp_path)
    # 60 passages: "poet" is in the 20 "Person i" ones, "town 7" only in "Town 7".
    records = [
        {"idx": 0, "question": "Which town was person 7 born in?", "answer": "town 7"},
        {"idx": 2, "question": "What is town 24 near?", "answer": "poet"},
    ]
    outside = write_jsonl(tmp_path / "hotpot_questions.jsonl", records)
    passages = load_qa_data(task_config(cfg.task)).passages
    assert len(passages) == 60
    town, poet, either = fresh_eval.answer_chances(
        passages, [["town 7"], ["Poet."], ["town 7", "poet"]], words=80, k=5
    )
    assert town == pytest.approx(1 - (59 / 60) ** 5)
    assert poet == either == pytest.approx(1 - (40 / 60) ** 5)
    kept, _ = outside_tasks(cfg, [outside], take=10)
    assert {t.id for ts in kept.values() for t in ts} == {
        "hotpot_questions:0",
        "hotpot_questions:2",
    }
    kept, note = outside_tasks(cfg, [outside], take=10, max_answer_chance=0.5)
    assert {t.id for ts in kept.values() for t in ts} == {"hotpot_questions:0"}
    assert (
        "2 in no recipe file, 1 whose answers a random top 5 shows with probability <= 0.5, 1 with an"
        in note
    )
    with pytest.raises(ValueError, match=r"--max-answer-chance must be in \[0, 1\]"):
        outside_tasks(cfg, [outside], take=10, max_answer_chance=1.5)
