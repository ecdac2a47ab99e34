"""The trainer's bf16 attention on AMX tiles (`TrainAttention`: torch's flash forward,
agentr1's backward kernel): its gradients against float64 attention, and the trainer's
calls reaching it."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from agentr1.backends import native
from agentr1.backends.attention import TrainAttention, decode_sdpa, train_attention


def _kernel() -> native.AttentionBackward:
    kernel = native.attention_backward()
    if kernel is None or not kernel.ready:
        pytest.skip("no AMX attention-backward kernel here (no compiler, no AMX, or not granted)")
    return kernel


def _exact(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sees: torch.Tensor, grad_out: torch.Tensor
) -> list[torch.Tensor]:
    """Gradients of float64 attention with each key head repeated to its query heads."""
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    G = q.shape[1] // k.shape[1]
    scores = qd @ kd.repeat_interleave(G, 1).mT * q.shape[-1] ** -0.5
    probs = torch.softmax(scores.masked_fill(~sees, float("-inf")), -1).nan_to_num(0.0)
    (probs @ vd.repeat_interleave(G, 1)).backward(grad_out.double())
    return [t.grad for t in (qd, kd, vd)]  # type: ignore[misc]


def _graph(t: torch.Tensor, depth: int = 4) -> str:
    """The names of the autograd nodes up to ``depth`` steps behind ``t``."""
    names, level = [], [t.grad_fn]
    for _ in range(depth):
        level = [n for n in level if n is not None]
        names += [type(n).__name__ for n in level]
        level = [m for n in level for m, _ in n.next_functions]
    return " ".join(names)


CASES = {
    # B, Hq, Hkv, S, T, D, masked
    "causal, one key head a query head": (2, 4, 4, 37, 37, 32, False),
    "causal, grouped": (2, 9, 3, 70, 70, 64, False),
    "masked: queries after a prefix, a row that sees nothing": (3, 6, 2, 45, 83, 64, True),
}


@pytest.mark.parametrize("case", CASES.values(), ids=list(CASES))
def test_the_gradients_are_within_a_rounding_of_the_exact_ones_and_no_further_than_torchs(
    case: tuple[Any, ...],
) -> None:
    """Against float64 attention on the same bf16 inputs (strided, as the model's heads
    come), each gradient is within 1% of its largest value and no further from the exact
    one than torch's own bf16 backward (plus a bf16 rounding of its scale); a query that
    sees no key gets and gives no gradient."""
    _kernel()
    B, Hq, Hkv, S, T, D, masked = case
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, S, Hq, D, generator=g).bfloat16().transpose(1, 2)
    k, v = (torch.randn(B, T, Hkv, D, generator=g).bfloat16().transpose(1, 2) for _ in "kv")
    grad_out = torch.randn(B, Hq, S, D, generator=g).bfloat16()
    causal = torch.arange(T)[None, :] <= torch.arange(S)[:, None] + (T - S)
    sees = causal[None, None].expand(B, 1, S, T).clone()
    mask = None
    if masked:
        sees[:, :, :, :5] = False  # a prefix some rows do not see
        sees[0, :, :, 2] = True
        sees[1, :, 3] = False  # row 1's query 3 sees nothing
        mask = sees
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = TrainAttention.apply(*leaves, mask, D**-0.5)
    out.backward(grad_out)
    ours = [t.grad for t in leaves]
    exact = _exact(q, k, v, sees, grad_out)

    theirs = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    additive = None if mask is None else torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
    ref = torch.nn.functional.scaled_dot_product_attention(
        *theirs,
        attn_mask=None if additive is None else additive.bfloat16(),
        is_causal=mask is None,
        enable_gqa=True,
    )
    if masked:  # torch's output for the query that sees nothing is not defined: compare
        ref = ref.clone()  # the others
        ref[1, :, 3] = out[1, :, 3].detach()
    assert torch.equal(out.detach(), ref.detach())
    ref.backward(grad_out)
    for name, a, b, t in zip("qkv", ours, exact, theirs, strict=True):
        assert a is not None and t.grad is not None and a.dtype == torch.bfloat16
        assert torch.isfinite(a).all()
        err = (a.double() - b).abs().max().item()
        scale = b.abs().max().item()
        assert err <= 0.01 * scale, (name, err, scale)
        assert err <= (t.grad.double() - b).abs().max().item() + scale * 2**-8, name
    if masked:
        assert not ours[0][1, :, 3].any()  # type: ignore[index]


def test_the_trainers_attention_calls_reach_it_under_autocast_and_keep_torchs_output() -> None:
    """`decode_sdpa` with gradients on under bf16 autocast (the trainer's policy: the
    rotated heads in float32, the values in bf16) runs `TrainAttention`, causal without
    a mask and with transformers' boolean mask; the output is the bits of torch's
    attention under the same autocast."""
    _kernel()
    g = torch.Generator().manual_seed(1)
    B, Hq, Hkv, S, D = 2, 6, 2, 40, 64
    module = torch.nn.Module()
    module.num_key_value_groups = Hq // Hkv  # type: ignore[assignment]
    q = torch.randn(B, Hq, S, D, generator=g, requires_grad=True)
    k = torch.randn(B, Hkv, S, D, generator=g, requires_grad=True)
    v = torch.randn(B, Hkv, S, D, generator=g).bfloat16().requires_grad_()
    causal = torch.ones(S, S, dtype=torch.bool).tril()
    padded = causal[None, None].expand(B, 1, S, S).clone()
    padded[1, :, :, :3] = False
    padded[1, :, :3, 0] = True
    for mask in (None, padded):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out, _ = decode_sdpa(module, q, k, v, mask)
            ref = torch.nn.functional.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=mask is None, enable_gqa=True
            )
        assert "TrainAttention" in _graph(out)
        assert torch.equal(out, ref.transpose(1, 2))
        out.float().square().sum().backward()
        assert q.grad is not None and torch.isfinite(q.grad).all()


def test_calls_it_does_not_take_go_on_to_torch() -> None:
    """No gradients, float32 without autocast, a float mask, or fewer keys than queries
    without a mask: `train_attention` declines (None) and the caller keeps torch's path."""
    q = torch.randn(1, 4, 8, 32, requires_grad=True)
    k = torch.randn(1, 2, 8, 32, requires_grad=True)
    assert train_attention(q, k, k, None, True, None) is None  # float32, no autocast
    qb, kb = q.detach().bfloat16(), k.detach().bfloat16()
    with torch.no_grad():
        assert train_attention(qb, kb, kb, None, True, None) is None
    qg = qb.requires_grad_()
    assert train_attention(qg, kb, kb, torch.zeros(1, 1, 8, 8), False, None) is None
    assert train_attention(qg, kb[:, :, :4], kb[:, :, :4], None, True, None) is None


def test_inputs_of_the_wrong_shape_are_refused_by_name() -> None:
    kernel = _kernel()
    q = torch.zeros(1, 4, 8, 32, dtype=torch.bfloat16)
    k = torch.zeros(1, 2, 8, 32, dtype=torch.bfloat16)
    lse = torch.zeros(1, 4, 8)
    with pytest.raises(ValueError, match="grad_out must be bf16"):
        kernel.backward(q, k, k, q, q[:, :, :4], lse, None, 0.1)
    with pytest.raises(ValueError, match="attend"):
        kernel.backward(q, k, k, q, q, lse, torch.ones(1, 8, 9, dtype=torch.bool), 0.1)
    with pytest.raises(ValueError, match="lse"):
        kernel.backward(q, k, k, q, q, lse[:, :2], None, 0.1)
