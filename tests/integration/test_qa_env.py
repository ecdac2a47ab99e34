"""Real-QA env and setup: the supporting-facts demonstrator through the real rollout (byte
chat, fake retriever), its answer rule when retrieval fails, and disjoint data splits."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from agentr1.data import resolve_entry
from agentr1.retrieval import retriever_from_spec
from agentr1.retrieval.base import Passage
from agentr1.rollout import RolloutConfig, run_rollout
from agentr1.tasks.multihop_qa import (
    QA_SYSTEM_PROMPT,
    SupportingFactsPolicy,
    assert_disjoint,
    load_qa_data,
    qa_env,
    supporting_facts_generator,
)
from agentr1.tasks.multihop_qa import QATaskConfig as QAConfig
from agentr1.types import StopReason, Task, Trajectory
from tests.fakes import byte_chat

PASSAGES = [
    Passage("p1", "Kiss and Tell (1945 film)", "Kiss and Tell stars Shirley Temple as Corliss."),
    Passage("p2", "Shirley Temple", "Shirley Temple served as Chief of Protocol."),
    Passage("p3", "Alû", "Alû is a demon, like Gallu and Lilu."),
    Passage("p4", "Distractor", "Nothing useful about Velmora."),
]

TASK = Task(
    "q1",
    "What position was held by the woman who starred in Kiss and Tell?",
    ["Chief of Protocol"],
    {"supporting_titles": ["Kiss and Tell (1945 film)", "Shirley Temple"], "hops": 2},
)


class FakeRetriever:
    """Passages titled with the query first, then those whose text contains it.

    ``hide`` titles are never returned (a retrieval failure); ``also`` maps a query to
    extra passages returned with it.
    """

    def __init__(self, hide: tuple[str, ...] = (), also: dict[str, list[str]] | None = None):
        self.hide, self.also, self.queries = set(hide), also or {}, []

    def search(self, query: str, k: int) -> list[Passage]:
        self.queries.append(query)
        live = [p for p in PASSAGES if p.title not in self.hide]
        hits = [p for p in live if p.title == query] + [
            p for p in live if p.title in self.also.get(query, [])
        ]
        hits += [p for p in live if query.lower() in p.text.lower() and p not in hits]
        return hits[:k]

    def search_batch(self, queries: list[str], k: int) -> list[list[Passage]]:
        return [self.search(q, k) for q in queries]


def demo(tasks: list[Task], retriever: Any, max_turns: int = 5, top_k: int = 1) -> list[Trajectory]:
    chat = byte_chat()
    groups = run_rollout(
        tasks,
        qa_env(retriever, top_k=top_k),
        supporting_facts_generator(tasks, chat, max_searches=max_turns - 1),
        chat,
        RolloutConfig(max_turns=max_turns, max_tokens_per_turn=400, max_context=20_000),
    )
    return [g.trajectories[0] for g in groups]


def queries(t: Trajectory) -> list[str]:
    return [e.arguments["query"] for e in t.tool_log]


def test_demo_searches_each_supporting_title_then_answers_gold() -> None:
    (t,) = demo([TASK], FakeRetriever())
    assert queries(t) == ["Kiss and Tell (1945 film)", "Shirley Temple"]
    assert t.stop_reason is StopReason.ANSWERED and t.answer == "Chief of Protocol"
    assert t.metrics["em"] == 1.0 and t.num_turns == 3


def test_demo_skips_a_title_an_earlier_search_already_returned() -> None:
    both = FakeRetriever(also={"Kiss and Tell (1945 film)": ["Shirley Temple"]})
    (t,) = demo([TASK], both, top_k=2)
    assert queries(t) == ["Kiss and Tell (1945 film)"] and t.metrics["em"] == 1.0


def test_failed_retrieval_answers_unknown_unless_the_answer_was_read() -> None:
    # "Shirley Temple" is never returned: the evidence is incomplete and the answer unseen.
    (t,) = demo([TASK], FakeRetriever(hide=("Shirley Temple",)))
    assert queries(t) == ["Kiss and Tell (1945 film)", "Shirley Temple"]
    assert t.answer == "unknown" and t.metrics["em"] == 0.0
    # The first hop's passage is missing, but the answer is in what it did read.
    (t,) = demo([TASK], FakeRetriever(hide=("Kiss and Tell (1945 film)",)))
    assert t.answer == "Chief of Protocol"


def test_search_budget_leaves_the_last_turn_for_the_answer() -> None:
    (t,) = demo([TASK], FakeRetriever(), max_turns=2)
    assert queries(t) == ["Kiss and Tell (1945 film)"]
    assert t.stop_reason is StopReason.ANSWERED and t.answer == "unknown"


def test_question_only_task_searches_the_question_and_non_ascii_is_verbatim() -> None:
    task = Task("q2", "Alû", ["demon"])
    (t,) = demo([task], FakeRetriever())
    assert queries(t) == ["Alû"] and t.answer == "demon"
    assert '"query": "Alû"' in t.turns[0].text  # not a \\u escape


def test_unknown_question_answers_unknown() -> None:
    chat = byte_chat()
    gen = supporting_facts_generator([TASK], chat)
    groups = run_rollout(
        [Task("zz", "Who?", ["x"])],
        qa_env(FakeRetriever()),
        gen,
        chat,
        RolloutConfig(max_turns=2, max_tokens_per_turn=400, max_context=20_000),
    )
    assert groups[0].trajectories[0].answer == "unknown"


def test_policy_rejects_an_empty_budget() -> None:
    with pytest.raises(ValueError, match="max_searches"):
        SupportingFactsPolicy(0)


def test_search_env_factory_wires_tool_prompt_and_top_k() -> None:
    env = qa_env(FakeRetriever(), top_k=3)()
    assert env.system_prompt == QA_SYSTEM_PROMPT
    assert [s["function"]["name"] for s in env.tool_schemas] == ["search"]
    assert env.tools[0].top_k == 3  # type: ignore[attr-defined]


def test_retriever_from_spec() -> None:
    assert len(retriever_from_spec("bm25", PASSAGES).search("Shirley Temple", 1)) == 1
    with pytest.raises(OSError, match=r"127\.0\.0\.1:1: no server answers"):  # asked at once
        retriever_from_spec("http://127.0.0.1:1", [])
    with pytest.raises(ValueError, match="'bm42' is unknown"):
        retriever_from_spec("bm42", PASSAGES)


# ------------------------------------------------------------------------- data setup


def ircot_record(i: int, question: str | None = None) -> dict[str, Any]:
    """One IRCoT-format question with two gold and one distractor paragraph."""
    return {
        "question_id": f"id{i}",
        "question_text": question or f"Where was person {i} born?",
        "answers_objects": [{"spans": [f"town {i}"]}],
        "contexts": [
            {
                "title": f"Person {i}",
                "paragraph_text": f"Person {i} is a poet.",
                "is_supporting": True,
            },
            {"title": f"Town {i}", "paragraph_text": f"Born in town {i}.", "is_supporting": True},
            {"title": f"Other {i}", "paragraph_text": "Unrelated.", "is_supporting": False},
        ],
    }


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return str(path)


def test_splits_are_disjoint_and_a_shared_file_is_held_out(tmp_path: Path) -> None:
    shared = write_jsonl(tmp_path / "ds" / "shared.jsonl", [ircot_record(i) for i in range(10)])
    # A training copy of eval question 0 under another id: removed by normalized question.
    other = write_jsonl(
        tmp_path / "ds" / "train.jsonl",
        [ircot_record(100, "where was PERSON 0 born"), ircot_record(101)],
    )
    qa = QAConfig(train=[shared, other], eval={"a": [shared]}, n_eval=4, data_dir=str(tmp_path))
    data = load_qa_data(qa)
    assert_disjoint(data.tasks)
    assert len(data.tasks["a"]) == 4
    eval_ids = {t.id for t in data.tasks["a"]}
    train_ids = {t.id for t in data.tasks["train"]}
    expected = {f"id{i}" for i in range(10)} - eval_ids | {"id101"}
    if "id0" not in eval_ids:
        expected.add("id100")
    assert train_ids == expected
    # The corpus holds every record's paragraphs, whatever was sampled.
    assert len(data.passages) == 12 * 3
    assert data.tasks["a"][0].metadata["supporting_titles"][0].startswith("Person")
    # Same seed, same sample; another seed, (almost surely) another one.
    assert {t.id for t in load_qa_data(qa).tasks["a"]} == eval_ids


def save_tiny_chatml_model(path: Path) -> Path:
    """A random 1-layer Llama with a ChatML BPE tokenizer, saved as a HF directory (~0.2 s)."""
    from agentr1.config import TinyModelConfig
    from agentr1.tasks.multihop_qa.baselines import NAIVE_RAG_SYSTEM_PROMPT
    from agentr1.tiny import build_and_save

    texts = [QA_SYSTEM_PROMPT, NAIVE_RAG_SYSTEM_PROMPT]
    texts += [json.dumps(ircot_record(i)) for i in range(5)]
    shape = TinyModelConfig(
        vocab_size=400,
        pretokenizer="words",
        hidden_size=32,
        layers=1,
        heads=2,
        intermediate_size=64,
        max_positions=4096,
    )
    return build_and_save(path, texts * 4, shape, seed=0)


def tiny_qa_recipe(
    tmp_path: Path, n_questions: int, tokens_per_turn: int, extra: str = ""
) -> tuple[Path, Path]:
    """The tiny ChatML model and a QA recipe file on ``n_questions`` IRCoT questions (2 of
    them eval split ``a``, top-1 search, 2 turns of ``tokens_per_turn``), plus the YAML
    lines ``extra``: (model dir, recipe path), for scripts that take ``--recipe``."""
    model = save_tiny_chatml_model(tmp_path / "tiny")
    data = write_jsonl(tmp_path / "d" / "q.jsonl", [ircot_record(i) for i in range(n_questions)])
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        "task:\n  name: multihop_qa\n  config:\n    top_k: 1\n"
        f"    train: [{data}]\n    eval: {{a: [{data}]}}\n    n_eval: 2\n{extra}"
        f"rollout: {{max_turns: 2, max_tokens_per_turn: {tokens_per_turn}, max_context: 2048}}\n"
        f"model: {{path: {model}, chat_template: qwen2.5}}\neval: {{splits: [a]}}\n"
    )
    return model, recipe


def tiny_qa_setup(tmp_path: Path, n_questions: int, *overrides: str) -> Any:
    """`build_setup` for a QA config on the tiny ChatML model and ``n_questions`` IRCoT
    questions (2 of them eval split ``a``, top-1 search), plus ``overrides``."""
    from agentr1.config import load_config
    from agentr1.trainer.setup import build_setup

    model = save_tiny_chatml_model(tmp_path / "tiny")
    data = write_jsonl(tmp_path / "d" / "q.jsonl", [ircot_record(i) for i in range(n_questions)])
    return build_setup(
        load_config(
            None,
            [
                "task.name=multihop_qa",
                f"model.path={model}",
                "model.chat_template=qwen2.5",
                f"task.config.train=[{data}]",
                f"task.config.eval={{a: [{data}]}}",
                "task.config.n_eval=2",
                "task.config.top_k=1",
                "eval.splits=[a]",
                *overrides,
            ],
        )
    )


def test_build_setup_for_qa_runs_demonstrations_through_the_real_stack(tmp_path: Path) -> None:
    setup = tiny_qa_setup(
        tmp_path,
        6,
        "task.config.passage_words=3",
        "task.process={enabled: true, valid_call: 0.0, evidence: 0.2}",
        "rollout.max_turns=3",
        "model.keep_kv_gib=0.5",
        "model.pack_weights_gib=0.25",
        "model.native_attention=false",
        "model.native_linear=false",
    )
    assert setup.generator.keep_cache_bytes == 2**29
    assert setup.generator.pack_weights_bytes == 2**28
    assert setup.generator.native_attention is False
    assert setup.generator.native_linear is False
    assert setup.task.name == "multihop_qa" and set(setup.tasks) == {"train", "a"}
    assert len(setup.tasks["train"]) == 4
    ((tasks, make_env, gen),) = setup.demo_sources(0)
    assert tasks == setup.tasks["train"]
    # A task without demonstrations has nothing to imitate: said, not a crash.
    bare = dataclasses.replace(setup, task=setup.task.replace(demonstrations=None))
    with pytest.raises(ValueError, match="gives no demonstrations"):
        bare.demo_sources(0)
    env = make_env()
    assert env.system_prompt == QA_SYSTEM_PROMPT
    groups = run_rollout(
        tasks, make_env, gen, setup.chat, RolloutConfig(max_turns=3, max_context=4096)
    )
    trajs = [g.trajectories[0] for g in groups]
    assert all(t.metrics["em"] == 1.0 and len(t.tool_log) == 2 for t in trajs)
    text = setup.chat.decode(trajs[0].token_ids)
    assert "<tools>" in text and '"query": "Person' in text
    # passages clipped to 3 words; each search found one of the two supporting titles
    assert all(e.content.endswith(" ...") for t in trajs for e in t.tool_log)
    assert [[turn.reward for turn in t.turns] for t in trajs[:1]] == [[0.1, 0.1, 0.0]]


@pytest.mark.parametrize(
    ("at_end", "no_answer", "max_turns", "rewards"),
    [
        ("keep", 0.0, 3, [0.1, 0.1, 0.0]),  # two searches find both titles; answered: keeps 0.2
        ("zero", 0.0, 3, [0.1, 0.1, -0.2]),  # the last turn gives Φ back: the sum is 0
        ("zero", 0.0, 2, [0.1, -0.1]),  # cut at the turn limit before answering: the same
        ("keep", 0.3, 3, [0.1, 0.1, 0.0]),  # answered: no penalty
        ("keep", 0.3, 2, [0.1, -0.2]),  # cut before the answer: the last turn pays 0.3
    ],
)
def test_end_of_episode_terms_through_the_real_rollout(
    tmp_path: Path, at_end: str, no_answer: float, max_turns: int, rewards: list[float]
) -> None:
    process = f"enabled: true, valid_call: 0.0, evidence_at_end: {at_end}, no_answer: {no_answer}"
    setup = tiny_qa_setup(tmp_path, 4, f"task.process={{{process}}}")
    ((tasks, make_env, gen),) = setup.demo_sources(0)
    rcfg = RolloutConfig(max_turns=max_turns, max_context=4096)
    (group,) = run_rollout(tasks[:1], make_env, gen, setup.chat, rcfg)
    traj = group.trajectories[0]
    assert [round(t.reward, 6) for t in traj.turns] == rewards
    assert "process_end" not in traj.metrics and "reward_errors" not in traj.metrics
    assert traj.stop_reason == (StopReason.ANSWERED if max_turns == 3 else StopReason.MAX_TURNS)


def test_dataset_folder_entries_and_clear_errors(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "mini" / "a.jsonl", [ircot_record(i) for i in range(3)])
    write_jsonl(tmp_path / "mini" / "qonly.jsonl", [{"idx": 1, "question": "q", "answer": "a"}])
    files = resolve_entry("mini", tmp_path, "task.config.train")
    assert [p.name for p in files] == ["a.jsonl"]  # only files with context
    with pytest.raises(FileNotFoundError, match=r"task\.config\.eval\.x: 'nope\.jsonl'"):
        resolve_entry("nope.jsonl", tmp_path, "task.config.eval.x")
