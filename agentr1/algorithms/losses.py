"""Policy and value losses, KL penalties, entropy; one masked aggregation for all of them.

Notation: B = batch rows (trajectories), T = tokens, V = vocabulary; suffixes give shapes
(``logprobs_BT`` is [B, T], ``logits_BTV`` is [B, T, V]).

Every loss reduces per-token terms with `masked_aggregate` over ``mask_BT`` (the loss mask:
1 exactly on agent-sampled tokens, docs/design.md §1). Inputs at mask-0 positions are replaced
by neutral values BEFORE any arithmetic, so whatever sits there (garbage, inf, NaN) changes
neither a loss nor its gradient.

Micro-batching: a micro-batch loss is a mean over its own denominator; to reproduce the
full-batch gradient, scale each micro-batch loss by
``aggregation_weight(mask_mb, mode) / aggregation_weight(mask_full, mode)``
(token counts for token-mean, non-empty row counts for the seq-mean modes).
"""

from __future__ import annotations

import math
from typing import Literal, get_args

import torch

AggMode = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"]
"""How per-token terms become one scalar (see `masked_aggregate`)."""
KLKind = Literal["k1", "k2", "k3"]
"""Schulman's KL estimators (see `kl_penalty`)."""

AGG_MODES: tuple[str, ...] = get_args(AggMode)
KL_KINDS: tuple[str, ...] = get_args(KLKind)

_LOG_RATIO_LIMIT = 20.0  # exp(20) ~ 5e8: beyond this a ratio is garbage, not information


def _check_mode(mode: str) -> None:
    if mode not in AGG_MODES:
        raise ValueError(f"unknown aggregation mode {mode!r}; valid: {', '.join(AGG_MODES)}")


def _on_mask(x_BT: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """``x`` where the mask is set, 0 elsewhere (no arithmetic touches mask-0 values). [B, T]"""
    return torch.where(mask_BT > 0, x_BT, torch.zeros_like(x_BT))


def masked_aggregate(
    loss_BT: torch.Tensor, mask_BT: torch.Tensor, mode: AggMode = "token-mean"
) -> torch.Tensor:
    """Reduce per-token terms to a scalar over the masked tokens: the ONE aggregation.

    Modes:
        token-mean: sum over all masked tokens / number of masked tokens (every token
            weighs the same; long rows weigh more). PPO / DAPO default.
        seq-mean-token-sum: per row, sum over its masked tokens; then the mean over rows
            that have at least one masked token. No length normalization (Dr. GRPO, up
            to the constant the paper divides by).
        seq-mean-token-mean: per row, mean over its masked tokens; then the mean over rows
            that have at least one masked token (original GRPO).

    Rows with no masked token are not counted in seq-mean denominators (they are not
    samples to learn from, e.g. padding rows). An empty mask gives 0, not NaN.

    Args:
        loss_BT: per-token terms. [B, T]
        mask_BT: loss mask (nonzero = counted). [B, T]
        mode: one of `AGG_MODES`.

    Returns:
        scalar tensor, in ``loss_BT``'s dtype.
    """
    _check_mode(mode)
    keep_BT = mask_BT > 0
    x_BT = _on_mask(loss_BT, keep_BT)
    ones_BT = keep_BT.to(x_BT.dtype)
    if mode == "token-mean":
        return x_BT.sum() / ones_BT.sum().clamp(min=1.0)
    tokens_B = ones_BT.sum(dim=-1)
    per_row_B = x_BT.sum(dim=-1)
    if mode == "seq-mean-token-mean":
        per_row_B = per_row_B / tokens_B.clamp(min=1.0)
    rows = (tokens_B > 0).to(x_BT.dtype).sum()
    return per_row_B.sum() / rows.clamp(min=1.0)


def aggregation_weight(mask_BT: torch.Tensor, mode: AggMode = "token-mean") -> torch.Tensor:
    """The denominator `masked_aggregate` divides by, before clamping: the number of masked
    tokens (token-mean) or of rows with a masked token (seq-mean modes). For weighting
    micro-batches, see the module docstring. Scalar float32 tensor."""
    _check_mode(mode)
    keep_BT = mask_BT > 0
    if mode == "token-mean":
        return keep_BT.sum().to(torch.float32)
    return keep_BT.any(dim=-1).sum().to(torch.float32)


def policy_loss_ppo(
    logprobs_BT: torch.Tensor,
    old_logprobs_BT: torch.Tensor,
    advantages_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip_c: float | None = 3.0,
    agg_mode: AggMode = "token-mean",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate (Schulman et al. 2017) with clip-higher and dual clip.

    Per masked token, with ratio = exp(logp - old_logp):
        clipped = max(-A * ratio, -A * clamp(ratio, 1 - clip_low, 1 + clip_high))
        loss    = min(clipped, -A * dual_clip_c)   if A < 0 and dual_clip_c is not None
                  clipped                           otherwise
    ``clip_high > clip_low`` is DAPO's clip-higher (Yu et al. 2025). The dual clip (Ye et
    al. 2020) bounds the loss of a negative-advantage token whose ratio has grown huge;
    it never applies to A >= 0. The log-ratio is clamped to +-20 before exp (a ratio
    beyond e^20 carries no information and would overflow).

    Args:
        logprobs_BT: log-probs of the sampled tokens under the current policy (grad). [B, T]
        old_logprobs_BT: log-probs under the policy that sampled them (no grad). [B, T]
        advantages_BT: advantages (no grad). [B, T]
        mask_BT: loss mask. [B, T]
        clip_low: lower clip, ratio >= 1 - clip_low; in [0, 1).
        clip_high: upper clip, ratio <= 1 + clip_high; >= 0.
        dual_clip_c: dual-clip constant (> 1), or None to disable.
        agg_mode: aggregation mode (`masked_aggregate`).

    Returns:
        (loss scalar, metrics) with detached scalar metrics, token means over the mask:
        ``clipfrac`` (tokens where the ratio clip is active, i.e. zeroes the gradient),
        ``approx_kl`` (k3 estimate of KL(old || new)), ``dual_clip_frac`` (tokens where the
        dual clip is active).
    """
    if not 0.0 <= clip_low < 1.0:
        raise ValueError(f"clip_low={clip_low} must be in [0, 1): the lower bound 1-clip_low > 0")
    if clip_high < 0.0:
        raise ValueError(f"clip_high={clip_high} must be >= 0")
    if dual_clip_c is not None and not dual_clip_c > 1.0:
        raise ValueError(f"dual_clip_c={dual_clip_c} must be > 1 (or None): <= 1 cuts below 1")
    _check_mode(agg_mode)
    keep_BT = mask_BT > 0
    log_ratio_BT = _on_mask(logprobs_BT - old_logprobs_BT.detach(), keep_BT)
    log_ratio_BT = log_ratio_BT.clamp(-_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT)
    adv_BT = _on_mask(advantages_BT.detach(), keep_BT)
    ratio_BT = torch.exp(log_ratio_BT)
    unclipped_BT = -adv_BT * ratio_BT
    ratio_clipped_BT = -adv_BT * ratio_BT.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss_BT = torch.maximum(unclipped_BT, ratio_clipped_BT)
    dual_active_BT = torch.zeros_like(keep_BT)
    if dual_clip_c is not None:
        dual_bound_BT = -adv_BT * dual_clip_c
        dual_active_BT = (adv_BT < 0) & (dual_bound_BT < loss_BT) & keep_BT
        loss_BT = torch.where(dual_active_BT, dual_bound_BT, loss_BT)
    loss = masked_aggregate(loss_BT, keep_BT, agg_mode)

    with torch.no_grad():
        ratio_active_BT = (ratio_clipped_BT > unclipped_BT) & keep_BT
        k3_BT = torch.expm1(log_ratio_BT) - log_ratio_BT  # (r - 1) - log r, r = new/old
        metrics = {
            "clipfrac": masked_aggregate(ratio_active_BT.float(), keep_BT),
            "approx_kl": masked_aggregate(k3_BT.float(), keep_BT),
            "dual_clip_frac": masked_aggregate(dual_active_BT.float(), keep_BT),
        }
    return loss, metrics


def explained_variance(
    values_BT: torch.Tensor, returns_BT: torch.Tensor, mask_BT: torch.Tensor
) -> float | None:
    """How much of the returns' variance the critic's values explain, over masked tokens:
    1 - Var(R - V) / Var(R) (population variances, float64). 1 = it predicts the returns,
    0 = no better than their mean, below 0 = worse than the mean. None when the returns do
    not vary (or no token is masked): nothing to explain.
    """
    keep = mask_BT > 0
    ret = returns_BT.detach()[keep].double()
    if ret.numel() == 0:
        return None
    var = ret.var(unbiased=False)
    if float(var) <= 1e-12:
        return None
    resid = ret - values_BT.detach()[keep].double()
    return float(1.0 - resid.var(unbiased=False) / var)


def value_loss(
    values_BT: torch.Tensor,
    old_values_BT: torch.Tensor,
    returns_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    clip_range: float | None = 0.2,
    agg_mode: AggMode = "token-mean",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped value loss (PPO2 / OpenAI baselines).

    Per masked token: v_clip = old_v + clamp(v - old_v, -clip_range, clip_range);
    loss = 0.5 * max((v - R)^2, (v_clip - R)^2). The 0.5 makes the gradient (v - R), the
    usual regression convention; the max keeps the update pessimistic (it can only stop
    the critic moving more than ``clip_range`` away from ``old_v``, never help it).
    ``clip_range=None`` gives the plain 0.5 * (v - R)^2.

    Args:
        values_BT: current critic values (grad). [B, T]
        old_values_BT: values at rollout time (no grad). [B, T]
        returns_BT: regression targets (`AdvantageOutput.returns_BT`, no grad). [B, T]
        mask_BT: loss mask. [B, T]
        clip_range: clip half-width (>= 0) or None.
        agg_mode: aggregation mode (`masked_aggregate`).

    Returns:
        (loss scalar, metrics) with ``vf_clipfrac``: masked-token fraction where the clipped
        term is the larger one (the gradient is cut).
    """
    if clip_range is not None and clip_range < 0.0:
        raise ValueError(f"clip_range={clip_range} must be >= 0 or None")
    _check_mode(agg_mode)
    keep_BT = mask_BT > 0
    v_BT = _on_mask(values_BT, keep_BT)
    old_BT = _on_mask(old_values_BT.detach(), keep_BT)
    ret_BT = _on_mask(returns_BT.detach(), keep_BT)
    sq_BT = (v_BT - ret_BT) ** 2
    if clip_range is None:
        loss = 0.5 * masked_aggregate(sq_BT, keep_BT, agg_mode)
        return loss, {"vf_clipfrac": torch.zeros((), device=values_BT.device)}
    v_clip_BT = old_BT + (v_BT - old_BT).clamp(-clip_range, clip_range)
    sq_clip_BT = (v_clip_BT - ret_BT) ** 2
    loss = 0.5 * masked_aggregate(torch.maximum(sq_BT, sq_clip_BT), keep_BT, agg_mode)
    with torch.no_grad():
        clipfrac = masked_aggregate((sq_clip_BT > sq_BT).float(), keep_BT)
    return loss, {"vf_clipfrac": clipfrac}


def kl_penalty(
    logprobs_BT: torch.Tensor,
    ref_logprobs_BT: torch.Tensor,
    kind: KLKind = "k3",
    mask_BT: torch.Tensor | None = None,
    k3_linear_above: float | None = None,
) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) on tokens sampled from pi (Schulman 2020,
    "Approximating KL divergence"). With d = ref_logp - logp:

        k1 = -d                  unbiased, high variance, can be negative
        k2 = 0.5 * d^2           biased, low variance, >= 0
        k3 = exp(d) - d - 1      unbiased, low variance, >= 0

    Typical use: k1 folded into the rewards (`apply_kl_to_rewards`) or k3 as a loss term
    (`kl_loss`). d is clamped to +-20 (k3's exp would overflow). With ``mask_BT`` the
    result is 0 at mask 0, with no arithmetic on the values there.

    k3 grows like exp(d) where the reference is much likelier than the policy, and so does
    its gradient (1 - exp(d) w.r.t. logp): one such token can outweigh a whole batch. With
    ``k3_linear_above = c``, k3 past d = c follows its tangent at c (value and slope
    continuous, still convex): the pull back toward the reference keeps its direction but
    a token's gradient is at most exp(c) - 1. The usual alternative, clamping k3's value
    (verl clamps it to 10), gives those tokens no gradient at all.

    Returns:
        kl_BT, differentiable w.r.t. ``logprobs_BT``. [B, T]
    """
    if kind not in KL_KINDS:
        raise ValueError(f"unknown KL kind {kind!r}; valid: {', '.join(KL_KINDS)}")
    if k3_linear_above is not None and not k3_linear_above > 0:
        raise ValueError(f"k3_linear_above={k3_linear_above} must be > 0 or None")
    d_BT = ref_logprobs_BT.detach() - logprobs_BT
    if mask_BT is not None:
        d_BT = _on_mask(d_BT, mask_BT)
    d_BT = d_BT.clamp(-_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT)
    if kind == "k1":
        return -d_BT
    if kind == "k2":
        return 0.5 * d_BT**2
    if k3_linear_above is None or k3_linear_above >= _LOG_RATIO_LIMIT:
        return torch.expm1(d_BT) - d_BT  # exp(d) - 1 - d, accurate for small d
    c = k3_linear_above
    inner_BT = torch.expm1(d_BT.clamp(max=c)) - d_BT.clamp(max=c)
    slope = math.expm1(c)  # d k3 / d d at c
    return torch.where(d_BT > c, inner_BT + slope * (d_BT - c), inner_BT)


def apply_kl_to_rewards(
    token_rewards_BT: torch.Tensor,
    kl_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    beta: float,
) -> torch.Tensor:
    """Token rewards with a KL penalty folded in: r - beta * kl on masked tokens only.

    The result is a new tensor with no autograd graph (rewards are constants to the
    policy gradient). Feed it to `AdvantageInputs` (REINFORCE++, PPO's KL-in-reward).

    Args:
        token_rewards_BT: placed rewards. [B, T]
        kl_BT: per-token KL (`kl_penalty`, usually k1). [B, T]
        mask_BT: loss mask. [B, T]
        beta: KL coefficient, >= 0.

    Returns:
        rewards_BT. [B, T]
    """
    if beta < 0.0:
        raise ValueError(f"beta={beta} must be >= 0: a negative KL coefficient rewards drift")
    penalty_BT = _on_mask(kl_BT.detach().to(token_rewards_BT.dtype), mask_BT)
    return token_rewards_BT.detach() - beta * penalty_BT


def kl_loss(
    logprobs_BT: torch.Tensor,
    ref_logprobs_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    kind: KLKind = "k3",
    agg_mode: AggMode = "token-mean",
    k3_linear_above: float | None = None,
) -> torch.Tensor:
    """KL to the reference as a loss term (GRPO style): the aggregate of `kl_penalty`
    (``k3_linear_above``: see there). Multiply by the KL coefficient and add to the policy
    loss. Scalar."""
    return masked_aggregate(
        kl_penalty(logprobs_BT, ref_logprobs_BT, kind, mask_BT, k3_linear_above),
        mask_BT,
        agg_mode,
    )


def entropy_from_logits(
    logits_BTV: torch.Tensor,
    chunk_size: int | None = None,
    mask_BT: torch.Tensor | None = None,
) -> torch.Tensor:
    """Entropy of the softmax over the last dim, in float32: H = -sum p log p. [B, T]

    ``chunk_size`` processes that many (b, t) positions at a time, so the float32 copy of
    the logits and the softmax are materialized one chunk at a time (a 150k vocabulary
    makes them large). Under autograd each chunk's intermediates are still kept for
    backward; compute logging-only entropy inside ``torch.no_grad()``. With ``mask_BT``
    only masked positions are computed (less work; mask-0 logits are never read, their
    entropy is 0). -inf logits (masked vocabulary) contribute 0.
    """
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size} must be >= 1 or None")
    *lead, vocab = logits_BTV.shape
    flat_NV = logits_BTV.reshape(-1, vocab)
    keep_N = None if mask_BT is None else (mask_BT > 0).reshape(-1)
    rows_MV = flat_NV if keep_N is None else flat_NV[keep_N]
    step = chunk_size or max(rows_MV.shape[0], 1)
    parts_M = []
    for chunk_CV in torch.split(rows_MV, step, dim=0):
        logp_CV = torch.log_softmax(chunk_CV.float(), dim=-1)
        p_CV = logp_CV.exp()
        # p = 0 where logp = -inf; zero the log first so neither 0 * -inf nor its gradient
        # produces NaN.
        safe_logp_CV = torch.where(p_CV > 0, logp_CV, torch.zeros_like(logp_CV))
        parts_M.append(-(p_CV * safe_logp_CV).sum(dim=-1))
    entropy_M = torch.cat(parts_M) if parts_M else rows_MV.new_zeros(0, dtype=torch.float32)
    if keep_N is None:
        return entropy_M.reshape(lead)
    entropy_N = entropy_M.new_zeros(flat_NV.shape[0]).masked_scatter(keep_N, entropy_M)
    return entropy_N.reshape(lead)


def entropy_bonus(
    entropy_BT: torch.Tensor, mask_BT: torch.Tensor, agg_mode: AggMode = "token-mean"
) -> torch.Tensor:
    """Mean policy entropy over the masked tokens (`masked_aggregate`). The trainer
    subtracts ``entropy_coef * entropy_bonus(...)`` from the loss. Scalar."""
    return masked_aggregate(entropy_BT, mask_BT, agg_mode)
