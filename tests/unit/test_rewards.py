"""Process rewards and their placement; outcome rewards equal the eval metrics."""

from __future__ import annotations

import pytest

from agentr1.rewards import OUTCOME_REWARDS, ProcessRewardConfig
from agentr1.rewards.process import evidence_potential, new_evidence, new_evidence_shaping
from agentr1.rollout.collate import place_rewards
from agentr1.types import StepContext, Task, ToolCall, ToolResult, Trajectory

TASK = Task("q", "?", ["Paris"], {"supporting": ["p1", "p2"]})


def step(
    turn: int, queries: list[str], found: list[list[str]], previous=(), errors=()
) -> StepContext:
    calls = [ToolCall("search", {"query": q}) for q in queries]
    results = [ToolResult("x", metadata={"passage_ids": ids}) for ids in found]
    return StepContext(TASK, turn, "", calls, results, list(errors), None, list(previous))


def test_potential_shaping_telescopes_to_final_potential() -> None:
    s0 = step(0, ["a"], [["p1", "zz"]])
    s1 = step(1, ["b"], [["p1"]], [s0])  # nothing new
    s2 = step(2, ["c"], [["p2"]], [s0, s1])
    shaping = [new_evidence_shaping(s) for s in (s0, s1, s2)]
    assert shaping == [0.5, 0.0, 0.5]
    # gamma = 1: the sum is Φ(final) - Φ(start) = 1 - 0, whatever the order of discovery
    assert sum(shaping) == evidence_potential(s2) == 1.0
    assert [new_evidence(s) for s in (s0, s1, s2)] == [2.0, 0.0, 1.0]


def test_config_combines_terms_and_disabled_is_none() -> None:
    assert ProcessRewardConfig(enabled=False).build() is None
    r = ProcessRewardConfig(
        enabled=True, valid_call=0.05, invalid_call=0.1, repeated_query=0.1, evidence=0.2
    ).build()
    assert r is not None
    s0 = step(0, ["a"], [["p1"]])
    # valid call 0.05 + evidence 0.2 * (0.5 - 0)
    assert r(s0) == pytest.approx(0.15)
    s1 = step(1, ["A "], [["p1"]], [s0], errors=["malformed_json"])
    # no valid bonus (a parse error), -0.1 per error, -0.1 repeated query, no new evidence
    assert r(s1) == pytest.approx(-0.2)


def test_evidence_kept_at_the_end_is_a_bonus_zeroed_it_sums_to_nothing() -> None:
    s0 = step(0, ["a"], [["p1"]])
    s1 = step(1, ["b"], [["p2"]], [s0])
    cfg = ProcessRewardConfig(enabled=True, valid_call=0.0, evidence=0.2)
    keep = cfg.build()
    zero = ProcessRewardConfig(**{**vars(cfg), "evidence_at_end": "zero"}).build()
    assert keep is not None and zero is not None
    steps = [zero(s0), zero(s1)]
    assert steps == [keep(s0), keep(s1)] == [pytest.approx(0.1), pytest.approx(0.1)]
    assert keep.terminal([s0, s1]) == 0.0  # the episode keeps 0.2 for its evidence
    assert zero.terminal([s0, s1]) == pytest.approx(-0.2)  # Φ(terminal) = 0
    assert sum(steps) + zero.terminal([s0, s1]) == pytest.approx(0.0)
    assert zero.terminal([s0]) == pytest.approx(-0.1) and zero.terminal([]) == 0.0
    # the plain count has no potential to give back
    plain = ProcessRewardConfig(**{**vars(cfg), "evidence_mode": "plain"})
    hook = ProcessRewardConfig(**{**vars(plain), "evidence_at_end": "zero"}).build()
    assert hook is not None and hook.terminal([s0, s1]) == 0.0


def test_no_answer_penalty_only_when_the_episode_ends_without_one() -> None:
    s0 = step(0, ["a"], [["p1"]])
    cfg = ProcessRewardConfig(enabled=True, valid_call=0.0, evidence=0.2, no_answer=0.3)
    hook = cfg.build()
    assert hook is not None
    assert hook.terminal([s0], "Velmora") == 0.0
    assert hook.terminal([s0], None) == hook.terminal([s0], "  ") == pytest.approx(-0.3)
    zero = ProcessRewardConfig(**{**vars(cfg), "evidence_at_end": "zero"}).build()
    assert zero is not None  # both end terms add up: Φ given back and the penalty
    assert zero.terminal([s0], None) == pytest.approx(-0.1 - 0.3)
    assert zero.terminal([s0], "x") == pytest.approx(-0.1)
    assert ProcessRewardConfig(enabled=True).build().terminal([s0], None) == 0.0  # default off


def test_rewards_sit_on_each_turns_last_token() -> None:
    t = Trajectory(task_id="x")
    t.append_prompt([1, 2])
    t.append_sampled([3, 4], [0.0, 0.0], "")
    t.turns[-1].reward = 0.25
    t.append_inserted([5])
    t.append_sampled([6, 7, 8], [0.0] * 3, "")
    t.turns[-1].reward = -0.5
    t.outcome_reward = 1.0
    assert place_rewards(t) == [0, 0, 0, 0.25, 0, 0, 0, 0.5]


@pytest.mark.parametrize("name", ["em", "f1", "cover_em"])
def test_outcome_reward_equals_metric(name: str) -> None:
    from agentr1.envs.base import ToolEnv
    from agentr1.rewards import ANSWER_METRICS

    env = ToolEnv(tools=[], outcome_reward=OUTCOME_REWARDS.get(name), metrics=ANSWER_METRICS)
    env.reset(Task("q", "?", ["New York City"]))
    reward, metrics = env.finish("new york")
    assert reward == metrics[name]


def test_evidence_on_real_qa_matches_supporting_titles_case_insensitively() -> None:
    task = Task("q", "?", ["x"], {"supporting_titles": ["Shirley Temple", "Kiss and Tell"]})

    def search(turn: int, titles: list[str], previous=()) -> StepContext:
        result = ToolResult("x", metadata={"titles": titles, "passage_ids": ["id"]})
        return StepContext(
            task, turn, "", [ToolCall("search", {"query": "q"})], [result], [], None, list(previous)
        )

    s0 = search(0, ["shirley  temple", "Other"])
    s1 = search(1, ["Shirley Temple"], [s0])  # the same title again earns nothing
    s2 = search(2, ["Kiss and Tell"], [s0, s1])
    assert [new_evidence_shaping(s) for s in (s0, s1, s2)] == [0.5, 0.0, 0.5]
    untitled = Task("q", "?", ["x"])  # question-only data: the shaping is inert
    assert evidence_potential(StepContext(untitled, 0, "", [], [], [], None)) == 0.0
