"""SFT warm start: next-token NLL on demonstration trajectories, with the RL tensors.

Demonstrations are ordinary `Trajectory` objects (a scripted policy run through the real
rollout, env and tools), collated by the same `collate`; the loss is the mean negative
log-likelihood over ``loss_mask = 1`` tokens — exactly the tokens RL will later train —
plus, optionally, ``context_weight`` x the same NLL over the context tokens (prompt and
tool responses): language modelling on the text the agent reads. A freshly initialized
model needs it to form copying circuits; RL itself never trains context tokens.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

from agentr1.algorithms import masked_aggregate
from agentr1.rollout.collate import collate
from agentr1.trainer.logprobs import token_logprobs
from agentr1.types import Trajectory

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
    warm = max(1, steps // 20)

    def lr_factor(s: int) -> float:  # linear warmup, then cosine decay to 10% of lr
        if s < warm:
            return (s + 1) / warm
        progress = (s - warm) / max(1, steps - warm)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor)
    batches: list[list[int]] = []
    losses = []
    model.train()
    for step in range(steps):
        if not batches:
            batches = length_bucketed_batches([len(d.token_ids) for d in demos], batch_size, rng)
        idx = batches.pop()
        batch = collate([demos[i] for i in idx], list(range(len(idx))), pad_id)
        batch = batch.to(next(model.parameters()).device)
        agent_BT = batch.loss_mask_BT
        context_BT = batch.attention_mask_BT.to(agent_BT.dtype) * (1 - agent_BT)
        select_BT = agent_BT if context_weight == 0 else agent_BT + context_BT
        opt.zero_grad(set_to_none=True)
        with autocast():
            lp_BT, _ = token_logprobs(model, batch.input_ids_BT, batch.attention_mask_BT, select_BT)
            agent_loss = -masked_aggregate(lp_BT, agent_BT, "token-mean")
            loss = agent_loss
            if context_weight:
                # Position 0 has no prediction; token_logprobs leaves it at 0.
                context_BT[:, 0] = 0
                loss = loss - context_weight * masked_aggregate(lp_BT, context_BT, "token-mean")
            finite = bool(torch.isfinite(loss))
            if finite:
                loss.backward()
        if not finite:
            log.warning("SFT step %d: non-finite loss, step skipped", step)
            losses.append(math.nan)
            continue
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        value = agent_loss.item()
        losses.append(value)
        if on_step is not None:
            on_step(step, value)
    return losses
