"""RL algorithms as pure tensor functions: advantage estimators (one signature, a name
registry), PPO policy and value losses, KL penalties, entropy, masked aggregation.

Notation: B = batch rows (trajectories), T = tokens, V = vocabulary.

Imports only torch and `agentr1.types` (docs/design.md §2).
"""

from agentr1.algorithms.advantages import (
    AdvantageConfig,
    AdvantageFn,
    AdvantageInputs,
    AdvantageOutput,
    compute_advantages,
    dr_grpo,
    gae,
    grpo,
    reinforce_plus_plus,
    reinforce_plus_plus_baseline,
    rloo,
)
from agentr1.algorithms.losses import (
    AGG_MODES,
    KL_KINDS,
    AggMode,
    KLKind,
    aggregation_weight,
    apply_kl_to_rewards,
    entropy_bonus,
    entropy_from_logits,
    explained_variance,
    kl_loss,
    kl_penalty,
    masked_aggregate,
    policy_loss_ppo,
    value_loss,
)
from agentr1.algorithms.registry import (
    Registry,
    UnknownNameError,
    advantage_names,
    get_advantage,
    register_advantage,
)

__all__ = [
    "AGG_MODES",
    "KL_KINDS",
    "AdvantageConfig",
    "AdvantageFn",
    "AdvantageInputs",
    "AdvantageOutput",
    "AggMode",
    "KLKind",
    "Registry",
    "UnknownNameError",
    "advantage_names",
    "aggregation_weight",
    "apply_kl_to_rewards",
    "compute_advantages",
    "dr_grpo",
    "entropy_bonus",
    "entropy_from_logits",
    "explained_variance",
    "gae",
    "get_advantage",
    "grpo",
    "kl_loss",
    "kl_penalty",
    "masked_aggregate",
    "policy_loss_ppo",
    "register_advantage",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "rloo",
    "value_loss",
]
