"""The critic for PPO: a transformer backbone with a scalar value head.

Alignment matches `token_logprobs`: ``values_BT[:, t]`` is V(state before token t), read
from the hidden state at position t − 1; position 0 is 0.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from agentr1.trainer.logprobs import backbone_and_head, backbone_hidden


class ValueModel(nn.Module):
    """Backbone (a copy of the policy's, by default) plus a zero-initialized value head."""

    def __init__(self, backbone: nn.Module, hidden_size: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.v_head = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.v_head.weight)
        nn.init.zeros_(self.v_head.bias)

    @classmethod
    def from_policy(cls, policy: Any) -> ValueModel:
        """A critic initialized from the policy's backbone (a deep copy, trained separately)."""
        import copy

        backbone, _ = backbone_and_head(policy)
        critic = cls(copy.deepcopy(backbone), int(policy.config.hidden_size))
        # The fresh value head starts on the CPU: follow the backbone's device.
        return critic.to(next(backbone.parameters()).device)

    def forward(self, input_ids_BT: torch.Tensor, attention_mask_BT: torch.Tensor) -> torch.Tensor:
        """Values aligned with tokens. [B, T] float32"""
        hidden_BTH = backbone_hidden(self.backbone, input_ids_BT, attention_mask_BT)
        v_BT = self.v_head(hidden_BTH).squeeze(-1).float()
        out_BT = torch.zeros_like(v_BT)
        out_BT[:, 1:] = v_BT[:, :-1]
        return out_BT
