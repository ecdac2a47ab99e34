"""Per-token log-probs (and entropy) of a causal LM, without [B, T, V] float32 logits.

Notation: B = rows, T = tokens, H = hidden size, V = vocabulary, N = selected positions.

The backbone runs once over the batch; the LM head and log-softmax then run only on the
positions that matter (those with ``loss_mask = 1`` — the agent's tokens), in chunks of
``chunk`` positions, each under activation checkpointing, so at most [chunk, V] float32
logits exist at a time, forward and backward. On multi-hop episodes most tokens are tool
responses, so this also skips most of the LM-head work.

Alignment: ``logprobs_BT[:, t]`` is log p(token_t | tokens_<t), computed from the hidden
state at position t − 1; position 0 has no log-prob and is 0.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.checkpoint import checkpoint


def _head_chunk(
    hidden_NH: torch.Tensor,
    targets_N: torch.Tensor,
    weight_VH: torch.Tensor,
    bias_V: torch.Tensor | None,
    inv_temp: float,
    with_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    logits_NV = torch.nn.functional.linear(hidden_NH, weight_VH, bias_V).float() * inv_temp
    logz_N = torch.logsumexp(logits_NV, dim=-1)
    lp_N = logits_NV.gather(-1, targets_N[:, None]).squeeze(-1) - logz_N
    if with_entropy:
        p_NV = torch.softmax(logits_NV, dim=-1)
        ent_N = logz_N - (p_NV * logits_NV).sum(-1)
    else:
        ent_N = torch.zeros_like(lp_N)
    return lp_N, ent_N


def backbone_and_head(model: Any) -> tuple[Any, torch.nn.Linear]:
    """Split a HF causal LM into (backbone returning hidden states, LM head)."""
    head = model.get_output_embeddings()
    backbone = getattr(model, getattr(model, "base_model_prefix", "model"), None)
    if backbone is None or head is None:
        raise TypeError(f"{type(model).__name__}: cannot find the backbone and LM head")
    return backbone, head


def token_logprobs(
    model: Any,
    input_ids_BT: torch.Tensor,
    attention_mask_BT: torch.Tensor,
    select_BT: torch.Tensor | None = None,
    temperature: float = 1.0,
    chunk: int = 1024,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs (and entropies) of each token under ``model`` at ``temperature``.

    Args:
        model: a HF causal LM (``model.model`` backbone + ``lm_head``).
        input_ids_BT: right-padded token ids. [B, T]
        attention_mask_BT: 1 for real tokens. [B, T]
        select_BT: positions to compute (e.g. the loss mask); None = every position ≥ 1.
            [B, T]
        temperature: the sampling temperature, so log-probs match the rollout's.
        chunk: positions per LM-head chunk.
        with_entropy: also return the entropy of the predictive distribution.

    Returns:
        (logprobs_BT, entropy_BT), zero outside the selected positions. [B, T] each
    """
    backbone, head = backbone_and_head(model)
    B, T = input_ids_BT.shape
    hidden_BTH = backbone(
        input_ids=input_ids_BT, attention_mask=attention_mask_BT
    ).last_hidden_state
    sel_BT = torch.zeros(B, T, dtype=torch.bool, device=input_ids_BT.device)
    if select_BT is None:
        sel_BT[:, 1:] = attention_mask_BT[:, 1:].bool()
    else:
        sel_BT[:, 1:] = select_BT[:, 1:].bool()
    # Position t is predicted from hidden state t-1.
    idx_b, idx_t = sel_BT.nonzero(as_tuple=True)
    hidden_NH = hidden_BTH[idx_b, idx_t - 1]
    targets_N = input_ids_BT[idx_b, idx_t]
    inv_temp = 1.0 / temperature if temperature > 0 else 1.0
    lps, ents = [], []
    for s in range(0, hidden_NH.shape[0], chunk):
        args = (
            hidden_NH[s : s + chunk],
            targets_N[s : s + chunk],
            head.weight,
            head.bias,
            inv_temp,
            with_entropy,
        )
        if torch.is_grad_enabled():
            lp, ent = checkpoint(_head_chunk, *args, use_reentrant=False)
        else:
            lp, ent = _head_chunk(*args)
        lps.append(lp)
        ents.append(ent)
    out_lp = torch.zeros(B, T, dtype=torch.float32, device=input_ids_BT.device)
    out_ent = torch.zeros(B, T, dtype=torch.float32, device=input_ids_BT.device)
    if lps:
        out_lp = out_lp.index_put((idx_b, idx_t), torch.cat(lps))
        out_ent = out_ent.index_put((idx_b, idx_t), torch.cat(ents))
    return out_lp, out_ent
