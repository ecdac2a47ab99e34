"""Where a step's episodes come from: this process, or Ray rollout workers, synchronous
or ``async.max_staleness`` steps ahead (docs/distributed.md).

    make_rollouts(state)      LocalRollouts (the default) or RemoteRollouts
    .batch(state, timer)      the step's groups, their stats, staleness metrics
    .synced(state, version)   after an update: the sampler(s) get weights ``version``
    .close()

Weight versions count updates: the weights after step ``s``'s update are version
``s + 1``, and every sampled turn records the version that sampled it
(`agentr1.types.Turn.weight_version`).

Asynchronous rollouts (``k = async.max_staleness > 0``): the tasks of steps ``s .. s+k``
are drawn (in order, from the run's task sampler) and handed to a producer thread that
samples them one batch after another on the workers while this process trains. The
batch of step ``t`` starts only once the weights of version ``t - k`` are out, so no
token is more than ``k`` versions older than the weights that train on it; the check is
made again on the trajectories themselves before training. ``k = 0`` is the
synchronous loop exactly: step ``t``'s batch starts after the weights of version ``t``.
"""

from __future__ import annotations

import dataclasses
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from agentr1 import lora
from agentr1.rollout.loop import RolloutConfig, RolloutStats, run_rollout
from agentr1.types import Task, TrajectoryGroup

if TYPE_CHECKING:
    from agentr1.distributed.rollout import RolloutPool
    from agentr1.trainer.state import Timer, TrainState

Batch = tuple[list[TrajectoryGroup], RolloutStats, dict[str, float]]
"""(the step's groups, what sampling them cost, staleness metrics)."""


def step_rollout_config(state: TrainState, step: int) -> RolloutConfig:
    """The rollout settings of step ``step``: the recipe's, seeded by the run's seed and
    the step (the same draws in one process, on workers, and after a resume)."""
    cfg = state.setup.cfg
    return dataclasses.replace(cfg.rollout, seed=cfg.train.seed * 1_000_003 + step)


def release_stale_packs(state: TrainState) -> None:
    """Drop the sampler's packed weights (`agentr1.backends.decode.WeightPacks`) after a
    step's rollout: the coming update makes them stale (a sampler copy is overwritten by
    the sync after it; the policy's own weights are trained; LoRA's adapted layers are
    never packed), so the next rollout packs them again either way, and the update's peak
    memory goes down by their size (a float32 sampler of SmolLM2-135M: 0.4 GiB)."""
    packs = getattr(state.setup.generator, "packs", None)
    if packs is not None:
        packs.clear()


class LocalRollouts:
    """Episodes sampled in this process by the run's own generator."""

    def batch(self, state: TrainState, timer: Timer) -> Batch:
        setup = state.setup
        tasks = state.sampler.sample(setup.cfg.train.tasks_per_step)
        stats = RolloutStats()
        setup.policy.eval()
        with timer("rollout"):
            groups = run_rollout(
                tasks,
                setup.make_env,
                setup.generator,
                setup.chat,
                step_rollout_config(state, state.step),
                stats,
            )
        release_stale_packs(state)
        return groups, stats, {}

    def synced(self, state: TrainState, version: int) -> None:
        state.setup.sync_sampler()
        state.setup.generator.weight_version = version  # type: ignore[attr-defined]

    def close(self) -> None:
        pass


class RemoteRollouts:
    """Episodes sampled by ``distributed.rollout_workers`` Ray actors, up to
    ``async.max_staleness`` steps ahead of the update."""

    def __init__(self, state: TrainState) -> None:
        from agentr1.distributed.rollout import RolloutPool

        setup = state.setup
        self.k = setup.cfg.async_.max_staleness
        self.pool: RolloutPool = RolloutPool(setup.cfg, str(setup.model_dir), setup.given_task)
        # With LoRA only the adapters travel after the first sync (the base is frozen).
        self.adapters_only = bool(lora.lora_modules(setup.policy))
        if self.adapters_only:
            base = lora.base_state_dict(setup.policy)
            self.pool.sync(state.step, base=base, adapters=lora.adapter_state(setup.policy))
        else:
            self.pool.sync(state.step, full=lora.merged_state_dict(setup.policy))
        self._version = state.step
        self._changed = threading.Condition()
        self._producer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollouts")
        self._pending: dict[int, Future[tuple[list[TrajectoryGroup], RolloutStats]]] = {}
        self._tasks: dict[int, list[Task]] = {}

    def batch(self, state: TrainState, timer: Timer) -> Batch:
        n = state.setup.cfg.train.tasks_per_step
        first = max(self._pending, default=state.step - 1) + 1
        for t in range(max(first, state.step), state.step + self.k + 1):
            self._tasks[t] = tasks = state.sampler.sample(n)
            self._pending[t] = self._producer.submit(
                self._produce, t, tasks, step_rollout_config(state, t)
            )
        restarts = self.pool.restarts
        with timer("rollout"):  # with k > 0: the wait for the producer, mostly 0
            groups, stats = self._pending.pop(state.step).result()
        tasks = self._tasks.pop(state.step)
        groups, dropped = self._fresh(state, groups, tasks)
        versions = [t.weight_version for g in groups for tr in g.trajectories for t in tr.turns]
        stale = [state.step - v for v in versions] or [0]
        metrics = {
            "rollout/worker_restarts": float(self.pool.restarts - restarts),
            "rollout/sync_mb": self.pool.sync_bytes / 2**20,
            "async/staleness_mean": sum(stale) / len(stale),
            "async/staleness_max": float(max(stale)),
            "async/dropped_groups": float(dropped),
        }
        return groups, stats, metrics

    def _produce(
        self, step: int, tasks: list[Task], rcfg: RolloutConfig
    ) -> tuple[list[TrajectoryGroup], RolloutStats]:
        """(producer thread) Step ``step``'s batch, once weights ``step - k`` are out."""
        with self._changed:
            self._changed.wait_for(lambda: self._version >= step - self.k)
        stats = RolloutStats()
        return self.pool.run(tasks, rcfg, stats), stats

    def _fresh(
        self, state: TrainState, groups: list[TrajectoryGroup], tasks: list[Task]
    ) -> tuple[list[TrajectoryGroup], int]:
        """The groups with every turn at most k versions old; a group with an older turn
        (a worker that missed a sync) is sampled again now, from the same task and seed."""
        oldest = state.step - self.k
        stale = [
            i
            for i, g in enumerate(groups)
            if any(t.weight_version < oldest for tr in g.trajectories for t in tr.turns)
        ]
        if not stale:
            return groups, 0
        rcfg = step_rollout_config(state, state.step)
        again = self.pool.run([tasks[i] for i in stale], rcfg, None, group_ids=stale)
        out = list(groups)
        for i, g in zip(stale, again, strict=True):
            out[i] = g
        return out, len(stale)

    def synced(self, state: TrainState, version: int) -> None:
        state.setup.sync_sampler()  # the driver's own generator evaluates
        state.setup.generator.weight_version = version  # type: ignore[attr-defined]
        policy = state.setup.policy
        if self.adapters_only:
            self.pool.sync(version, adapters=lora.adapter_state(policy))
        else:
            self.pool.sync(version, full=lora.merged_state_dict(policy))
        with self._changed:
            self._version = version
            self._changed.notify_all()

    def close(self) -> None:
        with self._changed:
            self._version = 1 << 62  # let a waiting producer through
            self._changed.notify_all()
        for f in self._pending.values():
            f.cancel()
        self._producer.shutdown(wait=True, cancel_futures=True)
        self.pool.close()


def make_rollouts(state: TrainState) -> Any:
    """The run's rollout source: workers when ``distributed.rollout_workers`` asks. The
    weights are version ``state.step`` (a resumed run's too)."""
    if state.setup.cfg.distributed.rollout_workers:
        return RemoteRollouts(state)
    state.setup.generator.weight_version = state.step  # type: ignore[attr-defined]
    return LocalRollouts()
