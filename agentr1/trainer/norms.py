"""The trainer's RMSNorms on the native kernel (`agentr1.backends.native.RMSNorm`).

transformers' Llama / Qwen2 RMSNorm is six torch ops forward (pow, mean, add, rsqrt, two
products) and about a dozen backward, each reading and writing the whole activation; the
kernel is one pass each way. On the demo's batches (16 x ~130 tokens, 128 wide) a norm's
forward and backward take ~0.2 ms against ~1.0 ms (`benchmarks/RESULTS.md`, "Native
RMSNorm"), and a tiny model has one norm for every three products.

`native_norms(model)` is a context: inside it, every RMSNorm module of ``model`` that the
kernel computes exactly as its own forward does (checked once per class on a random
input, `_matches`) runs on the kernel, forward and backward; outside it the modules are
untouched (nothing is saved with the model, copied or sent to another process). A module
that already has an instance ``forward`` of its own (a hook library's) is left alone, and
so is every module where the kernel is unavailable (`AGENTR1_NATIVE=0`, no compiler) or
the input is not float32 on the CPU. The results equal the modules' to float rounding
(the sums run in another order): `tests/unit/test_norms.py`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from agentr1.backends import native

_MATCHES: dict[type, bool] = {}
"""Per module class: whether the kernel computes its forward (`_matches`)."""


class _NativeRMSNorm(torch.autograd.Function):
    """``weight * (x * rsqrt(mean(x^2) + eps))`` and its gradients on the kernel."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float, kernel: native.RMSNorm
    ) -> torch.Tensor:
        y, r_N = kernel.forward(x, weight, eps)
        ctx.save_for_backward(x, weight, r_N)
        ctx.kernel = kernel
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_y: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        x, weight, r_N = ctx.saved_tensors
        need_x, need_w = ctx.needs_input_grad[:2]
        dx, dw = ctx.kernel.backward(x, weight, r_N, grad_y, with_weight=need_w)
        return (dx if need_x else None), dw, None, None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor | None:
    """The RMSNorm of ``x``'s rows on the kernel (differentiable in both), or None where
    the kernel is unavailable or does not take these tensors."""
    kernel = native.rms_norm()
    if kernel is None or not kernel.supports(x, weight):
        return None
    out: torch.Tensor = _NativeRMSNorm.apply(x, weight, eps, kernel)
    return out


def _norm_like(module: torch.nn.Module) -> bool:
    weight = getattr(module, "weight", None)
    return (
        type(module).__name__.endswith("RMSNorm")
        and isinstance(weight, torch.Tensor)
        and weight.dim() == 1
        and isinstance(getattr(module, "variance_epsilon", None), float)
        and "forward" not in vars(module)
    )


def _matches(module: torch.nn.Module) -> bool:
    """Whether the kernel computes ``module``'s class's forward: checked once per class,
    on the first float32 module met, with a random [4, width] input through the module's
    own forward and through the kernel (equal within float rounding). A class that
    computes something else (Gemma's ``1 + weight``, a norm with a bias) keeps its own
    forward."""
    cls = type(module)
    weight: torch.Tensor = module.weight  # type: ignore[assignment]
    if weight.dtype != torch.float32 or weight.device.type != "cpu":
        return False
    if cls not in _MATCHES:
        eps = float(module.variance_epsilon)  # type: ignore[arg-type]
        x = torch.randn(4, weight.shape[0], generator=torch.Generator().manual_seed(0))
        try:
            with torch.no_grad():
                theirs = cls.forward(module, x)
                ours = rms_norm(x, weight, eps)
            ok = ours is not None and torch.allclose(ours, theirs, rtol=1e-5, atol=1e-6)
        except Exception:  # a forward that wants more than the hidden states
            ok = False
        _MATCHES[cls] = ok
    return _MATCHES[cls]


@contextlib.contextmanager
def native_norms(model: torch.nn.Module) -> Iterator[int]:
    """Run ``model``'s RMSNorms on the kernel inside the context (module docstring);
    yields how many modules it switched (0 where the kernel is unavailable)."""
    if native.rms_norm() is None:
        yield 0
        return
    switched = []
    for m in model.modules():
        if _norm_like(m) and _matches(m):
            m.forward = _forward.__get__(m)  # type: ignore[method-assign]
            switched.append(m)
    try:
        yield len(switched)
    finally:
        for m in switched:
            del m.forward


def _forward(self: torch.nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    """A switched module's forward: the kernel where it takes the input, else the
    class's own forward."""
    out = rms_norm(hidden_states, self.weight, float(self.variance_epsilon))  # type: ignore[arg-type]
    if out is None:
        out = type(self).forward(self, hidden_states)
    return out
