"""Rollout workers as Ray actors (docs/distributed.md): each has its own generator
(``model.backend``) and envs; the driver hands out task groups and gets `Trajectory`
objects back, token ids, masks and log-probs included.

    RolloutPool.run(tasks, rcfg)   one step's groups, spread over the workers
    RolloutPool.sync(weights, v)   the weights of version v to every worker

Load balance: a step's groups are cut into calls of a few groups each
(``distributed.rollout_chunks`` per worker); a worker holds at most two calls (one
running, one queued so it never waits on the driver) and the next call goes to the
worker with the fewest episodes outstanding, so one long episode holds back one call,
not a fixed share of the step. Every episode draws with its own seed
(`agentr1.rollout.loop.row_seed`), so what a step samples does not depend on how it
was split: two workers return what one in-process generator does.

Failures: a worker whose process dies (killed, out of memory) is replaced, given the
newest weights, and its calls run again from their tasks (a call's result is kept
only once, when it completes: nothing is lost or counted twice); after
``distributed.restarts`` replacements in one step the step fails. A worker that raises
fails the step with an error naming the worker, its process and the tasks.

Weights travel through Ray's object store: one ``ray.put`` per version, read by every
worker (on GPUs, a NCCL broadcast from the trainer's rank 0 to the workers' engines
would replace the object store; the version bookkeeping stays as it is).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import torch

from agentr1 import lora
from agentr1.config import Config
from agentr1.distributed.cluster import actor_options, connect, ray_cause, threads
from agentr1.rollout.loop import RolloutConfig, RolloutStats, run_rollout
from agentr1.types import Task, TrajectoryGroup

log = logging.getLogger(__name__)


class RolloutWorkerError(RuntimeError):
    """A rollout worker raised (or could not start): the step cannot finish."""


class RolloutWorker:
    """The body of one rollout actor: a generator over the policy's weights and the
    task's envs, in a process of its own."""

    def __init__(self, cfg: Config, model_path: str, task: Any, name: str) -> None:
        from agentr1.trainer.setup import sampler_setup
        from agentr1.trainer.state import settled_heap

        torch.set_num_threads(threads(cfg.distributed))
        self.name = name
        self.make_env, self.chat, self.generator = sampler_setup(cfg, model_path, task)
        self.base: dict[str, torch.Tensor] | None = None
        # What the setup made (model, task data, tokenizer) lives as long as the worker:
        # kept out of the collector's full collections for the process's life, as the
        # driver's RL steps are (`settled_heap`). The worker holds the open block: dropping
        # it would close the block and unfreeze.
        self._settled = ExitStack()
        self._settled.enter_context(settled_heap())

    def pid(self) -> int:
        return os.getpid()

    def load_weights(
        self,
        version: int,
        full: dict[str, torch.Tensor] | None = None,
        base: dict[str, torch.Tensor] | None = None,
        adapters: lora.Adapters | None = None,
    ) -> int:
        """Sample from weights ``version`` from now on: ``full`` (HF names, adapters
        merged), or the LoRA ``adapters`` folded into ``base`` (sent once; kept here)."""
        from agentr1.trainer.setup import load_sampler_weights

        if base is not None:
            self.base = base
        if full is not None:
            load_sampler_weights(self.generator, full)
        elif adapters is not None:
            if self.base is None:
                raise RuntimeError(f"{self.name}: LoRA adapters arrived before the base weights")
            load_sampler_weights(self.generator, lora.merge_into(self.base, adapters))
        self.generator.weight_version = version  # type: ignore[attr-defined]
        return version

    def rollout(
        self, tasks: list[Task], group_ids: list[int], rcfg: RolloutConfig
    ) -> tuple[list[TrajectoryGroup], RolloutStats]:
        stats = RolloutStats()
        groups = run_rollout(
            tasks, self.make_env, self.generator, self.chat, rcfg, stats, group_ids
        )
        return groups, stats


@dataclass
class _Handle:
    """One live worker as the driver sees it."""

    name: str
    actor: Any
    pid: int
    outstanding: int = 0
    """Episodes of the calls sent to it and not yet returned."""
    calls: int = 0


@dataclass
class _Call:
    index: int
    tasks: list[Task]
    group_ids: list[int]
    episodes: int


@dataclass
class _Dispatch:
    """One step's calls in flight: future -> (worker, call)."""

    todo: list[_Call]
    running: dict[Any, tuple[_Handle, _Call]] = field(default_factory=dict)
    done: dict[int, tuple[list[TrajectoryGroup], RolloutStats]] = field(default_factory=dict)
    replaced: int = 0


class RolloutPool:
    """``distributed.rollout_workers`` rollout actors on the run's Ray cluster."""

    def __init__(self, cfg: Config, model_path: str, task: Any = None) -> None:
        self.ray = connect(cfg.distributed)
        self.cfg = cfg
        self.model_path = model_path
        self.task = task
        self._cls = self.ray.remote(RolloutWorker)
        self._full: Any = None  # object refs of the newest weights
        self._base: Any = None
        self._adapters: Any = None
        self.version = 0
        self.sync_bytes = 0
        """Bytes put in the object store by the last `sync`."""
        self.restarts = 0
        """Workers replaced so far (over all steps)."""
        self._lock = threading.RLock()
        self._started = 0
        self.workers = [self._start() for _ in range(cfg.distributed.rollout_workers)]

    # ------------------------------------------------------------------ workers
    def _start(self) -> _Handle:
        """A new worker (named ``rollout-<n>``, n counting every one started), with the
        newest weights."""
        name = f"rollout-{self._started}"
        self._started += 1
        opts = actor_options(self.cfg.distributed, name)
        opts.pop("name")  # names are for people; Ray's must be unique per cluster
        actor = self._cls.options(**opts).remote(self.cfg, self.model_path, self.task, name)
        try:
            pid = self.ray.get(actor.pid.remote())
        except self.ray.exceptions.RayError as e:
            raise RolloutWorkerError(
                f"rollout worker {name!r} could not start: {ray_cause(e)}"
            ) from None
        if self._full is not None or self._adapters is not None:
            full = None if self._adapters is not None else self._full
            actor.load_weights.remote(self.version, full, self._base, self._adapters)
        log.info("rollout worker %s started (pid %d)", name, pid)
        return _Handle(name, actor, pid)

    def sync(
        self,
        version: int,
        full: dict[str, torch.Tensor] | None = None,
        base: dict[str, torch.Tensor] | None = None,
        adapters: lora.Adapters | None = None,
    ) -> None:
        """Send weights ``version`` to every worker: ``full`` (HF names, adapters merged),
        or LoRA ``adapters`` alone once the workers have the frozen ``base`` (sent with the
        first adapters; a replaced worker gets it again). Each is put in the object store
        once and read by every worker. Calls sent later sample from the new weights; calls
        already queued on a worker run first (their turns record the older version)."""
        if full is None and adapters is None:
            raise ValueError("sync: give full weights or adapters")

        def put(tensors: Any) -> Any:
            self.sync_bytes += _nbytes(tensors)
            return self.ray.put(tensors)

        with self._lock:
            self.sync_bytes = 0
            new_base = put(_cpu(base)) if base is not None else None
            if new_base is not None:
                self._base = new_base
            self._full = put(_cpu(full)) if full is not None else None
            self._adapters = put(adapters) if adapters is not None else None
            self.version = version
            for w in self.workers:
                w.actor.load_weights.remote(version, self._full, new_base, self._adapters)

    def close(self) -> None:
        for w in self.workers:
            self.ray.kill(w.actor, no_restart=True)
        self.workers = []

    # ------------------------------------------------------------------ a step
    def run(
        self,
        tasks: Sequence[Task],
        rcfg: RolloutConfig,
        stats: RolloutStats | None = None,
        group_ids: Sequence[int] | None = None,
    ) -> list[TrajectoryGroup]:
        """``rcfg.n_samples`` episodes of every task, spread over the workers; one group
        per task, in order (what `run_rollout` returns in one process; ``group_ids`` as
        there).

        Raises:
            RolloutWorkerError: a worker raised, or more than ``distributed.restarts``
                workers died during this step.
        """
        t0 = time.perf_counter()
        ids = list(range(len(tasks))) if group_ids is None else list(group_ids)
        d = _Dispatch(todo=self._calls(tasks, ids, rcfg.n_samples))
        n_calls = len(d.todo)
        while len(d.done) < n_calls:
            self._fill(d, rcfg)
            ready, _ = self.ray.wait(list(d.running), num_returns=1)
            self._collect(d, ready[0])
        groups: list[TrajectoryGroup] = []
        for i in range(n_calls):
            g, st = d.done[i]
            groups.extend(g)
            if stats is not None:
                _add_stats(stats, st)
        if stats is not None:
            stats.total_s += time.perf_counter() - t0
        return groups

    def _calls(self, tasks: Sequence[Task], ids: list[int], n_samples: int) -> list[_Call]:
        """The step's groups cut into ``rollout_chunks`` calls per worker (in order)."""
        per = max(1, self.cfg.distributed.rollout_chunks) * max(1, len(self.workers))
        size = max(1, -(-len(tasks) // per))
        return [
            _Call(
                n, list(tasks[i : i + size]), ids[i : i + size], n_samples * len(ids[i : i + size])
            )
            for n, i in enumerate(range(0, len(tasks), size))
        ]

    def _fill(self, d: _Dispatch, rcfg: RolloutConfig) -> None:
        """Send waiting calls to the least loaded workers holding fewer than two."""
        with self._lock:
            self._fill_locked(d, rcfg)

    def _fill_locked(self, d: _Dispatch, rcfg: RolloutConfig) -> None:
        while d.todo:
            free = [w for w in self.workers if w.calls < 2]
            if not free:
                return
            w = min(free, key=lambda h: (h.outstanding, h.calls))
            call = d.todo.pop(0)
            ref = w.actor.rollout.remote(call.tasks, call.group_ids, rcfg)
            d.running[ref] = (w, call)
            w.outstanding += call.episodes
            w.calls += 1

    def _collect(self, d: _Dispatch, ref: Any) -> None:
        """Keep one finished call; a dead worker is replaced and its calls sent again."""
        w, call = d.running.pop(ref)
        with self._lock:
            w.outstanding -= call.episodes
            w.calls -= 1
        try:
            d.done[call.index] = self.ray.get(ref)
        except self.ray.exceptions.RayActorError as e:
            self._replace(d, w, call, e)
        except self.ray.exceptions.RayTaskError as e:
            ids = [t.id for t in call.tasks]
            raise RolloutWorkerError(
                f"rollout worker {w.name!r} (pid {w.pid}) raised on tasks {ids}: {ray_cause(e)}"
            ) from None

    def _replace(self, d: _Dispatch, dead: _Handle, call: _Call, err: Exception) -> None:
        """``dead``'s process is gone: its calls go back to the queue (front, in order),
        a new worker takes its place."""
        if dead not in self.workers:  # already replaced for another of its calls
            d.todo.insert(0, call)
            return
        lost = [call] + [c for ref, (w, c) in list(d.running.items()) if w is dead]
        for ref in [r for r, (w, _) in d.running.items() if w is dead]:
            d.running.pop(ref)
        d.todo[:0] = sorted(lost, key=lambda c: c.index)
        d.replaced += 1
        self.restarts += 1
        if d.replaced > self.cfg.distributed.restarts:
            raise RolloutWorkerError(
                f"rollout worker {dead.name!r} (pid {dead.pid}) died and "
                f"{d.replaced - 1} replacements died too this step (distributed.restarts="
                f"{self.cfg.distributed.restarts}): {ray_cause(err)}"
            )
        log.warning(
            "rollout worker %s (pid %d) died: %s; replacing it and running its %d call(s) again",
            dead.name,
            dead.pid,
            ray_cause(err),
            len(lost),
        )
        with self._lock:
            self.workers[self.workers.index(dead)] = self._start()


def _cpu(weights: dict[str, torch.Tensor] | None) -> dict[str, torch.Tensor] | None:
    return None if weights is None else {k: v.detach().cpu() for k, v in weights.items()}


def _nbytes(tensors: Any) -> int:
    """Bytes of the tensors in a (nested) dict / tuple."""
    if isinstance(tensors, torch.Tensor):
        return tensors.numel() * tensors.element_size()
    if isinstance(tensors, dict):
        return sum(_nbytes(v) for v in tensors.values())
    if isinstance(tensors, tuple | list):
        return sum(_nbytes(v) for v in tensors)
    return 0


def _add_stats(into: RolloutStats, st: RolloutStats) -> None:
    """Sum a worker's stats into the step's (``total_s`` is the driver's own wall time)."""
    into.episodes += st.episodes
    into.turns += st.turns
    into.generated_tokens += st.generated_tokens
    into.generate_s += st.generate_s
    into.env_s += st.env_s
    into.prefill_s += st.prefill_s
    into.decode_s += st.decode_s
    for k, v in st.stop_reasons.items():
        into.stop_reasons[k] = into.stop_reasons.get(k, 0) + v
