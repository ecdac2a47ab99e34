"""Rollout workers on a local Ray cluster (2 CPUs): what they sample, how they fail.

Marked ``ray`` (``make test-ray``): each test starts worker processes, seconds apiece.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

ray = pytest.importorskip("ray", reason="Ray is not installed here: make ray")

from agentr1 import lora  # noqa: E402
from agentr1.config import DistributedConfig, load_config  # noqa: E402
from agentr1.distributed.cluster import connect  # noqa: E402
from agentr1.distributed.rollout import RolloutPool, RolloutWorkerError  # noqa: E402
from agentr1.rollout.loop import RolloutStats, run_rollout  # noqa: E402
from agentr1.tasks import TaskSpec  # noqa: E402
from agentr1.trainer.setup import Setup, build_setup  # noqa: E402
from agentr1.types import TrajectoryGroup  # noqa: E402

pytestmark = pytest.mark.ray

SMALL = [
    "task.config.world.n_train=40",
    "task.config.world.n_test=4",
    "task.config.world.n_test_ood=4",
    "model.tiny.hidden_size=32",
    "model.tiny.intermediate_size=64",
    "model.tiny.vocab_size=600",
    "sft.enabled=false",
    "rollout.n_samples=3",
    "rollout.max_tokens_per_turn=24",
    "rollout.max_turns=3",
    "rollout.temperature=1.0",
    "distributed.rollout_workers=2",
    "distributed.num_cpus=2",
    "distributed.worker_threads=1",
]
DRIVER_PID = os.getpid()


@pytest.fixture(scope="module")
def cluster() -> Any:
    connect(DistributedConfig(num_cpus=2))  # the run's own way (workers import tests.*)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, cluster: Any) -> Setup:
    return build_setup(load_config(None, SMALL), cache_root=tmp_path_factory.mktemp("tiny"))


def episodes(groups: list[TrajectoryGroup]) -> list[tuple[str, int, list[int], str]]:
    return [
        (t.task_id, t.sample_index, t.token_ids, str(t.stop_reason))
        for g in groups
        for t in g.trajectories
    ]


def pool_for(setup: Setup, task: TaskSpec | None = None, **dist: Any) -> RolloutPool:
    cfg = setup.cfg
    cfg = dataclasses.replace(cfg, distributed=dataclasses.replace(cfg.distributed, **dist))
    pool = RolloutPool(cfg, str(setup.model_dir), task)
    pool.sync(7, full=lora.merged_state_dict(setup.policy))
    return pool


def test_two_workers_sample_what_one_process_does(setup: Setup) -> None:
    tasks = list(setup.task.splits["train"])[:8]
    rcfg = dataclasses.replace(setup.cfg.rollout, seed=1234)
    local = run_rollout(tasks, setup.make_env, setup.generator, setup.chat, rcfg)
    pool = pool_for(setup, rollout_chunks=2)
    try:
        stats = RolloutStats()
        remote = pool.run(tasks, rcfg, stats)
    finally:
        pool.close()
    assert episodes(remote) == episodes(local)  # the same tokens, episode for episode
    assert len({len(t.token_ids) for g in local for t in g.trajectories}) > 1  # not trivial
    # A bf16 sampler (the default where the CPU has bf16) rounds its sums by the batch's
    # shape, and a worker's batches are not the one process's: log-probs agree to bf16's
    # accumulation error (seen: 5e-4 at -6.5), fp32 ones to 1e-5.
    bf16 = next(setup.generator.model.parameters()).dtype == torch.bfloat16
    rel = 1e-3 if bf16 else 0.0
    for gl, gr in zip(local, remote, strict=True):
        assert gr.task.id == gl.task.id
        for a, b in zip(gl.trajectories, gr.trajectories, strict=True):
            assert a.loss_mask == b.loss_mask
            assert b.logprobs == pytest.approx(a.logprobs, rel=rel, abs=1e-5)
            assert {t.weight_version for t in b.turns} == {7}  # the version synced
    assert stats.episodes == 8 * 3 and stats.generated_tokens > 0


def slow_reset(spec: TaskSpec, seconds: float) -> TaskSpec:
    """``spec`` whose envs take ``seconds`` to reset on a worker (not in the driver)."""
    base = spec.make_env

    def make_env(**kwargs: Any) -> Any:
        env = base(**kwargs)
        reset = env.reset

        def slow(task: Any) -> Any:
            if os.getpid() != DRIVER_PID:
                time.sleep(seconds)
            return reset(task)

        env.reset = slow
        return env

    return dataclasses.replace(spec, make_env=make_env)


def test_a_worker_killed_mid_step_is_replaced_and_nothing_is_lost(setup: Setup) -> None:
    tasks = list(setup.task.splits["train"])[:8]
    rcfg = dataclasses.replace(setup.cfg.rollout, seed=99)
    expected = episodes(run_rollout(tasks, setup.make_env, setup.generator, setup.chat, rcfg))
    pool = pool_for(setup, slow_reset(setup.task, 0.25), rollout_chunks=2)
    victim = pool.workers[0].pid
    try:
        # 4 calls of 2 groups x 3 episodes, 1.5 s of resets each: the kill lands mid-call.
        killer = threading.Timer(0.8, os.kill, (victim, signal.SIGKILL))
        killer.start()
        stats = RolloutStats()
        got = pool.run(tasks, rcfg, stats)
        killer.join()
    finally:
        pool.close()
    assert pool.restarts == 1
    assert episodes(got) == expected  # every episode once, as sampled without the kill
    assert stats.episodes == 8 * 3  # the killed call is not counted


def raising(spec: TaskSpec) -> TaskSpec:
    """``spec`` whose envs cannot be made on a worker."""
    base = spec.make_env

    def make_env(**kwargs: Any) -> Any:
        if os.getpid() != DRIVER_PID:
            raise RuntimeError("the env's database is locked")
        return base(**kwargs)

    return dataclasses.replace(spec, make_env=make_env)


def test_a_worker_that_raises_is_named(setup: Setup) -> None:
    pool = pool_for(setup, raising(setup.task))
    try:
        with pytest.raises(RolloutWorkerError) as err:
            pool.run(list(setup.task.splits["train"])[:2], setup.cfg.rollout)
    finally:
        pool.close()
    msg = str(err.value)
    assert "rollout worker 'rollout-" in msg and "(pid " in msg
    assert "RuntimeError: the env's database is locked" in msg
    assert "tasks [" in msg


def settled_only(spec: TaskSpec) -> TaskSpec:
    """``spec`` whose envs can be made on a worker only once the worker's setup is frozen
    out of the collector's full collections (`agentr1.trainer.state.settled_heap`)."""
    base = spec.make_env

    def make_env(**kwargs: Any) -> Any:
        if os.getpid() != DRIVER_PID and gc.get_freeze_count() < 1000:
            raise RuntimeError(f"unsettled heap: {gc.get_freeze_count()} objects frozen")
        return base(**kwargs)

    return dataclasses.replace(spec, make_env=make_env)


def test_a_worker_keeps_its_setup_out_of_full_collections(setup: Setup) -> None:
    pool = pool_for(setup, settled_only(setup.task))
    try:
        stats = RolloutStats()
        pool.run(list(setup.task.splits["train"])[:4], setup.cfg.rollout, stats)
    finally:
        pool.close()
    assert stats.episodes == 4 * 3
    assert gc.get_freeze_count() == 0  # the driver's own heap is not touched


def test_workers_that_keep_dying_fail_the_step(setup: Setup, tmp_path: Path) -> None:
    pool = pool_for(setup, slow_reset(setup.task, 0.3), restarts=1, rollout_chunks=1)
    stop = threading.Event()

    def kill_all() -> None:
        while not stop.is_set():
            for w in list(pool.workers):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(w.pid, signal.SIGKILL)
            time.sleep(0.3)

    try:
        killer = threading.Thread(target=kill_all, daemon=True)
        killer.start()
        with pytest.raises(RolloutWorkerError, match=r"died .*distributed.restarts=1"):
            pool.run(list(setup.task.splits["train"])[:4], setup.cfg.rollout)
    finally:
        stop.set()
        pool.close()


def test_with_lora_only_the_adapters_travel(
    tmp_path_factory: pytest.TempPathFactory, cluster: Any
) -> None:
    cfg = load_config(None, [*SMALL, "model.lora.rank=4", "distributed.rollout_workers=1"])
    setup = build_setup(cfg, cache_root=tmp_path_factory.mktemp("tiny-lora"))
    torch.manual_seed(0)
    for _, m in lora.lora_modules(setup.policy):
        m.get_parameter("lora_B").data.normal_(0.0, 0.2)  # an update that changes samples
    tasks = list(setup.task.splits["train"])[:4]
    rcfg = dataclasses.replace(setup.cfg.rollout, seed=5)
    setup.sync_sampler()  # a bf16 sampler is a copy: give it the adapters, merged
    local = run_rollout(tasks, setup.make_env, setup.generator, setup.chat, rcfg)
    pool = RolloutPool(cfg, str(setup.model_dir))
    try:
        base = lora.base_state_dict(setup.policy)
        pool.sync(3, base=base, adapters=lora.adapter_state(setup.policy))
        first = pool.sync_bytes
        pool.sync(4, adapters=lora.adapter_state(setup.policy))
        assert pool.sync_bytes < first / 5  # the adapters alone, not the model
        remote = pool.run(tasks, rcfg)
        plain = RolloutPool(cfg, str(setup.model_dir))  # the base weights only, for contrast
        plain.sync(0, full=base)
        try:
            unadapted = plain.run(tasks, rcfg)
        finally:
            plain.close()
    finally:
        pool.close()
    assert episodes(remote) == episodes(local)
    assert episodes(unadapted) != episodes(local)  # the adapters mattered
    assert {t.weight_version for g in remote for tr in g.trajectories for t in tr.turns} == {4}


def test_more_actors_than_the_cluster_has_cpus_is_refused(setup: Setup) -> None:
    d = dataclasses.replace(setup.cfg.distributed, rollout_workers=2, trainer_ranks=2)
    with pytest.raises(ValueError, match=r"reserve 3 CPUs .*the cluster has 2 CPUs"):
        connect(d)
    connect(dataclasses.replace(d, cpus_per_worker=0.5))  # 1.5 of 2: fits
