"""The native decode-attention kernel (agentr1/backends/native.py) against the torch ops it
replaces in `DecodePass`: the same cache writes bit for bit, the attention within a
rounding of the exact one; its build (cached, atomic, failing cleanly) and its switches."""

from __future__ import annotations

import logging
import platform
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from agentr1.backends import native
from agentr1.backends.attention import one_query_attention
from agentr1.backends.hf import ReservedLayer

BASELINE = tuple("-march=x86-64-v2" if f == "-march=native" else f for f in native.FLAGS)
"""The kernel's flags for a CPU without AVX-512: its plain loops, what a machine without
those instructions runs."""


@pytest.fixture(scope="module", params=["native", "x86-64-v2"])
def kernel(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    if native.compiler() is None:
        pytest.skip("no C++ compiler on this machine: the native kernel cannot be built")
    if request.param == "native":
        return native.DecodeAttention(native.build())
    if platform.machine() != "x86_64":
        pytest.skip("the plain-loop build is tested on x86-64")
    out = tmp_path_factory.mktemp("plain")
    return native.DecodeAttention(native.build(out_dir=out, flags=BASELINE))


def torch_path(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    n: int,
    attend: torch.Tensor,
    Q: int,
    K: int,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`DecodePass`'s torch ops for one layer: (attention [B, Q, D], rotated queries)."""
    B, _, D = qkv.shape
    half = D // 2
    qk = qkv[:, : Q + K] * cos[:, None] + qkv[:, : Q + K].roll(half, -1) * sin[:, None]
    keys[:, :, n] = qk[:, Q:]
    values[:, :, n] = qkv[:, Q + K :]
    mask = F.pad(attend[:, : n + 1].bool(), (0, keys.shape[2] - n - 1))[:, None, None, :]
    blocked = torch.zeros_like(mask, dtype=torch.float32).masked_fill_(~mask, float("-inf"))
    q = qk[:, :Q].reshape(B, K, -1, D)
    return one_query_attention(q, keys, values, blocked, scale).reshape(B, Q, D), q


def exact(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    attend: torch.Tensor,
    n: int,
    scale: float,
) -> torch.Tensor:
    """The attention in float64 of the given (rounded) queries, keys and values. [B, Q, D]"""
    B, K, G, D = q.shape
    on_BT = attend[:, : n + 1].bool()
    cols = on_BT[:, None, :, None]  # masked columns may hold anything
    k = torch.where(cols, keys[:, :, : n + 1].double(), 0.0)
    v = torch.where(cols, values[:, :, : n + 1].double(), 0.0)
    s = torch.einsum("bkgd,bktd->bkgt", q.double(), k) * scale
    p = torch.softmax(s.masked_fill(~on_BT[:, None, None, :], float("-inf")), dim=-1)
    return torch.einsum("bkgt,bktd->bkgd", p, v).reshape(B, K * G, D)


CASES = [  # rows, query heads, key heads, head size, cache columns, column written
    (3, 6, 2, 64, 40, 29),  # grouped queries, SmolLM2's head size
    (5, 4, 4, 32, 24, 11),  # one query a key head, the demo's head size
    (2, 8, 1, 128, 20, 19),  # the last column of the buffer
    (4, 6, 3, 48, 17, 5),  # a head size without a specialised path
    (1, 2, 2, 8, 3, 0),  # the first column: attends to itself only
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", CASES, ids=[f"D{c[3]}-G{c[1] // c[2]}" for c in CASES])
def test_the_kernel_writes_the_cache_and_attends_like_the_torch_ops(
    kernel: native.DecodeAttention, case: tuple[int, ...], dtype: torch.dtype
) -> None:
    B, Q, K, D, C, n = case
    g = torch.Generator().manual_seed(sum(case))
    qkv = torch.randn(B, Q + 2 * K, D, generator=g).to(dtype)
    angle = torch.rand(B, D, generator=g) * 6
    cos, sin = angle.cos().to(dtype), angle.sin().to(dtype)
    keys = torch.randn(B, K, C, D, generator=g).to(dtype)
    values = torch.randn(B, K, C, D, generator=g).to(dtype)
    attend = torch.ones(B, C, dtype=torch.uint8)
    if n > 2:
        attend[0, 1:3] = 0  # left padding in the middle of row 0's columns
        keys[0, :, 1], values[0, :, 2] = float("nan"), float("inf")  # never used
    scale = D**-0.5
    k_ref, v_ref = keys.clone(), values.clone()
    ref, q = torch_path(qkv, cos, sin, k_ref, v_ref, n, attend, Q, K, scale)
    if n > 2:
        assert not torch.isfinite(ref[0]).all()  # the torch ops multiply masked NaNs by 0
    out = kernel(qkv, cos, sin, keys, values, n, attend, Q, K, scale)
    assert out.dtype == dtype and out.shape == (B, Q, D)
    # the cache: the same rotated key and value, bit for bit, and nothing else written
    assert torch.equal(keys.nan_to_num(), k_ref.nan_to_num())
    assert torch.equal(values.nan_to_num(), v_ref.nan_to_num())
    truth = exact(q, keys, values, attend, n, scale)
    err = (out.double() - truth).abs()
    if dtype == torch.float32:
        assert err.max() <= 2e-6 * max(1.0, truth.abs().max().item())
    else:  # float32 inside, rounded once: within a bf16 rounding (2^-8 relative) + fp32 noise
        assert (err <= truth.abs() * 2**-8 + 1e-6).all()
    assert torch.isfinite(out).all()


def test_bad_shapes_and_layouts_are_refused_with_the_reason(kernel: native.DecodeAttention) -> None:
    qkv = torch.randn(2, 8, 16)
    cos = sin = torch.ones(2, 16)
    keys = values = torch.zeros(2, 2, 10, 16)
    attend = torch.ones(2, 10, dtype=torch.uint8)
    with pytest.raises(ValueError, match="query"):
        kernel(qkv, cos, sin, keys, values, 3, attend, 5, 2, 0.25)  # 5 + 2 x 2 != 8
    with pytest.raises(ValueError, match="column 10"):
        kernel(qkv, cos, sin, keys, values, 10, attend, 4, 2, 0.25)
    with pytest.raises(ValueError, match="layout"):
        kernel(qkv, cos, sin, keys, values, 3, attend.bool(), 4, 2, 0.25)
    with pytest.raises(ValueError, match="CPU"):
        kernel(qkv.double(), cos, sin, keys, values, 3, attend, 4, 2, 0.25)


def test_claim_column_grows_the_buffer_and_keeps_what_was_filled() -> None:
    layer = ReservedLayer(reserve=3)
    assert layer.claim_column() is None  # nothing reserved before the first update
    k = torch.arange(2 * 3 * 4, dtype=torch.float32).view(1, 2, 3, 4)
    layer.update(k, -k)
    claimed = layer.claim_column()
    assert claimed is not None
    keys, values, n = claimed
    assert n == 3 and keys.shape[2] >= 4
    assert torch.equal(keys[:, :, :3], k) and torch.equal(values[:, :, :3], -k)
    assert layer.get_seq_length() == 4 and layer.keys.shape[2] == 4


def test_builds_are_cached_per_source_and_written_atomically(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if native.compiler() is None:
        pytest.skip("no C++ compiler on this machine")
    src = tmp_path / "k.cpp"
    src.write_text('extern "C" int answer() { return 42; }\n')
    first = native.build(src, tmp_path / "out")
    assert first.exists() and [p.name for p in (tmp_path / "out").iterdir()] == [first.name]
    real_run = subprocess.run

    def no_compile(cmd: list[str], *a: Any, **kw: Any) -> Any:
        assert "--version" in cmd, "an identical build must not compile again"
        return real_run(cmd, *a, **kw)

    monkeypatch.setattr(native.subprocess, "run", no_compile)
    assert native.build(src, tmp_path / "out") == first
    monkeypatch.setattr(native.subprocess, "run", real_run)
    src.write_text('extern "C" int answer() { return 43; }\n')
    assert native.build(src, tmp_path / "out") != first  # another source, another build
    # $CXX is a command line (a launcher, extra flags), as in make
    assert native.build(src, tmp_path / "other", cxx=f"{native.compiler()} -w").exists()


def test_a_failing_build_is_an_error_with_the_compiler_message(tmp_path: Path) -> None:
    if native.compiler() is None:
        pytest.skip("no C++ compiler on this machine")
    src = tmp_path / "bad.cpp"
    src.write_text("this is not C++\n")
    with pytest.raises(native.NativeBuildError, match=r"bad\.cpp"):
        native.build(src, tmp_path / "out")
    assert not list((tmp_path / "out").iterdir())  # no half-written library left
    with pytest.raises(native.NativeBuildError, match=r"no C\+\+ compiler|cannot run"):
        native.build(src, tmp_path / "out", cxx=str(tmp_path / "no-such-compiler"))


@pytest.mark.parametrize("refused", [("-fopenmp",), ("-fopenmp", "-fopenmp-simd")])
def test_where_openmp_does_not_compile_the_kernel_is_built_without_it(
    tmp_path: Path, refused: tuple[str, ...]
) -> None:
    """A compiler that rejects ``-fopenmp`` (and then ``-fopenmp-simd``) still gives a
    working kernel: the build falls back flag by flag, and the fallback computes the same
    bits as the OpenMP build (the SiLU gate is elementwise: threads and vector width
    change no rounding)."""
    cxx = native.compiler()
    if cxx is None:
        pytest.skip("no C++ compiler on this machine")
    calls = tmp_path / "calls"
    wrapper = tmp_path / "picky-c++"
    refuse = " ".join(f'"{f}"' for f in refused)
    wrapper.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> "{calls}"\n'
        f'for a in "$@"; do for r in {refuse}; do\n'
        '  if [ "$a" = "$r" ]; then echo "error: unrecognized option $a" >&2; exit 1; fi\n'
        "done; done\n"
        f'exec {cxx} "$@"\n'
    )
    wrapper.chmod(0o755)
    fallback = native.SiluGate(
        native.build(native.SILU_GATE_SOURCE, tmp_path / "out", str(wrapper))
    )
    compiles = [c for c in calls.read_text().splitlines() if "-shared" in c]
    used = {"-fopenmp", "-fopenmp-simd"} & set(compiles[-1].split())
    assert len(compiles) == len(refused) + 1  # each refused flag tried once, in order
    assert used == ({"-fopenmp-simd"} if refused == ("-fopenmp",) else set())
    reference = native.SiluGate(native.build(native.SILU_GATE_SOURCE))  # the cached build
    g = torch.randn(3, 1000, generator=torch.Generator().manual_seed(0)) * 8
    u, dy = torch.randn(3, 1000), torch.randn(3, 1000)
    assert torch.equal(fallback.forward(g, u), reference.forward(g, u))
    for a, b in zip(fallback.backward(g, u, dy), reference.backward(g, u, dy), strict=True):
        assert torch.equal(a, b)


def test_without_a_kernel_the_pass_keeps_torch_ops_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(native, "_LOADED", {})
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv(native.DIR_ENV, str(tmp_path / "kernels"))
    with caplog.at_level(logging.WARNING, logger=native.__name__):
        assert native.decode_attention() is None
        assert native.decode_attention() is None  # tried once a process
    assert len([r for r in caplog.records if "unavailable" in r.message]) == 1
    monkeypatch.setattr(native, "_LOADED", {})
    monkeypatch.delenv("CXX")
    monkeypatch.setenv(native.OFF_ENV, "0")
    assert native.decode_attention() is None and native._LOADED == {}  # off: not even built


# ------------------------------------------------------------ the prefill's attention
def prefill_exact(
    q_BSQD: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    attend_BT: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """The prefill's attention in float64: query s (column T - S + s) sees the attended
    columns up to its own, and its own. [B, S, Q x D]"""
    B, S, Q, D = q_BSQD.shape
    K, T = keys.shape[1], attend_BT.shape[1]
    k = keys[:, :, :T].double().repeat_interleave(Q // K, 1)
    v = values[:, :, :T].double().repeat_interleave(Q // K, 1)
    col, row = torch.arange(T), torch.arange(T - S, T)
    seen = ((col[None] <= row[:, None]) & attend_BT.bool()[:, None, :]) | (
        col[None] == row[:, None]
    )
    scores = (q_BSQD.transpose(1, 2).double() @ k.transpose(-1, -2)) * scale
    p = scores.masked_fill(~seen[:, None], float("-inf")).softmax(-1)
    return (p @ v).transpose(1, 2).reshape(B, S, Q * D)


PREFILL_CASES = [
    # rows, new queries, cached columns before them, query heads, key heads, head size
    (2, 37, 0, 4, 2, 64),  # a prompt prefill, two query heads a key head
    (3, 20, 13, 9, 3, 64),  # after kept columns (a later turn), SmolLM2's grouping
    (1, 70, 5, 2, 1, 32),  # one row (a shared prefix), heads of 32
    (2, 17, 0, 2, 2, 128),  # heads of 128, no grouping
]


@pytest.mark.parametrize(
    "case", PREFILL_CASES, ids=[f"S{c[1]}-P{c[2]}-D{c[5]}" for c in PREFILL_CASES]
)
def test_the_prefill_kernel_attends_causally_within_a_rounding(case: tuple[int, ...]) -> None:
    kernel = native.prefill_attention()
    if kernel is None or not kernel.ready:
        pytest.skip("no AMX prefill-attention kernel here (no compiler, no AMX, or not granted)")
    B, S, P, Q, K, D = case
    T = P + S
    g = torch.Generator().manual_seed(sum(case))
    qkv = torch.randn(B, S, Q + 2 * K, D, generator=g).bfloat16()
    q = qkv[:, :, :Q]  # rows strided, as the pass's q|k|v output holds them
    keys = torch.randn(B, K, T + 11, D, generator=g).bfloat16()  # a reserved buffer
    values = torch.randn(B, K, T + 11, D, generator=g).bfloat16()
    keys[:, :, T:] = float("nan")  # columns past T are never read
    attend = torch.ones(B, T, dtype=torch.uint8)
    attend[0, :3] = 0  # row 0 left-padded
    if P:
        attend[-1, 1:4] = 0  # padding inside the kept columns
    out = kernel(q, keys, values, T, attend, D**-0.5)
    assert out is not None and out.shape == (B, S, Q * D) and out.dtype == torch.bfloat16
    truth = prefill_exact(q, keys, values, attend, D**-0.5)
    # SDPA on the same bf16 inputs: the size of a bf16 rounding of this attention
    col, row = torch.arange(T), torch.arange(T - S, T)
    seen = ((col[None] <= row[:, None]) & attend.bool()[:, None, :]) | (col[None] == row[:, None])
    sdpa = F.scaled_dot_product_attention(
        q.transpose(1, 2),
        keys[:, :, :T],
        values[:, :, :T],
        attn_mask=seen[:, None],
        scale=D**-0.5,
        enable_gqa=True,
    )
    sdpa = sdpa.transpose(1, 2).reshape(B, S, Q * D)
    real = attend[:, T - S :].bool()[:, :, None].expand(B, S, Q * D)  # padding queries unread
    err, base = (out.double() - truth).abs()[real], (sdpa.double() - truth).abs()[real]
    # padding queries too: their outputs become keys and values the next layer multiplies
    assert torch.isfinite(out).all()
    assert err.max() <= 2 * base.max() and err.mean() <= 2 * base.mean()


def test_the_prefill_kernel_writes_into_a_given_buffer_and_keeps_its_scratch_between_calls() -> (
    None
):
    """`DecodePass` hands the kernel one output buffer for every layer, and the kernel
    keeps its packed keys and values between calls: calls of other sizes in between
    (larger, then smaller) leave each call's result what a fresh process computes."""
    kernel = native.prefill_attention()
    if kernel is None or not kernel.ready:
        pytest.skip("no AMX prefill-attention kernel here (no compiler, no AMX, or not granted)")
    g = torch.Generator().manual_seed(3)

    def call(B: int, S: int, out: torch.Tensor | None = None) -> torch.Tensor:
        gen = torch.Generator().manual_seed(B * 1000 + S)
        q = torch.randn(B, S, 4, 64, generator=gen).bfloat16()
        keys = torch.randn(B, 2, S, 64, generator=gen).bfloat16()
        values = torch.randn(B, 2, S, 64, generator=gen).bfloat16()
        attend = torch.ones(B, S, dtype=torch.uint8)
        attend[0, :2] = 0
        o = kernel(q, keys, values, S, attend, 0.125, out=out)
        assert o is not None
        return o

    small = call(2, 40)
    large = call(3, 150)
    assert torch.equal(call(2, 40), small)  # the larger scratch, partly rewritten
    buffer = torch.randn(3, 150, 4 * 64, generator=g).bfloat16()
    assert call(3, 150, out=buffer) is buffer and torch.equal(buffer, large)
    with pytest.raises(ValueError, match=r"out must be a contiguous CPU bfloat16 \[2, 40, 256\]"):
        call(2, 40, out=buffer)
