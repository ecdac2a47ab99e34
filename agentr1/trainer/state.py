"""What the RL loop carries between steps, and its checkpoint: build, save, restore, free.

`make_state` builds the optimizer, LR schedule, critic (gae) and frozen reference (a KL
without LoRA; with LoRA the reference is the policy's base, adapters off) for a `Setup`.
`checkpoint` / `restore` write and read all of it through the atomic checkpoints of
`agentr1.trainer.checkpoint`: weights, optimizer and scheduler states, every RNG and the
data cursor, so a resumed run continues exactly as if never killed.
"""

from __future__ import annotations

import copy
import ctypes
import gc
import logging
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from agentr1 import lora
from agentr1.config import Config
from agentr1.trainer.checkpoint import (
    CheckpointError,
    latest_checkpoint,
    load_checkpoint,
    load_weights,
    rng_state,
    save_checkpoint,
    save_weights_once,
    set_rng_state,
)
from agentr1.trainer.critic import ValueModel
from agentr1.trainer.run import SFT_DIR, RunDir
from agentr1.trainer.sampling import TaskSampler
from agentr1.trainer.setup import Setup
from agentr1.trainer.update import Learner

if TYPE_CHECKING:
    from agentr1.distributed.ranks import TrainerGroup

log = logging.getLogger(__name__)


@dataclass
class Timer:
    """Wall time per phase of the current step, as ``time/<phase>`` metrics."""

    times: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            key = f"time/{phase}"
            self.times[key] = self.times.get(key, 0.0) + (time.perf_counter() - t0)


@dataclass
class TrainState:
    """What the loop carries between steps (all of it is checkpointed)."""

    setup: Setup
    optimizer: torch.optim.Optimizer
    scheduler: Any
    sampler: TaskSampler
    update_rng: torch.Generator
    critic: ValueModel | None = None
    critic_optimizer: torch.optim.Optimizer | None = None
    reference: Any | None = None
    step: int = 0
    group: TrainerGroup | None = None
    """Trainer ranks 1..N-1 (``distributed.trainer_ranks``; this process is rank 0);
    None = one process. Not checkpointed: the ranks take rank 0's state at their first
    update."""
    rollouts: Any = None
    """Where the step's episodes come from (`agentr1.trainer.rollouts`), made at the first
    RL step (after the warm start and any restore: the workers get those weights)."""

    @property
    def learner(self) -> Learner:
        """What an update changes (`agentr1.trainer.update.rl_update`)."""
        return Learner(
            self.setup.policy, self.optimizer, self.scheduler, self.critic, self.critic_optimizer
        )


def lr_schedule(warmup: int, total: int, kind: str) -> Any:
    """The LR factor per step: linear warmup over ``warmup`` steps, then constant or a
    cosine decay to 0 at ``total``."""

    def lr_at(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if kind == "cosine":
            progress = min(1.0, (step - warmup) / max(1, total - warmup))
            return 0.5 * (1 + math.cos(math.pi * progress))
        return 1.0

    return lr_at


def make_learner(cfg: Config, policy: Any) -> Learner:
    """What an update changes, for ``policy``: its AdamW over the trainable parameters
    (the adapters with LoRA) and LR schedule, and the critic with its optimizer (gae).
    Every trainer rank builds its replica's this way."""
    critic = ValueModel.from_policy(policy) if cfg.algo.estimator == "gae" else None
    return make_optimizers(cfg, policy, critic)


def make_optimizers(cfg: Config, policy: Any, critic: Any | None) -> Learner:
    """The optimizers and LR schedule of `make_learner` over ``policy`` and ``critic``
    as they are (e.g. sharded by `agentr1.distributed.fsdp`)."""
    opt = torch.optim.AdamW(
        lora.trainable_parameters(policy),
        lr=cfg.optim.lr,
        weight_decay=cfg.optim.weight_decay,
        betas=(0.9, 0.99),
    )
    lr_at = lr_schedule(cfg.optim.warmup_steps, max(1, cfg.train.steps), cfg.optim.schedule)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    critic_opt = None
    if critic is not None:
        critic_opt = torch.optim.AdamW(critic.parameters(), lr=cfg.algo.critic_lr)
    return Learner(policy, opt, sched, critic, critic_opt)


def make_state(setup: Setup) -> TrainState:
    """A fresh training state for ``setup`` (step 0; `restore` may then load a checkpoint).
    With ``distributed.trainer_ranks > 1`` the other ranks start building their replicas
    now, in the background."""
    cfg = setup.cfg
    policy = setup.policy
    learner = make_learner(cfg, policy)
    reference = None
    if cfg.algo.kl_coef > 0 and not lora.lora_modules(policy):
        reference = copy.deepcopy(policy).eval()
        for p in reference.parameters():
            p.requires_grad_(False)
    state = TrainState(
        setup=setup,
        optimizer=learner.optimizer,
        scheduler=learner.scheduler,
        sampler=TaskSampler(list(setup.task.splits["train"]), cfg.train.seed),
        update_rng=torch.Generator().manual_seed(cfg.train.seed),
        critic=learner.critic,
        critic_optimizer=learner.critic_optimizer,
        reference=reference,
    )
    if cfg.distributed.trainer_ranks > 1:
        from agentr1.distributed.ranks import TrainerGroup

        state.group = TrainerGroup(cfg, policy)
    return state


REFERENCE_FILE = "reference.safetensors"
"""The warm-started KL reference, written once per run beside the checkpoints."""


def _modules(s: TrainState) -> dict[str, torch.nn.Module]:
    """What each checkpoint holds: the policy and the critic. Not the reference: it is
    the base model or the warm start, and never changes (`save_reference`)."""
    mods: dict[str, torch.nn.Module] = {"policy": s.setup.policy}
    if s.critic is not None:
        mods["critic"] = s.critic
    return mods


def reference_source(s: TrainState) -> str | None:
    """Where a resume finds the reference: "warm_start" (`REFERENCE_FILE`), "base" (the
    model as built from ``model.path``, which `make_state` copies), None (no reference)."""
    if s.reference is None:
        return None
    return "warm_start" if s.setup.cfg.sft.enabled else "base"


def save_reference(s: TrainState, run: RunDir) -> None:
    """Set the reference to the policy as it is now (after the warm start), and write it
    once to `REFERENCE_FILE` when it differs from the base."""
    if s.reference is None:
        return
    s.reference.load_state_dict(s.setup.policy.state_dict())
    if reference_source(s) == "warm_start":
        save_weights_once(run.ckpt_dir / REFERENCE_FILE, s.reference)


def checkpoint(s: TrainState, run: RunDir, extra: dict[str, Any]) -> None:
    """Write a checkpoint of the whole state (the newest ``train.keep_checkpoints`` stay;
    its size goes to ``extra["summary"]["checkpoint_bytes"]``); one that cannot be written
    (a full disk) is logged as an error and counted in ``checkpoint_errors``, and the run
    goes on: the previous checkpoint is intact and a later one may succeed."""
    states: dict[str, Any] = {
        "optimizer": s.optimizer.state_dict(),
        "scheduler": s.scheduler.state_dict(),
        "rng": rng_state(),
        "update_rng": s.update_rng.get_state(),
        "sampler": s.sampler.state(),
    }
    if s.critic_optimizer is not None:
        states["critic_optimizer"] = s.critic_optimizer.state_dict()
    if s.group is not None:  # sharded trainer ranks: their optimizers', gathered here
        states |= s.group.training_states(s.learner)
    summary = extra.get("summary")
    keep = s.setup.cfg.train.keep_checkpoints
    meta = {**extra, **run.checkpoint_facts(), "reference": reference_source(s)}
    try:
        path = save_checkpoint(run.ckpt_dir, s.step, _modules(s), states, meta, keep=keep)
    except CheckpointError as e:
        log.error("%s", e)
        if isinstance(summary, dict):
            summary["checkpoint_errors"] = summary.get("checkpoint_errors", 0) + 1
        return
    if isinstance(summary, dict):
        summary["checkpoint_bytes"] = sum(f.stat().st_size for f in path.iterdir())


def has_checkpoint(run_dir: str | Path) -> bool:
    """Whether ``run_dir`` holds a checkpoint a resume can start from (RL's or the warm
    start's)."""
    ckpt = RunDir.checkpoints_of(run_dir)
    return latest_checkpoint(ckpt) is not None or latest_checkpoint(ckpt / SFT_DIR) is not None


def restore(s: TrainState, run: RunDir) -> dict[str, Any] | None:
    """Load the newest checkpoint of ``run`` into ``s``; its meta (None when there is none)."""
    path = latest_checkpoint(run.ckpt_dir)
    if path is None:
        return None
    states, meta = load_checkpoint(path, _modules(s))
    if s.reference is not None:
        # The warm start's file; a checkpoint from before it was split out holds its own
        # copy; else the base, which make_state copied before anything was trained.
        for f in (run.ckpt_dir / REFERENCE_FILE, path / REFERENCE_FILE):
            if meta.get("reference", "warm_start") == "warm_start" and f.exists():
                load_weights(f, s.reference)
                break
        else:
            if meta.get("reference") != "base":
                raise FileNotFoundError(
                    f"{run.ckpt_dir / REFERENCE_FILE}: the warm-started KL reference is missing"
                )
    s.optimizer.load_state_dict(states["optimizer"])
    s.scheduler.load_state_dict(states["scheduler"])
    if s.critic_optimizer is not None:
        s.critic_optimizer.load_state_dict(states["critic_optimizer"])
    set_rng_state(states["rng"])
    s.update_rng.set_state(states["update_rng"])
    s.sampler.load(states["sampler"])
    s.step = int(meta["step"])
    run.resume_from(meta)
    log.info("resumed from %s (step %d)", path, s.step)
    return meta


@contextmanager
def settled_heap() -> Iterator[None]:
    """Keep Python's cyclic garbage collector off the objects that exist when the block
    starts (the model, the task's data, the tokenizer: ~0.4 million for the demo): they
    are collected once, then frozen (`gc.freeze`) until the block ends. The RL steps
    (`agentr1.trainer.loop.rl_steps`) and every evaluation (`run_eval`) run in one.

    A full collection walks every tracked object, and RL steps leave enough survivors
    (episodes, logs) to set one off every few steps: ~0.3 s each, ~4% of the demo's RL
    steps (`benchmarks/gc_pauses.py` measures it). Objects made inside the block are
    collected as usual; frozen ones are freed by their reference counts as always, only
    a cycle among them waits for the block's end. A process that froze objects itself,
    or turned the collector off, is left as it is, and so a nested block changes
    nothing."""
    if not gc.isenabled() or gc.get_freeze_count():
        yield
        return
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def trim_heap() -> None:
    """Return freed heap pages to the OS (glibc ``malloc_trim``; a no-op elsewhere): CPU
    tensors freed by Python stay in the process's RSS until then."""
    with suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def release_training_state(s: TrainState) -> None:
    """Free what only training needs (optimizer moments, critic, reference) once the last
    checkpoint is written, and hand the freed heap back to the OS, so that the final
    evaluation's generation buffers reuse the training state's memory instead of adding
    to it (the peak RSS of a run is then the larger of the two, not their sum). The
    trainer ranks, done too, are shut down."""
    if s.group is not None:
        s.group.close()
        s.group = None
    s.optimizer.state.clear()
    s.critic = s.critic_optimizer = s.reference = None
    for p in s.setup.policy.parameters():
        p.grad = None
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    trim_heap()
