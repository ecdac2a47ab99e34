"""The native RMSNorm and SiLU-gate kernels (agentr1/backends/native.py) and
`native_layers` (agentr1/trainer/fused.py): the same values and gradients as
transformers' modules, the modules switched only inside the context, and only where the
kernels compute them."""

from __future__ import annotations

import gc
import platform
import weakref
from contextlib import nullcontext
from typing import Any

import pytest
import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

from agentr1.backends import native
from agentr1.trainer import fused, logprobs
from agentr1.trainer.logprobs import token_logprobs
from tests.tiny_models import tiny_llama


@pytest.fixture(autouse=True)
def kernels() -> Any:
    if native.compiler() is None:
        pytest.skip("no C++ compiler on this machine: the native kernels cannot be built")
    ks = native.rms_norm(), native.silu_gate()
    if None in ks:
        pytest.skip("native kernels are off here (AGENTR1_NATIVE=0)")
    return ks


def module_path(x: torch.Tensor, w: torch.Tensor, eps: float) -> tuple[torch.Tensor, ...]:
    """(y, dx, dw) through transformers' LlamaRMSNorm in float64, the exact reference."""
    m = LlamaRMSNorm(w.shape[0], eps=eps).double()
    m.weight.data.copy_(w.double())
    x64 = x.detach().double().requires_grad_()
    y = m(x64)
    (y * torch.linspace(-1, 1, y.numel(), dtype=torch.float64).view(y.shape)).sum().backward()
    assert x64.grad is not None and m.weight.grad is not None
    return y.detach(), x64.grad, m.weight.grad


@pytest.mark.parametrize("shape", [(3, 5, 128), (7, 37), (1, 576), (0, 64)])
def test_norm_kernel_matches_the_module_forward_and_backward(shape: tuple[int, ...]) -> None:
    g = torch.Generator().manual_seed(len(shape))
    x = (3 * torch.randn(shape, generator=g)).requires_grad_()
    w = (1 + 0.3 * torch.randn(shape[-1], generator=g)).requires_grad_()
    y = fused.rms_norm(x, w, 1e-5)
    assert y is not None and y.shape == x.shape and y.dtype == torch.float32
    (y * torch.linspace(-1, 1, y.numel()).view(y.shape)).sum().backward()
    assert x.grad is not None and w.grad is not None
    ref_y, ref_dx, ref_dw = module_path(x, w, 1e-5)
    torch.testing.assert_close(y.double(), ref_y, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(x.grad.double(), ref_dx, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(w.grad.double(), ref_dw, rtol=1e-4, atol=1e-4)


def test_a_non_contiguous_input_and_a_frozen_weight() -> None:
    x = torch.randn(64, 10).t().requires_grad_()  # [10, 64], column-major
    w = 1 + 0.1 * torch.randn(64)  # no gradient wanted, as LoRA's frozen norms
    y = fused.rms_norm(x, w, 1e-6)
    assert y is not None
    y.sum().backward()
    ref_y, _, _ = module_path(x, w, 1e-6)
    torch.testing.assert_close(y.double(), ref_y, rtol=1e-5, atol=1e-6)
    assert x.grad is not None and w.grad is None


@pytest.mark.parametrize("shape", [(3, 5, 384), (7, 37), (1, 17), (0, 64)])
def test_gate_kernel_matches_silu_times_input_forward_and_backward(
    shape: tuple[int, ...],
) -> None:
    gen = torch.Generator().manual_seed(len(shape))
    g = (4 * torch.randn(shape, generator=gen)).requires_grad_()
    u = torch.randn(shape, generator=gen).requires_grad_()
    with torch.no_grad():  # far into both tails too, where exp saturates
        g.view(-1)[::7] *= 30
    y = fused.silu_gate(g, u)
    assert y is not None and y.shape == g.shape
    weights = torch.linspace(-1, 1, y.numel()).view(y.shape)
    (y * weights).sum().backward()
    g64, u64 = (t.detach().double().requires_grad_() for t in (g, u))
    ref = torch.nn.functional.silu(g64) * u64
    (ref * weights.double()).sum().backward()
    assert g.grad is not None and u.grad is not None
    torch.testing.assert_close(y.double(), ref.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(g.grad.double(), g64.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(u.grad.double(), u64.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape", [(3, 5, 384), (7, 37), (1, 17)])
def test_the_bf16_gate_kernel_rounds_where_torchs_bf16_ops_round(shape: tuple[int, ...]) -> None:
    """In bfloat16 (the trainer under bf16 autocast) the kernel computes in float32 and
    rounds each result where torch's bf16 ops round theirs: forward and gradients equal
    torch's to one bf16 rounding step (exp differs), and the exact values to bf16's
    precision."""
    gen = torch.Generator().manual_seed(len(shape))
    g32 = 4 * torch.randn(shape, generator=gen)
    g32.view(-1)[::7] *= 30
    u32 = torch.randn(shape, generator=gen)
    weights = torch.linspace(-1, 1, g32.numel()).view(shape).bfloat16()
    results = []
    for gate in (fused.silu_gate, fused.torch_silu_gate):
        g, u = (t.bfloat16().requires_grad_() for t in (g32, u32))
        y = gate(g, u)
        assert y is not None and y.dtype == torch.bfloat16
        (y * weights).sum().backward()
        assert g.grad is not None and u.grad is not None
        results.append((y.detach().float(), g.grad.float(), u.grad.float()))
    g64, u64 = (t.bfloat16().double().requires_grad_() for t in (g32, u32))
    ref = torch.nn.functional.silu(g64) * u64
    (ref * weights.double()).sum().backward()
    assert g64.grad is not None and u64.grad is not None
    exacts = (ref.detach(), g64.grad, u64.grad)
    for ours, torchs, exact in zip(results[0], results[1], exacts, strict=True):
        torch.testing.assert_close(ours, torchs, rtol=2**-7, atol=1e-6)
        torch.testing.assert_close(ours.double(), exact, rtol=2**-6, atol=1e-4)


def test_a_nan_gate_stays_nan() -> None:
    g = torch.tensor([[float("nan"), 1.0] * 12]).requires_grad_()
    u = torch.ones_like(g).requires_grad_()
    y = fused.silu_gate(g, u)
    assert y is not None
    y.sum().backward()
    assert g.grad is not None and u.grad is not None
    for t in (y.detach(), g.grad, u.grad):
        assert t[0, ::2].isnan().all() and t[0, 1::2].isfinite().all()


def test_the_kernels_refuse_what_they_do_not_compute() -> None:
    assert fused.rms_norm(torch.randn(2, 8, dtype=torch.bfloat16), torch.ones(8), 1e-5) is None
    assert fused.rms_norm(torch.randn(2, 8), torch.ones(4), 1e-5) is None
    assert fused.silu_gate(torch.randn(2, 8), torch.randn(2, 4)) is None
    assert fused.silu_gate(torch.randn(2, 8, dtype=torch.bfloat16), torch.randn(2, 8)) is None
    with pytest.raises(ValueError, match="rms-norm kernel"):
        native.rms_norm()._rows(torch.randn(2, 8, dtype=torch.float64), torch.ones(8))  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="silu-gate kernel"):
        native.silu_gate().forward(torch.randn(3), torch.randn(4))  # type: ignore[union-attr]


def test_native_layers_switches_the_modules_inside_the_context_only() -> None:
    model = tiny_llama(layers=2)
    mods = [m for m in model.modules() if isinstance(m, (LlamaRMSNorm, LlamaMLP))]
    assert len(mods) == 7  # two norms and an MLP a layer, and the final norm
    with fused.native_layers(model) as n:
        assert n == 7
        assert all("forward" in vars(m) for m in mods)
    assert not any("forward" in vars(m) for m in mods)


def test_token_logprobs_and_gradients_are_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    model = tiny_llama(layers=2)
    for m in model.modules():  # trained-looking norm weights, so their gradients count
        if isinstance(m, LlamaRMSNorm):
            m.weight.data.uniform_(0.5, 1.5)
    assert isinstance(model.model.layers[0].mlp.act_fn, torch.nn.Module)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(4, 64, (3, 20), generator=g)
    attn = torch.ones_like(ids)
    attn[2, 14:] = 0

    def run() -> tuple[torch.Tensor, list[torch.Tensor]]:
        model.zero_grad()
        lp, _ = token_logprobs(model, ids, attn)
        lp.sum().backward()
        return lp.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]

    calls: list[str] = []
    for name in ("rms_norm", "silu_gate"):
        real = getattr(fused, name)
        monkeypatch.setattr(fused, name, lambda *a, f=real, n=name: calls.append(n) or f(*a))
    lp, grads = run()
    assert sorted(calls) == ["rms_norm"] * 5 + ["silu_gate"] * 2  # all on the kernels
    monkeypatch.setattr(logprobs, "native_layers", lambda m: nullcontext(0))  # the modules' ops
    lp_ref, grads_ref = run()
    assert len(calls) == 7
    torch.testing.assert_close(lp, lp_ref, rtol=1e-5, atol=1e-5)
    assert len(grads) == len(grads_ref) == len(list(model.parameters()))
    for a, b in zip(grads, grads_ref, strict=True):  # float rounding of each tensor's scale
        assert (a - b).abs().max() <= 1e-4 * b.abs().max()


class OnePlusRMSNorm(LlamaRMSNorm):
    """Gemma's kind: ``(1 + weight)`` where Llama has ``weight``."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        v = hidden_states.pow(2).mean(-1, keepdim=True)
        return (1 + self.weight) * (hidden_states * torch.rsqrt(v + self.variance_epsilon))


class GeluMLP(LlamaMLP):
    """A gate the kernel does not compute: GELU where Llama has SiLU."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__(config)
        self.act_fn = torch.nn.GELU()


class ShardedParameter(torch.nn.Parameter):
    """A parameter subclass standing in for a sharded one."""


def test_a_module_that_computes_something_else_keeps_its_forward() -> None:
    config = LlamaConfig(hidden_size=16, intermediate_size=24, num_attention_heads=4)
    model = torch.nn.Sequential(OnePlusRMSNorm(16), LlamaRMSNorm(16), GeluMLP(config))
    sharded = LlamaRMSNorm(16)  # a tensor subclass holds the weight, as FSDP's DTensor
    sharded.weight = ShardedParameter(torch.ones(16))
    model.append(sharded)
    hooked = LlamaRMSNorm(16)
    hooked.forward = lambda h: h  # type: ignore[method-assign]  # a hook library's own
    model.append(hooked)
    with fused.native_layers(model) as n:
        assert n == 2
        assert "forward" not in vars(model[0]) and "forward" in vars(model[1])
        assert "forward" not in vars(model[2])
        # Switched (FSDP unshards the weight for its unit's forward), but a weight that
        # is still a tensor subclass at the call runs the module's own ops.
        assert "forward" in vars(sharded)
        x = torch.randn(4, 16)
        assert not native.rms_norm().supports(x, sharded.weight)  # type: ignore[union-attr]
        torch.testing.assert_close(sharded(x), LlamaRMSNorm.forward(sharded, x), rtol=0, atol=0)
    assert "forward" in vars(hooked)  # left as it was
    x = torch.randn(4, 16)
    torch.testing.assert_close(model[0](x), OnePlusRMSNorm.forward(model[0], x))


def test_activation_checkpointing_keeps_the_modules_own_forward(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = tiny_llama(layers=2)
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # the name since transformers 5.2x
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    model.train()
    calls = []
    monkeypatch.setattr(logprobs, "native_layers", lambda m: calls.append(m) or nullcontext(0))
    ids = torch.randint(4, 64, (2, 12))
    lp, _ = token_logprobs(model, ids, torch.ones_like(ids))
    lp.sum().backward()  # the recomputation saw the same ops as the forward
    assert not calls


def _logprobs_and_grads(model: Any, ids: torch.Tensor, attn: torch.Tensor) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=True)
    lp, _ = token_logprobs(model, ids, attn)
    (lp * torch.linspace(-1, 1, lp.numel()).view(lp.shape)).sum().backward()
    return [lp.detach()] + [p.grad for p in model.parameters() if p.grad is not None]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_torch_gate_is_the_modules_ops_bit_for_bit(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(3)
    g0, u0 = (4 * torch.randn(5, 7, 48, generator=gen)).to(dtype), torch.randn(5, 7, 48).to(dtype)
    dy = torch.randn(5, 7, 48, generator=gen).to(dtype)
    outs = []
    for gate in (fused.torch_silu_gate, lambda g, u: torch.nn.SiLU()(g) * u):
        g, u = g0.clone().requires_grad_(), u0.clone().requires_grad_()
        y = gate(g, u)
        y.backward(dy)
        outs.append((y.detach(), g.grad, u.grad))
    for a, b in zip(*outs, strict=True):
        assert a is not None and b is not None and a.dtype == dtype and torch.equal(a, b)
    assert fused.torch_silu_gate(g0, u0.double()) is None  # the module's own ops there


@pytest.mark.parametrize("lora", [False, True])
def test_remade_outputs_give_the_same_bits(monkeypatch: pytest.MonkeyPatch, lora: bool) -> None:
    from agentr1.lora import apply_lora

    model = tiny_llama(layers=2, kv_heads=2)
    if lora:
        apply_lora(model, rank=4, alpha=8)
        for name, p in model.named_parameters():  # B starts at zero: give it a value
            if "lora_B" in name:
                p.data.normal_(0, 0.1)
    model.train()
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(4, 64, (4, 40), generator=g)
    ids[:, :34] = ids[0, :34]  # one shared prefix: its pass and the rows' rest pass
    attn = torch.ones_like(ids)
    attn[3, 37:] = 0
    remakes: list[int] = []
    real_get = fused._Remake.get

    def get(self: Any) -> torch.Tensor:
        remakes.append(self.value is None)
        return real_get(self)

    monkeypatch.setattr(fused._Remake, "get", get)
    lean = _logprobs_and_grads(model, ids, attn)
    # Per layer and pass: two norms' outputs and a gate's, each remade once however many
    # projections (and adapters) read it; the final norm's output is read by no product.
    assert sum(remakes) == 2 * 2 * 3
    if not lora:  # q, k and v read one norm output (LoRA: their adapters' one product)
        assert len(remakes) > sum(remakes)
    calls = len(remakes)
    monkeypatch.setenv(fused.RECOMPUTE_ENV, "0")
    kept = _logprobs_and_grads(model, ids, attn)
    assert len(remakes) == calls
    assert len(lean) == len(kept) > 1
    for a, b in zip(lean, kept, strict=True):
        assert torch.equal(a, b)


def test_without_kernels_the_gates_are_remade_and_the_bits_are_the_modules(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = tiny_llama(layers=2, kv_heads=2)
    model.train()
    ids = torch.randint(4, 64, (3, 40), generator=torch.Generator().manual_seed(4))
    ids[:, :34] = ids[0, :34]
    attn = torch.ones_like(ids)
    monkeypatch.setattr(native, "rms_norm", lambda: None)  # AGENTR1_NATIVE=0, no compiler
    monkeypatch.setattr(native, "silu_gate", lambda: None)
    made = []
    real_note = fused._Remade.note
    monkeypatch.setattr(
        fused._Remade, "note", lambda self, *a: made.append(1) or real_note(self, *a)
    )
    lean = _logprobs_and_grads(model, ids, attn)
    assert len(made) == 2 * 2  # a gate a layer, in the prefix's pass and the rest's
    monkeypatch.setattr(logprobs, "native_layers", lambda m: nullcontext(0))
    modules = _logprobs_and_grads(model, ids, attn)
    for a, b in zip(lean, modules, strict=True):
        assert torch.equal(a, b)


def test_an_input_changed_in_place_is_an_error_not_a_wrong_gradient() -> None:
    x = torch.randn(6, 32, requires_grad=True)
    w, proj = torch.ones(32), torch.randn(32, 8, requires_grad=True)
    with fused.remade_outputs() as on:
        assert on
        h = x * 2
        y = fused.rms_norm(h, w, 1e-6)
        assert y is not None
        out = y @ proj
    with torch.no_grad():
        h.add_(1)
    with pytest.raises(RuntimeError, match="modified in place after the forward"):
        out.sum().backward()


def test_the_callers_saved_tensor_hooks_come_first() -> None:
    seen: list[torch.Size] = []
    x = torch.randn(6, 32, requires_grad=True)
    w, proj = torch.ones(32), torch.randn(32, 8, requires_grad=True)

    def pack(t: torch.Tensor) -> torch.Tensor:
        seen.append(t.shape)
        return t

    hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
    with hooks, fused.remade_outputs() as on:
        assert not on
        y = fused.rms_norm(x, w, 1e-6)
        assert y is not None
        (y @ proj).sum().backward()
    assert torch.Size([6, 32]) in seen and proj.grad is not None


def test_a_dead_outputs_memory_is_not_taken_for_it() -> None:
    remade = fused._Remade()
    t = torch.randn(4, 8)
    stand_in = torch.randn(4, 8)
    remade.note(stand_in, lambda: torch.zeros(4, 8))
    key = stand_in.untyped_storage().data_ptr()
    entry = remade.made.pop(key)
    del stand_in  # its weak reference dies; suppose t now lives at its address
    remade.made[t.untyped_storage().data_ptr()] = entry
    kept = remade.pack(t)
    assert isinstance(kept, torch.Tensor) and kept.data_ptr() == t.data_ptr()


def test_an_op_that_saves_its_own_output_makes_no_cycle() -> None:
    x = torch.randn(4, 8, requires_grad=True)
    with fused.remade_outputs() as on:
        assert on
        y = x.exp()  # exp's backward keeps its output
        dead = weakref.ref(y)
        del y
    gc.collect()
    assert dead() is None


def test_a_forward_without_a_backward_frees_its_graph() -> None:
    # A non-finite loss skips the backward (`trainer.update._accumulate`): the forward's
    # activations must go with its loss, not stay in a cycle through the graph.
    model = tiny_llama(layers=2)
    outputs: list[weakref.ref[torch.Tensor]] = []

    def keep(module: Any, args: Any, out: Any) -> None:
        for t in out if isinstance(out, tuple) else (out,):
            if isinstance(t, torch.Tensor) and t.requires_grad:
                outputs.append(weakref.ref(t))

    handles = [m.register_forward_hook(keep) for m in model.modules()]
    ids = torch.randint(4, 64, (3, 20), generator=torch.Generator().manual_seed(0))
    lp, _ = token_logprobs(model, ids, torch.ones_like(ids), torch.ones_like(ids))
    for h in handles:
        h.remove()
    assert lp.requires_grad and len(outputs) > 10
    del lp, _
    gc.collect()
    assert [r for r in outputs if r() is not None] == []


PLAIN = tuple("-march=x86-64-v2" if f == "-march=native" else f for f in native.FLAGS)
"""Flags for a CPU without AVX-512: the gate kernel's plain loops, which the compiler
vectorizes for the ISA it targets (exp as bf16.h's `exp1`)."""


@pytest.fixture(scope="module")
def plain_gate(tmp_path_factory: pytest.TempPathFactory) -> native.SiluGate:
    if native.compiler() is None or platform.machine() != "x86_64":
        pytest.skip("the plain-loop build is tested on x86-64 with a C++ compiler")
    out = tmp_path_factory.mktemp("plain")
    return native.SiluGate(native.build(native.SILU_GATE_SOURCE, out_dir=out, flags=PLAIN))


def test_the_plain_gate_is_exact_and_gives_this_machines_bits(plain_gate: native.SiluGate) -> None:
    """Without AVX-512 the gate computes the same float32 values, to the bit, as this
    machine's build (AVX-512's exp16 or, without it, exp1 in wider lanes): exp1 is exp16's
    one-lane twin, clamps included. NaN stays NaN."""
    this_machine = native.silu_gate()
    assert this_machine is not None
    gen = torch.Generator().manual_seed(5)
    g = 4 * torch.randn(3, 7, 391, generator=gen)  # not a multiple of any vector width
    g.view(-1)[::7] *= 30  # both clamps of exp
    g.view(-1)[::101] = float("nan")
    u, dy = torch.randn(g.shape, generator=gen), torch.randn(g.shape, generator=gen)
    y, (dg, du) = plain_gate.forward(g, u), plain_gate.backward(g, u, dy)
    theirs = (this_machine.forward(g, u), *this_machine.backward(g, u, dy))
    for a, b in zip((y, dg, du), theirs, strict=True):
        assert torch.equal(a.isnan(), g.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())
    finite = ~g.isnan()
    g64 = g.double().requires_grad_()
    ref = torch.nn.functional.silu(g64) * u.double()
    (ref * dy.double()).nan_to_num().sum().backward()
    assert g64.grad is not None
    want = (ref.detach(), g64.grad, dy.double() * torch.nn.functional.silu(g.double()))
    for ours, exact in zip((y, dg, du), want, strict=True):
        torch.testing.assert_close(ours.double()[finite], exact[finite], rtol=1e-5, atol=1e-6)
