"""RL learns: a CI-sized run where GRPO must raise the reward by a clear margin.

The demo in miniature (a world of 40 people, 1- and 2-hop questions; the demo's tiny
Llama and tokenizer; an SFT warm start through the real rollout on imperfect
demonstrations that answer right after the first search on 60% of 2-hop questions),
then GRPO with the exact-match reward on the 2-hop training questions only. The warm
start usually stops after one search; RL must teach it to search again and read the
second result. Measured (seed 0): reward 0.23 over the first 5 steps, 0.68 over the last
5, in about 65 s on 2 idle cores -- minutes on busy ones, hence the slow tier
(`make test-slow`, which CI runs after the default tier).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from agentr1.config import load_config
from agentr1.trainer.loop import close_run, rl_step
from agentr1.trainer.run import RunDir
from agentr1.trainer.setup import Setup, build_setup
from agentr1.trainer.sft import warm_start
from agentr1.trainer.state import make_state

CFG = [
    "task.config.world.hops=[1,2]",
    "task.config.world.ood_hops=[3]",
    "task.config.world.n_train=300",
    "task.config.world.n_test=12",
    "task.config.world.n_test_ood=4",
    "task.config.world.n_people=40",
    "task.config.world.n_cities=12",
    "task.config.world.n_countries=4",
    "task.config.world.n_companies=10",
    "task.config.world.n_films=10",
    "task.config.world.n_universities=6",
    "sft.steps=400",
    "sft.demos=600",
    "task.config.demo_worlds=0",
    "task.config.early_answer_prob=0.6",
    "train.tasks_per_step=8",
    "rollout.n_samples=8",
    "optim.lr=3e-4",
    "train.log_trajectories=0",
    "train.seed=0",
]


def teach_second_search(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    overrides: tuple[str, ...] = (),
    check_setup: Callable[[Setup], None] | None = None,
) -> tuple[list[float], list[float]]:
    """`CFG` (plus ``overrides``): the warm start, then 30 GRPO steps on the 2-hop training
    questions; each step's mean reward and mean searches per episode. ``check_setup``
    sees the setup before any training, so a wrong one fails in seconds, not minutes."""
    monkeypatch.setenv("AGENTR1_CACHE", str(tmp_path / "cache"))
    cfg = load_config(None, [*CFG, *overrides, f"train.run_dir={tmp_path / 'run'}"])
    setup = build_setup(cfg)
    if check_setup is not None:
        check_setup(setup)
    run = RunDir(cfg.train.run_dir, cfg, fresh=True)
    warm_start(setup, run)
    setup.tasks["train"] = [t for t in setup.tasks["train"] if t.metadata["hops"] == 2]
    state = make_state(setup)
    rewards, searches = [], []
    try:
        for _ in range(30):
            metrics = rl_step(state, run)
            assert metrics["skipped_updates"] == 0, metrics
            rewards.append(metrics["reward"])
            searches.append(metrics["tool_calls"])
            state.step += 1
    finally:
        close_run(run, state)
    return rewards, searches


def assert_learned_the_second_search(rewards: list[float], searches: list[float]) -> None:
    """The reward rose by a clear margin, because the policy learned to search twice."""
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last > first + 0.25, f"reward did not rise: {[round(r, 2) for r in rewards]}"
    # ... because it learned to search twice, not by some other route
    assert sum(searches[-5:]) / 5 > sum(searches[:5]) / 5 + 0.2, searches


@pytest.mark.slow
def test_grpo_teaches_the_second_search(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rewards, searches = teach_second_search(tmp_path, monkeypatch)
    assert_learned_the_second_search(rewards, searches)
