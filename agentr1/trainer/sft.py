"""SFT warm start: next-token NLL on demonstration trajectories, with the RL tensors.

`warm_start` runs the task's scripted demonstrations through the real rollout and trains
on them with `sft_train`.

Demonstrations are ordinary `Trajectory` objects (a scripted policy run through the real
rollout, env and tools), collated by the same `collate`; the loss is the mean negative
log-likelihood over ``loss_mask = 1`` tokens — exactly the tokens RL will later train —
plus, optionally, ``context_weight`` x the same NLL over the context tokens (prompt and
tool responses): language modelling on the text the agent reads. A freshly initialized
model needs it to form copying circuits; RL itself never trains context tokens.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
import shutil
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

from agentr1 import lora
from agentr1.algorithms import masked_aggregate
from agentr1.eval.evaluate import summarize
from agentr1.rollout.collate import collate
from agentr1.rollout.loop import run_rollout
from agentr1.trainer.checkpoint import (
    CheckpointError,
    latest_checkpoint,
    load_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from agentr1.trainer.logprobs import token_logprobs
from agentr1.trainer.run import SFT_DIR, RunDir
from agentr1.trainer.sampling import demo_picks
from agentr1.trainer.setup import Setup, train_autocast
from agentr1.types import RolloutBatch, Task, Trajectory

log = logging.getLogger(__name__)


def length_bucketed_batches(
    lengths: Sequence[int], batch_size: int, rng: random.Random, pool: int = 8
) -> list[list[int]]:
    """One epoch of batches: shuffle, then sort each pool of ``pool`` batches by length.

    Padding is wasted compute (every token passes through the backbone); grouping similar
    lengths cuts it several-fold on multi-hop episodes, whose lengths vary 3x, while the
    batch order stays random.

    >>> b = length_bucketed_batches([5, 1, 9, 2], 2, random.Random(0), pool=2)
    >>> sorted(sorted(x) for x in b)
    [[0, 2], [1, 3]]
    """
    order = list(range(len(lengths)))
    rng.shuffle(order)
    batches: list[list[int]] = []
    span = batch_size * pool
    for s in range(0, len(order), span):
        chunk = sorted(order[s : s + span], key=lambda i: lengths[i])
        batches.extend(chunk[j : j + batch_size] for j in range(0, len(chunk), batch_size))
    rng.shuffle(batches)
    return batches


def sft_train(
    model: Any,
    demos: Sequence[Trajectory],
    steps: int,
    batch_size: int,
    lr: float,
    pad_id: int,
    seed: int,
    on_step: Callable[[int, float], None] | None = None,
    context_weight: float = 0.0,
    autocast: Callable[[], AbstractContextManager[Any]] = nullcontext,
    start: dict[str, Any] | None = None,
    save: Callable[[dict[str, Any]], None] | None = None,
    save_every: int = 0,
) -> list[float]:
    """Train ``model`` in place for ``steps`` AdamW steps; returns the loss per step: the
    NLL over the agent's tokens only, whatever ``context_weight`` is, so runs with and
    without context loss compare directly. The learning rate warms up linearly over the
    first 5% of steps, then decays on a cosine to 10% of ``lr``. Non-finite losses skip
    the step (logged), as in RL.

    ``save`` is called every ``save_every`` (> 0) steps before the last with the state
    that continues the run (`sft_progress`); ``start`` is such a state (the model holds
    its checkpointed weights): training goes on as if it had never stopped.

    ``autocast`` makes the context of each step's forward and backward (e.g.
    `agentr1.trainer.setup.train_autocast`). It is entered per step on purpose: autocast
    caches its low-precision copies of the weights until its context exits, so one context
    around several optimizer steps would keep computing with the first step's weights.
    """
    if not demos:
        raise ValueError("SFT needs at least one demonstration trajectory")
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _sft_lr(steps))
    first, losses, batches = _continue(start, opt, sched, rng) if start else (0, [], [])
    model.train()
    for step in range(first, steps):
        if not batches:
            batches = length_bucketed_batches([len(d.token_ids) for d in demos], batch_size, rng)
        idx = batches.pop()
        batch = collate([demos[i] for i in idx], list(range(len(idx))), pad_id)
        opt.zero_grad(set_to_none=True)
        with autocast():
            agent_loss = _backward(model, batch.to(next(model.parameters()).device), context_weight)
        if agent_loss is None:
            log.warning("SFT step %d: non-finite loss, step skipped", step)
            losses.append(math.nan)
        else:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            losses.append(agent_loss)
            if on_step is not None:
                on_step(step, agent_loss)
        done = step + 1
        if save is not None and save_every and done % save_every == 0 and done < steps:
            save(sft_progress(done, losses, opt, sched, rng, batches))
    opt.zero_grad(set_to_none=True)  # their memory back for what follows (RL, the eval)
    return losses


def _continue(
    start: dict[str, Any], opt: torch.optim.Optimizer, sched: Any, rng: random.Random
) -> tuple[int, list[float], list[list[int]]]:
    """Load an `sft_progress` state into the optimizer, schedule and batch RNG; its
    (step, losses so far, batches left in the epoch)."""
    opt.load_state_dict(start["optimizer"])
    sched.load_state_dict(start["scheduler"])
    version, internal, gauss = start["rng"]
    rng.setstate((version, tuple(internal), gauss))
    return int(start["step"]), list(start["losses"]), [list(b) for b in start["batches"]]


def sft_progress(
    step: int,
    losses: list[float],
    opt: torch.optim.Optimizer,
    sched: Any,
    rng: random.Random,
    batches: list[list[int]],
) -> dict[str, Any]:
    """What continues an SFT run after ``step`` steps, in builtins and tensors only (so
    `torch.load(weights_only=True)` reads it back)."""
    version, internal, gauss = rng.getstate()
    return {
        "step": step,
        "losses": list(losses),
        "optimizer": opt.state_dict(),
        "scheduler": sched.state_dict(),
        "rng": [version, list(internal), gauss],
        "batches": [list(b) for b in batches],
    }


def _sft_lr(steps: int) -> Callable[[int], float]:
    """Linear warmup over the first 5% of ``steps``, then a cosine decay to 10%."""
    warm = max(1, steps // 20)

    def lr_factor(s: int) -> float:
        if s < warm:
            return (s + 1) / warm
        progress = (s - warm) / max(1, steps - warm)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return lr_factor


def _backward(model: Any, batch: RolloutBatch, context_weight: float) -> float | None:
    """Backpropagate one batch's loss; its agent-token NLL, or None (nothing
    backpropagated) when the loss is not finite."""
    agent_BT = batch.loss_mask_BT
    context_BT = batch.attention_mask_BT.to(agent_BT.dtype) * (1 - agent_BT)
    select_BT = agent_BT if context_weight == 0 else agent_BT + context_BT
    lp_BT, _ = token_logprobs(model, batch.input_ids_BT, batch.attention_mask_BT, select_BT)
    agent_loss = -masked_aggregate(lp_BT, agent_BT, "token-mean")
    loss = agent_loss
    if context_weight:
        context_BT[:, 0] = 0  # position 0 has no prediction; token_logprobs leaves it at 0
        loss = loss - context_weight * masked_aggregate(lp_BT, context_BT, "token-mean")
    if not torch.isfinite(loss):
        return None
    loss.backward()
    return agent_loss.item()


def _save_sft(
    setup: Setup, run: RunDir, step: int, states: dict[str, Any], meta: dict[str, Any]
) -> None:
    """A checkpoint of the warm start (the newest only); one that cannot be written is
    logged and SFT goes on (the previous one is intact)."""
    meta = {**meta, "phase": "sft", **run.checkpoint_facts()}
    try:
        save_checkpoint(
            run.ckpt_dir / SFT_DIR, step, {"policy": setup.policy}, states, meta, keep=1
        )
    except CheckpointError as e:
        log.error("%s", e)


def resume_warm_start(setup: Setup, run: RunDir, resume: bool) -> dict[str, float]:
    """The warm start, or what is left of it: with ``resume``, the newest SFT checkpoint
    either completes it (the weights and the logged figures of a finished warm start) or
    continues it from its step; then a checkpoint of the finished warm start, which a run
    killed before its first RL checkpoint resumes from."""
    root = run.ckpt_dir / SFT_DIR
    found = latest_checkpoint(root) if resume else None
    start: dict[str, Any] | None = None
    if found is not None:
        states, meta = load_checkpoint(found, {"policy": setup.policy})
        run.resume_from(meta)
        set_rng_state(states["rng"])
        if meta.get("complete"):
            setup.sync_sampler()
            log.info("resumed after the warm start (%s)", found)
            info: dict[str, float] = meta["sft"]
            return info
        start = {**states["sft"], "rng_global": states["rng"]}
        log.info("resuming the warm start at SFT step %d (%s)", start["step"], found)
    info = warm_start(setup, run, start)
    _save_sft(
        setup, run, setup.cfg.sft.steps, {"rng": rng_state()}, {"complete": True, "sft": info}
    )
    return info


def drop_sft_checkpoints(run: RunDir) -> None:
    """Remove the warm start's checkpoints once RL has one of its own."""
    shutil.rmtree(run.ckpt_dir / SFT_DIR, ignore_errors=True)


def warm_start(setup: Setup, run: RunDir, start: dict[str, Any] | None = None) -> dict[str, float]:
    """SFT on the task's scripted demonstrations run through the real rollout (same masks
    as RL). Logs ``sft/demo_<metric>`` for each task metric, and the headline one per
    breakdown group (``sft/demo_em/hops=2``): how good the imitated policy is.

    Every ``sft.checkpoint_every`` steps it writes a checkpoint (`SFT_DIR`); ``start``
    continues from one (`resume_warm_start`): the demonstrations are made again (the
    scripted policies are deterministic), then training goes on from its step."""
    cfg = setup.cfg
    sft = cfg.sft
    rcfg = dataclasses.replace(cfg.rollout, n_samples=1, temperature=1.0)
    t0 = time.perf_counter()
    sources = setup.demo_sources(cfg.train.seed)
    demos: list[Trajectory] = []
    demo_tasks: list[Task] = []
    picks = demo_picks([tasks for tasks, _, _ in sources], sft.demos, cfg.train.seed)
    for (_, make_env, gen), picked in zip(sources, picks, strict=True):
        for g in run_rollout(picked, make_env, gen, setup.chat, rcfg):
            demos.extend(g.trajectories)
        demo_tasks.extend(picked)
    names = setup.task.metric_names
    quality = summarize(demos, {t.id: t for t in demo_tasks}, names, setup.task.breakdown)
    t1 = time.perf_counter()
    if start is not None:  # every RNG as it was at the checkpoint
        set_rng_state(start["rng_global"])

    def save(progress: dict[str, Any]) -> None:
        _save_sft(setup, run, progress["step"], {"sft": progress, "rng": rng_state()}, {})

    bar = run.progress(sft.steps, "SFT warm start", initial=start["step"] if start else 0)
    losses = sft_train(
        setup.policy,
        demos,
        sft.steps,
        sft.batch_size,
        sft.lr,
        setup.pad_id,
        cfg.train.seed,
        on_step=lambda i, loss: bar.update_with(loss=loss),
        context_weight=sft.context_loss_weight,
        autocast=lambda: train_autocast(cfg, setup.policy),
        start=start,
        save=save,
        save_every=sft.checkpoint_every,
    )
    bar.close()
    # The RL reference is the adapters-off base: make it the warm start.
    lora.merge_adapters(setup.policy)
    setup.sync_sampler()
    head = setup.task.primary_metric
    info = {f"sft/demo_{m}": v for m, v in quality.by_group["all"].items() if m in names}
    for group, row in quality.by_group.items():
        if group != "all":
            info[f"sft/demo_{head}/{group}"] = row[head]
    info |= {
        "sft/demos": float(len(demos)),
        "sft/final_loss": sum(losses[-20:]) / max(1, len(losses[-20:])),
        "time/sft_demos": t1 - t0,
        "time/sft": time.perf_counter() - t1,
    }
    run.log_metrics({"phase": "sft", **info})
    return info
