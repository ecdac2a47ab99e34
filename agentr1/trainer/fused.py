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
so is every norm where the kernel is unavailable (``AGENTR1_NATIVE=0``, no compiler); a
switched norm whose input or weight the kernel does not take (not float32 on the CPU,
e.g. under bf16 autocast or on a GPU; a tensor subclass, e.g. FSDP's sharded DTensor
outside its unit's forward) runs its own forward. The gate kernel takes float32 and, under
bf16 autocast, bfloat16 (each result rounded where torch's bf16 ops round theirs); a
switched MLP's gate that it does not take runs on torch's ops (`torch_silu_gate`: the same
ops and bits as the module's, without keeping ``silu(g)`` for the backward). Results equal
the modules' to float rounding (sums and exp in another order): `tests/unit/test_fused.py`.

Inside the context a kernel's output is also not kept for the backward: autograd would
keep a norm's output for the projections that read it (q/k/v, gate/up) and a gate's
output for the down projection, two [tokens, hidden] and one [tokens, intermediate]
tensor a layer, though the kernel (or torch's gate) remakes each from tensors the
backward keeps anyway (a norm's input, a gate's two inputs) in one pass.
`remade_outputs` installs saved-tensor hooks (`torch.autograd.graph.saved_tensors_hooks`)
under which such an output is saved as the call that makes it; the backward makes it
again, once for all its readers, the same bits from the same kernel on the same inputs,
so values and gradients are unchanged. On SmolLM2-135M's update (float32, 4 rows of ~600
tokens, a shared prompt of 330) the forward keeps a quarter less (benchmarks/RESULTS.md,
"Norm and gate outputs remade in the backward"). Under autocast the projections keep a
low-precision copy of a float32 norm output of their own, which this does not reach; a
gate's output there is already in the down projection's dtype, and is remade. It is off
under saved-tensor hooks of the caller's own (they come first), and with
``AGENTR1_RECOMPUTE=0``.
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch

from agentr1.backends import native

_MATCHES: dict[type, bool] = {}
"""Per module class: whether the kernels compute its forward (`_matches`)."""

RECOMPUTE_ENV = "AGENTR1_RECOMPUTE"
"""``0``: autograd keeps the kernels' outputs (`remade_outputs` off)."""


class _Remake:
    """How to make a kernel's output again: ``fn(*args)`` on inputs that must be
    unchanged since (their version counters), and the result, made once for every
    reader's backward and dropped with the last of them."""

    __slots__ = ("args", "fn", "value", "versions")

    def __init__(self, fn: Callable[..., torch.Tensor], args: tuple[Any, ...]) -> None:
        self.fn, self.args = fn, args
        self.versions = [a._version for a in args if isinstance(a, torch.Tensor)]
        self.value: torch.Tensor | None = None

    def get(self) -> torch.Tensor:
        if self.value is None:
            now = [a._version for a in self.args if isinstance(a, torch.Tensor)]
            if now != self.versions:
                raise RuntimeError(
                    "agentr1.trainer.fused: an input of a norm or gate was modified in place "
                    "after the forward; its output cannot be remade for the backward (set "
                    f"{RECOMPUTE_ENV}=0 to keep outputs instead)"
                )
            with torch.no_grad():
                self.value = self.fn(*self.args)
        return self.value


class _Remade:
    """The saved-tensor hooks of `remade_outputs`: outputs noted by `note` (kept by weak
    reference, keyed by their memory) are packed as their `_Remake` and the view of it
    autograd saved; every other tensor as itself."""

    def __init__(self) -> None:
        self.made: dict[int, tuple[weakref.ref[torch.Tensor], int, _Remake]] = {}

    def note(self, out: torch.Tensor, fn: Callable[..., torch.Tensor], *args: Any) -> None:
        if type(out) is torch.Tensor and out.is_contiguous() and out.storage_offset() == 0:
            key = out.untyped_storage().data_ptr()
            self.made[key] = (weakref.ref(out), out._version, _Remake(fn, args))

    def pack(self, t: torch.Tensor) -> Any:
        # Every other tensor is kept as a detached alias (its memory and version counter,
        # no grad_fn), never as itself: a tensor an op saves may be that op's own output
        # (exp, softmax, attention), and a pack that returns it makes a cycle through the
        # autograd graph (node -> saved tensor -> its grad_fn -> node) that Python's
        # collector cannot see. A backward releases the saved tensors and breaks it; a
        # forward without one (a non-finite loss skips the backward, `_accumulate`)
        # would keep its whole graph alive for good, a few GB a micro-batch.
        plain = type(t) is torch.Tensor and t.layout == torch.strided
        entry = self.made.get(t.untyped_storage().data_ptr()) if plain and self.made else None
        if entry is not None:
            ref, version, remake = entry
            out = ref()
            # A live output owns its memory, so t is a view of it (a dead one's memory may
            # hold another tensor now); unchanged since the kernel wrote it.
            if out is not None and out._version == version and t._version == version:
                return remake, t.size(), t.stride(), t.storage_offset()
        return t.detach()

    @staticmethod
    def unpack(packed: Any) -> torch.Tensor:
        if isinstance(packed, torch.Tensor):
            return packed
        remake, size, stride, offset = packed
        return remake.get().as_strided(size, stride, offset)


_LOCAL = threading.local()
"""``.remade``: the `_Remade` of the innermost active `remade_outputs` in this thread."""


def _note(out: torch.Tensor, fn: Callable[..., torch.Tensor], *args: Any) -> None:
    """Let `remade_outputs`, where active, save ``out`` as ``fn(*args)``."""
    remade: _Remade | None = getattr(_LOCAL, "remade", None)
    if remade is not None and torch.is_grad_enabled():
        remade.note(out, fn, *args)


@contextlib.contextmanager
def remade_outputs() -> Iterator[bool]:
    """Inside: the norm and gate kernels' outputs are saved for the backward as the call
    that makes them (module docstring). Yields whether it is on: not with
    ``AGENTR1_RECOMPUTE=0`` or where saved-tensor hooks are active already."""
    on = os.environ.get(RECOMPUTE_ENV, "1") != "0" and (
        torch._C._autograd._top_saved_tensors_default_hooks(False) is None
    )
    if not on:
        yield False
        return
    remade, outer = _Remade(), getattr(_LOCAL, "remade", None)
    _LOCAL.remade = remade
    try:
        with torch.autograd.graph.saved_tensors_hooks(remade.pack, remade.unpack):
            yield True
    finally:
        _LOCAL.remade = outer
        remade.made.clear()


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
    _note(out, lambda a, w: kernel.forward(a, w, eps)[0], x, weight)
    return out


def silu_gate(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor | None:
    """``silu(g) * u`` on the kernel (differentiable in both), or None where the kernel
    is unavailable or does not take these tensors."""
    kernel = native.silu_gate()
    if kernel is None or not kernel.supports(g, u):
        return None
    out: torch.Tensor = _NativeSiluGate.apply(g, u, kernel)
    _note(out, kernel.forward, g, u)
    return out


def _torch_gate(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.silu(g) * u


class _TorchSiluGate(torch.autograd.Function):
    """``silu(g) * u`` in torch's own ops, keeping ``g`` and ``u`` only: autograd would
    keep ``silu(g)`` as well. Forward and backward are the ops autograd runs for
    ``F.silu(g) * u`` (``mul``'s two products, ``silu_backward``), so the same bits on
    every device and dtype."""

    @staticmethod
    def forward(ctx: Any, g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(g, u)
        return _torch_gate(g, u)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_y: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        g, u = ctx.saved_tensors
        need_g, need_u = ctx.needs_input_grad[:2]
        dg = torch.ops.aten.silu_backward(grad_y * u, g) if need_g else None
        du = grad_y * torch.nn.functional.silu(g) if need_u else None
        return dg, du


def torch_silu_gate(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor | None:
    """``silu(g) * u`` on torch's ops keeping only its inputs for the backward
    (`_TorchSiluGate`), or None for tensors it does not take (a tensor subclass, e.g. a
    tensor-parallel DTensor; differing shapes, dtypes or devices)."""
    plain = type(g) is torch.Tensor and type(u) is torch.Tensor
    if not plain or (g.shape, g.dtype, g.device) != (u.shape, u.dtype, u.device):
        return None
    out: torch.Tensor = _TorchSiluGate.apply(g, u)
    _note(out, _torch_gate, g, u)
    return out


def _norm_forward(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
    """A switched RMSNorm's forward: the kernel where it takes the input, else the
    class's own forward."""
    out = rms_norm(hidden_states, self.weight, float(self.variance_epsilon))
    return out if out is not None else type(self).forward(self, hidden_states)


def _mlp_forward(self: Any, x: torch.Tensor) -> torch.Tensor:
    """A switched MLP's forward: its projections, the gate on the kernel where it takes
    them, else on torch's ops keeping its inputs only, else the module's own
    activation."""
    g, u = self.gate_proj(x), self.up_proj(x)
    h = silu_gate(g, u)
    if h is None:
        h = torch_silu_gate(g, u)
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
        and weight.is_floating_point()
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
    (module docstring); yields how many modules it switched (its MLPs only where the norm
    kernel is unavailable)."""
    # The gate has torch's ops to fall back on (`torch_silu_gate`), the norm does not.
    available = (native.rms_norm() is not None, True)
    switched = []
    for m in model.modules():
        if "forward" in vars(m):  # switched already, or a hook library's own
            continue
        for (applies, forward), ok in zip(_SWITCHES, available, strict=True):
            if ok and applies(m) and _matches(m, forward):
                m.forward = forward.__get__(m)  # type: ignore[method-assign]
                switched.append(m)
                break
    try:
        with remade_outputs() if switched else contextlib.nullcontext():
            yield len(switched)
    finally:
        for m in switched:
            del m.forward
