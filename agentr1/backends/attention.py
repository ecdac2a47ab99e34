"""Attention for the ``hf`` sampler's decode passes: grouped-query heads packed per key.

transformers' ``sdpa`` attention runs a one-token query of a grouped-query model
(SmolLM2, Qwen2, Llama 3: several query heads per key/value head) through torch's
``enable_gqa`` kernel whenever the batch needs no mask, i.e. whenever a chunk's rows have
no padding (n samples of one prompt). On CPU that kernel is 5-7x slower than the same
attention with each key/value head's query heads packed as G query positions of one
head (1.4 ms against 0.2 ms a layer for 8 rows of 400 tokens in bf16; `benchmarks/
RESULTS.md`, "Roofline"), which is what transformers itself does when the batch has a
mask. `decode_sdpa` packs always and then, for every one-token query (grouped or not),
computes the attention as two matmuls with an fp32 softmax (`one_query_attention`),
which for one query position beats torch's CPU flash kernel.

Several query positions with a mask on the CPU (the trainer's passes over rows that share
a prefix: each row's rest attends to its group's cached prefix through a mask; padded
prompts) go to torch's flash kernel with ``enable_gqa`` where transformers would first
copy every key and value head to each of its query heads (`repeat_kv`): the kernel keeps
its inputs for the backward, so the copies cost memory as well as time (SmolLM2's 3 key
heads for 9 query heads: two thirds of the keys and values kept are copies). Outputs and
query gradients are the same bits; key and value gradients sum the heads' shares in
another order (float rounding: `tests/unit/test_one_query_attention.py`). Everything
else (no mask, a GPU, position biases, dropout) goes to transformers' own ``sdpa``
function unchanged.

Under bf16 autocast, a pass of several query positions on a CPU where agentr1's AMX
backward kernel does not run (`TrainAttention`) computes its attention in float32
(`widened_attention`) where its heads are small (the demo model's 32): torch's CPU flash
kernel's bf16 backward is 1.3-2.6x slower than its float32 one there.

Importing the module registers it under `NAME` (with ``sdpa``'s mask function), so a
model copied or unpickled in another process of agentr1 finds it; `use_decode_sdpa(model)`
switches a model whose attention is ``sdpa`` to it, other implementations are left as
they are (the name is not saved with the model's config). The trainer switches its policy
too (`agentr1.trainer.setup.load_policy`): with gradients on, the call is ``sdpa``'s or,
masked on the CPU, the grouped kernel above.
"""

from __future__ import annotations

from typing import Any

import torch

NAME = "agentr1_sdpa"
"""The attention implementation's registered name."""


def decode_sdpa(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature; query ``[B, Hq, Q, D]``, key and value
    ``[B, Hkv, T, D]``; returns ``([B, Q, Hq, D], None)``."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = int(getattr(module, "num_key_value_groups", 1))
    extras = any(kwargs.get(k) is not None for k in ("position_bias", "softcap", "sinks"))
    if not extras and dropout == 0.0:
        causal = attention_mask is None and query.shape[2] > 1 and module_is_causal(module)
        trained = train_attention(query, key, value, attention_mask, causal, scaling)
        if trained is not None:
            return trained
    if widened_attention(query):
        with torch.autocast("cpu", enabled=False):
            mask = attention_mask
            if mask is not None and mask.is_floating_point():
                mask = mask.float()
            q, k, v = (t.float() for t in (query, key, value))
            return decode_sdpa(module, q, k, v, mask, dropout, scaling, is_causal, **kwargs)
    if (
        query.shape[2] > 1
        and attention_mask is not None
        and groups > 1
        and not extras
        and query.device.type == "cpu"
        and key.shape[-1] == value.shape[-1] <= 256
    ):
        return grouped_masked_attention(query, key, value, attention_mask, dropout, scaling)
    plain = query.shape[2] != 1 or torch.is_grad_enabled() or dropout > 0 or extras
    if plain:
        return sdpa_attention_forward(
            module,
            query,
            key,
            value,
            attention_mask,
            dropout=dropout,
            scaling=scaling,
            is_causal=is_causal,
            **kwargs,
        )
    B, Hq, _, D = query.shape
    q_BKGD = query.reshape(B, Hq // groups, groups, D)
    # A mask shared by the heads ([B, 1, 1, T]) broadcasts over (key head, group).
    mask = attention_mask
    if mask is not None and mask.dim() == 4 and mask.shape[1] not in (1, Hq // groups):
        mask = mask.reshape(B, Hq // groups, groups, mask.shape[-1])
    out_BKGD = one_query_attention(
        q_BKGD, key, value, mask, D**-0.5 if scaling is None else scaling
    )
    return out_BKGD.reshape(B, Hq, 1, -1).transpose(1, 2).contiguous(), None


def cpu_bf16_autocast() -> bool:
    """Whether the CPU's autocast is on and computes in bf16."""
    return torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16


WIDEN_HEAD_SIZE = 32
"""The largest head size `widened_attention` runs in float32."""


def widened_attention(query: torch.Tensor) -> bool:
    """Whether a pass of several query positions under bf16 autocast on the CPU runs its
    attention in float32: heads of at most `WIDEN_HEAD_SIZE`, where agentr1's AMX backward
    kernel does not run (no AMX, or native kernels off). There the attention is torch's
    CPU flash kernel, whose bf16 backward at the demo model's head size (32) is 1.3-2.6x
    slower than its float32 one, the forwards equal; at 64 the two are within 12% of each
    other, at 128 float32 is 1.2x slower (`benchmarks/attention_dtype.py`). Every such pass
    widens, with gradients or without, so a run's old log-probs and its update's forward
    compute the same attention."""
    if query.device.type != "cpu" or query.shape[2] <= 1 or query.shape[-1] > WIDEN_HEAD_SIZE:
        return False
    if not cpu_bf16_autocast():
        return False
    from agentr1.backends.native import attention_backward

    kernel = attention_backward()
    return kernel is None or not kernel.ready


def grouped_masked_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor,
    dropout: float = 0.0,
    scaling: float | None = None,
) -> tuple[torch.Tensor, None]:
    """Masked attention of ``[B, Hq, Q, D]`` queries on ``[B, Hkv, T, D]`` keys and values
    (``Hq`` a multiple of ``Hkv``) by torch's kernel with ``enable_gqa``: no key or value
    head is copied, in the forward or for the backward. Returns ``([B, Q, Hq, D], None)``
    (transformers' attention-function result)."""
    out = torch.nn.functional.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=mask,
        dropout_p=dropout,
        scale=scaling,
        enable_gqa=True,
    )
    return out.transpose(1, 2).contiguous(), None


def module_is_causal(module: torch.nn.Module) -> bool:
    """Whether transformers treats ``module``'s unmasked multi-query calls as causal."""
    return bool(getattr(module, "is_causal", True))


class TrainAttention(torch.autograd.Function):
    """bf16 attention with gradients on a CPU with AMX: torch's flash kernel forward
    (which also gives each query's log-sum-exp), agentr1's AMX kernel backward
    (`agentr1.backends.native.AttentionBackward`). torch's CPU backward runs each block's
    products as separate small GEMM calls and takes 5-8x its forward; the kernel keeps
    them on tiles (`benchmarks/RESULTS.md`, "The attention's backward on AMX tiles").
    Outputs are torch's, the same bits; gradients sum in another order (within a bf16
    rounding of the exact ones: `tests/unit/test_train_attention.py`)."""

    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attend: torch.Tensor | None,
        scale: float,
    ) -> torch.Tensor:
        additive = None
        if attend is not None:
            additive = torch.zeros(attend.shape, dtype=q.dtype).masked_fill_(~attend, float("-inf"))
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, attend is None, attn_mask=additive, scale=scale
        )
        ctx.save_for_backward(q, k, v, out, lse, attend)
        ctx.scale = scale
        result: torch.Tensor = out
        return result

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:
        from agentr1.backends.native import attention_backward

        q, k, v, out, lse, attend = ctx.saved_tensors
        kernel = attention_backward()
        assert kernel is not None  # train_attention checked it before the forward
        mask = None if attend is None else attend[:, 0]
        dq, dk, dv = kernel.backward(q, k, v, out, grad_out, lse, mask, ctx.scale)
        return dq, dk, dv, None, None


def train_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    causal: bool,
    scaling: float | None,
) -> tuple[torch.Tensor, None] | None:
    """`TrainAttention` of ``[B, Hq, Q, D]`` queries on ``[B, Hkv, T, D]`` keys and values
    where it applies (gradients on, bf16 on a CPU whose AMX the kernel may use, a boolean
    ``[B or 1, 1, Q, T]`` mask, or none and ``causal`` with Q = T), as transformers'
    attention-function result ``([B, Q, Hq, D], None)``; else None (the caller goes on)."""
    if not (
        torch.is_grad_enabled()
        and any(t.requires_grad for t in (query, key, value))
        and query.device.type == "cpu"
        and query.shape[2] > 1
    ):
        return None
    if cpu_bf16_autocast():
        # what autocast does to scaled_dot_product_attention's inputs (the rotated query
        # and key heads come out of the rotary in float32)
        query, key, value = (t.to(torch.bfloat16) for t in (query, key, value))
    if not query.dtype == key.dtype == value.dtype == torch.bfloat16:
        return None
    B, _, S, D = query.shape
    T = key.shape[2]
    if mask is None:
        if not causal or S != T:
            return None
    elif not (
        mask.dtype == torch.bool
        and mask.dim() == 4
        and mask.shape[1] == 1
        and mask.shape[0] in (1, B)
        and tuple(mask.shape[2:]) == (S, T)
    ):
        return None
    from agentr1.backends.native import attention_backward

    kernel = attention_backward()
    if kernel is None or not kernel.supports(query, key) or value.shape != key.shape:
        return None
    scale = D**-0.5 if scaling is None else float(scaling)
    out = TrainAttention.apply(query, key, value, mask, scale)  # type: ignore[no-untyped-call]
    return out.transpose(1, 2).contiguous(), None


def one_query_attention(
    q_BKGD: torch.Tensor,
    k_BKTD: torch.Tensor,
    v_BKTD: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
) -> torch.Tensor:
    """Softmax attention of G query heads per key head, each one position, written as two
    batched matmuls with the softmax in fp32; ``mask`` is boolean (True = attend) or
    additive and broadcasts to ``[B, K, G, T]``.

    For a one-token query the CPU flash kernel of ``scaled_dot_product_attention`` pays
    its tiling for nothing: this is 1.1-2.4x faster on one layer (8 rows x 400 keys in
    bf16; 128 rows x 150 keys in fp32, the demo's model) and agrees with it to float
    rounding (fp32: 5e-7).
    """
    B, K, G, D = q_BKGD.shape
    T = k_BKTD.shape[-2]
    # bmm over the B x K (row, key head) batch: torch.matmul's own reshapes, without its
    # half a dozen dispatched views a call (a decode pass makes one call a layer).
    scores_NGT = torch.bmm(q_BKGD.reshape(B * K, G, D), k_BKTD.reshape(B * K, T, D).mT)
    scores = scores_NGT.view(B, K, G, T).float().mul_(scale)
    if mask is not None:
        if mask.dtype == torch.bool:
            scores = scores.masked_fill_(~mask, float("-inf"))
        else:
            scores = scores.add_(mask)
    probs_NGT = torch.softmax(scores, dim=-1).to(v_BKTD.dtype).view(B * K, G, T)
    return torch.bmm(probs_NGT, v_BKTD.reshape(B * K, T, -1)).view(B, K, G, -1)


def use_decode_sdpa(model: Any) -> bool:
    """Switch ``model`` from ``sdpa`` to `decode_sdpa`; whether it now uses it."""
    config = getattr(model, "config", None)
    current = getattr(config, "_attn_implementation", None)
    if current == NAME:
        return True
    if not _REGISTERED or current != "sdpa" or not hasattr(model, "set_attn_implementation"):
        return False
    model.set_attn_implementation(NAME)
    return getattr(model.config, "_attn_implementation", None) == NAME


def _register() -> bool:
    """Register `decode_sdpa`; False on a transformers without the attention and mask
    interfaces (older releases), where models keep their own attention."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    except ImportError:
        return False
    AttentionInterface.register(NAME, decode_sdpa)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    return True


_REGISTERED = _register()
