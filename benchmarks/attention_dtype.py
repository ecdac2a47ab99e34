"""The trainer's attention in bf16 and in float32 on the CPU, side by side in one process.

Where agentr1's AMX backward kernel does not run (a CPU without AMX, or native kernels
off), a pass under bf16 autocast with several query positions gets torch's CPU flash
kernel for its attention. This times that kernel's forward and backward on the same
tensors in bf16 and in float32 (inputs cast, as `agentr1.backends.attention.
widened_attention` does) at the demo model's and SmolLM2's shapes, and prints the medians
and the ratio: the measurement behind running that attention in float32.

    .venv/bin/python benchmarks/attention_dtype.py
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

SHAPES = {
    # B, query heads, key heads, queries, keys, head size, causal (else a boolean mask)
    "demo SFT [16 x 124], 4 heads of 32": (16, 4, 4, 124, 124, 32, True),
    "demo update [32 x 250], 4 heads of 32": (32, 4, 4, 250, 250, 32, True),
    "SmolLM2 update [4 x 431 after a shared 289], 9 / 3 heads of 64": (
        4,
        9,
        3,
        431,
        720,
        64,
        False,
    ),
    "SmolLM2 causal [4 x 640], 9 / 3 heads of 64": (4, 9, 3, 640, 640, 64, True),
    "Qwen2.5-3B causal [2 x 512], 16 / 2 heads of 128": (2, 16, 2, 512, 512, 128, True),
}


def times_ms(shape: tuple[int, ...], dtype: torch.dtype, repeats: int) -> tuple[float, float]:
    """Median forward and backward milliseconds of torch's attention at ``shape``."""
    B, Hq, Hkv, S, T, D, causal = shape
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, Hq, S, D, generator=g).to(dtype).requires_grad_()
    k, v = (torch.randn(B, Hkv, T, D, generator=g).to(dtype).requires_grad_() for _ in "kv")
    mask = None if causal else torch.ones(B, 1, S, T, dtype=torch.bool).tril(T - S)
    grad = torch.randn(B, Hq, S, D, generator=g).to(dtype)
    forward, backward = [], []
    for _ in range(repeats + 1):  # the first warms up
        t0 = time.perf_counter()
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=bool(causal), enable_gqa=Hq != Hkv
        )
        t1 = time.perf_counter()
        out.backward(grad)
        t2 = time.perf_counter()
        forward.append(t1 - t0)
        backward.append(t2 - t1)
        q.grad = k.grad = v.grad = None
    return 1000 * statistics.median(forward[1:]), 1000 * statistics.median(backward[1:])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    for name, shape in SHAPES.items():
        bf_f, bf_b = times_ms(shape, torch.bfloat16, args.repeats)
        fp_f, fp_b = times_ms(shape, torch.float32, args.repeats)
        print(
            f"{name}: forward bf16 {bf_f:.2f} ms, float32 {fp_f:.2f} ms ({bf_f / fp_f:.2f}x); "
            f"backward bf16 {bf_b:.2f} ms, float32 {fp_b:.2f} ms ({bf_b / fp_b:.2f}x)"
        )


if __name__ == "__main__":
    main()
