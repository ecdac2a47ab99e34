"""`one_query_attention` (the hf sampler's decode attention) equals torch's SDPA."""

from __future__ import annotations

import pytest
import torch

from agentr1.backends.attention import grouped_masked_attention, one_query_attention


@pytest.mark.parametrize("mask_kind", ["none", "bool", "additive"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_equals_scaled_dot_product_attention(mask_kind: str, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    B, K, G, T, D = 3, 2, 3, 11, 8
    q, k, v = (torch.randn(B, K, n, D, generator=g).to(dtype) for n in (G, T, T))
    allow = torch.ones(B, 1, 1, T, dtype=torch.bool)
    allow[0, ..., :4] = False  # a left-padded row
    mask = {"none": None, "bool": allow}.get(mask_kind)
    if mask_kind == "additive":
        mask = torch.zeros(B, 1, 1, T, dtype=dtype).masked_fill(~allow, float("-inf"))
    ours = one_query_attention(q, k, v, mask, 0.3)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.float(),
        k.float(),
        v.float(),
        attn_mask=mask if mask_kind != "additive" else mask.float(),
        scale=0.3,
    )
    assert ours.dtype == dtype and ours.shape == (B, K, G, D)
    tol = 1e-6 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(ours.float(), ref, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_masked_attention_equals_attention_on_copied_heads(dtype: torch.dtype) -> None:
    """Forward and backward equal torch's SDPA on key/value heads repeated to the query
    heads (transformers' way): the output and the queries' gradient bit for bit, the
    keys' and values' gradients to float rounding (the heads' shares summed in another
    order)."""
    g = torch.Generator().manual_seed(0)
    B, Hq, Hkv, Q, T, D = 2, 6, 2, 5, 9, 8
    q = torch.randn(B, Hq, Q, D, generator=g).to(dtype).requires_grad_()
    k, v = (torch.randn(B, Hkv, T, D, generator=g).to(dtype).requires_grad_() for _ in "kv")
    mask = torch.rand(B, 1, Q, T, generator=g) > 0.4
    mask[..., 0] = True  # every query sees a key
    grad_out = torch.randn(B, Q, Hq, D, generator=g).to(dtype)
    ours, none = grouped_masked_attention(q, k, v, mask, scaling=0.3)
    assert none is None and ours.shape == (B, Q, Hq, D) and ours.is_contiguous()
    ours.backward(grad_out)
    mine = [t.grad.clone() for t in (q, k, v)]  # type: ignore[union-attr]
    for t in (q, k, v):
        t.grad = None
    ref = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(Hq // Hkv, 1), v.repeat_interleave(Hq // Hkv, 1), mask, scale=0.3
    ).transpose(1, 2)
    ref.backward(grad_out)
    assert torch.equal(ours, ref) and torch.equal(mine[0], q.grad)
    tol = 1e-6 if dtype == torch.float32 else 2e-2
    for a, b in zip(mine[1:], (k.grad, v.grad), strict=True):
        torch.testing.assert_close(a, b, atol=tol, rtol=tol)
