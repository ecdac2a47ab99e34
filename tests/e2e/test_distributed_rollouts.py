"""Whole runs whose episodes are sampled by Ray rollout workers (issue 26): two workers
with ``async.max_staleness: 0`` train exactly like the synchronous one-process loop;
(slow) with ``max_staleness: 2`` the demo task still learns.

Marked ``ray`` (``make test-ray``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file

pytest.importorskip("ray", reason="Ray is not installed here: make ray")

from agentr1.config import load_config
from agentr1.trainer import loop
from agentr1.trainer.loop import rl_step, train
from agentr1.trainer.run import RunDir, metric_records
from agentr1.trainer.setup import build_setup
from agentr1.trainer.sft import warm_start
from agentr1.trainer.state import make_state
from tests.e2e.test_learning import CFG as LEARNING
from tests.e2e.test_train_loop import SMALL

pytestmark = pytest.mark.ray

DIST = ["distributed.num_cpus=2", "distributed.worker_threads=1", "train.threads=1"]


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTR1_CACHE", str(tmp_path_factory.getbasetemp() / "agentr1-cache"))


def rewarded(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiny model earns nothing yet: sample 0 of each group gets reward 1, so every
    step moves the weights."""
    real = loop.sample_rollouts

    def with_rewards(s: Any, timer: Any) -> Any:
        groups, stats, extra = real(s, timer)
        for g in groups:
            for t in g.trajectories:
                t.outcome_reward = float(t.sample_index == 0)
        return groups, stats, extra

    monkeypatch.setattr(loop, "sample_rollouts", with_rewards)


def rows(run_dir: Path) -> list[dict[str, Any]]:
    skip = ("time/", "mem/", "gen_tokens_per_s", "wall_time", "elapsed_s", "async/", "rollout/")
    return [
        {k: v for k, v in r.items() if not k.startswith(skip)}
        for r in metric_records(run_dir, "rl")
    ]


def test_two_rollout_workers_train_like_one_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rewarded(monkeypatch)
    base = [*SMALL, *DIST, "train.steps=3", "train.checkpoint_every=0", "eval.before=false"]
    runs = {}
    for name, extra in (
        ("one", []),
        ("workers", ["distributed.rollout_workers=2", "async.max_staleness=0"]),
    ):
        cfg = load_config(None, [*base, *extra, f"train.run_dir={tmp_path / name}"])
        train(cfg)
        runs[name] = tmp_path / name
    one, two = rows(runs["one"]), rows(runs["workers"])
    assert len(one) == len(two) == 3
    for a, b in zip(one, two, strict=True):
        assert a.keys() == b.keys()
        for k in a:
            same = (
                b[k] == a[k]
                if isinstance(a[k], str)
                else b[k] == pytest.approx(a[k], rel=1e-4, abs=1e-5)
            )
            assert same, (k, a[k], b[k])
    staleness = [r["async/staleness_max"] for r in metric_records(runs["workers"], "rl")]
    assert staleness == [0.0, 0.0, 0.0]  # k = 0: every token sampled by the newest weights
    wa = load_file(str(next((runs["one"] / "final_model").glob("*.safetensors"))))
    wb = load_file(str(next((runs["workers"] / "final_model").glob("*.safetensors"))))
    assert wa.keys() == wb.keys()
    for k in wa:
        assert (wa[k] - wb[k]).abs().max() < 1e-5, k
    assert all(r["grad_norm"] > 0 for r in one)  # the updates were real


@pytest.mark.slow
def test_async_with_staleness_two_learns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """test_learning's setting (RL must teach the second search), sampled by two workers
    up to two versions behind the weights it trains."""
    over = [*LEARNING, *DIST, "distributed.rollout_workers=2", "async.max_staleness=2"]
    cfg = load_config(None, [*over, f"train.run_dir={tmp_path / 'run'}"])
    setup = build_setup(cfg)
    run = RunDir(cfg.train.run_dir, cfg, fresh=True)
    warm_start(setup, run)
    setup.tasks["train"] = [t for t in setup.tasks["train"] if t.metadata["hops"] == 2]
    state = make_state(setup)
    rewards, stale, weights = [], [], []
    try:
        for _ in range(30):
            metrics = rl_step(state, run)
            rewards.append(metrics["reward"])
            stale.append(metrics["async/staleness_max"])
            weights.append(metrics["async/is_weight_mean"])
            state.step += 1
    finally:
        state.rollouts.close()
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last > first + 0.2, f"reward did not rise: {[round(r, 2) for r in rewards]}"
    assert max(stale) <= 2 and max(stale[2:]) >= 1, stale  # it did run ahead, within k
    assert all(0 < w <= 2.0 for w in weights), weights
