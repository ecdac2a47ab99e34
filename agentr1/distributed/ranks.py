"""Data-parallel trainer ranks (``distributed.trainer_ranks: N``, docs/distributed.md):
this process is rank 0, ranks 1..N-1 are Ray actors, all joined in one
``torch.distributed`` process group (gloo on CPU, nccl on GPU).

    TrainerGroup(cfg, policy)       start the ranks (they build their replicas meanwhile)
    TrainerGroup.update(...)        `agentr1.trainer.update.rl_update` on every rank at once
    TrainerGroup.sync(learner)      the ranks take rank 0's weights and optimizer states
    TrainerGroup.close()            the process group and the actors go

A rank holds a replica of the policy (and of the critic with gae), built as rank 0's
(`build_replica`: the same architecture, LoRA adapters, optimizer and LR schedule), and
takes rank 0's weights, optimizer and scheduler states at its first update (after a
resume, a warm start: whatever rank 0 holds then). Each update sends every rank the whole
batch and the permutation generator's state; each rank runs `rl_update` with its
`agentr1.distributed.dp.DataParallel` (its share of every minibatch, the gradients summed
over ranks), so every rank takes the same optimizer steps and the replicas stay equal.
With ``distributed.sharding: fsdp`` each rank (rank 0 too, beside its whole policy) holds
a shard instead of a replica (`agentr1.distributed.fsdp`); after each update the trained
weights are gathered into rank 0's policy, and `TrainerGroup.pull_states` gathers the
optimizer states into rank 0's optimizer before a checkpoint is written.

Failures: a rank that raises aborts its side of the process group, so the others'
collectives fail at once, and the update raises `TrainerRankError` naming the rank, its
actor and its error; a rank whose process dies is named the same way; one that hangs is
named after ``distributed.timeout_s`` (the collectives' timeout). Ray is imported here
only when a group starts.
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

from agentr1 import lora
from agentr1.config import AlgoConfig, Config, OptimConfig
from agentr1.distributed.cluster import actor_options, connect, ray_cause, threads
from agentr1.distributed.dp import CollectiveError, DataParallel, broadcast_flat, collective
from agentr1.trainer.setup import enable_activation_checkpointing, train_autocast
from agentr1.trainer.update import Learner, UpdateBatch, rl_update

log = logging.getLogger(__name__)

_GRACE_S = 5.0
"""How long rank 0, its collective failed, waits for a peer's error to arrive."""


class TrainerRankError(RuntimeError):
    """A trainer rank raised, died or did not answer: the update cannot finish."""


def replica_tensors(learner: Learner) -> list[torch.Tensor]:
    """Every tensor a replica must share with rank 0: the policy's and critic's
    parameters and buffers (non-persistent ones too, e.g. rotary frequencies), each once
    (tied weights are one tensor), in module order."""
    out: list[torch.Tensor] = []
    seen: set[int] = set()
    for module in (learner.policy, learner.critic):
        if module is None:
            continue
        for t in (*module.parameters(), *module.buffers()):
            if id(t) not in seen:
                seen.add(id(t))
                out.append(t.data)
    return out


def learner_states(learner: Learner) -> dict[str, Any]:
    """The optimizer and scheduler states of ``learner``, on the CPU (to travel)."""

    def cpu(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return x.detach().cpu()
        if isinstance(x, dict):
            return {k: cpu(v) for k, v in x.items()}
        if isinstance(x, list | tuple):
            return type(x)(cpu(v) for v in x)
        return x

    states = {"optimizer": cpu(learner.optimizer.state_dict())}
    if learner.scheduler is not None:
        states["scheduler"] = learner.scheduler.state_dict()
    if learner.critic_optimizer is not None:
        states["critic_optimizer"] = cpu(learner.critic_optimizer.state_dict())
    return states


def load_learner_states(learner: Learner, states: dict[str, Any]) -> None:
    """`learner_states` into ``learner`` (the optimizer moves them to its parameters'
    device)."""
    learner.optimizer.load_state_dict(states["optimizer"])
    if learner.scheduler is not None:
        learner.scheduler.load_state_dict(states["scheduler"])
    if learner.critic_optimizer is not None:
        learner.critic_optimizer.load_state_dict(states["critic_optimizer"])


def build_replica(cfg: Config, model_config: Any, device: torch.device) -> Learner:
    """A trainer rank's `Learner`: the policy's architecture from its transformers config
    (no weights read from disk: rank 0 sends them), in ``model.dtype``, with the same
    LoRA adapters and activation checkpointing, then `agentr1.trainer.state.make_learner`
    as rank 0's."""
    from transformers import AutoModelForCausalLM

    from agentr1.trainer.state import make_learner

    torch.manual_seed(cfg.train.seed)
    dtype = torch.bfloat16 if cfg.model.dtype == "bfloat16" else torch.float32
    policy = AutoModelForCausalLM.from_config(model_config, dtype=dtype)  # type: ignore[no-untyped-call]
    policy = torch.nn.Module.to(policy, device).eval()
    if cfg.model.lora.rank:
        lc = cfg.model.lora
        lora.apply_lora(policy, lc.rank, lc.alpha, lc.targets, lc.share_input)
    if cfg.optim.activation_checkpointing:
        enable_activation_checkpointing(policy)
    return make_learner(cfg, policy)


def backend_of(device: torch.device) -> str:
    """The process group's backend for tensors on ``device``."""
    return "nccl" if device.type == "cuda" else "gloo"


def init_group(
    init_method: str, rank: int, world: int, device: torch.device, timeout_s: float
) -> None:
    """Join the default process group (every rank calls this together)."""
    import torch.distributed as dist

    with collective(f"joining the process group at {init_method}"):
        dist.init_process_group(
            backend_of(device),
            init_method=init_method,
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=timeout_s),
        )


def leave_group() -> None:
    """Leave the default process group (its connections close: peers waiting on a
    collective with this rank fail at once)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def replica_of(learner: Learner) -> dict[str, dict[str, torch.Tensor]]:
    """``{"params": ..., "grads": ...}``: CPU copies of ``learner``'s trainable parameters
    (``critic.``-prefixed for the critic's) and of their gradients where they have one;
    whole tensors of a sharded learner (gathered: every rank calls this together)."""

    def whole(t: torch.Tensor) -> torch.Tensor:
        full = t.full_tensor() if hasattr(t, "full_tensor") else t
        return full.detach().cpu().clone()

    params: dict[str, torch.Tensor] = {}
    grads: dict[str, torch.Tensor] = {}
    for prefix, module in (("", learner.policy), ("critic.", learner.critic)):
        if module is None:
            continue
        for n, p in module.named_parameters():
            if p.requires_grad:
                params[prefix + n] = whole(p)
                if p.grad is not None:
                    grads[prefix + n] = whole(p.grad)
    return {"params": params, "grads": grads}


class Replica:
    """One rank's side of each group operation, over its training copy: a whole replica
    (ddp) or a shard (fsdp). Every rank calls the same method at the same time.

    Args:
        learner: the training copy, as built (`build_replica`); sharded by `start` (fsdp).
    """

    def __init__(self, cfg: Config, learner: Learner, rank: int, world: int) -> None:
        from agentr1.distributed.fsdp import ShardedParallel

        self.cfg, self.learner, self.rank = cfg, learner, rank
        self.sharded = cfg.distributed.sharding == "fsdp"
        device = next(learner.policy.parameters()).device
        self.dp = (ShardedParallel if self.sharded else DataParallel)(rank, world, device)

    def start(self, source: Learner | None, states: dict[str, Any]) -> None:
        """Take rank 0's state after joining the group (shard first, with fsdp)."""
        if self.sharded:
            from agentr1.distributed.fsdp import shard_learner

            self.learner = shard_learner(self.cfg, self.learner)
        self.take(source, states)

    def take(self, source: Learner | None, states: dict[str, Any]) -> None:
        """Rank 0's weights, optimizer and scheduler states; ``source`` = rank 0's learner
        (on rank 0), None elsewhere; ``states``: `travelling_states` of it."""
        if not self.sharded:
            broadcast_flat(replica_tensors(self.learner), src=0)
            if source is None:  # on rank 0 the replica is the source itself
                load_learner_states(self.learner, states)
            return
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
        )

        from agentr1.distributed.fsdp import clear_states, scatter_states

        opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        with collective("sending rank 0's weights"):
            for name in ("policy", "critic"):
                module = getattr(self.learner, name)
                if module is not None:
                    full = getattr(source, name).state_dict() if source is not None else {}
                    set_model_state_dict(module, full, options=opts)
        if states["moments"]:
            scatter_states(self.learner, learner_states(source) if source is not None else None)
        else:
            clear_states(self.learner)
        if self.learner.scheduler is not None:
            self.learner.scheduler.load_state_dict(states["scheduler"])

    def update(
        self,
        batch: UpdateBatch,
        algo: AlgoConfig,
        optim: OptimConfig,
        temperature: float,
        generator: torch.Generator,
        train_policy: bool,
        autocast: Callable[[], AbstractContextManager[Any]],
        into: Learner | None,
    ) -> dict[str, float]:
        """`rl_update` of this rank's share; with fsdp the trained weights are then
        gathered into ``into`` (rank 0's whole learner; None elsewhere)."""
        out = rl_update(
            self.learner,
            batch,
            algo,
            optim,
            temperature,
            generator,
            train_policy,
            autocast,
            self.dp,
        )
        if self.sharded:
            from agentr1.distributed.fsdp import gather_weights

            gather_weights(self.learner, into)
        return out

    def gather_states(self) -> dict[str, Any]:
        """fsdp: the optimizer and scheduler states as a checkpoint holds them (rank 0;
        empty elsewhere); ddp: empty (rank 0's own are the training's)."""
        if not self.sharded:
            return {}
        from agentr1.distributed.fsdp import gather_states

        return gather_states(self.learner, on_rank0=self.rank == 0)


def travelling_states(cfg: Config, learner: Learner) -> dict[str, Any]:
    """What the other ranks receive of rank 0's optimizer and scheduler states through
    Ray: all of them (ddp), or the schedule's and whether there are moments to scatter
    through the process group (fsdp)."""
    if cfg.distributed.sharding != "fsdp":
        return learner_states(learner)
    sched = learner.scheduler.state_dict() if learner.scheduler is not None else None
    return {"scheduler": sched, "moments": bool(learner.optimizer.state)}


class TrainerRank:
    """The body of one trainer rank's actor (rank >= 1). The driver calls `run`, which
    leaves the process group when a method raises, so that no peer waits out the
    collectives' timeout on a rank that is gone."""

    def __init__(self, cfg: Config, model_config: Any, rank: int, world: int) -> None:
        torch.set_num_threads(threads(cfg.distributed))
        self.cfg, self.model_config, self.rank, self.world = cfg, model_config, rank, world
        cuda = cfg.distributed.gpus_per_worker > 0
        self.device = torch.device("cuda", 0) if cuda else torch.device("cpu")
        if cuda:
            torch.cuda.set_device(self.device)
        self.replica_: Replica | None = None

    def run(self, method: str, *args: Any) -> Any:
        try:
            return getattr(self, method)(*args)
        except BaseException:
            leave_group()
            raise

    @property
    def me(self) -> Replica:
        assert self.replica_ is not None, "build() first"
        return self.replica_

    def pid(self) -> int:
        return os.getpid()

    def build(self) -> int:
        """Build the replica (weights to come from rank 0); this process's id."""
        torch.manual_seed(self.cfg.train.seed + self.rank)  # dropout, if any, differs per rank
        learner = build_replica(self.cfg, self.model_config, self.device)
        self.replica_ = Replica(self.cfg, learner, self.rank, self.world)
        return os.getpid()

    def join(self, init_method: str, states: dict[str, Any]) -> None:
        """Join the process group, then take rank 0's weights and states."""
        init_group(init_method, self.rank, self.world, self.device, self.cfg.distributed.timeout_s)
        self.me.start(None, states)

    def sync(self, states: dict[str, Any]) -> None:
        self.me.take(None, states)

    def update(
        self,
        batch: UpdateBatch,
        algo: AlgoConfig,
        optim: OptimConfig,
        temperature: float,
        rng_state: torch.Tensor,
        train_policy: bool,
    ) -> dict[str, float]:
        """`rl_update` of this rank's share of ``batch`` (the driver runs rank 0's)."""
        generator = torch.Generator()
        generator.set_state(rng_state)
        policy = self.me.learner.policy
        batch = batch.map(lambda x: x.to(self.device))
        autocast = lambda: train_autocast(self.cfg, policy)  # noqa: E731
        return self.me.update(
            batch, algo, optim, temperature, generator, train_policy, autocast, None
        )

    def gather_states(self) -> None:
        self.me.gather_states()

    def replica(self) -> dict[str, dict[str, torch.Tensor]]:
        """CPU copies of the replica's trainable parameters and their gradients, by name
        (checks and tests: every rank should hold rank 0's)."""
        return replica_of(self.me.learner)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


class TrainerGroup:
    """Ranks 1..N-1 of data-parallel training as Ray actors; this process is rank 0.

    Args:
        cfg: the run's config (``distributed`` says how many ranks and where).
        policy: rank 0's policy: its architecture and device are the replicas'.
        rank_cls: the actors' body (tests substitute a failing one).
    """

    def __init__(self, cfg: Config, policy: Any, rank_cls: type[TrainerRank] = TrainerRank) -> None:
        d = cfg.distributed
        self.device = next(policy.parameters()).device
        if (self.device.type == "cuda") != (d.gpus_per_worker > 0):
            raise ValueError(
                f"distributed.trainer_ranks={d.trainer_ranks}: rank 0's policy is on "
                f"{self.device} but distributed.gpus_per_worker={d.gpus_per_worker}; every "
                "rank must be on the same kind of device (gpus_per_worker: 1 with CUDA, 0 "
                "on CPUs)"
            )
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            raise RuntimeError(
                "distributed.trainer_ranks: this process is in a torch.distributed process "
                "group already (another TrainerGroup not closed?); one group per process"
            )
        self.ray = connect(d)
        self.cfg = cfg
        self.world = d.trainer_ranks
        self.names = [f"trainer-rank-{r}" for r in range(1, self.world)]
        cls = self.ray.remote(rank_cls)
        self.actors = []
        for r, name in enumerate(self.names, start=1):
            opts = actor_options(d, name)
            opts.pop("name")  # names are for people; Ray's must be unique per cluster
            self.actors.append(cls.options(**opts).remote(cfg, policy.config, r, self.world))
        self._built = [a.run.remote("build") for a in self.actors]
        self.pids: list[int | None] = [None] * len(self.actors)
        self.joined = False
        self.sharded = d.sharding == "fsdp"
        self.model_config = policy.config
        self.local: Replica | None = None
        """Rank 0's side: its sharded training copy (fsdp), or none (ddp: rank 0's own
        learner is its replica)."""
        log.info(
            "trainer ranks 1..%d starting (%s, %s)",
            self.world - 1,
            d.sharding,
            backend_of(self.device),
        )

    # ------------------------------------------------------------------ collectives
    def _ask(self, method: str, *args: Any) -> list[Any]:
        return [a.run.remote(method, *args) for a in self.actors]

    def _together(self, refs: list[Any], local: Callable[[], Any]) -> Any:
        """Run rank 0's part (``local``) while ranks 1.. run theirs (``refs``); rank 0's
        result. Any rank's failure raises `TrainerRankError` naming it."""
        try:
            out = local()
        except CollectiveError as e:
            # A peer that failed made our collective fail: name the peer, not the symptom;
            # one that did not fail never came (it hangs, or its node is gone).
            done, _ = self.ray.wait(refs, num_returns=len(refs), timeout=_GRACE_S)
            self._gather([r if r in done else None for r in refs], 0.0, failures_only=True)
            late = [self._who(r) for r, ref in enumerate(refs, start=1) if ref not in done]
            raise TrainerRankError(f"{', '.join(late) or 'a rank'} did not answer: {e}") from e
        # Rank 0's own error (not a collective's) is raised as it is; the others wait in
        # their collective until `close` stops them.
        self._gather(refs, timeout_s=self.cfg.distributed.timeout_s)
        return out

    def _who(self, rank: int) -> str:
        return f"trainer rank {rank} (actor {self.names[rank - 1]!r}, pid {self.pids[rank - 1]})"

    def _gather(self, refs: list[Any], timeout_s: float, failures_only: bool = False) -> list[Any]:
        """The ranks' results, in order; the first failure raises, naming its rank.
        ``failures_only``: raise only for a rank that raised or died (None = not done)."""
        ray = self.ray
        live = [r for r in refs if r is not None]
        ready, _ = ray.wait(live, num_returns=len(live), timeout=timeout_s)
        out = []
        for r, ref in enumerate(refs, start=1):
            who = self._who(r)
            if ref not in ready:
                if failures_only:
                    continue
                raise TrainerRankError(f"{who} did not answer within {timeout_s:.0f} s")
            try:
                out.append(ray.get(ref))
            except ray.exceptions.RayActorError as e:
                raise TrainerRankError(f"{who} died: {ray_cause(e)}") from None
            except ray.exceptions.RayTaskError as e:
                raise TrainerRankError(f"{who} raised {ray_cause(e)}") from None
        return out

    def _rank0(self, learner: Learner) -> Replica:
        """Rank 0's `Replica`: a training copy of its own (fsdp, built once), or
        ``learner`` itself (ddp)."""
        if not self.sharded:
            return Replica(self.cfg, learner, 0, self.world)
        if self.local is None:
            torch.manual_seed(self.cfg.train.seed)
            copy = build_replica(self.cfg, self.model_config, self.device)
            self.local = Replica(self.cfg, copy, 0, self.world)
        return self.local

    def _join(self, learner: Learner) -> None:
        """Wait for the replicas, form the process group, send rank 0's state."""
        self.pids = self._gather(self._built, timeout_s=self.cfg.distributed.timeout_s)
        host = self.ray.util.get_node_ip_address()
        init = f"tcp://{host}:{_free_port()}"
        states = travelling_states(self.cfg, learner)
        refs = self._ask("join", init, self.ray.put(states))
        timeout = self.cfg.distributed.timeout_s
        me = self._rank0(learner)

        def local() -> None:
            init_group(init, 0, self.world, self.device, timeout)
            me.start(learner, states)

        self._together(refs, local)
        if self.sharded:  # the shards' optimizers train; rank 0's whole one holds nothing
            learner.optimizer.state.clear()
            if learner.critic_optimizer is not None:
                learner.critic_optimizer.state.clear()
        self.joined = True
        log.info("trainer ranks joined at %s (pids %s)", init, self.pids)

    def sync(self, learner: Learner) -> None:
        """Every rank takes ``learner``'s weights, optimizer and scheduler states (rank 0's
        as they are now); `update` does this itself before the first update."""
        if not self.joined:
            self._join(learner)
            return
        states = travelling_states(self.cfg, learner)
        me = self._rank0(learner)
        self._together(self._ask("sync", self.ray.put(states)), lambda: me.take(learner, states))

    def update(
        self,
        learner: Learner,
        batch: UpdateBatch,
        algo: AlgoConfig,
        optim: OptimConfig,
        temperature: float,
        generator: torch.Generator,
        train_policy: bool = True,
        autocast: Callable[[], AbstractContextManager[Any]] = nullcontext,
    ) -> dict[str, float]:
        """`rl_update` over every rank: the same arguments, the same result (the metrics
        are means over every rank's micro-batches), the same weights after it in
        ``learner`` and on every rank."""
        if not self.joined:
            self._join(learner)
        cpu = self.ray.put(batch.map(lambda x: x.detach().cpu()))
        refs = self._ask(
            "update", cpu, algo, optim, temperature, generator.get_state(), train_policy
        )
        me = self._rank0(learner)
        if self.sharded:
            policy = me.learner.policy
            autocast = lambda: train_autocast(self.cfg, policy)  # noqa: E731
        out: dict[str, float] = self._together(
            refs,
            lambda: me.update(
                batch, algo, optim, temperature, generator, train_policy, autocast, learner
            ),
        )
        return out

    def training_states(self, learner: Learner) -> dict[str, Any]:
        """The optimizer and scheduler states a checkpoint holds where they are not
        ``learner``'s own: gathered from the shards (fsdp); none (ddp: rank 0's are)."""
        if not (self.sharded and self.joined):
            return {}
        me = self._rank0(learner)
        out: dict[str, Any] = self._together(self._ask("gather_states"), me.gather_states)
        return out

    def replicas(self, learner: Learner) -> list[dict[str, dict[str, torch.Tensor]]]:
        """`replica_of` every rank's training copy, rank 0's (``learner``, or its shard)
        first."""
        me = self._rank0(learner)
        rank0 = self._together(refs := self._ask("replica"), lambda: replica_of(me.learner))
        return [rank0, *self._gather(refs, timeout_s=self.cfg.distributed.timeout_s)]

    def close(self) -> None:
        """Leave the process group and stop the ranks' actors (idempotent)."""
        if self.joined:
            leave_group()
            self.joined = False
        for a in self.actors:
            self.ray.kill(a, no_restart=True)
        self.actors = []
