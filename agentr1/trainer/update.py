"""One RL update: K epochs of minibatch steps over a rollout batch.

    rl_update                    epochs x minibatches (`_minibatch_step` each)
      _minibatch_step            micro-batches (`_accumulate`), then one optimizer step
        _accumulate              policy terms + critic terms of one micro-batch, backward
          policy_terms           the policy loss (``algo.policy_loss``), entropy bonus,
                                 a KL loss term (``algo.kl_mode``, when it is one)
          critic_terms           the clipped value loss (gae)

Notation: B = rows, T = tokens. Every per-token tensor is [B, T] and aligned with
``input_ids_BT`` (see `token_logprobs`).

Gradient accumulation is exact: a minibatch is split into micro-batches whose losses are
weighted by their share of the minibatch's aggregation denominator, so micro-batching
changes memory, not the gradient. A non-finite loss or gradient skips the optimizer step
(the weights stay as they were) and is counted in the metrics.

Data-parallel training (``distributed.trainer_ranks > 1``) runs this same code on every
rank with a `Collective` (`agentr1.distributed.dp.DataParallel`): each rank backpropagates
its share of every minibatch's micro-batches, weighted by the whole minibatch's
denominator, then the gradients are summed over ranks before the one optimizer step, so
the update is the one-process update. Without one (None) nothing here changes.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

import torch

from agentr1.algorithms import aggregation_weight, masked_aggregate, value_loss
from agentr1.algorithms.objectives import (
    KLLossFn,
    PolicyLossFn,
    PolicyLossInputs,
    get_kl_variant,
    get_policy_loss,
)
from agentr1.config import AlgoConfig, OptimConfig
from agentr1.trainer.logprobs import backbone_and_head, micro_batches, recomputes, token_logprobs

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


@dataclass
class Learner:
    """What an update changes: the policy and its optimizer / LR schedule, and the critic
    with its optimizer when the estimator has one (gae)."""

    policy: Any
    optimizer: torch.optim.Optimizer
    scheduler: Any = None
    critic: Any | None = None
    critic_optimizer: torch.optim.Optimizer | None = None

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        if self.critic_optimizer is not None:
            self.critic_optimizer.zero_grad(set_to_none=True)


@dataclass
class LogprobTap:
    """Rows (of the update's batch) whose log-probs the update hands back from its own
    forward, taken before its first optimizer step: the run report's "before the update"
    of the rows it logs (`agentr1.trainer.tokenlog`), without a forward of their own.
    ``got`` maps a row to its log-probs [T] (0 on the padding the micro-batch cut)."""

    rows: set[int]
    got: dict[int, torch.Tensor] = field(default_factory=dict)

    def take(self, rows_b: torch.Tensor, lp_BT: torch.Tensor, width: int) -> None:
        """Keep the wanted ones of a micro-batch's rows (batch indices ``rows_b``, their
        log-probs ``lp_BT``), padded back to the batch's ``width``."""
        for i, r in enumerate(rows_b.tolist()):
            if r in self.rows:
                row = lp_BT[i].float()
                self.got[r] = torch.nn.functional.pad(row, (0, width - row.shape[0]))

    def taker(self, rows_b: torch.Tensor, width: int) -> Callable[[torch.Tensor], None]:
        """`take` for one micro-batch's rows, as `policy_terms`' ``seen``."""
        return lambda lp_BT: self.take(rows_b, lp_BT, width)


@dataclass
class _Terms:
    """The fixed choices of one update, resolved once."""

    algo: AlgoConfig
    temperature: float
    train_policy: bool
    policy_loss: PolicyLossFn
    kl_loss: KLLossFn | None


@dataclass
class MetricMeans:
    """Running weighted means of scalar metrics over micro-batches / optimizer steps.

    A micro-batch's metrics weigh its share of its minibatch's aggregation denominator
    (the weight its loss is backpropagated with), so a minibatch's logged policy loss,
    entropy or KL is the minibatch's whatever cut `micro_batches` made (an unweighted mean
    of micro-batches moved with the cut: a batch of repeated rows, planned as fewer
    passes, logged another policy loss); a per-minibatch metric (``grad_norm``) weighs 1,
    as each minibatch's micro-batches together do."""

    sums: dict[str, float] = field(default_factory=dict)
    counts: dict[str, float] = field(default_factory=dict)
    """The weights summed per metric."""

    def add(self, values: dict[str, float], weight: float = 1.0) -> None:
        if weight <= 0.0:
            return  # a micro-batch with no aggregated token: nothing of it is trained
        for k, v in values.items():
            self.sums[k] = self.sums.get(k, 0.0) + weight * v
            self.counts[k] = self.counts.get(k, 0.0) + weight

    def means(self) -> dict[str, float]:
        return {k: self.sums[k] / self.counts[k] for k in self.sums}


class Collective(Protocol):
    """What an update asks of its peer ranks in data-parallel training; every rank calls
    each method at the same point of the same update (they are collectives)."""

    lockstep: bool
    """Every rank runs every one of its micro-batches, forward and backward, even one
    whose loss is not finite or whose weight is 0 (FSDP: each pass is a collective)."""

    def micro_batches(
        self,
        input_ids_BT: torch.Tensor,
        attention_mask_BT: torch.Tensor,
        micro_batch_size: int,
        share_prefix: bool,
        max_tokens: int = 0,
    ) -> list[torch.Tensor]:
        """This rank's micro-batches (row indices) of a minibatch (its right-padded rows):
        a share of the micro-batches one process would run (`micro_batches`)."""
        ...

    def sum_gradients(self, params: list[torch.nn.Parameter], ok: bool) -> bool:
        """Sum every rank's gradients of ``params`` into each ``p.grad``; whether to step:
        every rank's losses were finite (``ok`` on all of them) and so is the sum (the
        same answer on every rank)."""
        ...

    def clip_grad_norm(self, params: list[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
        """`torch.nn.utils.clip_grad_norm_` of the summed gradients (over shards too)."""
        ...

    def reduce_metrics(self, means: MetricMeans) -> None:
        """Make ``means`` the means over every rank's micro-batches (sums and counts
        summed over ranks)."""
        ...


def policy_terms(
    policy: Any,
    mc: UpdateBatch,
    t: _Terms,
    seen: Callable[[torch.Tensor], None] | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The policy's loss on one micro-batch: the registered policy loss, minus the entropy
    bonus, plus ``kl_coef`` x a KL loss term (when the KL variant is one and there is a
    reference). Old log-probs default to this forward's own (on-policy: ratio 1).
    ``seen`` is given the forward's log-probs [B, T]."""
    algo = t.algo
    lp_BT, ent_BT = token_logprobs(
        policy,
        mc.input_ids_BT,
        mc.attention_mask_BT,
        mc.loss_mask_BT,
        temperature=t.temperature,
        with_entropy=True,
    )
    if seen is not None:
        seen(lp_BT.detach())
    old_BT = mc.old_logprobs_BT if mc.old_logprobs_BT is not None else lp_BT.detach()
    loss, metrics = t.policy_loss(
        PolicyLossInputs(lp_BT, old_BT, mc.advantages_BT, mc.loss_mask_BT), algo
    )
    ent = masked_aggregate(ent_BT, mc.loss_mask_BT, algo.agg_mode)
    metrics = {"policy_loss": loss.item(), "entropy": ent.item(), **metrics}
    if algo.entropy_coef > 0:
        loss = loss - algo.entropy_coef * ent
    if t.kl_loss is not None and algo.kl_coef > 0 and mc.ref_logprobs_BT is not None:
        kl, kl_metrics = t.kl_loss(lp_BT, mc.ref_logprobs_BT, mc.loss_mask_BT, algo)
        loss = loss + algo.kl_coef * kl
        metrics |= kl_metrics
    return loss, metrics


def critic_terms(
    critic: Any, mc: UpdateBatch, algo: AlgoConfig
) -> tuple[torch.Tensor, dict[str, float]]:
    """The critic's clipped value loss toward the returns on one micro-batch."""
    assert mc.returns_BT is not None and mc.old_values_BT is not None
    v_BT = critic(mc.input_ids_BT, mc.attention_mask_BT)
    vl, vm = value_loss(
        v_BT,
        mc.old_values_BT,
        mc.returns_BT,
        mc.loss_mask_BT,
        clip_range=algo.value_clip,
        agg_mode=algo.agg_mode,
    )
    return vl, {"value_loss": vl.item(), "vf_clipfrac": float(vm["vf_clipfrac"])}


def _accumulate(
    learner: Learner,
    mc: UpdateBatch,
    weight: float,
    t: _Terms,
    log_to: MetricMeans,
    lockstep: bool = False,
    seen: Callable[[torch.Tensor], None] | None = None,
) -> bool:
    """Backpropagate ``weight`` x one micro-batch's loss; False when the loss is not
    finite (then nothing is backpropagated, unless ``lockstep``: see `Collective`).
    ``seen``: as in `policy_terms`."""
    loss = torch.zeros(())
    if t.train_policy:
        pl, pm = policy_terms(learner.policy, mc, t, seen)
        loss = loss + pl
        log_to.add(pm, weight)
    if learner.critic is not None and mc.returns_BT is not None and mc.old_values_BT is not None:
        vl, vm = critic_terms(learner.critic, mc, t.algo)
        loss = loss + vl
        log_to.add(vm, weight)
    finite = bool(torch.isfinite(loss))
    if finite or lockstep:
        (loss * weight).backward()
    return finite


def _minibatch_step(
    learner: Learner,
    mb: UpdateBatch,
    t: _Terms,
    optim: OptimConfig,
    log_to: MetricMeans,
    dp: Collective | None = None,
    tap: tuple[LogprobTap, torch.Tensor] | None = None,
) -> bool:
    """Accumulate a minibatch's micro-batches, then step the optimizers; False (weights
    unchanged) when a loss or gradient is not finite. ``tap``: a `LogprobTap` and the
    minibatch's rows in the batch (their indices), handed each forward's log-probs.

    Each micro-batch's loss is weighted by its share of the minibatch's aggregation
    denominator, so the gradient is the same whatever the split (over micro-batches, and
    over ranks with ``dp``: the denominator is always the whole minibatch's). Micro-batches
    of similar length pad less, and rows that share a long prefix compute it once: the
    cut `micro_batches` plans (dealt to the ranks with ``dp``), free accuracy-wise."""
    denom = aggregation_weight(mb.loss_mask_BT, t.algo.agg_mode).clamp(min=1.0)
    learner.zero_grad()
    share = not recomputes(backbone_and_head(learner.policy)[0])
    plan = micro_batches if dp is None else dp.micro_batches
    micros = plan(
        mb.input_ids_BT,
        mb.attention_mask_BT,
        optim.micro_batch_size,
        share,
        max_tokens=optim.micro_batch_tokens,
    )
    lockstep = dp is not None and dp.lockstep
    finite = True
    width = mb.input_ids_BT.shape[1]
    for micro_idx in micros:
        mc = _trim(mb.rows(micro_idx))
        w = float(aggregation_weight(mc.loss_mask_BT, t.algo.agg_mode) / denom)
        seen = None if tap is None else tap[0].taker(tap[1][micro_idx], width)
        if (w != 0.0 or lockstep) and not _accumulate(learner, mc, w, t, log_to, lockstep, seen):
            finite = False
            if not lockstep:
                break
    params = [p for p in learner.policy.parameters() if p.requires_grad]
    critic_params = [] if learner.critic is None else learner.critic.parameters()
    cparams = [p for p in critic_params if p.requires_grad]
    if dp is None:
        finite = finite and _finite_grads(params + cparams)
    else:  # every rank, a finite loss or not: the sum is a collective
        finite = dp.sum_gradients(params + cparams, finite)
    if finite:
        clip = torch.nn.utils.clip_grad_norm_ if dp is None else dp.clip_grad_norm
        if t.train_policy:
            gn = clip(params, optim.grad_clip)
            log_to.add({"grad_norm": float(gn)})
            learner.optimizer.step()
        if learner.critic_optimizer is not None:
            clip(cparams, optim.grad_clip)
            learner.critic_optimizer.step()
        return True
    log.warning("non-finite loss or gradient: update skipped, weights unchanged")
    learner.zero_grad()
    return False


def rl_update(
    learner: Learner,
    batch: UpdateBatch,
    algo: AlgoConfig,
    optim: OptimConfig,
    temperature: float,
    generator: torch.Generator,
    train_policy: bool = True,
    autocast: Callable[[], AbstractContextManager[Any]] = nullcontext,
    dp: Collective | None = None,
    tap: LogprobTap | None = None,
) -> dict[str, float]:
    """K epochs x minibatches of policy steps (and critic steps when the learner has a
    critic); returns the metrics' means, ``skipped_updates`` and ``lr``.

    ``tap`` is filled from the forwards of the first minibatch (before any optimizer
    step) with the log-probs of the rows it wants that are in it.

    ``autocast`` makes the context of each optimizer step's forward and backward passes
    (e.g. `agentr1.trainer.setup.train_autocast`): one context per step, because autocast
    caches its low-precision copies of the weights until the context exits. ``dp``: this
    rank's part in data-parallel training (every rank then passes the same ``batch``
    and ``generator`` state, so all draw the same minibatches); None = one process.
    """
    kl = get_kl_variant(algo.kl_mode)
    terms = _Terms(algo, temperature, train_policy, get_policy_loss(algo.policy_loss), kl.loss)
    means = MetricMeans()
    skipped = 0
    learner.policy.train()
    B = batch.input_ids_BT.shape[0]
    for _epoch in range(optim.ppo_epochs):
        perm = torch.randperm(B, generator=generator)
        for mb_idx in perm.chunk(optim.minibatches):
            with autocast():
                mb = batch.rows(mb_idx)
                taps = None if tap is None else (tap, mb_idx)
                tap = None  # only the first minibatch's forwards come before a step
                skipped += not _minibatch_step(learner, mb, terms, optim, means, dp, taps)
    if dp is not None:
        dp.reduce_metrics(means)
    if train_policy and learner.scheduler is not None:
        learner.scheduler.step()
    out = means.means()
    out["skipped_updates"] = float(skipped)
    out["lr"] = float(learner.optimizer.param_groups[0]["lr"])
    return {k: (v if math.isfinite(v) else float("nan")) for k, v in out.items()}
