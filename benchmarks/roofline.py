"""Each phase of an RL step against this machine's limits, measured in one run.

The limits are measured first, in the same process: matmul GFLOP/s at n = 2048 in fp32
and bf16, and the bandwidth of a 1 GiB copy. Then four phases of the given model, with
agentr1's own code paths (`HFGenerator` for sampling, `token_logprobs` for the trainer's
passes):

- decode: one pass per token of ``--rows`` rows after a ``--context``-token prompt (the
  generator's own clock of its decode passes, `GenerationStats.decode_s`); its
  floor is the bytes a pass must read (every weight once, plus the KV cache) at the copy's
  rate (bytes read plus bytes written a second). Achieved = floor / measured time.
- prefill: the prompt pass of the same rows (``logits_to_keep=1``); FLOPs = 2 x weights
  x tokens + attention, against the matmul peak of the compute dtype.
- reference: the no-grad log-prob pass of the trainer (`sorted_token_logprobs`) over
  ``--rows`` rows of ``--train-len`` tokens, a fifth of them sampled (LM head only there).
- update: forward + backward of the same rows (``token_logprobs`` then the mean log-prob's
  gradient), 3x the forward FLOPs for full weights, 2x with ``--lora`` (no weight
  gradients for the frozen base).

    .venv/bin/python benchmarks/roofline.py                                  # SmolLM2-135M, bf16
    .venv/bin/python benchmarks/roofline.py --model runs/demo/final_model \\
        --dtype float32 --rows 128 --context 100 --new 48 --train-len 160    # the demo's model
    python3 benchmarks/roofline.py --device cuda --shape qwen2.5-3b \\
        --rows 64 --context 1024 --new 128 --train-len 2048                  # on a GPU

``--shape smollm2-135m`` or ``--shape qwen2.5-3b`` builds a randomly initialised model of
that configuration instead of loading one (the same shapes, so the same time; no
download): the way to measure a GPU that holds no weights. On CUDA every timing is
bracketed by a synchronisation, the matmul peak is measured at ``--matmul-n`` (8192 is
the GPU's own scale) and the copy at ``--copy-mib``.

Timing on a shared machine is noisy: run it with nothing else on the cores; every figure
is the best of ``--repeats``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import torch
from shaped_model import SHAPES, shaped_model


def sync(device: torch.device | str = "cpu") -> None:
    """Waits for the device's queued work (a no-op on the CPU, whose ops return done)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def best_of(fn: Callable[[], Any], repeats: int, device: torch.device | str = "cpu") -> float:
    fn()  # warm-up (allocations, oneDNN primitives, CUDA kernels' first launch)
    times = []
    for _ in range(repeats):
        sync(device)
        t = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t)
    return min(times)


def machine_limits(
    repeats: int, n: int = 2048, copy_mib: int = 1024, device: str = "cpu"
) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        a = torch.randn(n, n, dtype=dtype, device=device)
        b = torch.randn(n, n, dtype=dtype, device=device)
        s = best_of(lambda a=a, b=b: a @ b, repeats, device)
        out[f"matmul_{name}_gflops"] = 2 * n**3 / s / 1e9
    src = torch.ones(copy_mib << 18, dtype=torch.float32, device=device)  # copy_mib MiB
    dst = torch.empty_like(src)
    s = best_of(lambda: dst.copy_(src), repeats, device)
    out["copy_gbs"] = 2 * src.nbytes / s / 1e9  # read + write
    return out


def shape(model: Any) -> dict[str, int]:
    c = model.config
    heads = c.num_attention_heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
    kv = getattr(c, "num_key_value_heads", heads)
    H, inter = c.hidden_size, c.intermediate_size
    per_layer = H * heads * head_dim * 2 + H * kv * head_dim * 2 + 3 * H * inter
    return {
        "layers": c.num_hidden_layers,
        "heads": heads,
        "kv_heads": kv,
        "head_dim": head_dim,
        "body": per_layer * c.num_hidden_layers,  # matmul weights of the decoder layers
        "head": H * c.vocab_size,
    }


def attention_flops(sh: dict[str, int], queries: int, keys_seen: float) -> float:
    """QK and AV of ``queries`` query tokens that each see ``keys_seen`` keys on average."""
    return 4 * sh["layers"] * sh["heads"] * sh["head_dim"] * queries * keys_seen


def phases(args: argparse.Namespace, limits: dict[str, float]) -> dict[str, dict[str, float]]:
    from agentr1.backends.base import SamplingParams
    from agentr1.backends.hf import HFGenerator
    from agentr1.trainer.logprobs import sorted_token_logprobs, token_logprobs

    dtype = getattr(torch, args.dtype)
    device = torch.device(args.device)
    if args.shape:
        gen = HFGenerator(shaped_model(args.shape, dtype, args.device))
    else:
        gen = HFGenerator.from_pretrained(args.model, dtype=dtype, device=args.device)
    model = gen.model
    sh = shape(model)
    peak = limits["matmul_bf16_gflops" if dtype == torch.bfloat16 else "matmul_fp32_gflops"]
    size = torch.finfo(dtype).bits // 8
    g = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    B, P, N = args.rows, args.context, args.new
    # Prompts of P, P-1, ... tokens: a padded chunk, as in a rollout.
    prompts = [torch.randint(3, vocab, (P - i % 4,), generator=g).tolist() for i in range(B)]

    def sample(new: int) -> None:
        gen.generate(prompts, SamplingParams(max_new_tokens=new, temperature=1.0, seed=1))

    t_prefill = best_of(lambda: sample(1), args.repeats, device)
    # The generator's own clock of its decode passes (sampling included): not a
    # difference of two calls, which carries the prefill's noise into every pass.
    per_pass = []
    for _ in range(args.repeats):
        sample(N + 1)
        per_pass.append(gen.last_stats.ms_per_decode_pass / 1e3)
    t_pass = min(per_pass)
    tokens = sum(len(p) for p in prompts)
    out: dict[str, dict[str, float]] = {}
    kv_bytes = 2 * sh["layers"] * sh["kv_heads"] * sh["head_dim"] * size * B * (P + N / 2)
    weight_bytes = (sh["body"] + sh["head"]) * size
    # Every byte read once at the copy's rate (its reads and writes together): the floor
    # of a pass that streams the weights.
    floor = (weight_bytes + kv_bytes) / (limits["copy_gbs"] * 1e9)
    out["decode"] = {
        "ms": t_pass * 1e3,
        "floor_ms": floor * 1e3,
        "of_limit": floor / t_pass,
        "tokens_per_s": B / t_pass,
    }
    fl = 2 * sh["body"] * tokens + attention_flops(sh, tokens, P / 2) + 2 * sh["head"] * B
    out["prefill"] = {"ms": t_prefill * 1e3, "gflops": fl / t_prefill / 1e9}
    out["prefill"]["of_limit"] = out["prefill"]["gflops"] / peak

    # The trainer's passes: fp32 weights under autocast when the dtype is bf16 (the
    # recipe's model.compute_dtype), the dtype's own weights otherwise.
    model = model.float() if dtype == torch.bfloat16 else model
    T = args.train_len
    ids = torch.randint(3, vocab, (B, T), generator=g).to(device)
    mask = torch.ones(B, T, dtype=torch.long, device=device)
    sel = torch.zeros(B, T, dtype=torch.long, device=device)
    sel[:, T - T // 5 :] = 1  # the sampled fifth, at the end as in an episode's last turn
    n_sel = int(sel[:, 1:].sum())
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype == torch.bfloat16)
    if args.lora:
        from agentr1.lora import apply_lora

        apply_lora(model, rank=16, alpha=32)

    def reference() -> None:
        with autocast:
            sorted_token_logprobs(model, ids, mask, sel, 1.0, rows=args.micro_batch)

    fwd = 2 * sh["body"] * B * T + attention_flops(sh, B * T, T / 2) + 2 * sh["head"] * n_sel
    t_ref = best_of(reference, args.repeats, device)
    out["reference"] = {"ms": t_ref * 1e3, "gflops": fwd / t_ref / 1e9}
    out["reference"]["of_limit"] = out["reference"]["gflops"] / peak
    model.train()

    def update() -> None:
        model.zero_grad(set_to_none=True)
        for idx in torch.arange(B, device=device).split(args.micro_batch):
            with autocast:
                lp, _ = token_logprobs(model, ids[idx], mask[idx], sel[idx])
                (-lp.sum() / n_sel).backward()

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t_upd = best_of(update, args.repeats, device)
    factor = 2 if args.lora else 3
    out["update"] = {"ms": t_upd * 1e3, "gflops": factor * fwd / t_upd / 1e9}
    out["update"]["of_limit"] = out["update"]["gflops"] / peak
    if device.type == "cuda":  # the update's peak: fp32 weights, gradients, activations
        out["update"]["peak_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument(
        "--shape", choices=sorted(SHAPES), help="a random model of this shape, not --model"
    )
    ap.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--context", type=int, default=370, help="prompt tokens a row (decode)")
    ap.add_argument("--new", type=int, default=64, help="decode passes timed")
    ap.add_argument("--train-len", type=int, default=400, help="tokens a row (trainer)")
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--lora", action="store_true", help="LoRA r16 for the update")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--matmul-n", type=int, default=2048, help="matmul size for the peak")
    ap.add_argument("--copy-mib", type=int, default=1024, help="MiB copied for the bandwidth")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--record", help="append the figures as one JSON line to this file")
    ap.add_argument("--name", default="", help="the record's name")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    limits = machine_limits(args.repeats, args.matmul_n, args.copy_mib, args.device)
    results = phases(args, limits)
    if args.record:
        with open(args.record, "a") as f:
            f.write(
                json.dumps(
                    {"name": args.name, "args": vars(args), "limits": limits, "phases": results}
                )
                + "\n"
            )
    if args.json:
        print(json.dumps({"limits": limits, "phases": results}, indent=2))
        return {"limits": limits, "phases": results}
    print(
        f"limits: matmul {limits['matmul_fp32_gflops']:.0f} GFLOP/s fp32, "
        f"{limits['matmul_bf16_gflops']:.0f} bf16; copy {limits['copy_gbs']:.1f} GB/s"
    )
    d = results["decode"]
    print(
        f"decode    {d['ms']:8.1f} ms a pass   floor {d['floor_ms']:.1f} ms   "
        f"{100 * d['of_limit']:.0f}% of the bandwidth floor   {d['tokens_per_s']:.0f} tokens/s"
    )
    for name in ("prefill", "reference", "update"):
        r = results[name]
        print(
            f"{name:9} {r['ms']:8.1f} ms          {r['gflops']:.0f} GFLOP/s   "
            f"{100 * r['of_limit']:.0f}% of the matmul peak"
        )
    if "peak_gib" in results["update"]:
        print(f"update's peak device memory {results['update']['peak_gib']:.1f} GiB")
    return {"limits": limits, "phases": results}


if __name__ == "__main__":
    main()
