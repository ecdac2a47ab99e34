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
biases): RMSNorm in float32, ``rotate_half`` rotary embeddings from the model's own
rotary module, the SiLU-gated MLP, and the sampler's `one_query_attention`; the logits
agree with the module path's to float rounding (the softmax and the value product run
over more, zero-weighted, columns), which `tests/integration/test_decode_pass.py` pins.
The weights are read from the modules at every pass, never copied: a trainer's update
is seen by the next token, exactly as through the module path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import rotate_half

from agentr1.backends.attention import one_query_attention

MODEL_TYPES = ("llama", "qwen2")
"""Architectures whose decoder layer this pass writes out (both: pre-norm RMSNorm,
rotary, SiLU-gated MLP; Qwen2 adds q/k/v biases)."""


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' ``LlamaRMSNorm``, op for op (float32 inside, the input dtype out)."""
    xf = x.to(torch.float32)
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


@dataclass(frozen=True)
class _Layer:
    """The modules of one decoder layer the pass reads weights from."""

    input_norm: Any
    q: torch.nn.Linear
    k: torch.nn.Linear
    v: torch.nn.Linear
    o: torch.nn.Linear
    post_norm: Any
    gate: torch.nn.Linear
    up: torch.nn.Linear
    down: torch.nn.Linear
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
    head: torch.nn.Linear

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
        layers = []
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
            layers.append(
                _Layer(
                    layer.input_layernorm,
                    *projections,
                    layer.post_attention_layernorm,
                    mlp.gate_proj,
                    mlp.up_proj,
                    mlp.down_proj,
                    int(attn.head_dim),
                    float(attn.scaling),
                )
            )
        if not layers or not _norm_ok(norm):
            return None
        return cls(embed, rotary, tuple(layers), norm, head)

    def __call__(
        self,
        tokens_B1: torch.Tensor,
        mask_BT: torch.Tensor,
        position_ids_B1: torch.Tensor,
        cache_layers: list[Any],
    ) -> torch.Tensor:
        """Feed one token a row at ``position_ids_B1``; ``mask_BT`` covers the cache's
        filled columns plus this one (1 = attend); ``cache_layers`` are the cache's
        `ReservedLayer` s, one per decoder layer, each written in place."""
        x_B1H = F.embedding(tokens_B1, self.embed.weight)
        cos, sin = self.rotary(x_B1H, position_ids_B1)
        cos_B11D, sin_B11D = cos.unsqueeze(1), sin.unsqueeze(1)
        B, T = mask_BT.shape
        attend: torch.Tensor | None = None
        for layer, cache in zip(self.layers, cache_layers, strict=True):
            D = layer.head_dim
            h_B1H = _rms(x_B1H, layer.input_norm.weight, layer.input_norm.variance_epsilon)
            q = F.linear(h_B1H, layer.q.weight, layer.q.bias).view(B, 1, -1, D).transpose(1, 2)
            k = F.linear(h_B1H, layer.k.weight, layer.k.bias).view(B, 1, -1, D).transpose(1, 2)
            v = F.linear(h_B1H, layer.v.weight, layer.v.bias).view(B, 1, -1, D).transpose(1, 2)
            q = (q * cos_B11D) + (rotate_half(q) * sin_B11D)  # type: ignore[no-untyped-call]
            k = (k * cos_B11D) + (rotate_half(k) * sin_B11D)  # type: ignore[no-untyped-call]
            keys_BKCD, values_BKCD = cache.append(k, v)
            if attend is None:  # the buffers' width, the same for every layer of a call
                C = keys_BKCD.shape[-2]
                attend = F.pad(mask_BT.bool(), (0, C - T))[:, None, None, :]
            K = keys_BKCD.shape[1]
            o_BKGD = one_query_attention(
                q.reshape(B, K, -1, D), keys_BKCD, values_BKCD, attend, layer.scaling
            )
            x_B1H = x_B1H + F.linear(o_BKGD.reshape(B, 1, -1), layer.o.weight, layer.o.bias)
            h_B1H = _rms(x_B1H, layer.post_norm.weight, layer.post_norm.variance_epsilon)
            gated = F.silu(F.linear(h_B1H, layer.gate.weight)) * F.linear(h_B1H, layer.up.weight)
            x_B1H = x_B1H + F.linear(gated, layer.down.weight)
        x_B1H = _rms(x_B1H, self.norm.weight, self.norm.variance_epsilon)
        logits_BV: torch.Tensor = F.linear(x_B1H[:, -1], self.head.weight, self.head.bias)
        return logits_BV.float()
