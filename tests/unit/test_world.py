"""The embedded multi-hop world and its scripted oracle, driven through real BM25 search."""

from __future__ import annotations

import json
import random
import re
import time
from collections import Counter

import pytest

from agentr1.retrieval import BM25Retriever, Passage
from agentr1.rewards.qa import exact_match
from agentr1.tasks.world import (
    QUESTION_TYPES,
    SPLITS,
    Comparison,
    OraclePolicy,
    Plan,
    World,
    WorldConfig,
    parse_search_results,
    vocabulary_coverage,
)
from agentr1.types import Task

CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


@pytest.fixture(scope="module")
def world() -> World:
    return World.build()


@pytest.fixture(scope="module")
def retriever(world: World) -> BM25Retriever:
    return BM25Retriever(world.passages, index_text=world.index_text)


def observation(passages: list[Passage]) -> str:
    """The search tool's response layout (agentr1/tools/search.py)."""
    if not passages:
        return "No results found."
    return "\n".join(f"[{i}] {p.title}\n{p.text}" for i, p in enumerate(passages, 1))


def episode(
    policy: OraclePolicy, retriever: BM25Retriever, task: Task, max_turns: int
) -> tuple[str | None, list[str]]:
    """Run one episode; returns (answer or None, queries searched)."""
    observations: list[str] = []
    queries: list[str] = []
    for _ in range(max_turns):
        turn = policy.next_turn(task, observations)
        if m := ANSWER.search(turn):
            return m.group(1), queries
        m = CALL.search(turn)
        assert m, f"neither a call nor an answer: {turn!r}"
        call = json.loads(m.group(1))
        assert call["name"] == "search"
        queries.append(call["arguments"]["query"])
        observations.append(observation(retriever.search(queries[-1], 3)))
    return None, queries


def gold_answer(world: World, plan: Plan) -> str:
    """Evaluate a plan on the world's facts (ground truth, not passages)."""
    values: list[str] = []
    for step in plan.steps:
        name = step.query if isinstance(step.query, str) else values[step.query]
        values.append(str(world.entity(name).facts[step.read]))
    if isinstance(plan.answer, int):
        return values[plan.answer]
    c: Comparison = plan.answer
    left, right = int(values[c.left]), int(values[c.right])
    assert left != right, "comparison tie"
    left_wins = left < right if c.want == "min" else left > right
    pick = c.left_answer if left_wins else c.right_answer
    return pick if isinstance(pick, str) else values[pick]


def test_build_is_fast_and_sized(world: World) -> None:
    start = time.perf_counter()
    World.build()
    assert time.perf_counter() - start < 2.0  # ~0.1 s; slack for slow CI machines
    assert 300 <= len(world.entities) <= 600
    assert 1000 <= len(world.passages) <= 2000  # one per fact
    cfg = world.config
    assert [len(world.tasks(s)) for s in SPLITS] == [cfg.n_train, cfg.n_test, cfg.n_test_ood]


def test_same_seed_same_world_other_seed_other_world(world: World) -> None:
    again = World.build(WorldConfig(seed=0))
    assert again.passages == world.passages
    for split in SPLITS:
        assert again.tasks(split) == world.tasks(split)
    assert again.plans == world.plans
    other = World.build(WorldConfig(seed=1))
    assert other.passages != world.passages
    assert [t.question for t in other.tasks("test")] != [t.question for t in world.tasks("test")]


def test_names_unique_and_not_nested(world: World) -> None:
    names = [e.name.lower() for e in world.entities]
    assert len(set(names)) == len(names)
    for a in names:
        assert sum(a in b for b in names) == 1, f"{a!r} is inside another name"
    ids = [p.id for p in world.passages]
    assert len(set(ids)) == len(ids) and all(i.startswith("w:") for i in ids)
    assert all(p.text.count(".") == 1 and " has " in p.text for p in world.passages)
    entity = World.build(WorldConfig(passage_unit="entity"))
    assert len(entity.passages) == len(entity.entities)
    # One sentence per fact: 1 (a country) to 5 (a person with parents) sentences.
    assert all(1 <= p.text.count(". ") + 1 <= 5 for p in entity.passages)


def test_every_answer_follows_from_the_facts(world: World) -> None:
    for split in SPLITS:
        for task in world.tasks(split):
            plan = world.plans[task.id]
            assert task.metadata["hops"] == len(plan.steps)
            assert task.metadata["type"] in QUESTION_TYPES
            assert gold_answer(world, plan) == task.answers[0], task.question


def test_vocabulary_coverage_is_complete(world: World) -> None:
    assert vocabulary_coverage(world) == set()


def test_splits_are_disjoint(world: World) -> None:
    seen_ids: set[str] = set()
    seen_questions: set[str] = set()
    for split in SPLITS:
        ids = {t.id for t in world.tasks(split)}
        questions = {t.question for t in world.tasks(split)}
        assert len(questions) == len(world.tasks(split))
        assert not ids & seen_ids and not questions & seen_questions
        seen_ids |= ids
        seen_questions |= questions


def test_counts_by_hop_and_held_out_hops(world: World) -> None:
    train = Counter(t.metadata["hops"] for t in world.tasks("train"))
    test = Counter(t.metadata["hops"] for t in world.tasks("test"))
    ood = Counter(t.metadata["hops"] for t in world.tasks("test_ood"))
    assert train == {1: 600, 2: 600, 3: 600}
    assert test == {1: 50, 2: 50, 3: 50}
    assert ood == {4: 100}
    types = Counter(t.metadata["type"] for t in world.tasks("train"))
    assert set(types) == {"single", "bridge", "compositional", "comparison", "inference"}
    assert {t.metadata["type"] for t in world.tasks("test_ood")} == {
        "compositional",
        "comparison",
        "inference",
    }


def test_held_out_type() -> None:
    w = World.build(
        WorldConfig(seed=3, n_train=600, n_test=60, n_test_ood=60, ood_types=("inference",))
    )
    assert all(t.metadata["type"] != "inference" for s in ("train", "test") for t in w.tasks(s))
    ood = w.tasks("test_ood")
    assert all(t.metadata["type"] == "inference" or t.metadata["hops"] == 4 for t in ood)
    assert {t.metadata["hops"] for t in ood} == {2, 3, 4}
    assert vocabulary_coverage(w) == set()


@pytest.mark.parametrize(
    "bad",
    [
        {"hops": (1, 2), "ood_hops": (2,)},
        {"ood_hops": (5,)},
        {"ood_types": ("riddle",)},
        {"n_generations": 2},
        {"n_cities": 1000},
    ],
)
def test_bad_config_is_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        World.build(WorldConfig(**bad))  # type: ignore[arg-type]


def test_parse_search_results() -> None:
    text = observation([Passage("a", "A B", "x is y. z."), Passage("b", "C", "w.")])
    assert parse_search_results(text) == [("A B", "x is y. z."), ("C", "w.")]


def test_oracle_solves_every_test_question(world: World, retriever: BM25Retriever) -> None:
    oracle = OraclePolicy(world)
    train_sample = random.Random(0).sample(world.tasks("train"), 300)
    for task in world.tasks("test") + world.tasks("test_ood") + train_sample:
        hops = task.metadata["hops"]
        answer, queries = episode(oracle, retriever, task, max_turns=hops + 1)
        assert exact_match(answer, task.answers) == 1.0, (task.question, answer, queries)
        assert queries == world.gold_searches[task.id]
        assert len(queries) == hops


def test_oracle_notes_restate_a_passage_sentence_verbatim(
    world: World, retriever: BM25Retriever
) -> None:
    """Each turn after a search starts with the fact read, word for word as the passage
    states it: what makes reading learnable by copying (the note's prefix, up to the
    value, occurs in the observation right before the value)."""
    oracle = OraclePolicy(world)
    for task in world.tasks("test")[:60]:
        observations: list[str] = []
        for _ in range(task.metadata["hops"] + 1):
            turn = oracle.next_turn(task, observations)
            if observations:
                note, _, rest = turn.partition("\n")
                assert " has " in note and note.endswith("."), turn
                assert note in observations[-1], (note, observations[-1])
                assert rest.startswith(("<tool_call>", "<answer>")), turn
            else:
                assert turn.startswith("<tool_call>"), turn
            if ANSWER.search(turn):
                break
            query = json.loads(CALL.search(turn).group(1))["arguments"]["query"]
            observations.append(observation(retriever.search(query, 3)))
    task = next(t for t in world.tasks("test") if t.metadata["type"] == "bridge")
    first = world.gold_searches[task.id][0]
    obs = [observation(retriever.search(first, 3))]
    assert OraclePolicy(world, notes=False).next_turn(task, obs).startswith("<tool_call>")
    assert " has " in OraclePolicy(world).next_turn(task, obs).partition("\n")[0]


def test_oracle_reads_instead_of_knowing(world: World) -> None:
    """Without the passage in the observation it cannot answer."""
    task = next(t for t in world.tasks("test") if t.metadata["hops"] == 1)
    turn = OraclePolicy(world).next_turn(task, ["No results found."])
    assert turn == "<answer> unknown</answer>"


def test_early_answers(world: World, retriever: BM25Retriever) -> None:
    oracle = OraclePolicy(world, early_answer_prob=1.0, rng=random.Random(0))
    for task in world.tasks("test") + world.tasks("test_ood"):
        answer, queries = episode(oracle, retriever, task, max_turns=5)
        assert len(queries) == 1
        expected = 1.0 if task.metadata["hops"] == 1 else 0.0
        assert exact_match(answer, task.answers) == expected, (task.question, answer)


def test_early_answer_draw_is_seeded(world: World, retriever: BM25Retriever) -> None:
    tasks = [t for t in world.tasks("test") if t.metadata["hops"] > 1]

    def searches(seed: int) -> list[int]:
        oracle = OraclePolicy(world, early_answer_prob=0.5, rng=random.Random(seed))
        return [len(episode(oracle, retriever, t, max_turns=5)[1]) for t in tasks]

    first = searches(7)
    assert first == searches(7)
    assert 1 in first and any(n > 1 for n in first)
