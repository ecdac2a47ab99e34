"""The trainer's RMSNorm and SiLU gate: transformers' modules (torch ops) against the
native kernels `agentr1.trainer.fused.native_layers` switches them to, forward +
backward, float32, at the demo's SFT shapes and a SmolLM2 micro-batch's.

    .venv/bin/python benchmarks/fused_layers.py

Prints the median of 7 timings of 20 calls each per (shape, path), and the largest
difference to the torch path relative to its scale.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

from agentr1.trainer.fused import native_layers

SHAPES = {
    "demo SFT batch (16 x 133, 128 / 384 wide)": (16, 133, 128, 384),
    "SmolLM2 micro-batch (4 x 800, 576 / 1536 wide)": (4, 800, 576, 1536),
}


def timed(step: Callable[[], None]) -> float:
    """Median seconds of one call."""
    for _ in range(3):
        step()
    runs = []
    for _ in range(7):
        t = time.perf_counter()
        for _ in range(20):
            step()
        runs.append((time.perf_counter() - t) / 20)
    return statistics.median(runs)


def one(module: torch.nn.Module, x: torch.Tensor, native: bool) -> tuple[float, torch.Tensor]:
    """(seconds of a forward + backward, the input's gradient)."""
    g = torch.randn(
        (*x.shape[:-1], module(x).shape[-1]), generator=torch.Generator().manual_seed(1)
    )

    def step() -> None:
        x.grad = None
        module(x).backward(g)

    if native:
        with native_layers(module) as n:
            assert n == 1, "the kernels are unavailable here (AGENTR1_NATIVE=0 or no compiler)"
            s = timed(step)
    else:
        s = timed(step)
    assert x.grad is not None
    return s, x.grad.clone()


def main() -> None:
    torch.manual_seed(0)
    for name, (B, T, H, inter) in SHAPES.items():
        norm = LlamaRMSNorm(H)
        with torch.no_grad():
            norm.weight.uniform_(0.5, 1.5)
        mlp = LlamaMLP(LlamaConfig(hidden_size=H, intermediate_size=inter, num_attention_heads=1))
        print(f"{name}, threads {torch.get_num_threads()}")
        for label, module in (("RMSNorm", norm), ("MLP (products + SiLU gate)", mlp)):
            x = torch.randn(B, T, H, requires_grad=True)
            s_torch, g_torch = one(module, x, native=False)
            s_native, g_native = one(module, x, native=True)
            diff = float((g_native - g_torch).abs().max() / g_torch.abs().max())
            print(
                f"  {label}: torch {s_torch * 1e3:.2f} ms, native {s_native * 1e3:.2f} ms "
                f"({s_torch / s_native:.2f}x), input gradient differs by {diff:.1e} of its scale"
            )


if __name__ == "__main__":
    main()
