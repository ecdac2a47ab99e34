"""Trajectories -> `RolloutBatch` tensors. The ONLY place masks become tensors.

Notation: B = trajectories, T = longest token stream in the batch (right padding).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from agentr1.types import RolloutBatch, Trajectory, TrajectoryGroup


def place_rewards(traj: Trajectory) -> list[float]:
    """Token-level rewards for one trajectory. [T_i]

    Each turn's process reward sits on the turn's last sampled token; the outcome reward
    on the last token the policy sampled in the episode. Turns with no sampled tokens
    contribute nothing (there is no action to credit).
    """
    rewards = [0.0] * len(traj.token_ids)
    for turn in traj.turns:
        if turn.end > turn.start:
            rewards[turn.end - 1] += turn.reward
    last = max((i for i, m in enumerate(traj.loss_mask) if m), default=None)
    if last is not None:
        rewards[last] += traj.outcome_reward
    return rewards


def collate(
    trajectories: Sequence[Trajectory], group_index: Sequence[int], pad_id: int
) -> RolloutBatch:
    """Right-pad trajectories into a `RolloutBatch`.

    Args:
        trajectories: B trajectories.
        group_index: for each trajectory, the index of its task group.
        pad_id: token id for padding (masked out everywhere).
    """
    if len(trajectories) != len(group_index):
        raise ValueError(f"{len(trajectories)} trajectories but {len(group_index)} group indices")
    if not trajectories:
        raise ValueError("cannot collate an empty batch")
    B = len(trajectories)
    T = max(len(t.token_ids) for t in trajectories)
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    attn = torch.zeros((B, T), dtype=torch.long)
    mask = torch.zeros((B, T), dtype=torch.float32)
    old_lp = torch.zeros((B, T), dtype=torch.float32)
    rew = torch.zeros((B, T), dtype=torch.float32)
    for i, t in enumerate(trajectories):
        n = len(t.token_ids)
        if not (len(t.loss_mask) == len(t.logprobs) == n):
            raise ValueError(
                f"trajectory {t.task_id}#{t.sample_index}: token_ids ({n}), loss_mask "
                f"({len(t.loss_mask)}) and logprobs ({len(t.logprobs)}) differ in length"
            )
        ids[i, :n] = torch.tensor(t.token_ids, dtype=torch.long)
        attn[i, :n] = 1
        mask[i, :n] = torch.tensor(t.loss_mask, dtype=torch.float32)
        old_lp[i, :n] = torch.tensor(t.logprobs, dtype=torch.float32) * mask[i, :n]
        rew[i, :n] = torch.tensor(place_rewards(t), dtype=torch.float32)
    return RolloutBatch(
        input_ids_BT=ids,
        attention_mask_BT=attn,
        loss_mask_BT=mask,
        old_logprobs_BT=old_lp,
        token_rewards_BT=rew,
        outcome_B=torch.tensor([t.outcome_reward for t in trajectories], dtype=torch.float32),
        group_index_B=torch.tensor(list(group_index), dtype=torch.long),
    )


def collate_groups(groups: Sequence[TrajectoryGroup], pad_id: int) -> RolloutBatch:
    """`collate` over groups, with group indices 0..len(groups)-1."""
    trajs = [t for g in groups for t in g.trajectories]
    index = [i for i, g in enumerate(groups) for _ in g.trajectories]
    return collate(trajs, index, pad_id)
