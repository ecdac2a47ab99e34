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
from agentr1.trainer.logprobs import token_logprobs
from agentr1.trainer.run import RunDir
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
) -> list[float]:
    """Train ``model`` in place for ``steps`` AdamW steps; returns the loss per step.

    The returned (and reported) loss is the NLL over the agent's tokens only, whatever
    ``context_weight`` is, so runs with and without context loss compare directly.

    The learning rate warms up linearly over the first 5% of steps, then decays on a
    cosine to 10% of ``lr``.
    Non-finite losses skip the step (logged), as in RL.

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
    batches: list[list[int]] = []
    losses = []
    model.train()
    for step in range(steps):
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
            continue
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(agent_loss)
        if on_step is not None:
            on_step(step, agent_loss)
    return losses


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


def warm_start(setup: Setup, run: RunDir) -> dict[str, float]:
    """SFT on the task's scripted demonstrations run through the real rollout (same masks
    as RL). Logs ``sft/demo_<metric>`` for each task metric, and the headline one per
    breakdown group (``sft/demo_em/hops=2``): how good the imitated policy is."""
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
    bar = run.progress(sft.steps, "SFT warm start")
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
