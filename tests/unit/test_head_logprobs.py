"""The LM head's own forward and backward (`_HeadLogprobs`, with the native log-softmax
kernel or torch's ops) against autograd through the plain formula: log_softmax of the
logits at the temperature, gathered at the targets, and the softmax's entropy."""

from __future__ import annotations

import platform

import pytest
import torch

from agentr1.backends import native
from agentr1.trainer import logprobs as lpmod


def plain(h, w, b, t, inv_temp):
    logits = torch.nn.functional.linear(h.to(w.dtype), w, b).float() * inv_temp
    logp = logits.log_softmax(-1)
    lp = logp.gather(-1, t[:, None]).squeeze(-1)
    ent = -(logp.exp() * logp).sum(-1)
    return lp, ent


def cases():
    g = torch.Generator().manual_seed(0)
    for N, H, V, inv_temp, bias in [
        (7, 16, 50, 1.0, False),  # V not a multiple of 16: the kernel's tail loop
        (33, 24, 2048, 1 / 0.7, True),
        (5, 8, 16, 2.0, False),
    ]:
        h = 3 * torch.randn(N, H, generator=g)
        w = torch.randn(V, H, generator=g) / H**0.5
        b = torch.randn(V, generator=g) if bias else None
        t = torch.randint(0, V, (N,), generator=g)
        g_lp, g_ent = torch.randn(N, generator=g), torch.randn(N, generator=g)
        yield h, w, b, t, inv_temp, g_lp, g_ent


BASELINE = tuple("-march=x86-64-v2" if f == "-march=native" else f for f in native.FLAGS)
"""Flags for a CPU without AVX-512: the kernel's plain loops."""


@pytest.fixture(scope="module")
def plain_build(tmp_path_factory):
    if native.compiler() is None or platform.machine() != "x86_64":
        pytest.skip("the plain-loop build is tested on x86-64 with a C++ compiler")
    out = tmp_path_factory.mktemp("plain")
    return native.LogSoftmax(native.build(native.LOG_SOFTMAX_SOURCE, out_dir=out, flags=BASELINE))


@pytest.fixture(params=["native", "plain", "torch"])
def kernel(request, monkeypatch):
    """The head on each path: this machine's build, a build without AVX-512, torch ops."""
    if request.param == "native":
        if native.log_softmax() is None:
            pytest.skip("no C++ compiler here: the native kernel cannot be built")
    elif request.param == "plain":
        build = request.getfixturevalue("plain_build")
        monkeypatch.setattr(native, "log_softmax", lambda: build)
    else:
        monkeypatch.setattr(native, "log_softmax", lambda: None)
    return request.param


@pytest.mark.parametrize("with_entropy", [True, False])
@pytest.mark.parametrize("keep", [True, False])
def test_values_and_gradients_are_the_plain_formulas(kernel, with_entropy, keep) -> None:
    for h, w, b, t, inv_temp, g_lp, g_ent in cases():
        leaves = [x.clone().requires_grad_() for x in (h, w) + ((b,) if b is not None else ())]
        h1, w1, *b1 = leaves
        lp, ent = lpmod._head_chunk(h1, t, w1, b1[0] if b1 else None, inv_temp, with_entropy, keep)
        leaves0 = [x.clone().requires_grad_() for x in leaves]
        h0, w0, *b0 = leaves0
        want_lp, want_ent = plain(h0, w0, b0[0] if b0 else None, t, inv_temp)
        torch.testing.assert_close(lp, want_lp, atol=2e-5, rtol=1e-5)
        if with_entropy:
            torch.testing.assert_close(ent, want_ent, atol=2e-5, rtol=1e-5)
            loss, want = (lp * g_lp + ent * g_ent).sum(), (want_lp * g_lp + want_ent * g_ent).sum()
        else:
            assert torch.equal(ent, torch.zeros_like(lp))
            loss, want = (lp * g_lp).sum(), (want_lp * g_lp).sum()
        got = torch.autograd.grad(loss, leaves)
        ref = torch.autograd.grad(want, leaves0)
        for a, r in zip(got, ref, strict=True):
            torch.testing.assert_close(a, r, atol=5e-5, rtol=1e-4)


def test_a_second_backward_with_kept_logits_computes_them_again(kernel) -> None:
    """The kept logits are overwritten by the first backward; a retained graph's second
    backward gets the same gradient all the same."""
    h, w, b, t, inv_temp, g_lp, _ = next(cases())
    w = w.clone().requires_grad_()
    lp, _ = lpmod._head_chunk(h, t, w, b, inv_temp, False, True)
    first = torch.autograd.grad((lp * g_lp).sum(), w, retain_graph=True)[0]
    second = torch.autograd.grad((lp * g_lp).sum(), w)[0]
    assert torch.equal(first, second)


def test_bf16_hidden_states_get_bf16_gradients_from_a_float32_head(kernel) -> None:
    h, w, b, t, inv_temp, g_lp, _ = next(cases())
    h = h.to(torch.bfloat16).requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lp, _ = lpmod._head_chunk(h, t, w, b, inv_temp, False)
    assert lp.dtype == torch.float32
    (lp * g_lp).sum().backward()
    assert h.grad is not None and h.grad.dtype == torch.bfloat16
    h0 = h.detach().float().requires_grad_()
    (plain(h0, w, b, t, inv_temp)[0] * g_lp).sum().backward()
    torch.testing.assert_close(h.grad.float(), h0.grad, atol=2e-2, rtol=1e-2)


def test_the_kernel_refuses_a_target_outside_the_vocabulary() -> None:
    kernel = native.log_softmax()
    if kernel is None:
        pytest.skip("no C++ compiler here: the native kernel cannot be built")
    logits = torch.randn(3, 10)
    with pytest.raises(ValueError, match="outside the vocabulary of 10"):
        kernel.forward(logits, torch.tensor([0, 10, 2]), False)
    with pytest.raises(ValueError, match=r"\[N, V\] float32"):
        kernel.forward(logits.double(), torch.tensor([0, 1, 2]), False)


@pytest.mark.parametrize("build", ["native", "plain"])
def test_a_row_with_nan_gives_nan_not_a_number_from_elsewhere(request, build) -> None:
    """A non-finite logit makes that row's log-prob NaN (the update then skips the step),
    and the other rows stay exact: in the 16 lanes of AVX-512 and in the plain loops."""
    kernel = request.getfixturevalue("plain_build") if build == "plain" else native.log_softmax()
    if kernel is None:
        pytest.skip("no C++ compiler here: the native kernel cannot be built")
    logits = torch.randn(3, 40)
    logits[1, 7] = float("nan")
    t = torch.tensor([1, 2, 3])
    _, lp, _ = kernel.forward(logits, t, False)
    want = logits.log_softmax(-1).gather(-1, t[:, None]).squeeze(-1)
    assert torch.isnan(lp[1]) and not torch.isnan(lp[[0, 2]]).any()
    torch.testing.assert_close(lp[[0, 2]], want[[0, 2]], atol=1e-6, rtol=1e-6)


def test_the_plain_backward_gives_this_machines_bits(plain_build) -> None:
    """Given the same logsumexp and entropy, the backward is elementwise: the plain loops
    (exp as bf16.h's exp1, the fused product as AVX-512's) give the bits of this machine's
    build; the forwards sum in different orders, so they agree to a rounding."""
    this_machine = native.log_softmax()
    assert this_machine is not None
    g = torch.Generator().manual_seed(3)
    z = 4 * torch.randn(6, 2051, generator=g)
    t = torch.randint(0, 2051, (6,), generator=g)
    lse, lp, ent = this_machine.forward(z, t, True)
    lse2, lp2, ent2 = plain_build.forward(z, t, True)
    torch.testing.assert_close(lse2, lse, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(lp2, lp, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(ent2, ent, rtol=1e-5, atol=1e-5)
    assert ent is not None
    g_lp, g_ent = torch.randn(6, generator=g), torch.randn(6, generator=g)
    a = this_machine.backward(z.clone(), t, lse, ent, g_lp, g_ent, 0.7)
    b = plain_build.backward(z.clone(), t, lse, ent, g_lp, g_ent, 0.7)
    assert torch.equal(a, b)
