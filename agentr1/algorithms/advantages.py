"""Advantage estimators: pure tensor functions with ONE signature, registered by name.

    out = get_advantage(cfg.estimator)(AdvantageInputs(...), cfg)   # -> AdvantageOutput

Notation: B = batch rows (trajectories), T = tokens; suffixes give shapes (``rewards_BT`` is
[B, T], ``group_index_B`` is [B]).

The mask contract (docs/design.md §1): ``loss_mask_BT`` is 1 exactly on tokens the policy
sampled. Prompt, tool responses, template glue and padding are 0, and a tool response can
sit between two agent turns of the same row. Every estimator:

- returns advantages and returns that are exactly 0 wherever the mask is 0;
- reads values only at masked tokens (anything at mask 0, NaN included, is ignored);
- never loses a reward. The caller places rewards on agent tokens (each turn's process
  reward on its last token, the outcome on the last sampled token), but a reward found at
  a mask-0 position is credited, undiscounted, to the nearest agent token before it (the
  action whose consequence it is), or to the row's first agent token when none precedes
  it (a reward in the prompt). Outcome-style estimators use the sum of the whole row, so
  the position does not matter to them. In a row with no agent token nothing is trained,
  but its reward still counts in its group's statistics.

Statistics (group mean/std, batch whitening) are computed in float64 (group statistics
after shifting by the group minimum), so equal rewards give exactly 0, never NaN or
round-off noise that the eps-division would amplify.
Standard deviations are unbiased (Bessel), as in verl and TRL; a set of one has std 0.
Outputs are float32 and carry no autograd graph.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeAlias

import torch

from agentr1.algorithms.registry import get_advantage, register_advantage
from agentr1.types import RolloutBatch


@dataclass(frozen=True)
class AdvantageInputs:
    """What every estimator reads.

    Attributes:
        token_rewards_BT: rewards already placed on tokens: each agent turn's process
            reward on its last token, the outcome reward on the last sampled token; a KL
            penalty in the reward (`losses.apply_kl_to_rewards`) is already folded in by
            the caller when used. [B, T] float
        loss_mask_BT: 1 exactly on agent-sampled tokens (the mask contract). [B, T]
        group_index_B: task group of each row (any integer ids; rows with equal ids are
            the G samples of one task). [B] long
        values_BT: critic values, ``values_BT[b, t]`` = V(state before token t is
            sampled), aligned with token t like log-probs. Needed by ``gae`` only. [B, T]
    """

    token_rewards_BT: torch.Tensor
    loss_mask_BT: torch.Tensor
    group_index_B: torch.Tensor
    values_BT: torch.Tensor | None = None

    def __post_init__(self) -> None:
        shape = tuple(self.token_rewards_BT.shape)
        if len(shape) != 2:
            raise ValueError(f"token_rewards_BT must be [B, T], got shape {shape}")
        if tuple(self.loss_mask_BT.shape) != shape:
            raise ValueError(
                f"loss_mask_BT shape {tuple(self.loss_mask_BT.shape)} != rewards shape {shape}"
            )
        if tuple(self.group_index_B.shape) != (shape[0],):
            raise ValueError(
                f"group_index_B must be [B] = [{shape[0]}], got {tuple(self.group_index_B.shape)}"
            )
        if self.values_BT is not None and tuple(self.values_BT.shape) != shape:
            raise ValueError(f"values_BT shape {tuple(self.values_BT.shape)} != {shape}")

    @classmethod
    def from_batch(
        cls,
        batch: RolloutBatch,
        values_BT: torch.Tensor | None = None,
        token_rewards_BT: torch.Tensor | None = None,
    ) -> AdvantageInputs:
        """Inputs from a `RolloutBatch`; pass ``token_rewards_BT`` to use rewards with a KL
        penalty folded in instead of ``batch.token_rewards_BT``."""
        rewards_BT = batch.token_rewards_BT if token_rewards_BT is None else token_rewards_BT
        return cls(rewards_BT, batch.loss_mask_BT, batch.group_index_B, values_BT)


@dataclass(frozen=True)
class AdvantageConfig:
    """Settings shared by all estimators; each estimator reads the fields it needs.

    Attributes:
        estimator: registered name of the estimator (`advantage_names()`), so dispatch is
            ``get_advantage(cfg.estimator)(inputs, cfg)``.
        gamma: discount per agent token (tool-response tokens do not count), used by
            ``gae`` and ``reinforce_plus_plus``. 1.0 = no discount, the usual choice for
            LLMs, whose episodes are short and rewarded at the end.
        lam: GAE lambda (``gae`` only). 1.0 = Monte-Carlo return minus value (low bias),
            0.0 = one-step TD (low variance).
        norm_by_std: ``grpo`` divides the group-centred reward by the group std. False
            gives the Dr. GRPO numerator (Liu et al. 2025 argue the division biases toward
            too-easy and too-hard questions).
        gae_whiten: ``gae`` whitens its advantages over all masked tokens of the batch (as
            PPO implementations usually do); returns are computed before whitening.
        eps: added to every std before dividing, so zero spread gives 0, not NaN.
    """

    estimator: str = "grpo"
    gamma: float = 1.0
    lam: float = 1.0
    norm_by_std: bool = True
    gae_whiten: bool = True
    eps: float = 1e-6

    def __post_init__(self) -> None:
        get_advantage(self.estimator)  # a ValueError naming the valid names / the bad path
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma={self.gamma} must be in [0, 1]: >1 makes returns explode")
        if not 0.0 <= self.lam <= 1.0:
            raise ValueError(f"lam={self.lam} must be in [0, 1]: GAE weights would not sum to 1")
        if not self.eps > 0.0:
            raise ValueError(f"eps={self.eps} must be > 0, else equal rewards divide 0 by 0")


@dataclass(frozen=True)
class AdvantageOutput:
    """What every estimator returns. Both tensors are exactly 0 where the mask is 0.

    Attributes:
        advantages_BT: per-token advantage for the policy loss. [B, T] float32
        returns_BT: for ``gae``, the critic's regression target (raw GAE advantage +
            value); for the critic-free estimators, the return the estimator started from
            (per-token return-to-go, or the row's total reward on each of its tokens), for
            logging. [B, T] float32
    """

    advantages_BT: torch.Tensor
    returns_BT: torch.Tensor


AdvantageFn: TypeAlias = Callable[[AdvantageInputs, AdvantageConfig], AdvantageOutput]


def compute_advantages(inputs: AdvantageInputs, cfg: AdvantageConfig) -> AdvantageOutput:
    """Run the estimator ``cfg.estimator`` (the one-line dispatch)."""
    return get_advantage(cfg.estimator)(inputs, cfg)


# ---------------------------------------------------------------------------- helpers


def _agent_mask_BT(inputs: AdvantageInputs) -> torch.Tensor:
    """Bool mask of agent-sampled tokens. [B, T]"""
    return inputs.loss_mask_BT > 0


def _rewards_on_agent_tokens(rewards_BT: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """Rewards with every mask-0 reward moved onto an agent token of its row. [B, T] f32

    A reward at mask 0 goes to the last agent token before it, or to the row's first agent
    token if none precedes it; rows with no agent token keep nothing.
    """
    B, T = mask_BT.shape
    pos_BT = torch.arange(T, device=mask_BT.device).expand(B, T)
    last_agent_BT = torch.where(mask_BT, pos_BT, -1).cummax(dim=1).values  # -1: none yet
    first_agent_B = mask_BT.to(torch.float32).argmax(dim=1)  # 0 for rows with none
    target_BT = torch.where(last_agent_BT >= 0, last_agent_BT, first_agent_B[:, None])
    rewards_BT = rewards_BT.detach().to(torch.float32)
    moved_BT = torch.zeros_like(rewards_BT).scatter_add_(1, target_BT, rewards_BT)
    return torch.where(mask_BT, moved_BT, 0.0)


def _row_scores_B(rewards_BT: torch.Tensor) -> torch.Tensor:
    """Total reward of each row (every position counts, so none is lost). [B] float64"""
    return rewards_BT.detach().to(torch.float64).sum(dim=1)


@dataclass(frozen=True)
class _GroupStats:
    """Per-row view of the row's group. All [B] float64."""

    centred_B: torch.Tensor  # score - group mean (exactly 0 when the group's scores agree)
    std_B: torch.Tensor  # unbiased group std; 0 for a group of one
    count_B: torch.Tensor  # group size


def _group_stats(scores_B: torch.Tensor, group_index_B: torch.Tensor) -> _GroupStats:
    _, inv_B = torch.unique(group_index_B, return_inverse=True)
    num_groups = int(inv_B.max().item()) + 1 if inv_B.numel() else 0
    zeros_G = scores_B.new_zeros(num_groups)
    count_G = zeros_G.index_add(0, inv_B, torch.ones_like(scores_B))
    # Shift by the group minimum first: equal scores become exact zeros, so their mean and
    # deviations are exactly 0 (no 1-ulp noise that eps-division would blow up).
    min_G = torch.full_like(zeros_G, float("inf")).scatter_reduce(
        0, inv_B, scores_B, reduce="amin", include_self=True
    )
    shifted_B = scores_B - min_G[inv_B]
    mean_G = zeros_G.index_add(0, inv_B, shifted_B) / count_G
    centred_B = shifted_B - mean_G[inv_B]
    sq_G = zeros_G.index_add(0, inv_B, centred_B**2)
    var_G = torch.where(count_G > 1, sq_G / (count_G - 1).clamp(min=1), 0.0)
    return _GroupStats(centred_B, var_G.sqrt()[inv_B], count_G[inv_B])


def _masked_whiten(x_BT: torch.Tensor, mask_BT: torch.Tensor, eps: float) -> torch.Tensor:
    """(x - mean) / (std + eps) over all masked tokens of the batch; 0 at mask 0. [B, T] f32

    ``x_BT`` is float32, summed in float64: n equal values then have a mean exactly equal
    to the value (n * v is exact in float64), so equal values whiten to exactly 0.
    """
    x64_BT = x_BT.to(torch.float32).to(torch.float64)
    n = mask_BT.sum().to(torch.float64)
    mean = torch.where(mask_BT, x64_BT, 0.0).sum() / n.clamp(min=1)
    centred_BT = torch.where(mask_BT, x64_BT - mean, 0.0)
    std = ((centred_BT**2).sum() / (n - 1).clamp(min=1)).sqrt()
    return (centred_BT / (std + eps)).to(torch.float32)


def _broadcast(row_B: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """Put a per-row value on each of the row's masked tokens. [B, T] float32"""
    return torch.where(mask_BT, row_B.to(torch.float32)[:, None], 0.0)


def _discounted_return_to_go(
    rewards_BT: torch.Tensor, mask_BT: torch.Tensor, gamma: float
) -> torch.Tensor:
    """G_t = sum over agent tokens k >= t of gamma^(agent tokens between) r_k. [B, T] f32

    Mask-0 tokens neither discount nor reset the sum: they are skipped, as if absent.
    """
    returns_BT = torch.zeros_like(rewards_BT)
    running_B = rewards_BT.new_zeros(rewards_BT.shape[0])
    for t in reversed(range(rewards_BT.shape[1])):
        candidate_B = rewards_BT[:, t] + gamma * running_B
        running_B = torch.where(mask_BT[:, t], candidate_B, running_B)
        returns_BT[:, t] = torch.where(mask_BT[:, t], candidate_B, 0.0)
    return returns_BT


# -------------------------------------------------------------------------- estimators


@register_advantage("gae")
@torch.no_grad()
def gae(inputs: AdvantageInputs, cfg: AdvantageConfig) -> AdvantageOutput:
    """PPO with a critic: Generalized Advantage Estimation (Schulman et al. 2016).

    delta_t = r_t + gamma * V(next agent token) - V_t;  A_t = delta_t + gamma*lam*A_next.
    The recursion runs over agent tokens only (the "advantage mask", as in Agent-R1):
    the successor of the last token before a tool response is the first token of the next
    agent turn, so values bootstrap across the tool response as if its tokens were not
    there; after the row's last agent token the value is 0 (terminal). Returns are
    A + V, before the optional batch whitening of A (``cfg.gae_whiten``).

    Departures from the paper: time steps are agent tokens, not environment steps; rewards
    at mask-0 positions are moved onto agent tokens (module docstring).
    """
    if inputs.values_BT is None:
        raise ValueError("gae needs values_BT from a critic; use a critic-free estimator")
    mask_BT = _agent_mask_BT(inputs)
    rewards_BT = _rewards_on_agent_tokens(inputs.token_rewards_BT, mask_BT)
    values_BT = inputs.values_BT.detach().to(torch.float32)
    B, T = rewards_BT.shape
    adv_BT = torch.zeros_like(rewards_BT)
    next_value_B = rewards_BT.new_zeros(B)
    next_adv_B = rewards_BT.new_zeros(B)
    for t in reversed(range(T)):
        m_B = mask_BT[:, t]
        delta_B = rewards_BT[:, t] + cfg.gamma * next_value_B - values_BT[:, t]
        adv_t_B = delta_B + cfg.gamma * cfg.lam * next_adv_B
        # Mask-0 tokens leave the carried state untouched: they are skipped, not zeros.
        adv_BT[:, t] = torch.where(m_B, adv_t_B, 0.0)
        next_value_B = torch.where(m_B, values_BT[:, t], next_value_B)
        next_adv_B = torch.where(m_B, adv_t_B, next_adv_B)
    returns_BT = torch.where(mask_BT, adv_BT + values_BT, 0.0)
    if cfg.gae_whiten:
        adv_BT = _masked_whiten(adv_BT, mask_BT, cfg.eps)
    return AdvantageOutput(adv_BT, returns_BT)


@register_advantage("grpo")
@torch.no_grad()
def grpo(inputs: AdvantageInputs, cfg: AdvantageConfig) -> AdvantageOutput:
    """GRPO (Shao et al. 2024, DeepSeekMath), outcome supervision.

    r = sum of the row's token rewards; A = (r - mean_group(r)) / (std_group(r) + eps),
    or r - mean_group(r) when ``cfg.norm_by_std`` is False; A is put on every agent token
    of the row. A group of one has A = 0; a group of equal rewards has A = 0.

    Departures from the paper: process rewards are summed into the outcome instead of
    GRPO's process-supervision variant (per-step normalized rewards summed to go); the
    KL term lives in the loss or the reward (`losses`), not in the estimator.
    """
    mask_BT = _agent_mask_BT(inputs)
    scores_B = _row_scores_B(inputs.token_rewards_BT)
    stats = _group_stats(scores_B, inputs.group_index_B)
    adv_B = stats.centred_B / (stats.std_B + cfg.eps) if cfg.norm_by_std else stats.centred_B
    return AdvantageOutput(_broadcast(adv_B, mask_BT), _broadcast(scores_B, mask_BT))


@register_advantage("dr_grpo")
@torch.no_grad()
def dr_grpo(inputs: AdvantageInputs, cfg: AdvantageConfig) -> AdvantageOutput:
    """Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training").

    A = r - mean_group(r), never divided by the group std (``cfg.norm_by_std`` is ignored),
    put on every agent token of the row; r = sum of the row's token rewards. The paper's
    other fix, dropping the 1/|o_i| length normalization, is not an advantage matter: use
    the aggregation mode ``seq-mean-token-sum`` in the loss (the paper divides by a
    constant, the max generation length; that constant only rescales the learning rate).
    A group of one has A = 0.
    """
    mask_BT = _agent_mask_BT(inputs)
    scores_B = _row_scores_B(inputs.token_rewards_BT)
    stats = _group_stats(scores_B, inputs.group_index_B)
    return AdvantageOutput(_broadcast(stats.centred_B, mask_BT), _broadcast(scores_B, mask_BT))


@register_advantage("reinforce_plus_plus")
@torch.no_grad()
def reinforce_plus_plus(inputs: AdvantageInputs, cfg: AdvantageConfig) -> AdvantageOutput:
    """REINFORCE++ (Hu 2025).

    G_t = discounted return-to-go over agent tokens (``cfg.gamma`` per agent token; tool
    responses are skipped, not discounted), then A = (G - mean) / (std + eps) with mean
    and std over ALL masked tokens of the batch (global whitening, no critic, no group).
    Returns are G before whitening.

    Departures from the paper: the per-token KL penalty of the paper is folded into
    ``token_rewards_BT`` by the caller (`losses.apply_kl_to_rewards`), not here; time
    steps skip tool-response tokens.
    """
    mask_BT = _agent_mask_BT(inputs)
    rewards_BT = _rewards_on_agent_tokens(inputs.token_rewards_BT, mask_BT)
    returns_BT = _discounted_return_to_go(rewards_BT, mask_BT, cfg.gamma)
    return AdvantageOutput(_masked_whiten(returns_BT, mask_BT, cfg.eps), returns_BT)


@register_advantage("reinforce_plus_plus_baseline")
@torch.no_grad()
def reinforce_plus_plus_baseline(inputs: AdvantageInputs, cfg: AdvantageConfig) -> AdvantageOutput:
    """REINFORCE++-baseline (Hu 2025, the group-baseline variant).

    r = sum of the row's token rewards; a = r - mean_group(r) put on every agent token of
    the row; then A = (a - mean) / (std + eps) over ALL masked tokens of the batch. The
    whitening weights rows by their token counts and re-centres, so a group of one (a = 0)
    can end with a non-zero A; equal rewards everywhere give A = 0.

    Departures from the paper: none in the estimator; the paper's KL (k2/k3 in the loss)
    is the caller's choice (`losses.kl_loss`), and any KL folded into the rewards is
    summed into r.
    """
    mask_BT = _agent_mask_BT(inputs)
    scores_B = _row_scores_B(inputs.token_rewards_BT)
    stats = _group_stats(scores_B, inputs.group_index_B)
    centred_BT = _broadcast(stats.centred_B, mask_BT)
    return AdvantageOutput(
        _masked_whiten(centred_BT, mask_BT, cfg.eps), _broadcast(scores_B, mask_BT)
    )


@register_advantage("rloo")
@torch.no_grad()
def rloo(inputs: AdvantageInputs, cfg: AdvantageConfig) -> AdvantageOutput:
    """RLOO, REINFORCE Leave-One-Out (Ahmadian et al. 2024; Kool et al. 2019).

    r = sum of the row's token rewards; A_i = r_i - (1/(k-1)) * sum_{j != i} r_j, the
    paper's leave-one-out baseline over the other k-1 samples of the group
    (= k/(k-1) * (r_i - mean_group(r))), put on every agent token of the row. The paper's
    1/k average over samples is the loss aggregation's job. A group of one has no other
    sample to form a baseline: A = 0 (documented choice; that row then teaches nothing).

    Departures from the paper: the paper treats the whole completion as one action; here
    the sequence-level A is applied per token and may go through the PPO clipped loss.
    """
    mask_BT = _agent_mask_BT(inputs)
    scores_B = _row_scores_B(inputs.token_rewards_BT)
    stats = _group_stats(scores_B, inputs.group_index_B)
    k_B = stats.count_B
    adv_B = torch.where(k_B > 1, stats.centred_B * k_B / (k_B - 1).clamp(min=1), 0.0)
    return AdvantageOutput(_broadcast(adv_B, mask_BT), _broadcast(scores_B, mask_BT))
