"""Native kernels for the ``hf`` sampler's written-out pass and the trainer's passes,
built on first use.

Six kernels, each a C++ source in ``kernels/`` (with the shared ``bf16.h``):

- `DecodeAttention` (``decode_attention.cpp``): a decode step's rotary embedding,
  KV-cache write and grouped-query softmax attention for every (row, key head) pair in
  one call a layer, in float32 inside, AVX-512 where the compiler targets it and OpenMP
  across torch's threads. It replaces ~15 torch ops a layer (rotary's four, the cache's
  two writes, the mask, two ``bmm``, the softmax and their views: about a third of
  SmolLM2's bf16 decode pass at 8 rows, `benchmarks/RESULTS.md`, "Native decode
  attention") and visits only the cache columns up to the new token (the torch path reads
  the whole reserved buffer).
- `DecodeLinear` (``decode_linear.cpp``): a bf16 product ``x @ W^T`` from a weight packed
  once into the kernel's layout (`DecodeLinear.pack`), with an RMSNorm of ``x`` before it
  and a residual add or a SiLU-gated pair (gate | up) after it fused in, float32 sums
  rounded once: a decoder layer's four products and the seven small ops around them
  become four calls. The sums run on AMX tiles where the CPU has them (and the OS lets
  the process use them), else AVX512-BF16 (`DecodeLinear.isa`); at decode's few rows both
  read the weight at about the memory's rate. Builds for a CPU with neither compute the
  same in plain loops, slowly, and say so (`DecodeLinear.fast`): the pass keeps oneDNN's
  products there. A q|k|v pack can also rotate a prefill's q and k heads as it writes
  them.
- `PrefillAttention` (``prefill_attention.cpp``): a bf16 prefill's causal grouped-query
  attention on AMX tiles (16 queries of a head against 16 keys a tile for the scores,
  float32 softmax, the weighted values 32 keys a tile), visiting only the key blocks up
  to each tile's last query. Where this build or process has no AMX it does not run and
  the pass keeps torch's SDPA.
- `LogSoftmax` (``log_softmax.cpp``): the trainer's LM-head log-softmax over float32
  logits, forward (logsumexp, the target's log-prob, the entropy) and backward (the
  gradient written over the logits), a row at a time (`agentr1.trainer.logprobs`).
- `RMSNorm` (``rms_norm.cpp``): the trainer's RMSNorms over float32 rows, forward and
  backward, one call each where torch's ops read and write the whole activation six
  times forward and about twice that backward (`agentr1.trainer.fused`).
- `SiluGate` (``silu_gate.cpp``): the SiLU gate ``silu(g) * u`` of a Llama-style MLP
  over float32 tensors, forward and backward, one pass each (`agentr1.trainer.fused`).

Building: the machine's C++ compiler (``$CXX``, else ``c++`` / ``g++`` / ``clang++``)
compiles a source with ``-O3 -march=native`` into ``$AGENTR1_KERNEL_DIR`` (default
``~/.cache/agentr1/kernels``), under a name hashed from the source and its headers, the
flags, the compiler's version and the CPU's feature flags, so a home directory shared by
different machines keeps one build per CPU. The build writes a temporary file and renames
it (two processes building at once both succeed). ``-fopenmp`` links the OpenMP runtime
torch has already loaded (the same ``libgomp.so.1``), so the kernel's threads are torch's;
where ``-fopenmp`` does not compile the kernel is built single-threaded.

Where there is no compiler, the build fails or ``AGENTR1_NATIVE=0`` is set,
`decode_attention()` / `decode_linear()` / `prefill_attention()` / `log_softmax()`
return None (with one warning naming the reason) and the caller keeps its torch
operations: the same functions, rounded differently.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

KERNELS = Path(__file__).parent / "kernels"
SOURCE = KERNELS / "decode_attention.cpp"
LINEAR_SOURCE = KERNELS / "decode_linear.cpp"
PREFILL_SOURCE = KERNELS / "prefill_attention.cpp"
LOG_SOFTMAX_SOURCE = KERNELS / "log_softmax.cpp"
RMS_NORM_SOURCE = KERNELS / "rms_norm.cpp"
SILU_GATE_SOURCE = KERNELS / "silu_gate.cpp"
ATTENTION_BACKWARD_SOURCE = KERNELS / "attention_backward.cpp"
OFF_ENV = "AGENTR1_NATIVE"
"""Set to 0 to never build or load native kernels."""
DIR_ENV = "AGENTR1_KERNEL_DIR"
"""Where built kernels are kept (default ``~/.cache/agentr1/kernels``)."""
FLAGS = (
    "-std=c++17",
    "-O3",
    "-march=native",
    "-ffp-contract=off",
    "-fno-math-errno",
    "-fno-trapping-math",
)
"""Compile flags; ``-ffp-contract=off`` keeps the rotary's products rounded op by op, as
torch's, so the cache holds the torch path's exact keys. ``-fno-trapping-math`` (no
kernel reads the floating-point exception flags; values are unchanged) lets GCC turn a
loop's comparisons and selects (exp's clamp) into vector blends: without it the plain
loops of ``silu_gate.cpp`` and the log-softmax's backward stay scalar on a CPU without
AVX-512."""
BUILD_TIMEOUT_S = 300


class NativeBuildError(RuntimeError):
    """A kernel that could not be built or loaded (the compiler's message included)."""


def load_library(path: Path) -> ctypes.CDLL:
    """The shared library at ``path``; `NativeBuildError` when it cannot be loaded."""
    try:
        return ctypes.CDLL(str(path))
    except OSError as e:
        raise NativeBuildError(f"cannot load {path}: {e}") from e


def kernel_dir() -> Path:
    """Where built kernels live (`DIR_ENV`)."""
    return Path(os.environ.get(DIR_ENV) or Path.home() / ".cache" / "agentr1" / "kernels")


def compiler() -> str | None:
    """The C++ compiler to build with: ``$CXX`` (a command line, e.g. ``ccache g++``), else
    the first of c++, g++, clang++ on the PATH."""
    cxx = os.environ.get("CXX")
    if cxx:
        return cxx
    for name in ("c++", "g++", "clang++"):
        found = shutil.which(name)
        if found:
            return found
    return None


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()


def _version(cxx: str) -> str:
    try:
        run = subprocess.run(
            [*shlex.split(cxx), "--version"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError) as e:
        raise NativeBuildError(f"cannot run the C++ compiler {cxx!r}: {e}") from e
    if run.returncode != 0:
        raise NativeBuildError(f"{cxx} --version failed: {run.stderr.strip()[-500:]}")
    return run.stdout


def build(
    source: Path = SOURCE,
    out_dir: Path | None = None,
    cxx: str | None = None,
    flags: tuple[str, ...] = FLAGS,
) -> Path:
    """The shared library built from ``source`` with ``flags`` (compiled now unless an
    identical build is in ``out_dir``); `NativeBuildError` when it cannot be."""
    cxx = cxx or compiler()
    if cxx is None:
        raise NativeBuildError("no C++ compiler found (set CXX, or install g++ or clang++)")
    out_dir = out_dir or kernel_dir()
    code = source.read_bytes()
    headers = [h.read_bytes() for h in sorted(source.parent.glob("*.h"))]  # what it includes
    key = hashlib.sha256(
        b"\0".join(
            [
                code,
                *headers,
                " ".join(flags).encode(),
                _version(cxx).encode(),
                _cpu_flags().encode(),
                platform.machine().encode(),
            ]
        )
    ).hexdigest()[:16]
    target = out_dir / f"{source.stem}-{key}.so"
    if target.exists():
        return target
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise NativeBuildError(f"cannot create {out_dir}: {e}") from e
    errors = []
    # single-threaded where OpenMP does not compile (its simd loops still vectorized)
    for openmp in (("-fopenmp",), ("-fopenmp-simd",), ()):
        fd, tmp = tempfile.mkstemp(prefix=f".{source.stem}-", suffix=".so", dir=out_dir)
        os.close(fd)
        cmd = [*shlex.split(cxx), *flags, *openmp, "-shared", "-fPIC", "-o", tmp, str(source)]
        try:
            run = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        except (OSError, subprocess.SubprocessError) as e:
            os.unlink(tmp)
            raise NativeBuildError(f"{' '.join(cmd)}: {e}") from e
        if run.returncode == 0:
            os.replace(tmp, target)
            return target
        os.unlink(tmp)
        errors.append(f"{' '.join(cmd)}:\n{run.stderr.strip()[-1500:]}")
    raise NativeBuildError("the C++ compiler failed:\n" + "\n".join(errors))


_DTYPES = {torch.float32: "f32", torch.bfloat16: "bf16"}


class DecodeAttention:
    """The loaded ``decode_attention`` kernel: ``attention(qkv_BND, cos_BD, sin_BD, keys,
    values, n, attend_BT, q_heads, kv_heads, scale) -> [B, q_heads, D]``.

    It writes the rotated key and the value of the new token into column ``n`` of the
    ``[B, K, C, D]`` buffers ``keys`` / ``values`` (exactly the torch path's values:
    rotary rounded op by op in the dtype) and returns the attention of each query head
    over the columns ``0..n`` the row attends (``attend_BT[b, t]`` nonzero). The scores,
    the softmax and the weighted sum of the values are float32, the result rounded once
    to the dtype; the torch path rounds bf16 scores and probabilities on the way (both
    are within a bf16 rounding of the exact attention: `tests/unit/test_native.py`).
    """

    def __init__(self, path: Path) -> None:
        self.lib = load_library(path)
        self.path = path
        long, int_, ptr = ctypes.c_long, ctypes.c_int, ctypes.c_void_p
        self._fns: dict[torch.dtype, Any] = {}
        for dtype, suffix in _DTYPES.items():
            fn = getattr(self.lib, f"agentr1_decode_attention_{suffix}")
            fn.restype = int_
            fn.argtypes = [ptr, long, ptr, ptr, long, ptr, ptr, long, long, long, ptr, long, ptr]
            fn.argtypes += [int_, int_, int_, int_, ctypes.c_float]
            self._fns[dtype] = fn

    @staticmethod
    def supports(dtype: torch.dtype, device: torch.device) -> bool:
        """Whether the kernel runs tensors of ``dtype`` on ``device`` (CPU, fp32 / bf16)."""
        return device.type == "cpu" and dtype in _DTYPES

    def __call__(
        self,
        qkv_BND: torch.Tensor,
        cos_BD: torch.Tensor,
        sin_BD: torch.Tensor,
        keys_BKCD: torch.Tensor,
        values_BKCD: torch.Tensor,
        n: int,
        attend_BT: torch.Tensor,
        q_heads: int,
        kv_heads: int,
        scale: float,
    ) -> torch.Tensor:
        B, N, D = qkv_BND.shape
        dtype = qkv_BND.dtype
        if q_heads + 2 * kv_heads != N or q_heads % kv_heads or D % 2:
            raise ValueError(
                f"decode attention: qkv [{B}, {N}, {D}] is not {q_heads} query + 2 x "
                f"{kv_heads} key/value heads of an even size"
            )
        if keys_BKCD.shape != values_BKCD.shape or keys_BKCD.shape[:2] != (B, kv_heads):
            raise ValueError(f"decode attention: cache {tuple(keys_BKCD.shape)} for qkv {B}x{N}")
        if not 0 <= n < keys_BKCD.shape[2] or attend_BT.shape[0] != B or attend_BT.shape[1] <= n:
            raise ValueError(
                f"decode attention: column {n} of a {keys_BKCD.shape[2]}-column cache with an "
                f"attention mask of {attend_BT.shape[1]} columns"
            )
        tensors = (qkv_BND, cos_BD, sin_BD, keys_BKCD, values_BKCD)
        if any(t.dtype != dtype or not self.supports(t.dtype, t.device) for t in tensors):
            raise ValueError(f"decode attention: every tensor must be CPU {list(_DTYPES)}")
        if (
            qkv_BND.stride(2) != 1
            or qkv_BND.stride(1) != D
            or cos_BD.stride() != sin_BD.stride()
            or cos_BD.stride(1) != 1
            or keys_BKCD.stride() != values_BKCD.stride()
            or keys_BKCD.stride()[2:] != (D, 1)
            or attend_BT.dtype != torch.uint8
            or attend_BT.stride(1) != 1
        ):
            raise ValueError("decode attention: a tensor's layout is not the kernel's")
        out = torch.empty((B, q_heads, D), dtype=dtype)
        failed = self._fns[dtype](
            qkv_BND.data_ptr(),
            qkv_BND.stride(0),
            cos_BD.data_ptr(),
            sin_BD.data_ptr(),
            cos_BD.stride(0),
            keys_BKCD.data_ptr(),
            values_BKCD.data_ptr(),
            keys_BKCD.stride(0),
            keys_BKCD.stride(1),
            n,
            attend_BT.data_ptr(),
            attend_BT.stride(0),
            out.data_ptr(),
            B,
            q_heads,
            kv_heads,
            D,
            scale,
        )
        if failed:
            raise MemoryError("decode attention: the kernel's scratch memory")
        return out


def rope_layout(head_dim: int) -> bool:
    """Whether `DecodeLinear` can rotate heads of ``head_dim`` (a block pairs 16 columns of
    a head's first half with the 16 of its second half)."""
    return head_dim > 0 and head_dim % 32 == 0


ISAS = ("plain", "avx512_bf16", "amx")
"""`DecodeLinear.isa`'s names, by the kernel's number for them."""


@dataclass(frozen=True)
class LinearPack:
    """A bf16 weight ``[out_features, in_features]`` in `DecodeLinear`'s layout; ``glu``:
    the weight is a gate's rows then an up's, and the product gives ``silu(gate) * up``
    (``out_features // 2`` columns); ``rope_cols`` > 0: its first rows are query and key
    heads of ``head_dim`` that a call given ``cos`` / ``sin`` rotates."""

    data: torch.Tensor
    out_features: int
    in_features: int
    glu: bool
    rope_cols: int = 0
    head_dim: int = 0

    @property
    def layout(self) -> tuple[bool, int, int]:
        """What a pack of the same weight must match to serve the same calls."""
        return (self.glu, self.rope_cols, self.head_dim)


class DecodeLinear:
    """The loaded ``decode_linear`` kernel: ``linear(x, pack, norm=, eps=, bias=,
    residual=, cos=, sin=) -> [..., out]`` for bf16 CPU tensors (module docstring; the
    arithmetic is in ``kernels/decode_linear.cpp``).

    ``norm`` (a ``[in]`` bf16 weight) applies transformers' RMSNorm to ``x`` first (float32
    inside, rounded where it rounds); ``residual`` is added to the rounded product; a
    ``glu`` pack gives ``silu(gate) * up``, each rounded as the torch ops round them. Only
    the order of the float32 sums differs from ``F.linear``: within a bf16 rounding of
    the exact product (`tests/unit/test_native_linear.py`). ``cos`` / ``sin`` (``[...,
    head_dim]``, a rotary pack's) rotate its query and key heads as transformers'
    ``q * cos + rotate_half(q) * sin`` does, rounded op by op.
    """

    def __init__(self, path: Path) -> None:
        self.lib = load_library(path)
        self.path = path
        long, int_, ptr = ctypes.c_long, ctypes.c_int, ctypes.c_void_p
        self.lib.agentr1_linear_isa.restype = int_
        self.lib.agentr1_linear_isa.argtypes = []
        self.lib.agentr1_linear_use_amx.restype = int_
        self.lib.agentr1_linear_use_amx.argtypes = [int_]
        self.lib.agentr1_packed_size.restype = long
        self.lib.agentr1_packed_size.argtypes = [long, long, int_]
        self.lib.agentr1_pack_bf16.restype = int_
        self.lib.agentr1_pack_bf16.argtypes = [ptr, long, long, int_, long, long, ptr]
        fn = self.lib.agentr1_linear_bf16
        fn.restype = int_
        fn.argtypes = [ptr, long, long, long, ptr, ctypes.c_float, ptr, long, int_, long, long]
        fn.argtypes += [ptr, ptr, long, ptr, ptr, long, ptr, long]
        self._linear = fn

    @property
    def isa(self) -> str:
        """The path calls take: "amx" (tile matrix multiply), "avx512_bf16", or "plain"
        (loops the compiler vectorises as it can: correct, slow)."""
        return ISAS[self.lib.agentr1_linear_isa()]

    @property
    def fast(self) -> bool:
        """Whether calls run one of the bf16 instruction paths (not the plain loops)."""
        return self.isa != "plain"

    def use_amx(self, on: bool) -> str:
        """AMX on (the default where the CPU has it and the OS lets the process use it)
        or off for this process (the AVX512-BF16 path: tests and benchmarks compare the
        two on one machine); the path calls take now."""
        return ISAS[self.lib.agentr1_linear_use_amx(int(on))]

    @staticmethod
    def supports(dtype: torch.dtype, device: torch.device) -> bool:
        """Whether the kernel multiplies tensors of ``dtype`` on ``device`` (CPU bf16)."""
        return device.type == "cpu" and dtype == torch.bfloat16

    def pack(
        self, weight: torch.Tensor, glu: bool = False, rope_heads: int = 0, head_dim: int = 0
    ) -> LinearPack:
        """``weight`` ``[out, in]`` (bf16, CPU) packed; ``glu``: gate rows then up rows;
        ``rope_heads``: its first ``rope_heads x head_dim`` rows are query and key heads
        that calls given ``cos`` / ``sin`` rotate (`rope_layout` says which can be)."""
        if weight.dim() != 2 or not self.supports(weight.dtype, weight.device):
            raise ValueError(
                f"decode linear: a 2-d CPU bfloat16 weight, got {tuple(weight.shape)} "
                f"{weight.dtype} on {weight.device}"
            )
        N, K = weight.shape
        if glu and N % 2:
            raise ValueError(f"decode linear: a gate | up weight has an even row count, got {N}")
        rope_cols = rope_heads * head_dim
        if rope_heads and (glu or not rope_layout(head_dim) or rope_cols > N):
            raise ValueError(
                f"decode linear: rotary over {rope_heads} heads of {head_dim} needs a plain "
                f"weight of >= {rope_cols} rows and a head size that divides by 32, got "
                f"{N} rows{' (gate | up)' if glu else ''}"
            )
        w = weight.detach().contiguous()
        data = torch.empty(self.lib.agentr1_packed_size(N, K, int(glu)), dtype=torch.bfloat16)
        if self.lib.agentr1_pack_bf16(
            w.data_ptr(), N, K, int(glu), rope_cols, head_dim, data.data_ptr()
        ):
            raise ValueError(f"decode linear: the kernel refused to pack [{N}, {K}]")
        return LinearPack(data, N, K, glu, rope_cols, head_dim if rope_heads else 0)

    def __call__(
        self,
        x: torch.Tensor,
        pack: LinearPack,
        norm: torch.Tensor | None = None,
        eps: float = 0.0,
        bias: torch.Tensor | None = None,
        residual: torch.Tensor | None = None,
        cos: torch.Tensor | None = None,
        sin: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        K = pack.in_features
        out_cols = pack.out_features // 2 if pack.glu else pack.out_features
        if x.shape[-1] != K:
            raise ValueError(
                f"decode linear: input [..., {x.shape[-1]}] for a weight of {K} inputs"
            )
        lead = x.shape[:-1]
        x2 = x.reshape(-1, K)
        if x2.stride(-1) != 1:
            x2 = x2.contiguous()
        M = x2.shape[0]
        for name, t, size in (("norm", norm, K), ("bias", bias, pack.out_features)):
            if t is not None and (t.shape != (size,) or not t.is_contiguous()):
                raise ValueError(f"decode linear: {name} must be a contiguous [{size}]")
        if pack.glu and (bias is not None or residual is not None):
            raise ValueError("decode linear: a gate | up product takes no bias or residual")
        r2 = None
        if residual is not None:
            if residual.shape != (*lead, out_cols):
                raise ValueError(
                    f"decode linear: residual {tuple(residual.shape)} for an output "
                    f"{(*lead, out_cols)}"
                )
            r2 = residual.reshape(M, out_cols)
            if r2.stride(-1) != 1:
                r2 = r2.contiguous()
        cs: list[torch.Tensor] = []
        if cos is not None or sin is not None:
            D = pack.head_dim
            if not pack.rope_cols:
                raise ValueError("decode linear: cos / sin for a pack without rotary heads")
            for name, t in (("cos", cos), ("sin", sin)):
                if t is None or t.shape != (*lead, D):
                    got = None if t is None else tuple(t.shape)
                    raise ValueError(f"decode linear: {name} {got} for rows {(*lead, D)}")
            assert cos is not None and sin is not None
            cs = [cos.reshape(M, D).contiguous(), sin.reshape(M, D).contiguous()]
        if pack.rope_cols and residual is not None:
            raise ValueError("decode linear: a product with rotary heads takes no residual")
        tensors = [t for t in (x2, norm, bias, r2, *cs) if t is not None]
        if any(not self.supports(t.dtype, t.device) for t in tensors):
            raise ValueError("decode linear: every tensor must be CPU bfloat16")
        out = _output(out, (*lead, out_cols), "decode linear", x2)
        failed = self._linear(
            x2.data_ptr(),
            x2.stride(0),
            M,
            K,
            norm.data_ptr() if norm is not None else None,
            eps,
            pack.data.data_ptr(),
            pack.out_features,
            int(pack.glu),
            pack.rope_cols,
            pack.head_dim,
            bias.data_ptr() if bias is not None else None,
            r2.data_ptr() if r2 is not None else None,
            r2.stride(0) if r2 is not None else 0,
            cs[0].data_ptr() if cs else None,
            cs[1].data_ptr() if cs else None,
            pack.head_dim,
            out.data_ptr(),
            out_cols,
        )
        if failed == 1:
            raise MemoryError("decode linear: the kernel's scratch memory")
        if failed:
            raise ValueError(f"decode linear: the kernel refused the call (code {failed})")
        return out


class PrefillAttention:
    """The loaded ``prefill_attention`` kernel: causal grouped-query attention of a bf16
    prefill on AMX tiles (``kernels/prefill_attention.cpp``): ``attention(q, keys, values,
    T, attend, scale) -> [B, S, Q x D]``, or None where it does not run (no AMX here, a
    head size it has not): the caller keeps torch's SDPA.

    Query ``s`` of a row (its column ``T - S + s``) sees the columns up to its own that the
    row attends, and always its own (a padding query attends to itself). Scores, softmax
    and the weighted sum in float32 with the weights rounded once to bf16 before the
    product with the values, the output normalised in float32 and rounded once: within a
    bf16 rounding of the exact attention (`tests/unit/test_native.py`).
    """

    def __init__(self, path: Path) -> None:
        self.lib = load_library(path)
        self.path = path
        long, int_, ptr = ctypes.c_long, ctypes.c_int, ctypes.c_void_p
        self.lib.agentr1_prefill_attention_ready.restype = int_
        self.lib.agentr1_prefill_attention_ready.argtypes = []
        fn = self.lib.agentr1_prefill_attention_bf16
        fn.restype = int_
        fn.argtypes = [ptr, long, long, ptr, ptr, long, long, long, ptr, long, ptr]
        fn.argtypes += [int_, int_, int_, int_, int_, ctypes.c_float]
        self._fn = fn

    @property
    def ready(self) -> bool:
        """Whether calls run here (this build has AMX and the OS grants it)."""
        return bool(self.lib.agentr1_prefill_attention_ready())

    def supports(self, dtype: torch.dtype, device: torch.device, head_dim: int) -> bool:
        return (
            self.ready and device.type == "cpu" and dtype == torch.bfloat16 and head_dim % 32 == 0
        )

    def __call__(
        self,
        q_BSQD: torch.Tensor,
        keys_BKCD: torch.Tensor,
        values_BKCD: torch.Tensor,
        T: int,
        attend_BT: torch.Tensor,
        scale: float,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor | None:
        """Attention of ``q_BSQD`` (the rotated query heads; rows may be strided, heads
        must be packed) over the first ``T`` columns of the cache buffers, as
        ``attend_BT`` (``[B, T]`` uint8) allows. [B, S, Q x D], or None where the kernel
        does not run."""
        B, S, Q, D = q_BSQD.shape
        K = keys_BKCD.shape[1]
        if not self.supports(q_BSQD.dtype, q_BSQD.device, D):
            return None
        for name, t in (("q", q_BSQD), ("keys", keys_BKCD), ("values", values_BKCD)):
            if t.dtype != torch.bfloat16 or t.stride(-1) != 1 or t.stride(-2) != D:
                raise ValueError(f"prefill attention: {name} must be bf16 with packed heads")
        if keys_BKCD.stride() != values_BKCD.stride() or keys_BKCD.shape[2] < T or S > T:
            raise ValueError(
                f"prefill attention: {S} queries over {T} columns of buffers "
                f"{tuple(keys_BKCD.shape)} / {tuple(values_BKCD.shape)}"
            )
        if Q % K or attend_BT.shape != (B, T) or attend_BT.dtype != torch.uint8:
            raise ValueError(
                f"prefill attention: {Q} query heads over {K} key heads, attend "
                f"{tuple(attend_BT.shape)} {attend_BT.dtype} for [{B}, {T}] uint8"
            )
        attend = attend_BT.contiguous()
        out = _output(out, (B, S, Q * D), "prefill attention", q_BSQD, keys_BKCD, values_BKCD)
        code = self._fn(
            q_BSQD.data_ptr(),
            q_BSQD.stride(0),
            q_BSQD.stride(1),
            keys_BKCD.data_ptr(),
            values_BKCD.data_ptr(),
            keys_BKCD.stride(0),
            keys_BKCD.stride(1),
            T,
            attend.data_ptr(),
            attend.stride(0),
            out.data_ptr(),
            B,
            S,
            Q,
            K,
            D,
            scale,
        )
        if code == 3:
            return None
        if code:
            raise MemoryError("prefill attention: the kernel's scratch memory")
        return out


def _span(t: torch.Tensor) -> tuple[int, int]:
    """The bytes ``[start, end)`` a tensor's elements lie in."""
    if t.numel() == 0:
        return (0, 0)
    start = t.data_ptr()
    last = sum((n - 1) * st for n, st in zip(t.shape, t.stride(), strict=True))
    return (start, start + (last + 1) * t.element_size())


def _output(
    out: torch.Tensor | None, shape: tuple[int, ...], what: str, *inputs: torch.Tensor
) -> torch.Tensor:
    """A kernel's bf16 output: ``out`` checked (the caller's buffer, reused between calls
    so that a prefill's large outputs are not fresh pages every layer), else a new one.
    The kernels write every element; ``out`` must not overlap an input they read while
    writing (a residual it replaces in place is fine: each element is read, then
    written, by one thread)."""
    if out is None:
        return torch.empty(shape, dtype=torch.bfloat16)
    if (
        tuple(out.shape) != shape
        or out.dtype != torch.bfloat16
        or out.device.type != "cpu"
        or not out.is_contiguous()
    ):
        raise ValueError(
            f"{what}: out must be a contiguous CPU bfloat16 {list(shape)}, got "
            f"{list(out.shape)} {out.dtype} on {out.device}"
        )
    lo, hi = _span(out)
    for t in inputs:
        a, b = _span(t)
        if a < hi and lo < b:
            raise ValueError(f"{what}: out overlaps an input the kernel reads while writing")
    return out


def _bind(lib: ctypes.CDLL, name: str, restype: Any, argtypes: list[Any]) -> Any:
    """``lib``'s function ``name`` with its C signature set."""
    fn = getattr(lib, name)
    fn.restype, fn.argtypes = restype, argtypes
    return fn


class LogSoftmax:
    """The loaded ``log_softmax`` kernel (``kernels/log_softmax.cpp``): the LM head's
    log-softmax over float32 logits ``[N, V]`` for the trainer (`agentr1.trainer.logprobs`),
    forward (`forward`: each row's logsumexp, its target's log-prob and optionally its
    entropy) and backward (`backward`: the gradient with respect to the logits, written
    over them), each one pass over a row where torch's ops make several [N, V]
    temporaries."""

    def __init__(self, path: Path) -> None:
        self.lib = load_library(path)
        self.path = path
        long, int_, ptr = ctypes.c_long, ctypes.c_int, ctypes.c_void_p
        self._fwd = _bind(
            self.lib,
            "agentr1_log_softmax_forward",
            int_,
            [ptr, long, long, long, ptr, ptr, ptr, ptr],
        )
        bwd_args = [ptr, long, long, long, ptr, ptr, ptr, ptr, ptr, ctypes.c_float]
        self._bwd = _bind(self.lib, "agentr1_log_softmax_backward", int_, bwd_args)

    @staticmethod
    def supports(logits_NV: torch.Tensor) -> bool:
        """Whether the kernel takes these logits (float32 on the CPU, unit column stride)."""
        return (
            logits_NV.device.type == "cpu"
            and logits_NV.dtype == torch.float32
            and logits_NV.dim() == 2
            and logits_NV.stride(1) == 1
        )

    @staticmethod
    def _check(logits_NV: torch.Tensor, targets_N: torch.Tensor) -> torch.Tensor:
        if not LogSoftmax.supports(logits_NV):
            raise ValueError(
                f"log-softmax kernel: logits must be [N, V] float32 on the CPU with unit "
                f"column stride, got {tuple(logits_NV.shape)} {logits_NV.dtype} "
                f"{logits_NV.device} strides {logits_NV.stride()}"
            )
        if targets_N.shape != logits_NV.shape[:1]:
            raise ValueError(
                f"log-softmax kernel: {tuple(targets_N.shape)} targets for "
                f"{logits_NV.shape[0]} rows"
            )
        return targets_N.to(torch.int64).contiguous()

    def forward(
        self, logits_NV: torch.Tensor, targets_N: torch.Tensor, with_entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(logsumexp, target log-prob, entropy or None) of each row. [N] each"""
        targets = self._check(logits_NV, targets_N)
        N, V = logits_NV.shape
        lse, lp = torch.empty(N), torch.empty(N)
        ent = torch.empty(N) if with_entropy else None
        bad = self._fwd(
            logits_NV.data_ptr(),
            N,
            V,
            logits_NV.stride(0),
            targets.data_ptr(),
            lse.data_ptr(),
            lp.data_ptr(),
            None if ent is None else ent.data_ptr(),
        )
        if bad:
            raise ValueError(f"log-softmax kernel: a target outside the vocabulary of {V}")
        return lse, lp, ent

    def backward(
        self,
        logits_NV: torch.Tensor,
        targets_N: torch.Tensor,
        lse_N: torch.Tensor,
        ent_N: torch.Tensor | None,
        grad_lp_N: torch.Tensor,
        grad_ent_N: torch.Tensor | None,
        scale: float,
    ) -> torch.Tensor:
        """Overwrite ``logits_NV`` (the logits at the temperature, as `forward` saw them)
        with ``scale`` x the gradient of ``sum(grad_lp x lp + grad_ent x ent)`` with
        respect to them, and return it."""
        targets = self._check(logits_NV, targets_N)
        N, V = logits_NV.shape
        lse, g_lp = lse_N.float().contiguous(), grad_lp_N.float().contiguous()
        ent = g_ent = None
        if ent_N is not None and grad_ent_N is not None:
            ent, g_ent = ent_N.float().contiguous(), grad_ent_N.float().contiguous()
        bad = self._bwd(
            logits_NV.data_ptr(),
            N,
            V,
            logits_NV.stride(0),
            targets.data_ptr(),
            lse.data_ptr(),
            None if ent is None else ent.data_ptr(),
            g_lp.data_ptr(),
            None if g_ent is None else g_ent.data_ptr(),
            scale,
        )
        if bad:
            raise ValueError(f"log-softmax kernel: a target outside the vocabulary of {V}")
        return logits_NV


class AttentionBackward:
    """The loaded ``attention_backward`` kernel (``kernels/attention_backward.cpp``): the
    gradients of bf16 grouped-query attention on AMX tiles from torch's forward output
    and log-sum-exp, for the trainer (`agentr1.backends.attention.TrainAttention`).
    ``backward(...) -> (dq, dk, dv)``; `ready` says whether it runs here at all."""

    def __init__(self, path: Path) -> None:
        self.lib = load_library(path)
        self.path = path
        long, int_, ptr = ctypes.c_long, ctypes.c_int, ctypes.c_void_p
        self._ready = _bind(self.lib, "agentr1_attention_backward_ready", int_, [])
        args = [ptr] * 6 + [ptr, ptr, long, ptr, ptr, ptr] + [int_] * 6 + [ctypes.c_float]
        self._fn = _bind(self.lib, "agentr1_attention_backward_bf16", int_, args)

    @property
    def ready(self) -> bool:
        """Whether calls run here (this build has AMX and the OS grants it)."""
        return bool(self._ready())

    def supports(self, q: torch.Tensor, k: torch.Tensor) -> bool:
        """Whether the kernel takes ``[B, Q, S, D]`` queries over ``[B, K, T, D]`` keys."""
        return (
            self.ready
            and q.device.type == "cpu"
            and q.dtype == k.dtype == torch.bfloat16
            and q.dim() == k.dim() == 4
            and q.shape[-1] % 32 == 0
            and q.shape[-1] == k.shape[-1]
            and q.shape[1] % k.shape[1] == 0
            and q.shape[2] <= k.shape[2]
            and _plain(q, k)
        )

    def backward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        out: torch.Tensor,
        grad_out: torch.Tensor,
        lse: torch.Tensor,
        attend: torch.Tensor | None,
        scale: float,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(dq, dk, dv) of attention ``softmax(scale q k^T) v`` over the keys each query
        sees: ``attend`` (``[B or 1, S, T]`` bool or uint8, nonzero = sees), or causally
        with the queries at the last ``S`` of the ``T`` columns. ``q``, ``out``,
        ``grad_out`` ``[B, Q, S, D]``, ``k``, ``v`` ``[B, K, T, D]``, bf16, any strides
        with the last dimension contiguous; ``lse`` the forward's float32 log-sum-exp
        ``[B, Q, S]``."""
        B, Q, S, D = q.shape
        K, T = k.shape[1], k.shape[2]
        tensors = {"q": q, "k": k, "v": v, "out": out, "grad_out": grad_out}
        if not self.supports(q, k):
            raise ValueError(
                f"attention backward: bf16 [B, Q, S, D] queries over [B, K, T, D] keys with "
                f"D a multiple of 32 on a CPU with AMX, got {tuple(q.shape)} "
                f"{tuple(k.shape)} {q.dtype}"
            )
        views = []
        for name, t in tensors.items():
            want = (B, Q, S, D) if name in ("q", "out", "grad_out") else (B, K, T, D)
            if tuple(t.shape) != want or t.dtype != torch.bfloat16:
                raise ValueError(
                    f"attention backward: {name} must be bf16 {list(want)}, got "
                    f"{list(t.shape)} {t.dtype}"
                )
            views.append(t if t.stride(-1) == 1 else t.contiguous())
        strides = torch.tensor([s for t in views for s in t.stride()[:3]], dtype=torch.long)
        lse = lse.float().contiguous()
        if tuple(lse.shape) != (B, Q, S):
            raise ValueError(f"attention backward: lse {tuple(lse.shape)} for [{B}, {Q}, {S}]")
        mask, m_sb = None, 0
        if attend is not None:
            if attend.dim() != 3 or attend.shape[0] not in (1, B) or attend.shape[1:] != (S, T):
                raise ValueError(
                    f"attention backward: attend {tuple(attend.shape)} for [{B} or 1, {S}, {T}]"
                )
            mask = attend.to(torch.uint8).contiguous()
            m_sb = S * T if mask.shape[0] == B and B > 1 else 0
        dq = torch.empty(B, Q, S, D, dtype=torch.bfloat16)
        dk = torch.empty(B, K, T, D, dtype=torch.bfloat16)
        dv = torch.empty(B, K, T, D, dtype=torch.bfloat16)
        code = self._fn(
            *(t.data_ptr() for t in views),
            strides.data_ptr(),
            lse.data_ptr(),
            None if mask is None else mask.data_ptr(),
            m_sb,
            dq.data_ptr(),
            dk.data_ptr(),
            dv.data_ptr(),
            B,
            S,
            T,
            Q,
            K,
            D,
            scale,
        )
        if code == 1:
            raise MemoryError("attention backward: the kernel's scratch memory")
        if code:
            raise ValueError(f"attention backward: the kernel refused the call (code {code})")
        return dq, dk, dv


_LOADED: dict[str, Any] = {}


def _off() -> bool:
    return os.environ.get(OFF_ENV, "1").strip().lower() in ("0", "false", "no", "off")


def _load(name: str, source: Path, cls: Any) -> Any:
    """``cls`` of the kernel built from ``source``, once a process; None where native
    kernels are off or it cannot be built (logged once, with the reason)."""
    if _off():
        return None
    if name not in _LOADED:
        kernel = None
        try:
            kernel = cls(build(source))
        except NativeBuildError as e:
            log.warning("native %s unavailable, using torch ops: %s", name.replace("_", " "), e)
        _LOADED[name] = kernel
    return _LOADED[name]


def decode_attention() -> DecodeAttention | None:
    """The decode-attention kernel, built and loaded once a process; None where native
    kernels are off (`OFF_ENV`) or cannot be built here (logged once, with the reason)."""
    kernel: DecodeAttention | None = _load("decode_attention", SOURCE, DecodeAttention)
    return kernel


def decode_linear() -> DecodeLinear | None:
    """The bf16 product kernel, as `decode_attention` (None: off or not buildable)."""
    kernel: DecodeLinear | None = _load("decode_linear", LINEAR_SOURCE, DecodeLinear)
    return kernel


def prefill_attention() -> PrefillAttention | None:
    """The AMX prefill-attention kernel, as `decode_attention` (None: off or not
    buildable; a loaded one may still not run here: `PrefillAttention.ready`)."""
    kernel: PrefillAttention | None = _load("prefill_attention", PREFILL_SOURCE, PrefillAttention)
    return kernel


def attention_backward() -> AttentionBackward | None:
    """The AMX attention-backward kernel, as `prefill_attention` (None: off or not
    buildable; a loaded one may still not run here: `AttentionBackward.ready`)."""
    kernel: AttentionBackward | None = _load(
        "attention_backward", ATTENTION_BACKWARD_SOURCE, AttentionBackward
    )
    return kernel


def _plain(*tensors: torch.Tensor) -> bool:
    """Whether each is a plain tensor (or parameter), whose memory holds all its values:
    not a subclass such as a sharded DTensor, whose ``data_ptr`` is one rank's part."""
    return all(type(t) in (torch.Tensor, torch.nn.Parameter) for t in tensors)


class RMSNorm:
    """The loaded ``rms_norm`` kernel (``kernels/rms_norm.cpp``): ``w * (x * r)`` with
    ``r = 1 / sqrt(mean(x^2) + eps)`` over the last dimension of float32 rows on the CPU
    (`forward`), and its gradients (`backward`); the products of transformers' Llama /
    Qwen2 RMSNorm, summed in another order."""

    def __init__(self, path: Path) -> None:
        self.lib = load_library(path)
        self.path = path
        long, ptr, float_ = ctypes.c_long, ctypes.c_void_p, ctypes.c_float
        fwd_args = [ptr, long, long, long, ptr, float_, ptr, long, ptr]
        self._fwd = _bind(self.lib, "agentr1_rms_norm_forward", None, fwd_args)
        bwd_args = [ptr, ptr, long, long, long, long, ptr, ptr, ptr, long, ptr]
        self._bwd = _bind(self.lib, "agentr1_rms_norm_backward", None, bwd_args)

    @staticmethod
    def supports(x: torch.Tensor, weight: torch.Tensor) -> bool:
        """Whether the kernel takes these rows and weight: plain float32 tensors on the
        CPU, the weight a vector as long as a row."""
        return (
            _plain(x, weight)
            and x.device.type == "cpu"
            and x.dtype == torch.float32
            and weight.device.type == "cpu"
            and weight.dtype == torch.float32
            and x.dim() >= 1
            and weight.shape == x.shape[-1:]
        )

    @staticmethod
    def _rows(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if not RMSNorm.supports(x, weight):
            raise ValueError(
                f"rms-norm kernel: rows must be float32 on the CPU with a float32 weight of "
                f"their width, got {tuple(x.shape)} {x.dtype} {x.device}, weight "
                f"{tuple(weight.shape)} {weight.dtype} {weight.device}"
            )
        return x.reshape(-1, x.shape[-1]).contiguous()

    def forward(
        self, x: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(the normalized rows, shaped as ``x``; each row's scale ``r`` [N])."""
        x_NH = self._rows(x, weight)
        N, H = x_NH.shape
        w = weight.detach().contiguous()
        y_NH, r_N = torch.empty_like(x_NH), torch.empty(N)
        self._fwd(x_NH.data_ptr(), N, H, H, w.data_ptr(), eps, y_NH.data_ptr(), H, r_N.data_ptr())
        return y_NH.view(x.shape), r_N

    def backward(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        r_N: torch.Tensor,
        grad_y: torch.Tensor,
        with_weight: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(the gradient with respect to ``x``, shaped as it; with ``with_weight`` the one
        with respect to ``weight``, else None), given ``grad_y`` and the forward's ``r_N``."""
        x_NH = self._rows(x, weight)
        N, H = x_NH.shape
        g_NH = grad_y.reshape(N, H).float().contiguous()
        w = weight.detach().contiguous()
        r = r_N.float().contiguous()
        dx_NH = torch.empty_like(x_NH)
        dw_H = torch.empty(H) if with_weight else None
        self._bwd(
            x_NH.data_ptr(),
            g_NH.data_ptr(),
            N,
            H,
            H,
            H,
            w.data_ptr(),
            r.data_ptr(),
            dx_NH.data_ptr(),
            H,
            None if dw_H is None else dw_H.data_ptr(),
        )
        return dx_NH.view(x.shape), dw_H


class SiluGate:
    """The loaded ``silu_gate`` kernel (``kernels/silu_gate.cpp``): ``silu(g) * u`` over
    float32 or bfloat16 tensors on the CPU (`forward`) and its gradients (`backward`), the
    products of torch's ``F.silu(g) * u`` with exp rounded differently (in bfloat16 each
    result rounded where torch's ops round theirs)."""

    def __init__(self, path: Path) -> None:
        self.lib = load_library(path)
        self.path = path
        long, ptr = ctypes.c_long, ctypes.c_void_p
        fwd_args, bwd_args = [ptr, ptr, long, ptr], [ptr, ptr, ptr, long, ptr, ptr]
        self._fwd = {
            torch.float32: _bind(self.lib, "agentr1_silu_gate_forward", None, fwd_args),
            torch.bfloat16: _bind(self.lib, "agentr1_silu_gate_forward_bf16", None, fwd_args),
        }
        self._bwd = {
            torch.float32: _bind(self.lib, "agentr1_silu_gate_backward", None, bwd_args),
            torch.bfloat16: _bind(self.lib, "agentr1_silu_gate_backward_bf16", None, bwd_args),
        }

    @staticmethod
    def supports(g: torch.Tensor, u: torch.Tensor) -> bool:
        """Whether the kernel takes this gate and input: plain float32 or bfloat16 tensors
        on the CPU, one shape and dtype."""
        return (
            _plain(g, u)
            and g.device.type == "cpu"
            and u.device.type == "cpu"
            and g.dtype in (torch.float32, torch.bfloat16)
            and u.dtype == g.dtype
            and g.shape == u.shape
        )

    @staticmethod
    def _check(g: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if not SiluGate.supports(g, u):
            raise ValueError(
                f"silu-gate kernel: gate and input must be float32 or bfloat16 on the CPU "
                f"with one shape and dtype, got {tuple(g.shape)} {g.dtype} {g.device} and "
                f"{tuple(u.shape)} {u.dtype} {u.device}"
            )
        return g.contiguous(), u.contiguous()

    def forward(self, g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """``silu(g) * u``, shaped as ``g``."""
        g, u = self._check(g, u)
        y = torch.empty_like(g)
        self._fwd[g.dtype](g.data_ptr(), u.data_ptr(), g.numel(), y.data_ptr())
        return y

    def backward(
        self, g: torch.Tensor, u: torch.Tensor, grad_y: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(the gradients with respect to ``g`` and ``u``), given ``grad_y``."""
        g, u = self._check(g, u)
        dy = grad_y.to(g.dtype).contiguous()
        if dy.shape != g.shape:
            raise ValueError(
                f"silu-gate kernel: a gradient of {tuple(dy.shape)} for {tuple(g.shape)}"
            )
        dg, du = torch.empty_like(g), torch.empty_like(u)
        self._bwd[g.dtype](
            g.data_ptr(), u.data_ptr(), dy.data_ptr(), g.numel(), dg.data_ptr(), du.data_ptr()
        )
        return dg, du


def silu_gate() -> SiluGate | None:
    """The trainer's SiLU-gate kernel, as `decode_attention` (None: off or not buildable)."""
    kernel: SiluGate | None = _load("silu_gate", SILU_GATE_SOURCE, SiluGate)
    return kernel


def rms_norm() -> RMSNorm | None:
    """The trainer's RMSNorm kernel, as `decode_attention` (None: off or not buildable)."""
    kernel: RMSNorm | None = _load("rms_norm", RMS_NORM_SOURCE, RMSNorm)
    return kernel


def log_softmax() -> LogSoftmax | None:
    """The trainer's LM-head log-softmax kernel, as `decode_attention` (None: off or not
    buildable)."""
    kernel: LogSoftmax | None = _load("log_softmax", LOG_SOFTMAX_SOURCE, LogSoftmax)
    return kernel
