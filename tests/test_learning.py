"""RL learns: a CI-sized run where GRPO must raise the reward by a clear margin.

The task keeps the whole pipeline (world, env, search, tokenizer, tiny model, SFT warm
start through the real rollout, GRPO updates) but makes the target something RL can find
from the warm-started policy's own samples: every training question's gold answer is set
to the answer the warm-started policy already gives most often. Reward starts at that
answer's frequency; GRPO must push it up. (Reading the passage — the demo's real skill —
is measured by `benchmarks/reading_probe.py` and the demo itself.)
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import pytest

from agentr1.config import load_config
from agentr1.rollout import run_rollout
from agentr1.trainer.loop import make_state, rl_step, warm_start
from agentr1.trainer.run import RunDir
from agentr1.trainer.setup import build_setup

CFG = [
    "task.world.n_train=300",
    "task.world.n_test=12",
    "task.world.n_test_ood=4",
    "task.world.hops=[1]",
    "task.world.ood_hops=[2]",
    "model.tiny.hidden_size=64",
    "model.tiny.intermediate_size=128",
    "sft.steps=150",
    "sft.demos=300",
    "sft.demo_worlds=1",
    "sft.batch_size=16",
    "train.tasks_per_step=8",
    "rollout.n_samples=8",
    "rollout.max_turns=3",
    "optim.lr=2e-3",
    "train.log_trajectories=0",
    "train.seed=0",
]


def test_grpo_raises_reward(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTR1_CACHE", str(tmp_path / "cache"))
    cfg = load_config(None, [*CFG, f"train.run_dir={tmp_path / 'run'}"])
    setup = build_setup(cfg)
    run = RunDir(cfg.train.run_dir, cfg, fresh=True)
    warm_start(setup, run)
    probe = run_rollout(
        setup.tasks["train"][:64],
        setup.make_env,
        setup.generator,
        setup.chat,
        dataclasses.replace(cfg.rollout, n_samples=1, seed=123),
    )
    answers = Counter(g.trajectories[0].answer for g in probe if g.trajectories[0].answer)
    target, count = answers.most_common(1)[0]
    assert 0 < count < 64, "the warm-started policy should answer, and not always the same"
    setup.tasks["train"] = [dataclasses.replace(t, answers=[target]) for t in setup.tasks["train"]]
    state = make_state(setup)
    rewards = []
    for _ in range(30):
        rewards.append(rl_step(state, run)["reward"])
        state.step += 1
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last > first + 0.2, f"reward did not rise: {rewards}"
