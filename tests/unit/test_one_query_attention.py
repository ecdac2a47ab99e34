"""`one_query_attention` (the hf sampler's decode attention) equals torch's SDPA."""

from __future__ import annotations

import pytest
import torch

from agentr1.backends.attention import one_query_attention


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
