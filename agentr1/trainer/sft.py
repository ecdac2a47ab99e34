"""SFT warm start: next-token NLL on demonstration trajectories, with the RL tensors.

Demonstrations are ordinary `Trajectory` objects (a scripted policy run through the real
rollout, env and tools), collated by the same `collate`; the loss is the mean negative
log-likelihood over ``loss_mask = 1`` tokens — exactly the tokens RL will later train.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable, Sequence
from typing import Any

import torch

from agentr1.algorithms import masked_aggregate
from agentr1.rollout.collate import collate
from agentr1.trainer.logprobs import token_logprobs
from agentr1.types import Trajectory

log = logging.getLogger(__name__)


def sft_train(
    model: Any,
    demos: Sequence[Trajectory],
    steps: int,
    batch_size: int,
    lr: float,
    pad_id: int,
    seed: int,
    on_step: Callable[[int, float], None] | None = None,
) -> list[float]:
    """Train ``model`` in place for ``steps`` AdamW steps; returns the loss per step.

    The learning rate warms up linearly over the first 5% of steps, then stays constant.
    Non-finite losses skip the step (logged), as in RL.
    """
    if not demos:
        raise ValueError("SFT needs at least one demonstration trajectory")
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    warm = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm))
    order: list[int] = []
    losses = []
    model.train()
    for step in range(steps):
        if len(order) < batch_size:
            fresh = list(range(len(demos)))
            rng.shuffle(fresh)
            order.extend(fresh)
        idx, order = order[:batch_size], order[batch_size:]
        batch = collate([demos[i] for i in idx], list(range(len(idx))), pad_id)
        lp_BT, _ = token_logprobs(
            model, batch.input_ids_BT, batch.attention_mask_BT, batch.loss_mask_BT
        )
        loss = -masked_aggregate(lp_BT, batch.loss_mask_BT, "token-mean")
        opt.zero_grad(set_to_none=True)
        if not torch.isfinite(loss):
            log.warning("SFT step %d: non-finite loss, step skipped", step)
            losses.append(math.nan)
            continue
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        value = loss.item()
        losses.append(value)
        if on_step is not None:
            on_step(step, value)
    return losses
