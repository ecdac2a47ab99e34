"""Policy losses and KL variants as named parts, registered like the advantage estimators.

A recipe picks them by name (or by import path, `agentr1.registry`):

    algo.policy_loss: ppo_clip          # PolicyLossFn: (PolicyLossInputs, algo) -> (loss, metrics)
    algo.kl_mode: k3_loss               # a KLVariant: in the rewards or in the loss

so a new variant is one function and one name, never a branch in the trainer. The update
(`agentr1.trainer.update`) calls the policy loss once per micro-batch and a KL variant's
``loss`` term there (times ``algo.kl_coef``); the loop calls a variant's ``reward`` term
once per step, before the advantages, and folds it into the token rewards.

Notation: B = batch rows, T = tokens. Imports only torch and this package.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from agentr1.algorithms.losses import kl_loss, kl_penalty, masked_aggregate, policy_loss_ppo
from agentr1.registry import Registry

__all__ = [
    "KLVariant",
    "PolicyLossFn",
    "PolicyLossInputs",
    "get_kl_variant",
    "get_policy_loss",
    "kl_variant_names",
    "policy_loss_names",
    "register_kl_variant",
    "register_policy_loss",
]

Metrics = dict[str, float]


class AlgoSettings(Protocol):
    """The fields of `agentr1.config.AlgoConfig` the built-in parts read (a custom part
    may read any other field of it)."""

    clip_low: float
    clip_high: float
    dual_clip: float | None
    agg_mode: Any
    k3_linear_above: float | None


@dataclass(frozen=True)
class PolicyLossInputs:
    """One micro-batch's policy-loss inputs, [B, T], aligned with the input ids.

    Attributes:
        logprobs_BT: log-probs of the sampled tokens under the current policy (grad).
        old_logprobs_BT: under the policy that sampled them (no grad).
        advantages_BT: advantages, 0 off the mask (no grad).
        mask_BT: the loss mask (1 = a token the agent sampled and is trained on).
    """

    logprobs_BT: torch.Tensor
    old_logprobs_BT: torch.Tensor
    advantages_BT: torch.Tensor
    mask_BT: torch.Tensor


PolicyLossFn = Callable[[PolicyLossInputs, Any], tuple[torch.Tensor, Metrics]]
"""(inputs, algo config) -> (scalar loss aggregated with ``algo.agg_mode``, metrics as
floats, logged as the mean over micro-batches)."""

KLFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Any], torch.Tensor]
"""(logprobs_BT, ref_logprobs_BT, mask_BT, algo config) -> a KL estimate per token [B, T]."""

KLLossFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Any], tuple[torch.Tensor, Metrics]]
"""(logprobs_BT, ref_logprobs_BT, mask_BT, algo config) -> (scalar, metrics); the update
adds ``algo.kl_coef`` x the scalar to the loss."""


@dataclass(frozen=True)
class KLVariant:
    """Where the KL to the reference enters: exactly one of

    - ``reward``: a per-token estimate on the sampling log-probs, folded into the token
      rewards before the advantages (``r - kl_coef * kl``; no gradient through it), or
    - ``loss``: a differentiable term added to each micro-batch's loss.
    """

    reward: KLFn | None = None
    loss: KLLossFn | None = None

    def __post_init__(self) -> None:
        if (self.reward is None) == (self.loss is None):
            raise ValueError("a KLVariant is either a reward term or a loss term (exactly one)")


_POLICY_LOSSES: Registry[PolicyLossFn] = Registry("policy loss")
_KL_VARIANTS: Registry[KLVariant] = Registry("KL variant")


def register_policy_loss(name: str) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Register a policy loss ``(PolicyLossInputs, algo) -> (loss, metrics)`` as ``name``."""
    return _POLICY_LOSSES.register(name)


def register_kl_variant(name: str, variant: KLVariant) -> KLVariant:
    """Register a `KLVariant` as ``name`` (for ``algo.kl_mode``)."""
    _KL_VARIANTS.add(name, variant)
    return variant


def get_policy_loss(name: str) -> PolicyLossFn:
    """The policy loss registered as ``name``, or the function an import path names."""
    fn: PolicyLossFn = _POLICY_LOSSES.resolve(name)
    return fn


def get_kl_variant(name: str) -> KLVariant:
    """The KL variant registered as ``name``, or the `KLVariant` an import path names."""
    variant = _KL_VARIANTS.resolve(name)
    if not isinstance(variant, KLVariant):
        raise TypeError(f"algo.kl_mode {name!r} names a {type(variant).__name__}, not a KLVariant")
    return variant


def policy_loss_names() -> list[str]:
    return _POLICY_LOSSES.names()


def kl_variant_names() -> list[str]:
    return _KL_VARIANTS.names()


# ---------------------------------------------------------------------------- built-ins
@register_policy_loss("ppo_clip")
def ppo_clip(inputs: PolicyLossInputs, algo: AlgoSettings) -> tuple[torch.Tensor, Metrics]:
    """PPO's clipped surrogate with DAPO clip-higher and the dual clip (`policy_loss_ppo`):
    ``clipfrac``, ``approx_kl``, ``dual_clip_frac``."""
    loss, metrics = policy_loss_ppo(
        inputs.logprobs_BT,
        inputs.old_logprobs_BT,
        inputs.advantages_BT,
        inputs.mask_BT,
        clip_low=algo.clip_low,
        clip_high=algo.clip_high,
        dual_clip_c=algo.dual_clip,
        agg_mode=algo.agg_mode,
    )
    return loss, {k: float(v) for k, v in metrics.items()}


def _k1_reward(lp_BT: torch.Tensor, ref_BT: torch.Tensor, mask_BT: torch.Tensor, algo: Any) -> Any:
    return kl_penalty(lp_BT, ref_BT, "k1", mask_BT)


def _tail_frac(
    lp_BT: torch.Tensor, ref_BT: torch.Tensor, mask_BT: torch.Tensor, above: float
) -> float:
    """Share of loss tokens whose log(pi_ref / pi) exceeds ``above`` (k3's linear tail)."""
    keep_BT = mask_BT > 0
    tail_BT = (ref_BT - lp_BT.detach()) > above
    return float((tail_BT & keep_BT).sum() / keep_BT.sum().clamp(min=1))


def _k3_loss(
    lp_BT: torch.Tensor, ref_BT: torch.Tensor, mask_BT: torch.Tensor, algo: AlgoSettings
) -> tuple[torch.Tensor, Metrics]:
    """k3 with its linear tail past ``algo.k3_linear_above`` (`kl_penalty`); logs ``kl``
    and, with the tail on, ``kl_tail_frac``."""
    above = algo.k3_linear_above
    kl = kl_loss(lp_BT, ref_BT, mask_BT, "k3", algo.agg_mode, above)
    metrics = {"kl": kl.item()}
    if above is not None:
        metrics["kl_tail_frac"] = _tail_frac(lp_BT, ref_BT, mask_BT, above)
    return kl, metrics


def _k2_loss(
    lp_BT: torch.Tensor, ref_BT: torch.Tensor, mask_BT: torch.Tensor, algo: AlgoSettings
) -> tuple[torch.Tensor, Metrics]:
    """k2 = (log pi - log pi_ref)^2 / 2: biased, low variance, gradient linear in the
    log-ratio (no exponential tail); logs ``kl``."""
    kl = masked_aggregate(kl_penalty(lp_BT, ref_BT, "k2", mask_BT), mask_BT, algo.agg_mode)
    return kl, {"kl": kl.item()}


register_kl_variant("k1_reward", KLVariant(reward=_k1_reward))
register_kl_variant("k3_loss", KLVariant(loss=_k3_loss))
register_kl_variant("k2_loss", KLVariant(loss=_k2_loss))
