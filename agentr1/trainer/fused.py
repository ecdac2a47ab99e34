"""The trainer's RMSNorms and SiLU gates on native kernels (`agentr1.backends.native`'s
`RMSNorm` and `SiluGate`).

transformers' Llama / Qwen2 RMSNorm is six torch ops forward (pow, mean, add, rsqrt, two
products) and about a dozen backward, each reading and writing the whole activation; its
MLP's gate ``act_fn(gate_proj(x)) * up_proj(x)`` is two forward and three backward, and
autograd keeps ``act_fn``'s output as well as both inputs. Each kernel is one pass each
way. On the demo's SFT batches (16 x ~130 tokens, 128 wide) a norm's forward and backward
take ~0.2 ms against ~1.05 ms, and the tiny model has one norm or gate for every two
products.

`native_layers(model)` is a context: inside it, every RMSNorm and MLP module of ``model``
that the kernels compute exactly as its own forward does (checked once per class on a
random input, `_matches`) runs on them, forward and backward; outside it the modules are
untouched (nothing is saved with the model, copied or sent to another process). A module
that already has an instance ``forward`` of its own (a hook library's) is left alone, and
so is every module where a kernel is unavailable (``AGENTR1_NATIVE=0``, no compiler); a
switched module whose input or weight the kernel does not take (not float32 on the CPU,
e.g. under bf16 autocast; a tensor subclass, e.g. FSDP's sharded DTensor outside its
unit's forward) runs its own forward. Results equal the modules' to float rounding (sums
and exp in another order): `tests/unit/test_fused.py`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from agentr1.backends import native

_MATCHES: dict[type, bool] = {}
"""Per module class: whether the kernels compute its forward (`_matches`)."""


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


class _NativeSiluGate(torch.autograd.Function):
    """``silu(g) * u`` and its gradients on the kernel."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, g: torch.Tensor, u: torch.Tensor, kernel: native.SiluGate
    ) -> torch.Tensor:
        ctx.save_for_backward(g, u)
        ctx.kernel = kernel
        return kernel.forward(g, u)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_y: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        g, u = ctx.saved_tensors
        dg, du = ctx.kernel.backward(g, u, grad_y)
        need_g, need_u = ctx.needs_input_grad[:2]
        return (dg if need_g else None), (du if need_u else None), None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor | None:
    """The RMSNorm of ``x``'s rows on the kernel (differentiable in both), or None where
    the kernel is unavailable or does not take these tensors."""
    kernel = native.rms_norm()
    if kernel is None or not kernel.supports(x, weight):
        return None
    out: torch.Tensor = _NativeRMSNorm.apply(x, weight, eps, kernel)
    return out


def silu_gate(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor | None:
    """``silu(g) * u`` on the kernel (differentiable in both), or None where the kernel
    is unavailable or does not take these tensors."""
    kernel = native.silu_gate()
    if kernel is None or not kernel.supports(g, u):
        return None
    out: torch.Tensor = _NativeSiluGate.apply(g, u, kernel)
    return out


def _norm_forward(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
    """A switched RMSNorm's forward: the kernel where it takes the input, else the
    class's own forward."""
    out = rms_norm(hidden_states, self.weight, float(self.variance_epsilon))
    return out if out is not None else type(self).forward(self, hidden_states)


def _mlp_forward(self: Any, x: torch.Tensor) -> torch.Tensor:
    """A switched MLP's forward: its projections, the gate on the kernel where it takes
    them, else the module's own activation."""
    g, u = self.gate_proj(x), self.up_proj(x)
    h = silu_gate(g, u)
    out: torch.Tensor = self.down_proj(h if h is not None else self.act_fn(g) * u)
    return out


def _is_norm(module: torch.nn.Module) -> bool:
    weight = getattr(module, "weight", None)
    return (
        type(module).__name__.endswith("RMSNorm")
        and isinstance(weight, torch.Tensor)
        and weight.dim() == 1
        and weight.dtype == torch.float32
        and isinstance(getattr(module, "variance_epsilon", None), float)
    )


_MLP_PARTS = ("gate_proj", "up_proj", "down_proj")


def _is_mlp(module: torch.nn.Module) -> bool:
    act = getattr(module, "act_fn", None)
    weight = getattr(getattr(module, "gate_proj", None), "weight", None)
    return (
        all(isinstance(getattr(module, n, None), torch.nn.Module) for n in _MLP_PARTS)
        and type(act).__name__ in ("SiLU", "SiLUActivation")
        and isinstance(weight, torch.Tensor)
        and weight.dtype == torch.float32
        and hasattr(module, "config")
    )


def _probe(module: torch.nn.Module) -> tuple[torch.nn.Module, torch.Tensor]:
    """A new module of ``module``'s class with random float32 weights of its own (the
    module's may be a rank's shard), and a random [4, width] input for it."""
    gen = torch.Generator().manual_seed(0)
    cls: Any = type(module)
    if _is_norm(module):
        width = module.weight.shape[0]  # type: ignore[index]
        probe = cls(width, eps=module.variance_epsilon)
        with torch.no_grad():
            probe.weight.copy_(1 + 0.3 * torch.randn(width, generator=gen))
    else:
        probe = cls(module.config)
        width = probe.gate_proj.weight.shape[1]
    return probe.float(), torch.randn(4, width, generator=gen)


_SWITCHES: tuple[tuple[Callable[[torch.nn.Module], bool], Callable[..., torch.Tensor]], ...] = (
    (_is_norm, _norm_forward),
    (_is_mlp, _mlp_forward),
)


def _matches(module: torch.nn.Module, forward: Callable[..., torch.Tensor]) -> bool:
    """Whether ``forward`` computes ``module``'s class's own forward: checked once per
    class on a `_probe`, a random input through both (equal within float rounding,
    relative to the output's scale). A class that computes something else (Gemma's
    ``1 + weight``, a norm with a bias, a gate of another kind), or that cannot be built
    from its width or config alone, keeps its own forward."""
    cls = type(module)
    if cls not in _MATCHES:
        try:
            probe, x = _probe(module)
            with torch.no_grad():
                theirs, ours = cls.forward(probe, x), forward(probe, x)
            scale = float(theirs.abs().max()) or 1.0
            ok = bool((ours - theirs).abs().max() <= 1e-5 * scale)
        except Exception:  # a constructor or forward that wants more
            ok = False
        _MATCHES[cls] = ok
    return _MATCHES[cls]


@contextlib.contextmanager
def native_layers(model: torch.nn.Module) -> Iterator[int]:
    """Run ``model``'s RMSNorms and SiLU-gated MLPs on the kernels inside the context
    (module docstring); yields how many modules it switched (0 where no kernel is
    available)."""
    kernels = (native.rms_norm(), native.silu_gate())
    switched = []
    for m in model.modules() if any(k is not None for k in kernels) else ():
        if "forward" in vars(m):  # switched already, or a hook library's own
            continue
        for (applies, forward), kernel in zip(_SWITCHES, kernels, strict=True):
            if kernel is not None and applies(m) and _matches(m, forward):
                m.forward = forward.__get__(m)  # type: ignore[method-assign]
                switched.append(m)
                break
    try:
        yield len(switched)
    finally:
        for m in switched:
            del m.forward
