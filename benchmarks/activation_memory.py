"""What the update's forward keeps for its backward, and the peak it reaches: one
micro-batch of the multi-hop QA update through `agentr1.trainer.logprobs.token_logprobs`
(forward, a loss on the agent's tokens, backward) on a random model of SmolLM2-135M's
shape, each setting in a fresh process.

    .venv/bin/python benchmarks/activation_memory.py                 # float32, 4 rows
    .venv/bin/python benchmarks/activation_memory.py --rows 8 --lora  # LoRA r16's update
    .venv/bin/python benchmarks/activation_memory.py --lora --bf16    # the fast setting's

Settings: ``lean`` (the default: norm outputs and gate products remade in the backward,
`agentr1.trainer.fused`), ``kept`` (``AGENTR1_RECOMPUTE=0``: autograd keeps them), and
``torch`` (``AGENTR1_NATIVE=0``: transformers' own modules). Per setting: the process's
resident memory before the forward, what the forward adds (the tensors kept for the
backward, plus the forward's own output), the peak over forward and backward
(``ru_maxrss`` less the start), and the forward + backward time (best of ``--repeats``;
this machine's timing is noisy, compare in one invocation). The batch is the QA
update's shape: rows of 560-660 tokens, the first 330 shared by all (the system prompt
and question), the loss on the last 70.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

SETTINGS = {
    "lean": {},
    "kept": {"AGENTR1_RECOMPUTE": "0"},
    "torch": {"AGENTR1_NATIVE": "0"},
}


def rss_gib() -> float:
    """The process's resident memory now, GiB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30


def peak_gib() -> float:
    """The process's peak resident memory so far, GiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def exact_rss() -> None:
    """Have glibc map every block over 64 KiB on its own and give it back when freed, so
    resident memory follows the live tensors (a run keeps freed memory for reuse,
    `agentr1.trainer.setup.keep_freed_memory`, which blurs this count)."""
    import ctypes

    from agentr1.trainer.setup import MALLOC_MMAP_THRESHOLD, MALLOC_TRIM_THRESHOLD

    mallopt = ctypes.CDLL(None).mallopt
    mallopt(MALLOC_MMAP_THRESHOLD, 64 << 10)  # fixed: no longer raised by frees
    mallopt(MALLOC_TRIM_THRESHOLD, 0)


def measure(args: argparse.Namespace) -> dict[str, float]:
    """One setting, in this process."""
    exact_rss()
    import torch

    sys.path.insert(0, str(Path(__file__).parent))
    from shaped_model import shaped_model

    from agentr1.backends.attention import use_decode_sdpa
    from agentr1.lora import apply_lora
    from agentr1.trainer.logprobs import token_logprobs

    torch.manual_seed(0)
    model = shaped_model("smollm2-135m", torch.float32)
    use_decode_sdpa(model)  # agentr1's attention, as the trainer's policy has it
    if args.lora:
        apply_lora(model, rank=16, alpha=32)
    model.train()
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(560, 661, (args.rows,), generator=g).tolist()
    T = max(lengths)
    ids = torch.randint(100, 40000, (args.rows, T), generator=g)
    ids[:, : args.prefix] = ids[0, : args.prefix]
    attn = torch.zeros(args.rows, T, dtype=torch.long)
    select = torch.zeros(args.rows, T)
    for b, n in enumerate(lengths):
        attn[b, :n] = 1
        select[b, n - 70 : n] = 1
    ids = ids * attn

    def step() -> tuple[float, float]:
        start = rss_gib()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            lp, _ = token_logprobs(model, ids, attn, select)
        kept = rss_gib() - start
        (-(lp * select).sum() / select.sum()).backward()
        return kept, start

    step()  # warm: the kernels load, the gradients' buffers exist
    model.zero_grad(set_to_none=False)
    base = rss_gib()
    times, kept = [], 0.0
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        kept, _ = step()
        times.append(time.perf_counter() - t0)
        model.zero_grad(set_to_none=False)
    return {
        "tokens": float(sum(lengths)),
        "base_gib": base,
        "forward_keeps_gib": kept,
        "peak_over_base_gib": peak_gib() - base,
        "seconds": min(times),
    }


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=4)
    p.add_argument("--prefix", type=int, default=330)
    p.add_argument("--lora", action="store_true", help="LoRA r16 adapters, base frozen")
    p.add_argument("--bf16", action="store_true", help="under bf16 autocast (float32 weights)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--only", default=",".join(SETTINGS), help="comma-separated settings")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args)))
        return {}
    out = {}
    for name in args.only.split(","):
        cmd = [sys.executable, __file__, "--child", name, "--rows", str(args.rows)]
        cmd += ["--prefix", str(args.prefix), "--repeats", str(args.repeats)]
        cmd += ["--lora"] if args.lora else []
        cmd += ["--bf16"] if args.bf16 else []
        env = {**os.environ, **SETTINGS[name]}
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if res.returncode != 0:
            raise SystemExit(f"{name}: exit {res.returncode}\n{res.stderr[-3000:]}")
        out[name] = json.loads(res.stdout.strip().splitlines()[-1])
        r = out[name]
        print(
            f"{name:6s} tokens {r['tokens']:.0f}  base {r['base_gib']:.2f} GiB  forward keeps "
            f"{r['forward_keeps_gib']:.2f} GiB  peak over base {r['peak_over_base_gib']:.2f} GiB"
            f"  fwd+bwd {r['seconds']:.2f} s",
            flush=True,
        )
    return out


if __name__ == "__main__":
    main()
