"""The trainer's native kernels against torch's ops on the same tensors, in one process.

For each kernel the trainer runs on float32 tensors (`agentr1/backends/kernels/`: the SiLU
gate, the LM head's log-softmax) it times the forward and the backward at the demo's and
SmolLM2's shapes, next to the torch ops the kernel replaces, and prints the medians and
the ratio. ``--flags`` builds the kernels with other flags (e.g. ``-march=x86-64-v2``:
the plain loops a CPU without AVX-512 runs) into a scratch directory; ``--source-dir``
builds another version of the sources (a checkout's ``agentr1/backends/kernels``, to
compare code side by side).

    .venv/bin/python benchmarks/native_kernels.py
    .venv/bin/python benchmarks/native_kernels.py --source-dir /tmp/old/agentr1/backends/kernels
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from agentr1.backends import native

SHAPES = {
    "gate, demo SFT [16, 124, 384]": (16, 124, 384),
    "gate, SmolLM2 pass [4, 431, 1536]": (4, 431, 1536),
}
HEADS = {
    "log-softmax, demo [600, 2048]": (600, 2048),
    "log-softmax, SmolLM2 [256, 49152]": (256, 49152),
}


def median_ms(fn: Callable[[], Any], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--flags", default="", help="compile flags instead of native.FLAGS")
    ap.add_argument("--source-dir", type=Path, help="kernel sources to build instead")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    flags = tuple(args.flags.split()) if args.flags else native.FLAGS
    src = args.source_dir or native.KERNELS
    with tempfile.TemporaryDirectory(prefix="kernels-") as tmp:  # loaded before it goes
        out = Path(tmp)
        gate = native.SiluGate(native.build(src / "silu_gate.cpp", out_dir=out, flags=flags))
        head = native.LogSoftmax(native.build(src / "log_softmax.cpp", out_dir=out, flags=flags))
    print(
        f"sources {src}, flags {' '.join(flags)}, {args.threads} threads, medians of {args.repeats}"
    )
    gen = torch.Generator().manual_seed(0)
    for name, shape in SHAPES.items():
        report(name, gate_row(gate, shape, gen, args.repeats))
    for name, (n, v) in HEADS.items():
        report(name, head_row(head, n, v, gen, args.repeats))


def gate_row(
    gate: native.SiluGate, shape: tuple[int, ...], gen: torch.Generator, repeats: int
) -> dict[str, tuple[float, float]]:
    """(kernel ms, torch ops ms) of the SiLU gate's forward and backward."""
    g, u, dy = (torch.randn(shape, generator=gen) for _ in range(3))

    def torch_backward() -> Any:
        s = torch.sigmoid(g)
        silu = g * s
        return dy * u * (s + silu * (1 - s)), dy * silu

    return {
        "forward": (
            median_ms(lambda: gate.forward(g, u), repeats),
            median_ms(lambda: torch.nn.functional.silu(g) * u, repeats),
        ),
        "backward": (
            median_ms(lambda: gate.backward(g, u, dy), repeats),
            median_ms(torch_backward, repeats),
        ),
    }


def head_row(
    head: native.LogSoftmax, n: int, v: int, gen: torch.Generator, repeats: int
) -> dict[str, tuple[float, float]]:
    """(kernel ms, torch ops ms) of the log-softmax's forward (log-prob and entropy) and
    backward (into a copy of the logits, as the trainer's)."""
    z = 3 * torch.randn(n, v, generator=gen)
    t = torch.randint(0, v, (n,), generator=gen)
    lse, _, ent = head.forward(z, t, True)
    g_lp, g_ent = torch.randn(n, generator=gen), torch.randn(n, generator=gen)

    def torch_forward() -> Any:
        logp = z.log_softmax(-1)
        return logp.gather(-1, t[:, None]), -(logp.exp() * logp).sum(-1)

    def torch_backward() -> Any:
        p = (z - lse[:, None]).exp()
        return -p * (g_lp[:, None] + g_ent[:, None] * z)

    return {
        "forward": (
            median_ms(lambda: head.forward(z, t, True), repeats),
            median_ms(torch_forward, repeats),
        ),
        "backward": (
            median_ms(lambda: head.backward(z.clone(), t, lse, ent, g_lp, g_ent, 1.0), repeats),
            median_ms(torch_backward, repeats),
        ),
    }


def report(name: str, row: dict[str, tuple[float, float]]) -> None:
    cells = [
        f"{k} {ours:.3f} ms (torch ops {theirs:.3f}, {theirs / ours:.1f}x)"
        for k, (ours, theirs) in row.items()
    ]
    print(f"{name}: " + "; ".join(cells))


if __name__ == "__main__":
    main()
