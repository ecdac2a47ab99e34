"""The `hf` sampler's decode pass, written out (`agentr1.backends.decode.DecodePass`,
with the native kernels or torch ops, from packed weights or the modules' own) or
through transformers' forward, side by side in one process.

Alternates five settings of `HFGenerator` (the default: native attention and, in bf16,
native products; ``native_linear=False``: oneDNN's products; both off: torch attention;
that and ``pack_weights_bytes=0``; ``fast_decode=False``) over ``--rounds`` rounds on the same
padded chunk of prompts (``--rows`` rows of about ``--context`` tokens, each row's length
a little different) and reports the median milliseconds a decode pass (the generator's own
clock of a call's decode passes, sampling included: `GenerationStats.decode_s`) against the
pass's bandwidth floor (every weight and the KV cache read once at ``--copy-gbs``), and
the median prefill of the chunk (`GenerationStats.prefill_s`: with native products the
written-out pass prefills too, elsewhere transformers' forward does).

    .venv/bin/python benchmarks/decode_pass.py                     # SmolLM2-135M's shape, bf16, 8 rows
    .venv/bin/python benchmarks/decode_pass.py --model runs/demo/final_model --dtype float32 \\
        --rows 128 --context 100 --new 48                          # the demo's model

Without ``--model`` the model is a randomly initialised Llama of SmolLM2-135M's
configuration (the same shapes and so the same time; no download).
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

import torch
from shaped_model import shaped_model

from agentr1.backends.base import SamplingParams
from agentr1.backends.hf import HFGenerator
from agentr1.backends.native import decode_linear


def smollm2_shaped() -> Any:
    return shaped_model("smollm2-135m", torch.float32)


def floor_ms(model: Any, rows: int, keys: float, size: int, copy_gbs: float) -> float:
    c = model.config
    weights = sum(p.numel() for p in model.parameters()) * size
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    kv = 2 * c.num_hidden_layers * c.num_key_value_heads * head_dim * size * rows * keys
    return (weights + kv) / (copy_gbs * 1e9) * 1e3


def main(argv: list[str] | None = None) -> dict[str, float]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default=None, help="a model directory (default: SmolLM2's shape)")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--context", type=int, default=370)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--copy-gbs", type=float, default=37.0, help="the machine's copy rate")
    ap.add_argument(
        "--no-amx",
        action="store_true",
        help="the native product kernel without AMX (its AVX512-BF16 path); run with\n"
        "ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16 to hold oneDNN to the same instructions:\n"
        "a CPU with AVX512-BF16 and no AMX, measured on one that has both",
    )
    args = ap.parse_args(argv)
    kernel = decode_linear()
    if kernel is not None:
        print(f"native product kernel: {kernel.use_amx(not args.no_amx)} path")
    dtype = getattr(torch, args.dtype)
    if args.model is None:
        model = smollm2_shaped().to(dtype)
    else:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype).eval()
    g = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    prompts = [
        torch.randint(3, vocab, (args.context - i % 4,), generator=g).tolist()
        for i in range(args.rows)
    ]
    gens = {
        "written out": HFGenerator(model),
        "oneDNN products": HFGenerator(model, native_linear=False),
        "torch attention": HFGenerator(model, native_attention=False, native_linear=False),
        "unpacked": HFGenerator(
            model, native_attention=False, native_linear=False, pack_weights_bytes=0
        ),
        "transformers": HFGenerator(model, fast_decode=False),
    }
    runs: dict[str, list[float]] = {name: [] for name in gens}
    prefills: dict[str, list[float]] = {name: [] for name in gens}
    outs: dict[str, list[list[int]]] = {}
    for _ in range(args.rounds):
        for name, gen in gens.items():
            done = gen.generate(
                prompts, SamplingParams(max_new_tokens=args.new + 1, temperature=0.0)
            )
            outs[name] = [c.token_ids for c in done]
            runs[name].append(gen.last_stats.ms_per_decode_pass)
            prefills[name].append(gen.last_stats.prefill_s * 1e3)
    size = torch.finfo(dtype).bits // 8
    floor = floor_ms(model, args.rows, args.context + args.new / 2, size, args.copy_gbs)
    result = {name: statistics.median(ms) for name, ms in runs.items()}
    for name, ms in list(result.items()):
        print(
            f"{name:>15}: {ms:.2f} ms a pass (rounds {min(runs[name]):.2f}-"
            f"{max(runs[name]):.2f}), floor {floor:.2f} ms: {floor / ms:.0%} of it; "
            f"prefill {statistics.median(prefills[name]):.0f} ms"
        )
        result[f"{name} prefill_ms"] = statistics.median(prefills[name])
    same = outs["torch attention"] == outs["transformers"] == outs["unpacked"]
    print(f"greedy tokens {'identical' if same else 'DIFFER'} between the three torch settings")
    # The native kernels round bf16 attention differently (float32 inside) and sum the
    # products in another order: greedy tokens agree until a near-tie breaks the other way.
    for name, key in (
        ("written out", "native_agreement"),
        ("oneDNN products", "attention_agreement"),
    ):
        pairs = [
            (a, b)
            for ra, rb in zip(outs[name], outs["transformers"], strict=True)
            for a, b in zip(ra, rb, strict=False)
        ]
        result[key] = sum(a == b for a, b in pairs) / max(1, len(pairs))
        print(f"{name}: greedy tokens equal to transformers': {result[key]:.0%}")
    result["floor_ms"] = floor
    result["identical"] = float(same)
    return result


if __name__ == "__main__":
    main()
