"""The native bf16 product kernel (`agentr1.backends.native.DecodeLinear`) against the
torch ops it replaces in `DecodePass`: RMSNorm -> product (+ bias) -> residual add or
SiLU gate, each rounded to bf16 where the torch ops round. Every path this machine has
is run: AMX, AVX512-BF16 (the same build with AMX off) and the plain loops (a build for
a CPU without AVX-512)."""

from __future__ import annotations

import platform
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from agentr1.backends import native
from agentr1.backends.decode import _rms

BASELINE = tuple("-march=x86-64-v2" if f == "-march=native" else f for f in native.FLAGS)
"""Flags for a CPU without AVX-512: the kernel's plain loops."""


@pytest.fixture(scope="module", params=["amx", "avx512_bf16", "plain"])
def kernel(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The kernel on one of its paths (skipped where this machine does not have it)."""
    if native.compiler() is None:
        pytest.skip("no C++ compiler on this machine: the native kernel cannot be built")
    path = request.param
    if path == "plain":
        if platform.machine() != "x86_64":
            pytest.skip("the plain-loop build is tested on x86-64")
        out = tmp_path_factory.mktemp("plain")
        k = native.DecodeLinear(native.build(native.LINEAR_SOURCE, out_dir=out, flags=BASELINE))
        assert k.isa == "plain" and not k.fast
        yield k
        return
    k = native.DecodeLinear(native.build(native.LINEAR_SOURCE))
    if k.use_amx(path == "amx") != path:
        k.use_amx(True)
        pytest.skip(f"this CPU (or OS) has no {path} path for the kernel")
    yield k
    k.use_amx(True)  # the library is loaded once a process: leave it as found


def torch_ops(
    x: torch.Tensor,
    weight: torch.Tensor,
    norm: torch.Tensor | None,
    bias: torch.Tensor | None,
    residual: torch.Tensor | None,
    glu: bool,
) -> torch.Tensor:
    """What `DecodePass` computes without the kernel, op by op in bf16."""
    h = x if norm is None else _rms(x, norm, 1e-5)
    y = F.linear(h, weight, bias)
    if glu:
        gate, up = y.chunk(2, dim=-1)
        return F.silu(gate) * up
    return y if residual is None else residual + y


CASES = [
    # rows, outputs, inputs, glu, norm, bias, residual
    (8, 960, 576, False, True, False, False),  # SmolLM2's q|k|v after the input norm
    (8, 576, 576, False, False, False, True),  # o_proj + the residual
    (8, 3072, 576, True, True, False, False),  # gate|up after the post norm, SiLU-gated
    (3, 576, 1536, False, False, False, True),  # down_proj + the residual, 3 rows
    (1, 200, 64, False, True, True, False),  # one row, Qwen2's q|k|v biases
    (20, 99, 33, False, False, True, True),  # > 16 rows (two row tiles), odd K, N's tail
    (13, 80, 70, True, False, False, False),  # a GLU half of 40 (a block's tail), K % 32
    # more rows than a chunk (256) and blocks than a group (16), 32-row strips and a tail:
    # each block's epilogue runs among the next block's products, across strips
    (300, 1100, 96, False, True, False, True),
    (290, 1040, 64, True, True, False, False),
]


@pytest.mark.parametrize(
    "case", CASES, ids=[f"M{c[0]}-N{c[1]}-K{c[2]}{'-glu' if c[3] else ''}" for c in CASES]
)
def test_the_kernel_computes_the_torch_ops_to_a_rounding(
    kernel: Any, case: tuple[Any, ...]
) -> None:
    M, N, K, glu, with_norm, with_bias, with_residual = case
    g = torch.Generator().manual_seed(M * N + K)
    x = torch.randn(M, K, generator=g).bfloat16()
    weight = (torch.randn(N, K, generator=g) / K**0.5).bfloat16()
    norm = (torch.rand(K, generator=g) + 0.5).bfloat16() if with_norm else None
    bias = torch.randn(N, generator=g).bfloat16() if with_bias else None
    cols = N // 2 if glu else N
    residual = torch.randn(M, cols, generator=g).bfloat16() if with_residual else None
    pack = kernel.pack(weight, glu)
    assert pack.glu == glu and (pack.out_features, pack.in_features) == (N, K)
    out = kernel(x, pack, norm=norm, eps=1e-5, bias=bias, residual=residual)
    ref = torch_ops(x, weight, norm, bias, residual, glu)
    assert out.dtype == torch.bfloat16 and out.shape == ref.shape == (M, cols)
    # Only the order of the float32 sums differs: a result on the other side of a bf16
    # rounding boundary is one unit (2^-7 relative at most) off, and rarely.
    diff = (out.float() - ref.float()).abs()
    assert (diff <= ref.float().abs() * 2**-7 + 1e-3).all()
    assert (diff == 0).float().mean() >= 0.95  # rounded where the torch ops round
    # the same call on a batch of one row gives that row (no cross-row leakage)
    one = kernel(
        x[-1:],
        pack,
        norm=norm,
        eps=1e-5,
        bias=bias,
        residual=None if residual is None else residual[-1:],
    )
    assert (one.float() - out[-1:].float()).abs().max() <= ref.float().abs().max() * 2**-7


@pytest.mark.parametrize("D", [32, 64, 128])
def test_rotary_heads_are_rotated_as_transformers_rotates_them(kernel: Any, D: int) -> None:
    """A q|k|v product whose q and k heads are rotated in the epilogue: each head as
    transformers' ``q * cos + rotate_half(q) * sin`` in bf16 (rounded op by op), the v
    heads as they are; without cos / sin the same pack gives the plain product."""
    from transformers.models.llama.modeling_llama import rotate_half

    M, K, rope_heads, v_heads = 13, 96, 3, 1
    N = (rope_heads + v_heads) * D
    g = torch.Generator().manual_seed(D)
    x = torch.randn(2, M, K, generator=g).bfloat16()  # [B, S, K] as a prefill feeds it
    weight = (torch.randn(N, K, generator=g) / K**0.5).bfloat16()
    bias = torch.randn(N, generator=g).bfloat16()
    angle = torch.rand(2, M, D, generator=g) * 6
    cos, sin = angle.cos().bfloat16(), angle.sin().bfloat16()
    pack = kernel.pack(weight, rope_heads=rope_heads, head_dim=D)
    plain = F.linear(x, weight, bias)  # [B, S, N]
    unrotated = kernel(x, pack, bias=bias)
    assert (unrotated.float() - plain.float()).abs().max() <= plain.float().abs().max() * 2**-7
    out = kernel(x, pack, bias=bias, cos=cos, sin=sin)
    heads = plain.view(2, M, -1, D)
    qk = heads[:, :, :rope_heads]
    rotated = qk * cos[:, :, None] + rotate_half(qk) * sin[:, :, None]
    ref = torch.cat([rotated, heads[:, :, rope_heads:]], 2).reshape(2, M, N)
    diff = (out.float() - ref.float()).abs()
    # the product's own rounding may differ by one unit; the rotation's four roundings
    # then follow torch's, so most values are equal bit for bit
    assert (diff <= ref.float().abs() * 2**-6 + 2e-2).all()
    assert (diff == 0).float().mean() >= 0.99  # one rounding skipped: ~0.91


def test_rotary_packs_refuse_what_they_cannot_lay_out(kernel: Any) -> None:
    w = torch.randn(96, 32).bfloat16()
    with pytest.raises(ValueError, match="head size that divides by 32"):
        kernel.pack(w, rope_heads=2, head_dim=48)
    with pytest.raises(ValueError, match=">= 128 rows"):
        kernel.pack(w, rope_heads=2, head_dim=64)
    with pytest.raises(ValueError, match=r"\(gate \| up\)"):
        kernel.pack(torch.randn(128, 32).bfloat16(), glu=True, rope_heads=1, head_dim=64)
    x, cs = torch.randn(4, 32).bfloat16(), torch.ones(4, 32).bfloat16()
    with pytest.raises(ValueError, match="without rotary heads"):
        kernel(x, kernel.pack(w), cos=cs, sin=cs)
    rope = kernel.pack(w, rope_heads=2, head_dim=32)
    with pytest.raises(ValueError, match=r"sin None for rows \(4, 32\)"):
        kernel(x, rope, cos=cs)
    with pytest.raises(ValueError, match="takes no residual"):
        kernel(x, rope, residual=torch.zeros(4, 96).bfloat16())


def test_leading_dimensions_and_strided_rows_are_taken_as_they_come(kernel: Any) -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 64, generator=g).bfloat16()  # [B, 1-ish, H] as the pass feeds it
    weight = (torch.randn(48, 64, generator=g) / 8).bfloat16()
    residual = torch.randn(2, 3, 48, generator=g).bfloat16()
    pack = kernel.pack(weight)
    out = kernel(x, pack, residual=residual)
    assert out.shape == (2, 3, 48)
    assert torch.allclose(
        out.float(), (residual + F.linear(x, weight)).float(), rtol=2**-7, atol=1e-3
    )
    wide = torch.randn(4, 100, generator=g).bfloat16()
    view = wide[:, 10:74]  # rows 100 apart
    assert torch.allclose(
        kernel(view, pack).float(), F.linear(view, weight).float(), rtol=2**-7, atol=1e-3
    )


@pytest.mark.parametrize("M", [5, 70])
def test_a_given_output_buffer_is_written_and_a_residual_replaced_in_place(
    kernel: Any, M: int
) -> None:
    """What `DecodePass` does with its buffers: a product written into one buffer held
    between calls (over what an earlier call left there), and the residual stream added
    to in place: the same bits as a fresh output."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(M, 64, generator=g).bfloat16()
    norm = (1 + torch.randn(64, generator=g) / 4).bfloat16()
    weight = (torch.randn(96, 64, generator=g) / 8).bfloat16()
    pack, glu = kernel.pack(weight), kernel.pack(weight, glu=True)
    buffer = torch.full((M, 96), float("nan")).bfloat16()
    fresh = kernel(x, pack, norm=norm, eps=1e-5)
    assert kernel(x, pack, norm=norm, eps=1e-5, out=buffer) is buffer
    assert torch.equal(buffer, fresh)
    act = torch.full((M, 48), float("nan")).bfloat16()
    fresh_act = kernel(x, glu, norm=norm, eps=1e-5)
    assert torch.equal(kernel(x, glu, norm=norm, eps=1e-5, out=act), fresh_act)
    square = kernel.pack((torch.randn(64, 64, generator=g) / 8).bfloat16())
    stream = torch.randn(M, 64, generator=g).bfloat16()
    h = torch.randn(M, 64, generator=g).bfloat16()
    expected = kernel(h, square, residual=stream)
    assert kernel(h, square, residual=stream, out=stream) is stream
    assert torch.equal(stream, expected)


def test_an_output_buffer_of_the_wrong_kind_or_over_the_input_is_refused(kernel: Any) -> None:
    x = torch.randn(4, 32).bfloat16()
    pack = kernel.pack(torch.randn(32, 32).bfloat16())
    with pytest.raises(ValueError, match=r"out must be a contiguous CPU bfloat16 \[4, 32\]"):
        kernel(x, pack, out=torch.empty(4, 31).bfloat16())
    with pytest.raises(ValueError, match="out must be a contiguous CPU bfloat16"):
        kernel(x, pack, out=torch.empty(4, 32))
    with pytest.raises(ValueError, match="out must be a contiguous CPU bfloat16"):
        kernel(x, pack, out=torch.empty(32, 4).bfloat16().t())
    # the input read while the output is written: refused, not silently corrupted
    with pytest.raises(ValueError, match="out overlaps an input"):
        kernel(x, pack, out=x)
    wide = torch.randn(8, 32).bfloat16()
    with pytest.raises(ValueError, match="out overlaps an input"):
        kernel(wide[:4], pack, out=wide[2:6])


def test_bad_inputs_are_refused_with_the_reason(kernel: Any) -> None:
    w = torch.randn(32, 16).bfloat16()
    with pytest.raises(ValueError, match="2-d CPU bfloat16 weight"):
        kernel.pack(w.float())
    with pytest.raises(ValueError, match="2-d CPU bfloat16 weight"):
        kernel.pack(w[None])
    with pytest.raises(ValueError, match="even row count"):
        kernel.pack(torch.randn(31, 16).bfloat16(), glu=True)
    pack, glu = kernel.pack(w), kernel.pack(w, glu=True)
    x = torch.randn(4, 16).bfloat16()
    with pytest.raises(ValueError, match=r"input \[..., 15\] for a weight of 16 inputs"):
        kernel(x[:, :15], pack)
    with pytest.raises(ValueError, match="CPU bfloat16"):
        kernel(x.float(), pack)
    with pytest.raises(ValueError, match=r"norm must be a contiguous \[16\]"):
        kernel(x, pack, norm=torch.ones(8).bfloat16())
    with pytest.raises(ValueError, match=r"residual \(4, 31\) for an output \(4, 32\)"):
        kernel(x, pack, residual=torch.zeros(4, 31).bfloat16())
    with pytest.raises(ValueError, match=r"gate \| up product takes no bias or residual"):
        kernel(x, glu, residual=torch.zeros(4, 16).bfloat16())


def test_the_paths_are_named_and_amx_can_be_turned_off() -> None:
    kernel = native.decode_linear()
    if kernel is None:
        pytest.skip("no native product kernel here (no C++ compiler, or AGENTR1_NATIVE=0)")
    first = kernel.isa
    assert first in native.ISAS
    try:
        assert kernel.use_amx(False) in ("avx512_bf16", "plain")
        assert kernel.use_amx(True) == first
    finally:
        kernel.use_amx(True)
