"""Per-token log-probs (and entropy) of a causal LM, without [B, T, V] float32 logits.

Notation: B = rows, T = tokens, H = hidden size, V = vocabulary, N = selected positions.

The backbone runs once over the batch -- the prefix each group of rows shares (a GRPO
group's prompt and, once the policy is sure of itself, its first turns and their tool
responses; at least the system prompt with the tool schema: 289 of 650-1,024 tokens per
multi-hop QA episode) once for the group, then each row's rest against its cached keys
and values (`hidden_states`), with gradients flowing through the shared part exactly as
through copies of it. `micro_batches` cuts a batch into passes where that computes the
fewest tokens. The LM head and log-softmax then run only on the positions that matter
(those with ``loss_mask = 1`` — the agent's tokens), in chunks of ``chunk`` positions.
The head has its own backward (`_HeadLogprobs`: two passes over a chunk's logits, the
native kernel's on the CPU). When the pass's float32 logits would exceed
`CHECKPOINT_LOGITS_BYTES`, each chunk's backward computes its logits again, so at most
[chunk, V] of them exist at a time, forward and backward; below it they are kept. On
multi-hop episodes most tokens are tool responses, so this also skips most of the
LM-head work.

Alignment: ``logprobs_BT[:, t]`` is log p(token_t | tokens_<t), computed from the hidden
state at position t − 1; position 0 has no log-prob and is 0.
"""

from __future__ import annotations

import contextlib
import itertools
from typing import Any

import torch

from agentr1.backends import native
from agentr1.backends.hf import MIN_SHARED_PREFIX, cache_kwarg
from agentr1.trainer.fused import native_layers

CHECKPOINT_LOGITS_BYTES = 64 << 20
"""Float32 logits of a pass's selected positions beyond which the LM-head chunks compute
their logits again in the backward instead of keeping them (SmolLM2's 49k vocabulary:
~340 positions; the demo's 2k: ~8,000, so its passes skip the recomputation)."""


def _logits(
    h_NH: torch.Tensor, weight_VH: torch.Tensor, bias_V: torch.Tensor | None, inv_temp: float
) -> torch.Tensor:
    """Float32 logits at the temperature, the head in its weights' dtype."""
    logits_NV = torch.nn.functional.linear(h_NH, weight_VH, bias_V).float()
    return logits_NV.mul_(inv_temp) if inv_temp != 1.0 else logits_NV


def _rows_forward(
    logits_NV: torch.Tensor, targets_N: torch.Tensor, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(logsumexp, the target's log-prob, the entropy or None) of each row: the native
    kernel on the CPU, torch's ops elsewhere. [N] each"""
    kernel = native.log_softmax()
    if kernel is not None and kernel.supports(logits_NV):
        return kernel.forward(logits_NV, targets_N, with_entropy)
    lse_N = torch.logsumexp(logits_NV, dim=-1)
    lp_N = logits_NV.gather(-1, targets_N[:, None]).squeeze(-1) - lse_N
    ent_N = None
    if with_entropy:
        p_NV = torch.exp(logits_NV - lse_N[:, None])
        ent_N = lse_N - (p_NV * logits_NV).sum(-1)
    return lse_N, lp_N, ent_N


def _rows_backward(
    logits_NV: torch.Tensor,
    targets_N: torch.Tensor,
    lse_N: torch.Tensor,
    ent_N: torch.Tensor | None,
    g_lp_N: torch.Tensor,
    g_ent_N: torch.Tensor | None,
    scale: float,
) -> torch.Tensor:
    """``scale`` x the gradient of ``sum(g_lp lp + g_ent ent)`` with respect to the logits,
    written over ``logits_NV``: ``-p (g_lp + g_ent (z - lse + H)) + g_lp [j = target]``."""
    kernel = native.log_softmax()
    if kernel is not None and kernel.supports(logits_NV):
        return kernel.backward(logits_NV, targets_N, lse_N, ent_N, g_lp_N, g_ent_N, scale)
    z_NV = logits_NV
    coef_NV = None
    if ent_N is not None and g_ent_N is not None:
        coef_NV = (z_NV - lse_N[:, None] + ent_N[:, None]).mul_(g_ent_N[:, None])
        coef_NV.add_(g_lp_N[:, None])
    p_NV = z_NV.sub_(lse_N[:, None]).exp_()
    grad_NV = p_NV.mul_(coef_NV).neg_() if coef_NV is not None else p_NV.mul_(-g_lp_N[:, None])
    grad_NV[torch.arange(len(targets_N), device=grad_NV.device), targets_N] += g_lp_N
    return grad_NV.mul_(scale) if scale != 1.0 else grad_NV


class _HeadLogprobs(torch.autograd.Function):
    """The LM head and its log-softmax over selected positions: ``(lp, ent)`` [N] each.

    Its own backward, so the [N, V] work is two passes over the logits (their logsumexp,
    then the gradient written over them: `agentr1.backends.native.LogSoftmax` on the CPU)
    where autograd through logsumexp and gather makes, fills and reads several [N, V]
    temporaries. With ``keep`` the forward's logits are saved for the backward; without
    it only the hidden states are, and the backward computes the logits again (the
    head's memory stays at one chunk's logits, forward and backward)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        hidden_NH: torch.Tensor,
        weight_VH: torch.Tensor,
        bias_V: torch.Tensor | None,
        targets_N: torch.Tensor,
        inv_temp: float,
        with_entropy: bool,
        keep: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        h_NH = hidden_NH.to(weight_VH.dtype)
        logits_NV = _logits(h_NH, weight_VH, bias_V, inv_temp)
        lse_N, lp_N, ent_N = _rows_forward(logits_NV, targets_N, with_entropy)
        ctx.set_materialize_grads(False)
        ctx.inv_temp, ctx.hidden_dtype = inv_temp, hidden_NH.dtype
        # Not a saved tensor: the backward writes its gradient over them (once; a second
        # backward of a retained graph computes them again).
        ctx.logits = logits_NV if keep else None
        ctx.save_for_backward(h_NH, weight_VH, bias_V, targets_N, lse_N, ent_N)
        return lp_N, ent_N if ent_N is not None else torch.zeros_like(lp_N)

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: Any, g_lp_N: torch.Tensor | None, g_ent_N: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, ...]:
        h_NH, weight_VH, bias_V, targets_N, lse_N, ent_N = ctx.saved_tensors
        if ent_N is None:
            g_ent_N = None  # the zeros returned for it: nothing to differentiate
        if g_lp_N is None and g_ent_N is None:
            return (None,) * 7
        with torch.autocast(h_NH.device.type, enabled=False):
            logits_NV, ctx.logits = ctx.logits, None
            if logits_NV is None:
                logits_NV = _logits(h_NH, weight_VH, bias_V, ctx.inv_temp)
            g_lp_N = g_lp_N if g_lp_N is not None else torch.zeros_like(lse_N)
            grad_NV = _rows_backward(
                logits_NV,
                targets_N,
                lse_N,
                ent_N,
                g_lp_N,
                g_ent_N,
                ctx.inv_temp,
            ).to(weight_VH.dtype)
            need_h, need_w, need_b = ctx.needs_input_grad[:3]
            grad_h = (grad_NV @ weight_VH).to(ctx.hidden_dtype) if need_h else None
            grad_w = grad_NV.t() @ h_NH if need_w else None
            grad_b = grad_NV.sum(0) if need_b and bias_V is not None else None
        return grad_h, grad_w, grad_b, None, None, None, None


def _head_chunk(
    hidden_NH: torch.Tensor,
    targets_N: torch.Tensor,
    weight_VH: torch.Tensor,
    bias_V: torch.Tensor | None,
    inv_temp: float,
    with_entropy: bool,
    keep: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    # The head in its weights' dtype even under autocast: with the head in bf16 a GRPO test
    # run's learning flattened (`ModelConfig.compute_dtype`). Its forward log-probs hardly
    # move (demo episodes: mean |diff| to fp32 0.0004 nats against 0.0003), so the likely
    # cause is the backward: the head's (often tied embedding's) gradient in bf16.
    with torch.autocast(hidden_NH.device.type, enabled=False):
        lp_N, ent_N = _HeadLogprobs.apply(
            hidden_NH, weight_VH, bias_V, targets_N, inv_temp, with_entropy, keep
        )
    return lp_N, ent_N


def _head_logprobs(
    hidden_NH: torch.Tensor,
    targets_N: torch.Tensor,
    head: torch.nn.Linear,
    inv_temp: float,
    with_entropy: bool,
    chunk: int,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The LM head and log-softmax over the selected positions, ``chunk`` at a time."""
    # Computing the logits again in the backward saves the float32 logits autograd would
    # keep; below CHECKPOINT_LOGITS_BYTES in all that memory is not worth a second head pass.
    keep = hidden_NH.shape[0] * head.weight.shape[0] * 4 <= CHECKPOINT_LOGITS_BYTES
    lps, ents = [], []
    for s in range(0, hidden_NH.shape[0], chunk):
        lp, ent = _head_chunk(
            hidden_NH[s : s + chunk],
            targets_N[s : s + chunk],
            head.weight,
            head.bias,
            inv_temp,
            with_entropy,
            keep,
        )
        lps.append(lp)
        ents.append(ent)
    return lps, ents


def backbone_and_head(model: Any) -> tuple[Any, torch.nn.Linear]:
    """Split a HF causal LM into (backbone returning hidden states, LM head)."""
    head = model.get_output_embeddings()
    backbone = getattr(model, getattr(model, "base_model_prefix", "model"), None)
    if backbone is None or head is None:
        raise TypeError(f"{type(model).__name__}: cannot find the backbone and LM head")
    return backbone, head


def backbone_hidden(
    backbone: Any,
    input_ids_BT: torch.Tensor,
    attention_mask_BT: torch.Tensor,
    share_prefix: bool = True,
) -> torch.Tensor:
    """Last hidden states of a right-padded batch (`hidden_states`, gathered). [B, T, H]"""
    B, T = input_ids_BT.shape
    states_MH, index_BT = hidden_states(backbone, input_ids_BT, attention_mask_BT, share_prefix)
    return states_MH.index_select(0, index_BT.flatten()).view(B, T, -1)


def hidden_states(
    backbone: Any,
    input_ids_BT: torch.Tensor,
    attention_mask_BT: torch.Tensor,
    share_prefix: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The last hidden states of a right-padded batch as (states [M, H], index [B, T]):
    row b's state at position t is ``states[index[b, t]]`` (a gather with
    ``index_select``, whose backward is a fast ``index_add``).

    With ``share_prefix``, rows that start with the same `MIN_SHARED_PREFIX` tokens form
    a group (`prefix_groups`); a group of two rows or more computes its common prefix
    once. The prefixes run as one call ([G, longest prefix], right-padded), each row's
    KV cache is its group's (rows ordered by group, the cache repeated to them), then
    every row's rest runs against it with the other columns masked out (a row of no
    group sees no prefix). Equal to the plain forward (to float rounding) and so are
    gradients: the repeat sums the rows' contributions into their group's prefix. It
    saves (rows - 1) x prefix tokens of work per group.

    The backbone's RMSNorms and MLP gates run on native kernels (`agentr1.trainer.fused`)
    unless it recomputes its activations in the backward.
    """
    fused = contextlib.nullcontext() if recomputes(backbone) else native_layers(backbone)
    with fused:  # a recomputing backward would run the modules' own forward
        return _hidden_states(backbone, input_ids_BT, attention_mask_BT, share_prefix)


def _hidden_states(
    backbone: Any,
    input_ids_BT: torch.Tensor,
    attention_mask_BT: torch.Tensor,
    share_prefix: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    B, T = input_ids_BT.shape
    device = input_ids_BT.device

    def plain() -> tuple[torch.Tensor, torch.Tensor]:
        h = _plain_hidden(backbone, input_ids_BT, attention_mask_BT)
        return h.reshape(B * T, -1), torch.arange(B * T, device=device).view(B, T)

    cache_kw = cache_kwarg(backbone)
    if not share_prefix or B < 2 or cache_kw is None or recomputes(backbone):
        return plain()
    if not right_padded(attention_mask_BT):
        return plain()
    lengths = [int(n) for n in attention_mask_BT.sum(-1).tolist()]
    rows = [r[:n] for r, n in zip(input_ids_BT.tolist(), lengths, strict=True)]
    groups = prefix_groups(rows)
    if not groups:
        return plain()
    G, P = len(groups), max(p for _, p in groups)
    order, counts, shared_B, src_B = _by_group(groups, B)
    pre_GP = torch.zeros(G, P, dtype=input_ids_BT.dtype, device=device)
    for g, (members, p) in enumerate(groups):
        pre_GP[g, :p] = input_ids_BT[members[0], :p]
    pre = backbone(input_ids=pre_GP, attention_mask=None, use_cache=True)
    cache = pre.get("cache") if "cache" in pre else pre.get("past_key_values")
    if cache is None:  # a model that returns no cache
        return plain()
    cache.batch_repeat_interleave(torch.tensor(counts, device=device))
    shared = torch.tensor(shared_B, device=device)
    order_B = torch.tensor(order, device=device)
    inputs, S = _rest_inputs(input_ids_BT, attention_mask_BT.dtype, lengths, shared, P)
    rest = backbone(
        **{k: v[order_B] for k, v in inputs.items()}, use_cache=True, **{cache_kw: cache}
    )
    # Row r's states: its group's prefix states, then its own rest's (clamped past its
    # end: padding, never read); q is a row's place in the rest call.
    q_B = torch.empty_like(order_B)
    q_B[order_B] = torch.arange(B, device=device)
    t_T = torch.arange(T, device=device)
    from_pre = torch.tensor(src_B, device=device)[:, None] * P + t_T
    from_rest = G * P + q_B[:, None] * S + (t_T - shared[:, None]).clamp(0, S - 1)
    index_BT = torch.where(t_T < shared[:, None], from_pre, from_rest)
    pre_h, rest_h = pre.last_hidden_state, rest.last_hidden_state
    return torch.cat([pre_h.reshape(G * P, -1), rest_h.reshape(B * S, -1)]), index_BT


def _by_group(
    groups: list[tuple[list[int], int]], B: int
) -> tuple[list[int], list[int], list[int], list[int]]:
    """For `hidden_states`: the rows in group order (the rows of no group last, with the
    last group's cache, masked), how many rows each group's cache serves, and per row its
    shared prefix length and group."""
    grouped = [r for members, _ in groups for r in members]
    lone = sorted(set(range(B)) - set(grouped))
    counts = [len(members) for members, _ in groups]
    counts[-1] += len(lone)
    shared_B, src_B = [0] * B, [len(groups) - 1] * B
    for g, (members, p) in enumerate(groups):
        for r in members:
            shared_B[r], src_B[r] = p, g
    return grouped + lone, counts, shared_B, src_B


def _rest_inputs(
    input_ids_BT: torch.Tensor,
    mask_dtype: torch.dtype,
    lengths: list[int],
    shared_B: torch.Tensor,
    P: int,
) -> tuple[dict[str, torch.Tensor], int]:
    """The rest call's inputs for rows whose first ``shared_B`` tokens come from a cache
    of ``P`` columns: each row's remaining tokens (right-padded to the longest rest, S),
    a mask over the cache's columns and theirs (a row sees its own prefix's columns
    only), and positions that go on from its prefix. (inputs [B, S] / [B, P + S], S)"""
    device = input_ids_BT.device
    S = max(n - int(p) for n, p in zip(lengths, shared_B.tolist(), strict=True))
    s_S = torch.arange(S, device=device)
    real_BS = s_S < (torch.tensor(lengths, device=device) - shared_B)[:, None]
    take_BS = (shared_B[:, None] + s_S).clamp(max=input_ids_BT.shape[1] - 1)
    mask_BC = torch.cat([torch.arange(P, device=device) < shared_B[:, None], real_BS], 1)
    inputs = {
        "input_ids": input_ids_BT.gather(1, take_BS) * real_BS,
        "attention_mask": mask_BC.to(mask_dtype),
        "position_ids": shared_B[:, None] + s_S,
    }
    return inputs, S


def prefix_groups(rows: list[list[int]]) -> list[tuple[list[int], int]]:
    """Groups of rows (their indices) that start with the same `MIN_SHARED_PREFIX`
    tokens, two rows or more each, and how many leading tokens each group's rows all
    share (at most one less than its longest row, so every group leaves a rest to run).

    >>> a, b = [1] * 40 + [2, 3], [1] * 40 + [2, 4, 5]
    >>> prefix_groups([a, [7] * 50, b, [1] * 33])
    [([0, 2, 3], 33)]
    >>> prefix_groups([a, [7] * 50, b])
    [([0, 2], 41)]
    """
    by_start: dict[tuple[int, ...], list[int]] = {}
    for i, row in enumerate(rows):
        if len(row) > MIN_SHARED_PREFIX:
            by_start.setdefault(tuple(row[:MIN_SHARED_PREFIX]), []).append(i)
    out = []
    for members in by_start.values():
        if len(members) < 2:
            continue
        first, p = rows[members[0]], min(len(rows[i]) for i in members)
        for i in members[1:]:
            row, k = rows[i], MIN_SHARED_PREFIX
            while k < p and row[k] == first[k]:
                k += 1
            p = k
        out.append((members, min(p, max(len(rows[i]) for i in members) - 1)))
    return out


def right_padded(mask_BT: torch.Tensor) -> bool:
    """Whether every row's real tokens come first, its padding after them.

    >>> right_padded(torch.tensor([[1, 1, 0], [1, 1, 1]]))
    True
    >>> right_padded(torch.tensor([[0, 1, 1]]))
    False
    """
    return bool((mask_BT.cumprod(-1) == mask_BT).all())


def _plain_hidden(backbone: Any, input_ids_BT: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """The backbone's last hidden states, no cache kept (nothing reads one).

    A right-padded batch (`collate`'s layout) goes in without its mask: the causal mask
    alone keeps every real position off the padding after it, so the real positions'
    states (and gradients) are the masked pass's, while attention runs its causal kernel
    (skipping the blocks above the diagonal) and no ``[B, 1, T, T]`` mask is built. The
    padding positions' own states differ and are never read."""
    mask = None if right_padded(mask_BT) else mask_BT
    out = backbone(input_ids=input_ids_BT, attention_mask=mask, use_cache=False)
    return out.last_hidden_state


def recomputes(backbone: Any) -> bool:
    """Whether ``backbone`` recomputes its activations in the backward (transformers'
    gradient checkpointing, in training), which drops the cache: no prefix to share."""
    return bool(backbone.training) and checkpointing(backbone)


def checkpointing(model: Any) -> bool:
    """Whether transformers' activation (gradient) checkpointing is on in ``model``."""
    flag = getattr(type(model), "is_activation_checkpointing", None)
    name = "is_activation_checkpointing" if flag is not None else "is_gradient_checkpointing"
    return bool(getattr(model, name, False))


def token_logprobs(
    model: Any,
    input_ids_BT: torch.Tensor,
    attention_mask_BT: torch.Tensor,
    select_BT: torch.Tensor | None = None,
    temperature: float = 1.0,
    chunk: int = 1024,
    with_entropy: bool = False,
    share_prefix: bool = True,
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
        share_prefix: run the rows' common prefix once (`hidden_states`).

    Returns:
        (logprobs_BT, entropy_BT), zero outside the selected positions. [B, T] each
    """
    repeats = distinct_rows(input_ids_BT, attention_mask_BT)
    if repeats is not None:
        first_U, inverse_B = repeats
        return _repeated_rows(
            model,
            input_ids_BT,
            attention_mask_BT,
            select_BT,
            first_U,
            inverse_B,
            temperature=temperature,
            chunk=chunk,
            with_entropy=with_entropy,
            share_prefix=share_prefix,
        )
    backbone, head = backbone_and_head(model)
    B, T = input_ids_BT.shape
    states_MH, index_BT = hidden_states(backbone, input_ids_BT, attention_mask_BT, share_prefix)
    sel_BT = torch.zeros(B, T, dtype=torch.bool, device=input_ids_BT.device)
    if select_BT is None:
        sel_BT[:, 1:] = attention_mask_BT[:, 1:].bool()
    else:
        sel_BT[:, 1:] = select_BT[:, 1:].bool()
    # Position t is predicted from hidden state t-1.
    idx_b, idx_t = sel_BT.nonzero(as_tuple=True)
    hidden_NH = states_MH.index_select(0, index_BT[idx_b, idx_t - 1])
    targets_N = input_ids_BT[idx_b, idx_t]
    inv_temp = 1.0 / temperature if temperature > 0 else 1.0
    lps, ents = _head_logprobs(hidden_NH, targets_N, head, inv_temp, with_entropy, chunk)
    out_lp = torch.zeros(B, T, dtype=torch.float32, device=input_ids_BT.device)
    out_ent = torch.zeros(B, T, dtype=torch.float32, device=input_ids_BT.device)
    if lps:
        out_lp = out_lp.index_put((idx_b, idx_t), torch.cat(lps))
        out_ent = out_ent.index_put((idx_b, idx_t), torch.cat(ents))
    return out_lp, out_ent


def distinct_rows(
    input_ids_BT: torch.Tensor, attention_mask_BT: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Where some rows repeat another (the same tokens at the same unmasked positions):
    ``(first_U, inverse_B)``, the first row of each distinct row (in row order) and each
    row's distinct row; None where every row is its own.

    A GRPO group of a policy that is sure of itself samples the same episode several
    times: in the demo's RL batches 1-3 of a group's 8 samples are distinct, from its
    first step to its last (`benchmarks/RESULTS.md`, "Repeated rows computed once").

    >>> ids = torch.tensor([[5, 6, 0], [7, 8, 9], [5, 6, 1]])
    >>> mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 0]])
    >>> [t.tolist() for t in distinct_rows(ids, mask)]
    [[0, 1], [0, 1, 0]]
    >>> distinct_rows(ids[:2], mask[:2]) is None
    True
    """
    B = input_ids_BT.shape[0]
    if B < 2:
        return None
    keys = torch.where(attention_mask_BT.bool(), input_ids_BT, -1).tolist()
    seen: dict[tuple[int, ...], int] = {}
    first: list[int] = []
    inverse: list[int] = []
    for b, key in enumerate(map(tuple, keys)):
        u = seen.setdefault(key, len(first))
        if u == len(first):
            first.append(b)
        inverse.append(u)
    if len(first) == B:
        return None
    device = input_ids_BT.device
    return torch.tensor(first, device=device), torch.tensor(inverse, device=device)


def _repeated_rows(
    model: Any,
    input_ids_BT: torch.Tensor,
    attention_mask_BT: torch.Tensor,
    select_BT: torch.Tensor | None,
    first_U: torch.Tensor,
    inverse_B: torch.Tensor,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`token_logprobs` of rows of which some repeat another: each distinct row computed
    once (at the positions any of its copies selects), its results given to every copy
    (each zero outside its own selected positions). The gradient of a copy's log-probs
    flows into its distinct row's, summed over the copies: the gradient of computing every
    row, up to float rounding."""
    U = first_U.shape[0]
    select_UT = None
    if select_BT is not None:
        picked_BT = select_BT.bool().to(torch.int32)
        counts_UT = torch.zeros(U, picked_BT.shape[1], dtype=torch.int32, device=picked_BT.device)
        select_UT = counts_UT.index_add_(0, inverse_B, picked_BT) > 0
    lp_UT, ent_UT = token_logprobs(
        model, input_ids_BT[first_U], attention_mask_BT[first_U], select_UT, **kwargs
    )
    lp_BT, ent_BT = lp_UT.index_select(0, inverse_B), ent_UT.index_select(0, inverse_B)
    if select_BT is not None:
        own_BT = select_BT.bool()
        lp_BT = torch.where(own_BT, lp_BT, 0.0)
        ent_BT = torch.where(own_BT, ent_BT, 0.0)
    return lp_BT, ent_BT


PASS_TOKENS = 128
"""What one more pass costs, in tokens of work, when `length_groups` weighs a
micro-batch's padding against another pass (a pass's fixed cost is a few hundred small
ops; a token of the demo's model costs ~30 us forward and backward)."""


def length_groups(
    by_len: torch.Tensor,
    lengths: list[int],
    max_rows: int,
    pass_tokens: int = PASS_TOKENS,
    max_tokens: int = 0,
) -> list[torch.Tensor]:
    """Rows, shortest first (``by_len``, their ``lengths`` in that order), cut into
    micro-batches of at most ``max_rows`` consecutive rows so that the tokens computed
    (each micro-batch padded to its longest row) plus ``pass_tokens`` a pass are fewest:
    where lengths jump, a micro-batch ends early rather than pad its short rows; where
    they are even, micro-batches stay full. Exact (dynamic programming over the cut
    points). A fixed split of 128 demo episodes into 32s computes 22,000 tokens for
    15,600 real ones. ``max_tokens`` > 0: no micro-batch of two rows or more computes
    more tokens than that.

    >>> [g.tolist() for g in length_groups(torch.arange(5), [10, 10, 10, 90, 90], 4)]
    [[0, 1, 2], [3, 4]]
    >>> [g.tolist() for g in length_groups(torch.arange(4), [1, 2, 3, 4], 4, pass_tokens=0)]
    [[0], [1], [2], [3]]
    >>> [g.tolist() for g in length_groups(torch.arange(5), [10, 10, 10, 90, 90], 4, max_tokens=100)]
    [[0, 1, 2], [3], [4]]
    """
    n = len(lengths)
    if n != len(by_len):
        raise ValueError(f"{len(by_len)} rows but {n} lengths")
    _, cuts = _cheapest_cuts(lengths, [0] * n, max_rows, pass_tokens, max_tokens)
    return [by_len[a:b] for a, b in cuts]


def _cheapest_cuts(
    lengths: list[int], common: list[int], max_rows: int, pass_tokens: int, max_tokens: int = 0
) -> tuple[int, list[tuple[int, int]]]:
    """(tokens computed, cuts [start, end)) of rows in a fixed order whose ``lengths``
    are given, ``common[k]`` leading tokens shared by rows k - 1 and k (``common[0]`` is
    unused), cut into runs of at most ``max_rows`` rows at the fewest tokens computed.

    A run is computed the way `hidden_states` does: its rows that share at least
    `MIN_SHARED_PREFIX` leading tokens with their neighbours form groups (consecutive
    here: rows in token order), each group of two or more sharing the least ``common``
    inside it (at most its longest row - 1). Without a group a run computes its rows
    padded to its longest, plus ``pass_tokens``; with groups, G prefixes padded to the
    longest prefix, then every row's rest padded to the longest rest, plus two passes.
    With ``max_tokens`` > 0 a run of two rows or more computes at most that many tokens
    (a longer row runs alone). Exact (dynamic programming over the cut points; each
    run's cost kept up to date as it grows a row to the left)."""
    n = len(lengths)
    max_rows = max(1, max_rows)
    best = [0] + [-1] * n  # best[i]: the fewest tokens for the first i rows
    start = [0] * (n + 1)
    for i in range(1, n + 1):
        longest = 0  # the run's longest row
        groups = prefix = rest = 0  # the finished groups': count, longest prefix, longest rest
        f_rows, f_shared, f_longest = 0, 0, 0  # the group at the run's left end
        for j in range(i - 1, max(0, i - max_rows) - 1, -1):  # ties: the shortest run
            longest = max(longest, lengths[j])
            if f_rows and common[j + 1] >= MIN_SHARED_PREFIX:  # row j joins the left group
                f_rows, f_shared = f_rows + 1, min(f_shared, common[j + 1])
                f_longest = max(f_longest, lengths[j])
            else:  # the left group is finished: row j starts another
                if f_rows > 1:
                    p = min(f_shared, f_longest - 1)
                    groups, prefix, rest = groups + 1, max(prefix, p), max(rest, f_longest - p)
                elif f_rows:
                    rest = max(rest, f_longest)
                f_rows, f_shared, f_longest = 1, lengths[j], lengths[j]
            rows = i - j
            if f_rows > 1:
                p = min(f_shared, f_longest - 1)
                g, pre, r = groups + 1, max(prefix, p), max(rest, f_longest - p)
            else:
                g, pre, r = groups, prefix, max(rest, f_longest)
            tokens = g * pre + rows * r if g else rows * longest
            if max_tokens > 0 and rows > 1 and tokens > max_tokens:
                continue  # over the memory cap (a single row always runs)
            cost = tokens + (2 * pass_tokens if g else pass_tokens)
            if best[i] < 0 or best[j] + cost < best[i]:
                best[i], start[i] = best[j] + cost, j
    cuts, i = [], n
    while i > 0:
        cuts.append((start[i], i))
        i = start[i]
    return best[n], cuts[::-1]


def _neighbours(rows: list[list[int]], order: list[int]) -> list[int]:
    """For each row in ``order``, how many leading tokens it shares with the row before
    it (0 for the first)."""
    out = [0]
    for a, b in itertools.pairwise(order):
        x, y = rows[a], rows[b]
        n, i = min(len(x), len(y)), 0
        while i < n and x[i] == y[i]:
            i += 1
        out.append(i)
    return out


def micro_batches(
    input_ids_BT: torch.Tensor,
    attention_mask_BT: torch.Tensor,
    max_rows: int,
    share_prefix: bool = True,
    pass_tokens: int = PASS_TOKENS,
    max_tokens: int = 0,
) -> list[torch.Tensor]:
    """The rows of a right-padded batch cut into passes of at most ``max_rows`` rows
    (row indices), at the fewest tokens computed: the cheaper of `length_groups`'s plan
    (rows by length, so passes pad little) and, with ``share_prefix``, one with rows
    that start alike next to each other (sorted by their tokens), cut where runs share
    a long prefix, which `hidden_states` computes once for the run.

    A GRPO group's samples share their prompt and, once the policy is sure of itself,
    their first turns and the tool's answers to them: in the demo's batches from a
    trained agent 59% of the tokens are a common prefix of their group, and its passes
    compute 8-11 thousand tokens instead of 19-26 thousand. Equal to any other cut up to
    float rounding (a row's result does not depend on its batch-mates). ``max_tokens``
    > 0 caps the tokens a pass of two rows or more computes (what its activations take:
    `OptimConfig.micro_batch_tokens`). Rows that repeat another (`distinct_rows`) are
    planned as one, whose pass takes every copy along: ``max_rows`` and ``max_tokens``
    count the distinct rows a pass computes (`token_logprobs` computes each once).

    Rows 0 and 2 share 40 tokens, row 1 starts otherwise; without sharing, the two
    short rows pad least together:

    >>> ids = torch.zeros(3, 60, dtype=torch.long)
    >>> ids[0], ids[0, 40:], ids[1, :41], ids[2, :40] = 5, 1, 7, 5
    >>> mask = (ids > 0).long()
    >>> [g.tolist() for g in micro_batches(ids, mask, 2, pass_tokens=10)]
    [[2, 0], [1]]
    >>> [g.tolist() for g in micro_batches(ids, mask, 2, False, pass_tokens=10)]
    [[2, 1], [0]]
    """
    repeats = distinct_rows(input_ids_BT, attention_mask_BT)
    if repeats is not None:  # plan the distinct rows; each pass takes their copies along
        first_U, inverse_B = repeats
        copies: list[list[int]] = [[] for _ in range(first_U.shape[0])]
        for b, u in enumerate(inverse_B.tolist()):
            copies[u].append(b)
        plan = micro_batches(
            input_ids_BT[first_U],
            attention_mask_BT[first_U],
            max_rows,
            share_prefix,
            pass_tokens,
            max_tokens,
        )
        return [torch.tensor([b for u in p.tolist() for b in copies[u]]) for p in plan]
    lengths_B = attention_mask_BT.sum(-1)
    by_len = torch.argsort(lengths_B, stable=True)
    lengths = [int(x) for x in lengths_B.tolist()]
    n = len(lengths)
    rows = [r[:k] for r, k in zip(input_ids_BT.tolist(), lengths, strict=True)]
    plans = []
    for order in _orders(rows, by_len.tolist(), share_prefix):
        common = _neighbours(rows, order) if share_prefix else [0] * n
        ordered = [lengths[k] for k in order]
        cost, cuts = _cheapest_cuts(ordered, common, max_rows, pass_tokens, max_tokens)
        plans.append((cost, [torch.tensor(order[a:b], dtype=torch.long) for a, b in cuts]))
    return min(plans, key=lambda p: p[0])[1]


def _orders(rows: list[list[int]], by_len: list[int], share_prefix: bool) -> list[list[int]]:
    """Row orders `micro_batches` cuts: by length; with ``share_prefix`` also the rows
    that share `MIN_SHARED_PREFIX` leading tokens with a neighbour in token order (in
    that order), then the others by length."""
    if not share_prefix:
        return [by_len]
    by_tokens = sorted(range(len(rows)), key=rows.__getitem__)
    common = [*_neighbours(rows, by_tokens), 0]
    alike = {k for k in range(len(rows)) if max(common[k], common[k + 1]) >= MIN_SHARED_PREFIX}
    runs = [by_tokens[k] for k in sorted(alike)]
    rest = set(by_tokens[k] for k in range(len(rows)) if k not in alike)
    return [by_len, runs + [i for i in by_len if i in rest]]


@torch.no_grad()
def sorted_token_logprobs(
    model: Any,
    input_ids_BT: torch.Tensor,
    attention_mask_BT: torch.Tensor,
    select_BT: torch.Tensor | None = None,
    temperature: float = 1.0,
    rows: int = 32,
) -> torch.Tensor:
    """`token_logprobs` without gradients, at most ``rows`` rows a pass: the passes
    `micro_batches` plans (rows of similar length, or rows that share a long prefix,
    computed once), each cut to its longest row, so a batch of mixed lengths computes
    little padding (one pass over the whole batch pads every row to the longest). Equal
    to one pass up to float rounding (each row's result does not depend on its
    batch-mates). [B, T]
    """
    B, T = input_ids_BT.shape
    out_BT = torch.zeros(B, T, dtype=torch.float32, device=input_ids_BT.device)
    lengths_B = attention_mask_BT.sum(-1)
    share = not recomputes(backbone_and_head(model)[0])
    for idx in micro_batches(input_ids_BT, attention_mask_BT, rows, share):
        t = max(1, int(lengths_B[idx].max()))
        sel = None if select_BT is None else select_BT[idx, :t]
        lp, _ = token_logprobs(
            model, input_ids_BT[idx, :t], attention_mask_BT[idx, :t], sel, temperature
        )
        out_BT[idx, :t] = lp
    return out_BT
