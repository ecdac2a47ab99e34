"""One decode pass of a Llama-family model, written out: what the ``hf`` sampler runs for
every new token when the model qualifies (`DecodePass.of`), instead of transformers'
forward.

Notation: B rows, C reserved cache columns, H hidden size, K key/value heads, G query
heads per key head, D head size, V vocabulary.

Two costs of the module path that this pass does not pay (`benchmarks/RESULTS.md`,
"The hf sampler's decode pass"):

- **The cache copied inside attention.** A decode step attends over the filled columns
  of each `ReservedLayer`, a slice ``[:, :, :n]`` of a ``[B, K, C, D]`` buffer. That slice
  is not a compact batch of matrices (its batch stride is C x D, not n x D), and torch's
  bf16 ``bmm`` on CPU copies it to contiguous memory first: every layer's whole cache
  once per token, 5x the matmul itself for SmolLM2's 8 rows x 390 keys. This pass
  attends over the whole buffer, the columns not yet written masked out (the buffer is
  zero-filled, so masked columns hold finite values and contribute exactly 0).
- **The module stack**: mask building, output objects, decorators and a dozen module
  calls per layer; here a layer is its operations on the modules' own weights.

The arithmetic is transformers' ``LlamaDecoderLayer`` (Qwen2's too, with its q/k/v
biases): RMSNorm in float32 (torch's ``rms_norm``, the same composite), rotary
embeddings from the model's own rotary module (``rotate_half(x) * sin`` computed as
``roll(x) * sin'`` with sin's first half negated: the same products), the SiLU-gated
MLP, and the sampler's `one_query_attention`; the logits agree with the module path's
to float rounding (the softmax and the value product run over more, zero-weighted,
columns), which `tests/integration/test_decode_pass.py` pins. A trainer's update is seen
by the next token, exactly as through the module path.

A third cost, **skinny matmuls on a row-major weight**: at 8 rows a decode matmul
streams its weight once and does little else, and oneDNN streams a weight held in its
own blocked layout ~1.4x faster than a plain ``[out, in]`` tensor (SmolLM2-135M's layer
matmuls in bf16 at 8 rows: 12.1 -> 8.3 ms a pass, the same bits; `benchmarks/RESULTS.md`,
"Packed weights"). `WeightPacks` holds such copies, one per product with q|k|v and
gate|up fused into one weight each (fewer, larger calls), and re-makes a copy when any
of its source weights changes (its storage or its version counter: an optimizer step,
``load_state_dict``, ``.to``; a write through ``.data`` bumps no counter and is not
seen). A pass with packs reads the copies, one without (``packs=None``) the modules'
weights; both compute the same products (bf16: bit for bit here; fp32: to float
rounding). The copies cost the memory of the linear weights once more (`HFGenerator`'s
``pack_weights_bytes`` caps it).

A fourth, **a dozen small ops a layer between the matmuls**: the rotary's four, the
cache's two writes, two ``bmm`` with the softmax and their views each pay a fixed
dispatch cost, and the ``bmm`` read every reserved column. With ``attention`` (the
native kernel, `agentr1.backends.native.DecodeAttention`, which `HFGenerator` loads
unless ``native_attention=False``) they are one call a layer that visits only the
columns up to the new token; it writes the cache's keys exactly as the torch ops do and
computes the attention in float32 (bf16: one rounding where the torch ops round the
scores and probabilities too).

A fifth, in bf16 on a CPU with AMX or AVX512-BF16: the RMSNorms, residual adds and SiLU
gate between the products are ~10 more small ops a layer, and oneDNN's bf16 GEMM reads a
weight below the memory's rate at decode's few rows. With ``WeightPacks.native``
(`agentr1.backends.native.DecodeLinear`, which `HFGenerator` loads unless
``native_linear=False``) the packs are in that kernel's layout and a layer's products
are four calls with the ops around them fused in (norm -> q|k|v, o + residual, norm ->
gate|up -> SiLU gate, down + residual; the final norm -> head), each rounded where the
torch ops round: only the order of the float32 sums in a product differs.

Where the products are native (`DecodePass.fused`) the same pass is also the sampler's
**prefill**: S tokens a row at once (left-padded, after any cached columns), q and k
rotated in the q|k|v product's epilogue, the attention by the AMX kernel
(`agentr1.backends.native.PrefillAttention`) or torch's SDPA with an additive causal,
padding-aware mask built once a pass. Without native products the prefill keeps
transformers' forward (the written-out one was no faster there).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from agentr1.backends.attention import one_query_attention
from agentr1.backends.native import (
    DecodeAttention,
    DecodeLinear,
    LinearPack,
    PrefillAttention,
    rope_layout,
)

MODEL_TYPES = ("llama", "qwen2")
"""Architectures whose decoder layer this pass writes out (both: pre-norm RMSNorm,
rotary, SiLU-gated MLP; Qwen2 adds q/k/v biases)."""


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' ``LlamaRMSNorm`` (float32 inside, the input dtype out): torch's
    ``rms_norm`` is the same composite (``x * rsqrt(mean(x^2) + eps)``) in one call."""
    xf = torch.rms_norm(x.to(torch.float32), (x.shape[-1],), None, eps)
    return weight * xf.to(x.dtype)


@dataclass(frozen=True)
class _Matmul:
    """One product of the pass: ``x`` times the ``weights`` fused along their outputs
    (q|k|v, gate|up, or one weight), plus their biases."""

    name: str
    weights: tuple[torch.Tensor, ...]
    biases: tuple[torch.Tensor | None, ...]

    @classmethod
    def of(cls, name: str, *mods: torch.nn.Linear) -> _Matmul:
        return cls(name, tuple(m.weight for m in mods), tuple(m.bias for m in mods))

    @property
    def sources(self) -> tuple[torch.Tensor, ...]:
        return (*self.weights, *(b for b in self.biases if b is not None))

    def __call__(self, x: torch.Tensor, packs: WeightPacks | None) -> torch.Tensor:
        if packs is not None:
            return packs.linear(self, x)
        if len(self.weights) == 1:
            return F.linear(x, self.weights[0], self.biases[0])
        parts = [F.linear(x, w, b) for w, b in zip(self.weights, self.biases, strict=True)]
        return torch.cat(parts, dim=-1)

    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.sources)

    @property
    def out_features(self) -> int:
        return sum(w.shape[0] for w in self.weights)


class _Buffers:
    """The bf16 buffers one pass writes its native products and attention into, each
    reused by every layer: a prefill's outputs are megabytes, and fresh ones each layer
    are fresh pages the OS zeroes on first touch (about a tenth of a bf16 prefill)."""

    def __init__(self) -> None:
        self.held: dict[str, torch.Tensor] = {}

    def __call__(self, name: str, *shape: int) -> torch.Tensor:
        t = self.held.get(name)
        if t is None or tuple(t.shape) != shape:
            t = self.held[name] = torch.empty(shape, dtype=torch.bfloat16)
        return t


@dataclass(frozen=True)
class _Layer:
    """What one decoder layer's pass reads: its norms and its four products."""

    input_norm: Any
    qkv: _Matmul
    o: _Matmul
    post_norm: Any
    gate_up: _Matmul
    down: _Matmul
    q_heads: int
    kv_heads: int
    head_dim: int
    scaling: float


def _plain_linear(*modules: Any) -> bool:
    """Exactly ``nn.Linear`` (a parametrized or quantized layer is not)."""
    return all(type(m) is torch.nn.Linear for m in modules)


def _hooked(model: torch.nn.Module) -> bool:
    """Whether a forward hook may change what a module computes (LoRA adapters are forward
    hooks on plain linear layers: `agentr1.lora`); such a model keeps its own forward."""
    from torch.nn.modules import module as nn_module

    if nn_module._global_forward_hooks or nn_module._global_forward_pre_hooks:
        return True
    return any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def packable(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether oneDNN can hold weights of ``dtype`` on ``device`` in its blocked layout
    (a CPU with oneDNN: float32, and bfloat16 where the CPU has bf16 instructions)."""
    if device.type != "cpu" or not torch.backends.mkldnn.is_available():  # type: ignore[no-untyped-call]
        return False
    if not hasattr(torch.ops.mkldnn, "_reorder_linear_weight"):
        return False
    if dtype == torch.float32:
        return True
    return dtype == torch.bfloat16 and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


@dataclass
class _Pack:
    """One packed product: its source weights fused along their outputs, in oneDNN's
    blocked layout, with their biases fused alike; ``key`` is what they were made from."""

    key: tuple[tuple[int, int], ...]
    weight: torch.Tensor
    bias: torch.Tensor | None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(
            x, self.weight, self.bias, "none", [], ""
        )
        return out


@dataclass
class _NativePack:
    """One product packed for the native bf16 kernel (`DecodeLinear`), biases fused
    alike; ``key`` as `_Pack`'s."""

    key: tuple[tuple[int, int], ...]
    weight: LinearPack
    bias: torch.Tensor | None


def _key(tensors: Sequence[torch.Tensor]) -> tuple[tuple[int, int], ...]:
    """What changes when a weight does: its storage (``.to``, a new tensor) or its
    version counter (every in-place write bumps it: an optimizer step, ``copy_``)."""
    return tuple((t.data_ptr(), t._version) for t in tensors)


@dataclass
class WeightPacks:
    """Packed copies of a model's decode matmul weights, kept between passes and calls
    and re-made when a source weight changes (module docstring: the third cost). Only
    for weights oneDNN can pack (`packable`; a CUDA model's are not)."""

    rows: int = 8
    """The batch size oneDNN is told to expect (any batch size works)."""
    packs: dict[str, _Pack | _NativePack] = field(default_factory=dict)
    repacked: int = 0
    """Packs made so far (a first pack or a re-pack after a weight change)."""
    native: DecodeLinear | None = None
    """The native bf16 product kernel (`agentr1.backends.native.DecodeLinear`): where it
    has its fast path, a bf16 pass's products read packs in its layout, with the RMSNorm
    before and the residual add or SiLU gate after each fused in (`native_linear`);
    None: oneDNN's packs and torch ops."""

    def fused(self, dtype: torch.dtype, device: torch.device) -> bool:
        """Whether a pass of ``dtype`` on ``device`` runs its products natively."""
        return self.native is not None and self.native.fast and self.native.supports(dtype, device)

    def native_linear(
        self,
        matmul: _Matmul,
        x: torch.Tensor,
        norm: Any = None,
        residual: torch.Tensor | None = None,
        glu: bool = False,
        rope: tuple[int, int] = (0, 0),
        cos: torch.Tensor | None = None,
        sin: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``matmul`` of ``norm(x)`` (an RMSNorm module, or None) plus ``residual``, or
        with ``glu`` the SiLU-gated product of a gate | up weight, by the native kernel
        from its pack (made again when a source has changed); ``rope`` (heads, head
        size): the pack's first heads are query and key heads, rotated by ``cos`` /
        ``sin`` when given (`agentr1.backends.native.rope_layout` says which can be);
        written into ``out`` when given (the residual itself may be it)."""
        native = self.native
        if native is None:
            raise ValueError(f"{matmul.name}: no native product kernel")
        key = _key(matmul.sources)
        pack = self.packs.get(matmul.name)
        layout = (glu, rope[0] * rope[1], rope[1] if rope[0] else 0)
        if not isinstance(pack, _NativePack) or pack.key != key or pack.weight.layout != layout:
            self.repacked += 1
            with torch.no_grad():
                weight = native.pack(_fused_weight(matmul.weights), glu, *rope)
                pack = _NativePack(key, weight, _fused_bias(matmul))
            self.packs[matmul.name] = pack
        return native(
            x,
            pack.weight,
            norm=None if norm is None else norm.weight,
            eps=0.0 if norm is None else float(norm.variance_epsilon),
            bias=pack.bias,
            residual=residual,
            cos=cos,
            sin=sin,
            out=out,
        )

    def linear(self, matmul: _Matmul, x: torch.Tensor) -> torch.Tensor:
        """``matmul`` of ``x`` from its pack, made (again) when a source has changed."""
        key = _key(matmul.sources)
        pack = self.packs.get(matmul.name)
        if not isinstance(pack, _Pack) or pack.key != key:
            pack = self.packs[matmul.name] = self._pack(key, matmul)
        return pack(x)

    def _pack(self, key: tuple[tuple[int, int], ...], matmul: _Matmul) -> _Pack:
        weights = matmul.weights
        if not all(packable(t.dtype, t.device) for t in weights):
            kinds = sorted({f"{t.dtype} on {t.device}" for t in weights})
            raise ValueError(f"{matmul.name}: oneDNN cannot pack weights of {', '.join(kinds)}")
        self.repacked += 1
        with torch.no_grad():
            w = _fused_weight(weights)
            bias = _fused_bias(matmul)
            return _Pack(key, torch.ops.mkldnn._reorder_linear_weight(w, self.rows), bias)

    def clear(self) -> None:
        """Drop every pack (their memory with them)."""
        self.packs.clear()

    def nbytes(self) -> int:
        """Bytes the packs hold."""
        total = 0
        for p in self.packs.values():
            total += p.weight.data.nbytes if isinstance(p, _NativePack) else p.weight.nbytes
            total += p.bias.nbytes if p.bias is not None else 0
        return total


def _fused_weight(weights: Sequence[torch.Tensor]) -> torch.Tensor:
    """The weights of one product fused along their outputs (no copy for one)."""
    return weights[0].detach() if len(weights) == 1 else torch.cat([w.detach() for w in weights])


def _fused_bias(matmul: _Matmul) -> torch.Tensor | None:
    """The product's biases fused alike (zeros for a weight without one), or None."""
    if all(b is None for b in matmul.biases):
        return None
    return torch.cat(
        [
            b.detach() if b is not None else w.new_zeros(w.shape[0])
            for b, w in zip(matmul.biases, matmul.weights, strict=True)
        ]
    )


def _norm_ok(norm: Any) -> bool:
    return isinstance(getattr(norm, "weight", None), torch.Tensor) and hasattr(
        norm, "variance_epsilon"
    )


@dataclass(frozen=True)
class DecodePass:
    """``DecodePass.of(model)(tokens_B1, mask_BT, position_ids_B1, cache)`` -> float32
    logits ``[B, V]`` of the one new position of every row; see the module docstring."""

    embed: torch.nn.Embedding
    rotary: Any
    layers: tuple[_Layer, ...]
    norm: Any
    head: _Matmul
    packs: WeightPacks | None = None
    """Where the matmuls read their weights: packed copies, or (None) the modules'."""
    attention: DecodeAttention | None = None
    """The native kernel for a layer's rotary, cache write and attention
    (`agentr1.backends.native`), used where it supports the model's dtype and device;
    None: torch operations."""
    prefill_attention: PrefillAttention | None = None
    """The native AMX kernel for a prefill's attention, used where it runs (bf16, heads
    of a multiple of 32, AMX granted); None or elsewhere: torch's SDPA."""

    @classmethod
    def of(cls, model: Any) -> DecodePass | None:
        """The pass for ``model``, or None when it is not one this module writes out
        (another architecture, sliding-window layers, forward hooks such as LoRA's
        adapters, a wrapped projection, a non-SiLU MLP): that model keeps transformers'
        forward."""
        config = getattr(model, "config", None)
        body = getattr(model, "model", None)
        if config is None or body is None or getattr(config, "model_type", None) not in MODEL_TYPES:
            return None
        if getattr(config, "hidden_act", None) != "silu" or getattr(config, "mlp_bias", False):
            return None
        layer_types = getattr(config, "layer_types", None) or ()
        if any(t != "full_attention" for t in layer_types):
            return None
        if getattr(config, "use_sliding_window", False) or _hooked(model):
            return None
        head = model.get_output_embeddings()
        embed = getattr(body, "embed_tokens", None)
        rotary = getattr(body, "rotary_emb", None)
        norm = getattr(body, "norm", None)
        if not (_plain_linear(head) and type(embed) is torch.nn.Embedding and rotary is not None):
            return None
        layers: list[_Layer] = []
        for layer in getattr(body, "layers", ()):
            attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
            if attn is None or mlp is None or hasattr(attn, "q_norm"):
                return None
            projections = (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj)
            if not _plain_linear(*projections, mlp.gate_proj, mlp.up_proj, mlp.down_proj):
                return None
            norms = (layer.input_layernorm, layer.post_attention_layernorm)
            if not all(_norm_ok(n) for n in norms):
                return None
            D = int(attn.head_dim)
            layers.append(
                _Layer(
                    layer.input_layernorm,
                    _Matmul.of(f"{len(layers)}.qkv", *projections[:3]),
                    _Matmul.of(f"{len(layers)}.o", attn.o_proj),
                    layer.post_attention_layernorm,
                    _Matmul.of(f"{len(layers)}.gate_up", mlp.gate_proj, mlp.up_proj),
                    _Matmul.of(f"{len(layers)}.down", mlp.down_proj),
                    attn.q_proj.out_features // D,
                    attn.k_proj.out_features // D,
                    D,
                    float(attn.scaling),
                )
            )
        if not layers or not _norm_ok(norm):
            return None
        return cls(embed, rotary, tuple(layers), norm, _Matmul.of("head", head))

    def norms(self) -> list[Any]:
        """Every RMSNorm of the pass: each layer's two, then the final one."""
        return [*(n for x in self.layers for n in (x.input_norm, x.post_norm)), self.norm]

    def products(self) -> list[_Matmul]:
        """Every product of the pass: the head, then each layer's four."""
        return [self.head, *(m for x in self.layers for m in (x.qkv, x.o, x.gate_up, x.down))]

    def fused(self, dtype: torch.dtype, device: torch.device) -> bool:
        """Whether a pass of ``dtype`` on ``device`` runs its products natively, the norms,
        residual adds and SiLU gate fused in (`WeightPacks.native`); where it does, the
        pass is also the ``hf`` sampler's prefill (faster than transformers' forward
        there; elsewhere the same or slower, so the prefill keeps that forward)."""
        packs = self.packs
        return (
            packs is not None
            and packs.fused(dtype, device)
            and all(n.weight.dtype == dtype for n in self.norms())
        )

    def packable(self) -> bool:
        """Whether every weight of the pass's products can be packed (`packable`)."""
        return all(packable(w.dtype, w.device) for m in self.products() for w in m.weights)

    def linear_bytes(self) -> int:
        """Bytes of the weights and biases the pass's matmuls read: what `WeightPacks`
        holds for it."""
        return sum(m.nbytes() for m in self.products())

    def __call__(
        self,
        tokens_BS: torch.Tensor,
        mask_BT: torch.Tensor,
        position_ids_BS: torch.Tensor,
        cache_layers: list[Any],
    ) -> torch.Tensor:
        """Feed S tokens a row at ``position_ids_BS`` (S = 1: a decode step; more: a
        prefill, each row left-padded); ``mask_BT`` covers the cache's filled columns
        plus these S (1 = attend); ``cache_layers`` are the cache's `ReservedLayer` s, one
        per decoder layer, each written in place. Float32 logits of every row's last
        position. [B, V]"""
        packs = self.packs
        B, S = tokens_BS.shape
        x_BSH = F.embedding(tokens_BS, self.embed.weight)
        cos_BSD, sin_BSD = self.rotary(x_BSH, position_ids_BS)
        # transformers' rotate_half(x) * sin is cat(-x2, x1) * sin: the same products as
        # roll(x) * cat(-sin1, sin2) (negation is exact), two ops a layer instead of five.
        half = sin_BSD.shape[-1] // 2
        sin = torch.cat((-sin_BSD[..., :half], sin_BSD[..., half:]), dim=-1)
        cos, sin = cos_BSD[:, :, None], sin[:, :, None]  # [B, S, 1, D]: over the heads
        native = self.attention if S == 1 else None
        if native is not None and (
            not native.supports(x_BSH.dtype, x_BSH.device) or cos.dtype != x_BSH.dtype
        ):
            native = None  # the kernel takes one dtype on a CPU; torch ops promote
        # a prefill's attention: the AMX kernel, or SDPA with a mask the same every layer
        # (made at the first layer that needs it)
        pre = self.prefill_attention
        head_dim = self.layers[0].head_dim
        if S == 1 or pre is None or not pre.supports(x_BSH.dtype, x_BSH.device, head_dim):
            pre = None
        seen_B1ST: torch.Tensor | None = None
        # the attended columns as the native kernels read them (either kernel runs)
        attend_u8_BT = None
        if native is not None or pre is not None:
            attend_u8_BT = mask_BT.to(torch.uint8).contiguous()
        blocked: torch.Tensor | None = None  # 0 / -inf over the buffers' columns
        fused = self.fused(x_BSH.dtype, x_BSH.device)
        # a prefill's rotary in the q|k|v product's epilogue (a decode step's native
        # attention rotates its own; the pack's layout serves both)
        rope_ok = fused and rope_layout(head_dim)
        rotate = rope_ok and S > 1 and cos_BSD.dtype == x_BSH.dtype
        buffers = _Buffers()
        for layer, cache in zip(self.layers, cache_layers, strict=True):
            Q, K, D = layer.q_heads, layer.kv_heads, layer.head_dim
            # q | k | v of every head as one product; rotary on the q and k heads at once.
            if fused:
                assert packs is not None
                qkv_BSND = packs.native_linear(
                    layer.qkv,
                    x_BSH,
                    norm=layer.input_norm,
                    rope=(Q + K, D) if rope_ok else (0, 0),
                    cos=cos_BSD if rotate else None,
                    sin=sin_BSD if rotate else None,
                    out=buffers("qkv", B, S, layer.qkv.out_features),
                )
            else:
                h_BSH = _rms(x_BSH, layer.input_norm.weight, layer.input_norm.variance_epsilon)
                qkv_BSND = layer.qkv(h_BSH, packs)
            qkv_BSND = qkv_BSND.view(B, S, -1, D)
            claimed = cache.claim_column() if native is not None else None
            if native is not None and claimed is not None:
                # rotary, the cache's new column and the attention in one native call
                keys_BKCD, values_BKCD, n = claimed
                assert attend_u8_BT is not None
                o_BSX = native(
                    qkv_BSND[:, 0],
                    cos[:, 0, 0],
                    sin[:, 0, 0],
                    keys_BKCD,
                    values_BKCD,
                    n,
                    attend_u8_BT,
                    Q,
                    K,
                    layer.scaling,
                ).view(B, 1, -1)
            else:
                qk_BSND = qkv_BSND[:, :, : Q + K]
                if not rotate:
                    qk_BSND = qk_BSND * cos + qk_BSND.roll(half, -1) * sin
                keys_BKCD, values_BKCD = cache.append(
                    qk_BSND[:, :, Q:].transpose(1, 2), qkv_BSND[:, :, Q + K :].transpose(1, 2)
                )
                q_BQSD = qk_BSND[:, :, :Q].transpose(1, 2)
                if S > 1:
                    o_native: torch.Tensor | None = None
                    if pre is not None:
                        assert attend_u8_BT is not None
                        o_native = pre(
                            qk_BSND[:, :, :Q],
                            keys_BKCD,
                            values_BKCD,
                            mask_BT.shape[1],
                            attend_u8_BT,
                            layer.scaling,
                            out=buffers("attention", B, S, Q * D),
                        )
                    if o_native is not None:
                        o_BSX = o_native
                    else:  # SDPA
                        if seen_B1ST is None:
                            seen_B1ST = _prefill_mask(mask_BT, S, x_BSH.dtype)
                        o_BSX = _prefill_attention(
                            q_BQSD, keys_BKCD, values_BKCD, seen_B1ST, layer.scaling
                        )
                else:
                    if blocked is None:  # the buffers' width, the same for every layer
                        C = keys_BKCD.shape[-2]
                        attend = F.pad(mask_BT.bool(), (0, C - mask_BT.shape[1]))
                        blocked = torch.zeros_like(attend[:, None, None, :], dtype=torch.float32)
                        blocked = blocked.masked_fill_(~attend[:, None, None, :], float("-inf"))
                    o_BKGD = one_query_attention(
                        q_BQSD.reshape(B, K, -1, D),
                        keys_BKCD,
                        values_BKCD,
                        blocked,
                        layer.scaling,
                    )
                    o_BSX = o_BKGD.reshape(B, 1, -1)
            if fused:  # the residual adds, the second norm and the SiLU gate inside
                assert packs is not None
                # the residual stream added to in place (x_BSH is this pass's own: the
                # embedding's output, then these products')
                x_BSH = packs.native_linear(layer.o, o_BSX, residual=x_BSH, out=x_BSH)
                act = buffers("act", B, S, layer.gate_up.out_features // 2)
                act_BSI = packs.native_linear(
                    layer.gate_up, x_BSH, norm=layer.post_norm, glu=True, out=act
                )
                x_BSH = packs.native_linear(layer.down, act_BSI, residual=x_BSH, out=x_BSH)
                continue
            x_BSH = x_BSH + layer.o(o_BSX, packs)
            h_BSH = _rms(x_BSH, layer.post_norm.weight, layer.post_norm.variance_epsilon)
            gate_BSI, up_BSI = layer.gate_up(h_BSH, packs).chunk(2, dim=-1)
            x_BSH = x_BSH + layer.down(F.silu(gate_BSI) * up_BSI, packs)
        if fused:
            assert packs is not None
            logits_BV = packs.native_linear(self.head, x_BSH[:, -1], norm=self.norm)
        else:
            x_BH = _rms(x_BSH[:, -1], self.norm.weight, self.norm.variance_epsilon)
            logits_BV = self.head(x_BH, packs)
        return logits_BV.float()


def _prefill_mask(mask_BT: torch.Tensor, S: int, dtype: torch.dtype) -> torch.Tensor:
    """Which columns each of S new queries a row sees (T = the columns before them + S),
    as an additive mask of ``dtype`` (0 seen, -inf not; SDPA turns a boolean one into
    this in every call): those the mask has that are not after the query. A query always
    sees its own column, so a padding query (its column masked) attends to itself
    instead of to nothing (NaN); its output is never read. [B, 1, S, T]"""
    T = mask_BT.shape[1]
    col_T = torch.arange(T, device=mask_BT.device)
    row_S = torch.arange(T - S, T, device=mask_BT.device)
    seen_BST = (col_T[None, :] <= row_S[:, None]) & mask_BT.bool()[:, None, :]
    seen_BST = seen_BST | (col_T[None, :] == row_S[:, None])
    blocked_BST = torch.zeros(seen_BST.shape, dtype=dtype, device=mask_BT.device)
    return blocked_BST.masked_fill_(~seen_BST, float("-inf"))[:, None]


def _prefill_attention(
    q_BQSD: torch.Tensor,
    keys_BKCD: torch.Tensor,
    values_BKCD: torch.Tensor,
    seen_B1ST: torch.Tensor,
    scaling: float,
) -> torch.Tensor:
    """Attention of S new queries a row over the first T columns of the buffers, as
    ``seen_B1ST`` (`_prefill_mask`) lets them, each query heads' group sharing its key
    head. [B, S, Q x D]"""
    B, Q, S, D = q_BQSD.shape
    T = seen_B1ST.shape[-1]
    o_BQSD = F.scaled_dot_product_attention(
        q_BQSD,
        keys_BKCD[:, :, :T],
        values_BKCD[:, :, :T],
        attn_mask=seen_B1ST,
        scale=scaling,
        enable_gqa=True,
    )
    return o_BQSD.transpose(1, 2).reshape(B, S, Q * D)
