"""Keeping each episode's KV cache between turns, against re-prefilling every turn, in the
real multi-hop QA rollout (`agentr1.rollout.run_rollout` with the `hf` generator).

    .venv/bin/python benchmarks/kept_cache.py --questions 2 --samples 8 --repeats 2 \\
        --model runs/multihop_real2/warm_start/final_model task.config.data_dir=../shared/data/raw

The recipe's sampler (bf16 copy) and BM25 search, from a model that searches (the SFT warm
start by default). The same rollout (same questions, samples and seed) runs with
``model.keep_kv_gib`` at 0 and at the recipe's value, alternating, ``--repeats`` times
each; reported: wall time, generation time, prompt tokens actually prefilled (after the
shared prefix and the kept caches), peak kept bytes, and whether the two settings sampled
the same tokens (bf16 numerics may flip a near-tie; greedy ``--temperature 0`` compares
log-probs token for token).

Extra ``section.field=value`` overrides go to the recipe.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from grpo_step import RECIPE, WARM_START, check_warm_start

from agentr1.backends.base import Completion, SamplingParams
from agentr1.backends.hf import HFGenerator
from agentr1.config import load_config
from agentr1.rollout import RolloutStats, run_rollout
from agentr1.trainer.setup import build_setup


class Counting:
    """Wraps an HFGenerator: sums its per-call stats over a rollout, keeps ``session``."""

    def __init__(self, gen: HFGenerator) -> None:
        self.gen = gen
        self.prefilled = self.kept = self.peak_kept_bytes = 0
        self.session = gen.session

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        out = self.gen.generate(prompts, params)
        s = self.gen.last_stats
        self.kept += s.kept_tokens
        self.prefilled += s.prompt_tokens - s.kept_tokens - s.shared_prefix_tokens
        if self.gen.kept is not None:
            self.peak_kept_bytes = max(self.peak_kept_bytes, self.gen.kept.nbytes)
        return out


def rollout(setup: Any, keep_bytes: int, args: argparse.Namespace) -> dict[str, Any]:
    cfg = setup.cfg
    setup.generator.keep_cache_bytes = keep_bytes
    gen = Counting(setup.generator)
    stats = RolloutStats()
    tasks = setup.tasks["train"][: args.questions]
    t0 = time.perf_counter()
    groups = run_rollout(tasks, setup.make_env, gen, setup.chat, cfg.rollout, stats)
    trajs = [t for g in groups for t in g.trajectories]
    return {
        "wall": time.perf_counter() - t0,
        "generate": stats.generate_s,
        "prefilled": gen.prefilled,
        "kept": gen.kept,
        "peak_mib": gen.peak_kept_bytes / 2**20,
        "tokens": [t.token_ids for t in trajs],
        "logprobs": [lp for t in trajs for lp, m in zip(t.logprobs, t.loss_mask, strict=True) if m],
    }


def main(argv: list[str] | None = None) -> dict[str, list[dict[str, Any]]]:
    """Run and print; returns each setting's rollouts."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default=WARM_START, help="a model that calls the search tool")
    ap.add_argument("--questions", type=int, default=2)
    ap.add_argument("--samples", type=int, default=8, help="episodes per question")
    ap.add_argument("--repeats", type=int, default=2, help="rollouts per setting")
    ap.add_argument("--temperature", type=float, default=None, help="default: the recipe's")
    ap.add_argument("--recipe", default=str(RECIPE))
    ap.add_argument("overrides", nargs="*", help="section.field=value")
    args = ap.parse_args(argv)
    check_warm_start(ap, args.model)
    extra = [] if args.temperature is None else [f"rollout.temperature={args.temperature}"]
    cfg = load_config(
        args.recipe,
        [
            *args.overrides,
            *extra,
            f"model.path={args.model}",
            f"rollout.n_samples={args.samples}",
            "rollout.seed=0",
            "sft.enabled=false",
        ],
    )
    setup = build_setup(cfg)
    keep = int(cfg.model.keep_kv_gib * 2**30)
    runs: dict[str, list[dict[str, Any]]] = {"re-prefill": [], "kept": []}
    for _ in range(args.repeats):
        runs["re-prefill"].append(rollout(setup, 0, args))
        runs["kept"].append(rollout(setup, keep, args))

    print(
        f"{args.questions} questions x {args.samples} samples, T={cfg.rollout.temperature}, "
        f"median of {args.repeats}:"
    )
    print("| setting | rollout s | generate s | prompt tokens prefilled | kept tokens | kept MiB |")
    print("|---|---|---|---|---|---|")
    med = {}
    for name, rs in runs.items():
        med[name] = {k: statistics.median(r[k] for r in rs) for k in ("wall", "generate")}
        r = rs[0]
        print(
            f"| {name} | {med[name]['wall']:.1f} | {med[name]['generate']:.1f} | "
            f"{r['prefilled']:,} | {r['kept']:,} | {r['peak_mib']:.0f} |"
        )
    a, b = runs["re-prefill"][0], runs["kept"][0]
    same = sum(x == y for x, y in zip(a["tokens"], b["tokens"], strict=True))
    print(
        f"speed-up: rollout {med['re-prefill']['wall'] / med['kept']['wall']:.2f}x, "
        f"generation {med['re-prefill']['generate'] / med['kept']['generate']:.2f}x; "
        f"{same}/{len(a['tokens'])} episodes sampled the same tokens in both settings"
    )
    if a["tokens"] == b["tokens"]:
        d = [abs(x - y) for x, y in zip(a["logprobs"], b["logprobs"], strict=True)]
        print(
            f"|log-prob difference| over {len(d)} agent tokens: mean {statistics.mean(d):.3g}, "
            f"max {max(d):.3g}"
        )
    return runs


if __name__ == "__main__":
    main()
