"""A collated rollout batch -> what the update takes: masks, scores, advantages.

    masks            train mask and advantage mask [B, T] (the ablations swap in "every
                     real token")
    score_batch      reference log-probs, critic values and (off-policy) old log-probs
    step_advantages  token rewards (with a reward-side KL variant folded in) -> the
                     registered estimator's advantages and returns
    update_batch     all of it as an `UpdateBatch`

Notation: B = rows (episodes), T = tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from agentr1 import lora
from agentr1.algorithms import (
    AdvantageConfig,
    AdvantageInputs,
    apply_kl_to_rewards,
    compute_advantages,
    explained_variance,
)
from agentr1.algorithms.objectives import get_kl_variant
from agentr1.config import Config
from agentr1.trainer import tokenlog
from agentr1.trainer.logprobs import sorted_token_logprobs
from agentr1.trainer.setup import train_autocast
from agentr1.trainer.state import Timer, TrainState
from agentr1.trainer.update import UpdateBatch
from agentr1.types import RolloutBatch


@dataclass(frozen=True)
class Scores:
    """The step's extra forward passes over the batch, [B, T] each, None when not needed."""

    ref_BT: torch.Tensor | None = None
    """Reference log-probs (a KL is on)."""
    values_BT: torch.Tensor | None = None
    """Critic values at rollout time (gae)."""
    old_BT: torch.Tensor | None = None
    """The trainer's own log-probs before the update (off-policy updates, the loss-mask
    ablation); on-policy, the update takes them from its first forward (ratio 1)."""
    logged_BT: torch.Tensor | None = None
    """The same before the update for the rows whose tokens the step logs only
    (`agentr1.trainer.tokenlog.logged_rows`; [N, T]): the report's PPO ratio and KL.
    None until the update has given them where it can (`tokenlog.update_gives_before`)."""


@dataclass(frozen=True)
class Advantages:
    advantages_BT: torch.Tensor
    returns_BT: torch.Tensor
    metrics: dict[str, float]


def masks(batch: RolloutBatch, cfg: Config) -> tuple[torch.Tensor, torch.Tensor]:
    """(train mask, advantage mask) [B, T]; the ablations swap in "every real token".

    With the loss mask off, every real token is trained, so it needs an advantage too:
    the advantage mask then covers every real token as well (otherwise the ablation
    would train prompt and tool tokens with advantage 0, i.e. not at all).
    """
    real_BT = batch.attention_mask_BT.float().clone()
    real_BT[:, 0] = 0.0  # the first token has no log-prob
    train_BT = batch.loss_mask_BT if cfg.algo.loss_mask else real_BT
    both_on = cfg.algo.advantage_mask and cfg.algo.loss_mask
    adv_BT = batch.loss_mask_BT if both_on else real_BT
    return train_BT, adv_BT


@torch.no_grad()
def score_batch(
    s: TrainState, batch: RolloutBatch, train_mask_BT: torch.Tensor, timer: Timer
) -> Scores:
    """Reference log-probs, critic values and (when off-policy) old log-probs.

    On-policy (one epoch, one minibatch) the update takes the old log-probs from its own
    forward pass (ratio 1), never from the sampler, so a bf16 sampler copy changes nothing
    there."""
    cfg = s.setup.cfg
    policy = s.setup.policy
    temp = cfg.rollout.temperature

    def logprobs(model: torch.nn.Module) -> torch.Tensor:
        return sorted_token_logprobs(
            model,
            batch.input_ids_BT,
            batch.attention_mask_BT,
            train_mask_BT,
            temp,
            rows=cfg.optim.micro_batch_size,
        )

    old = ref = values = None
    on_policy = cfg.optim.ppo_epochs == 1 and cfg.optim.minibatches == 1
    stale = cfg.async_.max_staleness > 0  # the proximal policy of the IS weights
    with train_autocast(cfg, policy):
        if not on_policy or not cfg.algo.loss_mask or stale:
            with timer("old_logprobs"):
                policy.eval()
                old = logprobs(policy)
        if s.reference is not None:
            with timer("reference"):
                ref = logprobs(s.reference)
        elif cfg.algo.kl_coef > 0 and lora.lora_modules(policy):
            with timer("reference"), lora.adapters_disabled(policy):
                policy.eval()
                ref = logprobs(policy)
        if s.critic is not None:
            with timer("values"):
                values = s.critic(batch.input_ids_BT, batch.attention_mask_BT)
    logged = None
    # On-policy in one process the update's own first forward gives the logged rows'
    # log-probs before it (`tokenlog.tap_for`, `rl_step`): no forward of their own here.
    if cfg.train.log_trajectories and not tokenlog.update_gives_before(s, old):
        with timer("log_tokens"):
            logged = tokenlog.logprobs_before(s, batch, train_mask_BT, old)
    return Scores(ref_BT=ref, values_BT=values, old_BT=old, logged_BT=logged)


def step_advantages(
    cfg: Config, batch: RolloutBatch, scores: Scores, adv_mask_BT: torch.Tensor
) -> Advantages:
    """Token rewards (with a reward-side KL variant folded in) -> advantages and returns."""
    rewards_BT = batch.token_rewards_BT
    metrics: dict[str, float] = {}
    kl = get_kl_variant(cfg.algo.kl_mode)
    if scores.ref_BT is not None and kl.reward is not None and cfg.algo.kl_coef > 0:
        lp_BT = scores.old_BT if scores.old_BT is not None else batch.old_logprobs_BT
        mask_BT = batch.loss_mask_BT
        kl_BT = kl.reward(lp_BT, scores.ref_BT, mask_BT, cfg.algo)
        rewards_BT = apply_kl_to_rewards(rewards_BT, kl_BT, mask_BT, cfg.algo.kl_coef)
        metrics["kl_reward"] = float((kl_BT * mask_BT).sum() / mask_BT.sum().clamp(min=1))
    acfg = AdvantageConfig(
        estimator=cfg.algo.estimator,
        gamma=cfg.algo.gamma,
        lam=cfg.algo.lam,
        norm_by_std=cfg.algo.norm_by_std,
    )
    inputs = AdvantageInputs(rewards_BT, adv_mask_BT, batch.group_index_B, scores.values_BT)
    out = compute_advantages(inputs, acfg)
    if scores.values_BT is not None:
        # the critic's values at rollout time against the returns it is trained toward
        ev = explained_variance(scores.values_BT, out.returns_BT, adv_mask_BT)
        if ev is not None:
            metrics["value_explained_var"] = ev
    return Advantages(out.advantages_BT, out.returns_BT, metrics)


def update_batch(
    s: TrainState, batch: RolloutBatch, timer: Timer
) -> tuple[UpdateBatch, Scores, dict[str, float]]:
    """What the update takes (masks, scores, advantages), the scores, and the advantage
    phase's metrics (``kl_reward``, ``value_explained_var``)."""
    cfg = s.setup.cfg
    train_mask_BT, adv_mask_BT = masks(batch, cfg)
    scores = score_batch(s, batch, train_mask_BT, timer)
    with timer("advantage"):
        adv = step_advantages(cfg, batch, scores, adv_mask_BT)
    advantages_BT = adv.advantages_BT * train_mask_BT
    metrics = dict(adv.metrics)
    if cfg.async_.max_staleness > 0 and scores.old_BT is not None:
        is_BT, is_metrics = truncated_is_weights(
            scores.old_BT, batch.old_logprobs_BT, batch.loss_mask_BT, cfg.async_.is_cap
        )
        advantages_BT = advantages_BT * is_BT
        metrics |= is_metrics
    ub = UpdateBatch(
        input_ids_BT=batch.input_ids_BT,
        attention_mask_BT=batch.attention_mask_BT,
        loss_mask_BT=train_mask_BT,
        advantages_BT=advantages_BT,
        old_logprobs_BT=scores.old_BT,
        ref_logprobs_BT=scores.ref_BT,
        returns_BT=adv.returns_BT if s.critic is not None else None,
        old_values_BT=scores.values_BT,
    )
    return ub, scores, metrics


def truncated_is_weights(
    prox_BT: torch.Tensor, behaviour_BT: torch.Tensor, mask_BT: torch.Tensor, cap: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-token importance weights ``min(pi_prox / pi_behaviour, cap)`` of a stale batch,
    1 off the mask, and their metrics.

    The decoupled PPO objective of AReaL (Fu et al., 2025, "AReaL: A Large-Scale
    Asynchronous Reinforcement Learning System for Language Reasoning", §5): the clipped
    ratio is taken against the proximal policy (the trainer's weights before this
    update, ``prox``) and the whole token term is weighted by ``pi_prox / pi_behaviour``,
    the behaviour policy being the (older) weights that sampled the token, whose
    log-probs the rollout recorded. The weight is truncated from above at ``cap``, as in
    truncated importance sampling (Yao et al., 2025, "Your Efficient RL Framework Secretly
    Brings You Off-Policy RL Training"; verl's ``tis_imp_ratio_cap``), so one token the
    old weights found unlikely cannot dominate the step. A weight on the advantage is
    the same as a weight on the token's loss for every loss that is positively
    homogeneous in the advantage (PPO clip, dual clip), and costs nothing extra.
    """
    keep_BT = mask_BT > 0
    log_w_BT = torch.where(keep_BT, prox_BT - behaviour_BT, torch.zeros_like(prox_BT))
    w_BT = log_w_BT.clamp(max=math.log(cap)).exp()
    n = keep_BT.sum().clamp(min=1)
    metrics = {
        "async/is_weight_mean": float((w_BT * keep_BT).sum() / n),
        "async/is_clipped": float(((log_w_BT >= math.log(cap)) & keep_BT).sum() / n),
        "async/behaviour_kl": float(((-log_w_BT) * keep_BT).sum() / n),
    }
    return torch.where(keep_BT, w_BT, torch.ones_like(w_BT)), metrics
