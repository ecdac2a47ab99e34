"""One RL update: K epochs of minibatch steps over a rollout batch.

Notation: B = rows, T = tokens. Every per-token tensor is [B, T] and aligned with
``input_ids_BT`` (see `token_logprobs`).

Gradient accumulation is exact: a minibatch is split into micro-batches whose losses are
weighted by their share of the minibatch's aggregation denominator, so micro-batching
changes memory, not the gradient. A non-finite loss or gradient skips the optimizer step
(the weights stay as they were) and is counted in the metrics.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, fields
from typing import Any

import torch

from agentr1.algorithms import (
    aggregation_weight,
    kl_loss,
    masked_aggregate,
    policy_loss_ppo,
    value_loss,
)
from agentr1.config import AlgoConfig, OptimConfig
from agentr1.trainer.logprobs import token_logprobs

log = logging.getLogger(__name__)


@dataclass
class UpdateBatch:
    """Everything one update needs, [B, T] unless noted (no grad on any of it)."""

    input_ids_BT: torch.Tensor
    attention_mask_BT: torch.Tensor
    loss_mask_BT: torch.Tensor
    advantages_BT: torch.Tensor
    old_logprobs_BT: torch.Tensor | None
    """Log-probs of the policy that sampled the batch; None = take them from the first
    forward of each row (exact when the update is on-policy: one epoch, one minibatch)."""
    ref_logprobs_BT: torch.Tensor | None = None
    returns_BT: torch.Tensor | None = None
    old_values_BT: torch.Tensor | None = None

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> UpdateBatch:
        """Apply ``fn`` to every tensor (None stays None)."""
        return UpdateBatch(
            *(None if x is None else fn(x) for x in (getattr(self, f.name) for f in fields(self)))
        )

    def rows(self, idx: torch.Tensor) -> UpdateBatch:
        return self.map(lambda x: x[idx])


def _trim(b: UpdateBatch) -> UpdateBatch:
    """Drop trailing all-padding columns of a micro-batch (saves compute on short rows)."""
    T = int(b.attention_mask_BT.sum(-1).max().item())
    return b.map(lambda x: x[:, :T])


def _finite_grads(params: list[torch.nn.Parameter]) -> bool:
    return all(p.grad is None or bool(torch.isfinite(p.grad).all()) for p in params)


def _tail_frac(lp_BT: torch.Tensor, mc: UpdateBatch, above: float) -> float:
    """Share of loss tokens whose log(pi_ref / pi) exceeds ``above`` (k3's linear tail)."""
    assert mc.ref_logprobs_BT is not None
    mask_BT = mc.loss_mask_BT > 0
    tail_BT = (mc.ref_logprobs_BT - lp_BT.detach()) > above
    return float((tail_BT & mask_BT).sum() / mask_BT.sum().clamp(min=1))


def rl_update(
    policy: Any,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    batch: UpdateBatch,
    algo: AlgoConfig,
    optim: OptimConfig,
    temperature: float,
    generator: torch.Generator,
    critic: Any | None = None,
    critic_optimizer: torch.optim.Optimizer | None = None,
    train_policy: bool = True,
    autocast: Callable[[], AbstractContextManager[Any]] = nullcontext,
) -> dict[str, float]:
    """K epochs x minibatches of PPO-clip steps (and critic steps when a critic is given).

    ``autocast`` makes the context of each optimizer step's forward and backward passes
    (e.g. `agentr1.trainer.setup.train_autocast`).
    """
    B = batch.input_ids_BT.shape[0]
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}

    def add(k: str, v: float) -> None:
        sums[k] = sums.get(k, 0.0) + v
        counts[k] = counts.get(k, 0) + 1

    params = [p for p in policy.parameters() if p.requires_grad]
    cparams = [p for p in critic.parameters() if p.requires_grad] if critic is not None else []
    policy.train()
    skipped = 0
    for _epoch in range(optim.ppo_epochs):
        perm = torch.randperm(B, generator=generator)
        for mb_idx in perm.chunk(optim.minibatches):
            # One autocast context per optimizer step: autocast caches its low-precision
            # copies of the weights until the context exits.
            with autocast():
                mb = batch.rows(mb_idx)
                denom = aggregation_weight(mb.loss_mask_BT, algo.agg_mode).clamp(min=1.0)
                optimizer.zero_grad(set_to_none=True)
                if critic_optimizer is not None:
                    critic_optimizer.zero_grad(set_to_none=True)
                bad = False
                # Micro-batches of similar length pad less; the accumulated gradient is the
                # same whatever the split (weights below), so sorting is free accuracy-wise.
                by_len = torch.argsort(mb.attention_mask_BT.sum(-1), stable=True)
                for micro_idx in by_len.split(optim.micro_batch_size):
                    mc = _trim(mb.rows(micro_idx))
                    w = float(aggregation_weight(mc.loss_mask_BT, algo.agg_mode) / denom)
                    if w == 0.0:
                        continue
                    loss = torch.zeros(())
                    if train_policy:
                        lp_BT, ent_BT = token_logprobs(
                            policy,
                            mc.input_ids_BT,
                            mc.attention_mask_BT,
                            mc.loss_mask_BT,
                            temperature=temperature,
                            with_entropy=True,
                        )
                        old_BT = (
                            mc.old_logprobs_BT if mc.old_logprobs_BT is not None else lp_BT.detach()
                        )
                        pl, pm = policy_loss_ppo(
                            lp_BT,
                            old_BT,
                            mc.advantages_BT,
                            mc.loss_mask_BT,
                            clip_low=algo.clip_low,
                            clip_high=algo.clip_high,
                            dual_clip_c=algo.dual_clip,
                            agg_mode=algo.agg_mode,
                        )
                        loss = loss + pl
                        ent = masked_aggregate(ent_BT, mc.loss_mask_BT, algo.agg_mode)
                        if algo.entropy_coef > 0:
                            loss = loss - algo.entropy_coef * ent
                        if (
                            algo.kl_coef > 0
                            and algo.kl_mode == "k3_loss"
                            and mc.ref_logprobs_BT is not None
                        ):
                            kl = kl_loss(
                                lp_BT,
                                mc.ref_logprobs_BT,
                                mc.loss_mask_BT,
                                "k3",
                                algo.agg_mode,
                                algo.k3_linear_above,
                            )
                            loss = loss + algo.kl_coef * kl
                            add("kl", kl.item())
                            if algo.k3_linear_above is not None:
                                add("kl_tail_frac", _tail_frac(lp_BT, mc, algo.k3_linear_above))
                        add("policy_loss", pl.item())
                        add("entropy", ent.item())
                        for k, v in pm.items():
                            add(k, float(v))
                    if (
                        critic is not None
                        and mc.returns_BT is not None
                        and mc.old_values_BT is not None
                    ):
                        v_BT = critic(mc.input_ids_BT, mc.attention_mask_BT)
                        vl, vm = value_loss(
                            v_BT,
                            mc.old_values_BT,
                            mc.returns_BT,
                            mc.loss_mask_BT,
                            clip_range=algo.value_clip,
                            agg_mode=algo.agg_mode,
                        )
                        loss = loss + vl
                        add("vf_clipfrac", float(vm["vf_clipfrac"]))
                        add("value_loss", vl.item())
                    if not torch.isfinite(loss):
                        bad = True
                        break
                    (loss * w).backward()
                if bad or not _finite_grads(params + cparams):
                    skipped += 1
                    log.warning("non-finite loss or gradient: update skipped, weights unchanged")
                    optimizer.zero_grad(set_to_none=True)
                    if critic_optimizer is not None:
                        critic_optimizer.zero_grad(set_to_none=True)
                    continue
                if train_policy:
                    gn = torch.nn.utils.clip_grad_norm_(params, optim.grad_clip)
                    add("grad_norm", float(gn))
                    optimizer.step()
                if critic_optimizer is not None:
                    torch.nn.utils.clip_grad_norm_(cparams, optim.grad_clip)
                    critic_optimizer.step()
    if train_policy and scheduler is not None:
        scheduler.step()
    out = {k: sums[k] / counts[k] for k in sums}
    out["skipped_updates"] = float(skipped)
    out["lr"] = float(optimizer.param_groups[0]["lr"])
    return {k: (v if math.isfinite(v) else float("nan")) for k, v in out.items()}
