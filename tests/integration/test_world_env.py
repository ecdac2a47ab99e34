"""The oracle, run through the real rollout, ToolEnv, search tool and BM25, answers every
held-out question of the embedded world: proof that each one is answerable by searching."""

from __future__ import annotations

import pytest

from agentr1.rollout import RolloutConfig, run_rollout
from agentr1.tasks.world import World, oracle_generator, tokenizer_corpus, world_env
from agentr1.types import StopReason
from tests.fakes import byte_chat


@pytest.fixture(scope="module")
def world() -> World:
    return World.build()


@pytest.mark.parametrize("top_k", [1, 3])
@pytest.mark.parametrize("split", ["test", "test_ood"])
def test_oracle_reaches_em_1_through_the_real_stack(world: World, split: str, top_k: int) -> None:
    chat = byte_chat()
    tasks = world.tasks(split)
    groups = run_rollout(
        tasks,
        world_env(world, top_k=top_k),
        oracle_generator(world, chat),
        chat,
        RolloutConfig(max_turns=6, max_tokens_per_turn=256, max_context=8192),
    )
    trajs = [g.trajectories[0] for g in groups]
    assert all(t.stop_reason is StopReason.ANSWERED for t in trajs)
    assert sum(t.metrics["em"] for t in trajs) / len(trajs) == 1.0
    for t, task in zip(trajs, tasks, strict=True):
        assert len(t.tool_log) == task.metadata["hops"]  # one search per hop, no more


def test_imperfect_demonstrations_answer_early_on_multihop(world: World) -> None:
    chat = byte_chat()
    tasks = [t for t in world.tasks("train") if t.metadata["hops"] > 1][:40]
    groups = run_rollout(
        tasks,
        world_env(world),
        oracle_generator(world, chat, early_answer_prob=1.0),
        chat,
        RolloutConfig(max_turns=6, max_tokens_per_turn=256, max_context=8192),
    )
    assert all(len(g.trajectories[0].tool_log) == 1 for g in groups)
    assert all(g.trajectories[0].metrics["em"] == 0.0 for g in groups)


def test_tokenizer_corpus_covers_calls_and_answers(world: World) -> None:
    texts = tokenizer_corpus(world)
    assert any(t.startswith('<tool_call>{"name": "search"') for t in texts)
    assert any(t.startswith("<answer>") for t in texts)
    assert len(texts) > len(world.passages)


def test_world_formats_copy_names_token_for_token(world: World) -> None:
    """With the demo's byte-level BPE, every name the agent writes (in a query or an
    answer) is the same token sequence as where it reads it (question or search result):
    copying is then copying ids, not a learned pairing of " Velmora" with "Velmora"."""
    from agentr1.envs.parsers import search_call
    from agentr1.tasks.world import answer_turn, search_query
    from agentr1.tiny import train_tokenizer

    tok = train_tokenizer(tokenizer_corpus(world), 2048, "bytelevel")

    def contains(text: str, part: str) -> bool:
        ids = tok.encode(text, add_special_tokens=False)
        sub = tok.encode(" " + part, add_special_tokens=False)
        return any(ids[i : i + len(sub)] == sub for i in range(len(ids)))

    for p in world.passages[:200]:
        name, value = p.title, p.text.rsplit(" ", 1)[-1].rstrip(".")
        key = p.id.rsplit(":", 1)[-1]
        assert contains(p.text, value) and contains(answer_turn(value), value), p
        assert contains(search_call(search_query(name, key)), name), p
