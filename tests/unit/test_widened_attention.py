"""Under bf16 autocast on a CPU where agentr1's AMX attention kernel does not run, the
trainer's multi-query attention runs in float32 (`widened_attention`): the same bits as
torch's float32 attention, with gradients or without, while decode, float32 runs and CPUs
with the kernel keep their path."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from agentr1.backends import native
from agentr1.backends.attention import WIDEN_HEAD_SIZE, decode_sdpa, widened_attention


class _Ready:
    ready = True

    def supports(self, q: torch.Tensor, k: torch.Tensor) -> bool:
        return False  # the kernel is here, this call is not its: torch's bf16 path


@pytest.fixture
def no_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "attention_backward", lambda: None)


def _module(groups: int) -> torch.nn.Module:
    module = torch.nn.Module()
    module.num_key_value_groups = groups  # type: ignore[assignment]
    return module


def _heads(B: int, Hq: int, Hkv: int, S: int, D: int) -> tuple[torch.Tensor, ...]:
    """The policy's heads under autocast: rotated query and key in float32, value bf16."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, Hq, S, D, generator=g, requires_grad=True)
    k = torch.randn(B, Hkv, S, D, generator=g, requires_grad=True)
    v = torch.randn(B, Hkv, S, D, generator=g).bfloat16().requires_grad_()
    return q, k, v


MASKS: dict[str, Any] = {"causal, no mask": None, "boolean, a padded row": "bool"}


@pytest.mark.parametrize("mask_kind", list(MASKS.values()), ids=list(MASKS))
@pytest.mark.parametrize("groups", [1, 3], ids=["one key head a query head", "grouped"])
def test_autocast_passes_compute_torchs_float32_attention(
    no_kernel: None, mask_kind: str | None, groups: int
) -> None:
    B, Hkv, S, D = 2, 2, 9, 32
    q, k, v = _heads(B, Hkv * groups, Hkv, S, D)
    mask = None
    if mask_kind == "bool":
        mask = torch.ones(S, S, dtype=torch.bool).tril()[None, None].expand(B, 1, S, S).clone()
        mask[1, :, :, :3] = False
        mask[1, :, :3, 0] = True
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert widened_attention(q)
        out, _ = decode_sdpa(_module(groups), q, k, v, mask)
        with torch.no_grad():
            scored, _ = decode_sdpa(_module(groups), q, k, v, mask)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.detach(),
        k.detach(),
        v.detach().float(),
        attn_mask=mask,
        is_causal=mask is None,
        enable_gqa=groups > 1,
    ).transpose(1, 2)
    assert out.dtype == torch.float32
    assert torch.equal(out.detach(), ref)
    assert torch.equal(scored, ref)  # old log-probs and the update's forward agree
    out.square().sum().backward()
    assert v.grad is not None and v.grad.dtype == torch.bfloat16
    assert q.grad is not None and torch.isfinite(q.grad).all()


def test_a_float_mask_in_bf16_is_widened_with_the_heads(no_kernel: None) -> None:
    B, H, S, D = 1, 2, 6, 32
    q, k, v = _heads(B, H, H, S, D)
    allow = torch.ones(B, 1, S, S, dtype=torch.bool).tril()
    additive = torch.zeros(allow.shape).masked_fill(~allow, float("-inf"))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = decode_sdpa(_module(1), q, k, v, additive.bfloat16())
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.detach(), k.detach(), v.detach().float(), attn_mask=additive
    ).transpose(1, 2)
    assert torch.equal(out.detach(), ref)


def test_other_passes_keep_their_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """float32 without autocast, one query position (decode), heads larger than
    `WIDEN_HEAD_SIZE` (bf16 is as fast or faster there), float16 autocast, and a CPU whose
    kernel is ready (the AMX path and the bf16 forward it matches) are not widened."""
    monkeypatch.setattr(native, "attention_backward", lambda: None)
    q = torch.randn(1, 2, 5, WIDEN_HEAD_SIZE)
    assert not widened_attention(q)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert widened_attention(q)
        assert not widened_attention(q[:, :, :1])
        assert not widened_attention(torch.randn(1, 2, 5, 2 * WIDEN_HEAD_SIZE))
    with torch.autocast("cpu", dtype=torch.float16):
        assert not widened_attention(q)
    monkeypatch.setattr(native, "attention_backward", lambda: _Ready())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not widened_attention(q)
        q, k, v = _heads(1, 2, 2, 5, 32)
        out, _ = decode_sdpa(_module(1), q, k, v, None)
    assert out.dtype == torch.bfloat16  # torch's own autocast attention, as before
