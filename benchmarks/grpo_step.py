"""One GRPO step on the real multi-hop QA task, timed by phase, next to TRL's GRPOTrainer.

The peer (measured on this machine class and given in the developers' guide): TRL 1.16's
GRPOTrainer takes ~53 s a GRPO step for SmolLM2-135M with 8 completions, two search calls
and 256 new tokens (~21 s generating, ~33 s updating) at 11 GiB RSS.

This runs the real training loop (`agentr1.trainer.loop.train`) of
``recipes/multihop_smollm2.yaml`` with one question x 8 samples a step (a GRPO group of 8),
from a model that already searches (the recipe's SFT warm start by default: the untrained
model never calls the tool), and reports per step: rollout (generation + BM25 searches),
reference and old log-probs, update, the whole step, the agent's sampled tokens and tool
calls per episode; then the process's peak RSS. The first step pays one-off costs (lazy
init, allocator growth): the summary is the median of the later ones.

    .venv/bin/python benchmarks/grpo_step.py --steps 4 \\
        --model runs/multihop_real2/warm_start/final_model task.config.data_dir=../shared/data/raw

Extra ``section.field=value`` overrides go to the recipe (e.g. ``optim.minibatches=4``).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import tempfile
from pathlib import Path

from agentr1.config import load_config
from agentr1.trainer.loop import train
from agentr1.trainer.run import metric_records

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "multihop_smollm2.yaml"
TRL = {"step": 53.0, "generate": 21.0, "update": 33.0, "rss_gib": 11.0}
WARM_START = "runs/multihop_real2/warm_start/final_model"
PHASES = ("time/rollout", "time/old_logprobs", "time/reference", "time/update", "time/step")


def check_warm_start(ap: argparse.ArgumentParser, model: str) -> None:
    """Stop with the command that makes it when ``model`` is the missing default warm start
    (``from_pretrained`` would take the path for a hub id and say so, unhelpfully)."""
    if model == WARM_START and not Path(WARM_START).is_dir():
        ap.error(
            f"no {WARM_START}: make the recipe's warm start first (experiments/smollm2_multihop/"
            "multihop_real.py warm --root runs/multihop_real2) or pass --model DIR"
        )


def summarize(rows: list[dict[str, float]]) -> dict[str, float]:
    """Median over the steps after the first (all of them if there is only one)."""
    later = rows[1:] or rows
    keys = (*PHASES, "response_len", "tool_calls", "episode_len")
    return {k: statistics.median(r.get(k, 0.0) for r in later) for k in keys}


def main(argv: list[str] | None = None) -> list[dict[str, float]]:
    """Run and print; returns the timed steps' metric rows."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default=WARM_START, help="a model that calls the search tool")
    ap.add_argument("--steps", type=int, default=4, help="RL steps to time (the first is warm-up)")
    ap.add_argument("--samples", type=int, default=8, help="completions per question (group)")
    ap.add_argument("--recipe", default=str(RECIPE))
    ap.add_argument("overrides", nargs="*", help="section.field=value")
    args = ap.parse_args(argv)
    if args.steps < 1:
        ap.error("--steps must be >= 1")
    check_warm_start(ap, args.model)
    with tempfile.TemporaryDirectory(prefix="grpo_step_") as tmp:
        cfg = load_config(
            args.recipe,
            [
                *args.overrides,
                f"model.path={args.model}",
                f"rollout.n_samples={args.samples}",
                "train.tasks_per_step=1",
                f"train.steps={args.steps + 1}",
                "train.checkpoint_every=0",
                "sft.enabled=false",
                "eval.before=false",
                f"train.run_dir={tmp}",
            ],
        )
        train(cfg, stop_after=args.steps)  # stops before the final eval
        rows = metric_records(Path(tmp), "rl")
    rss_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
    print(
        "| step | rollout s | old logprobs s | reference s | update s | step s "
        "| sampled tokens / episode | tool calls / episode |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for i, r in enumerate(rows):
        t = " | ".join(f"{r.get(k, 0.0):.1f}" for k in PHASES)
        print(f"| {i} | {t} | {r['response_len']:.0f} | {r['tool_calls']:.2f} |")
    s = summarize(rows)
    print(
        f"\nmedian of steps 1..{len(rows) - 1 or 0}: step {s['time/step']:.1f} s (rollout "
        f"{s['time/rollout']:.1f}, reference + old logprobs "
        f"{s['time/reference'] + s['time/old_logprobs']:.1f}, update {s['time/update']:.1f}); "
        f"{args.samples} episodes of {s['response_len']:.0f} sampled tokens, "
        f"{s['tool_calls']:.2f} searches, {s['episode_len']:.0f} tokens in all; "
        f"peak RSS {rss_gib:.1f} GiB"
    )
    print(
        f"TRL GRPOTrainer (guide): {TRL['step']:.0f} s a step ({TRL['generate']:.0f} generating, "
        f"{TRL['update']:.0f} updating), {TRL['rss_gib']:.0f} GiB -> step ratio "
        f"{s['time/step'] / TRL['step']:.2f}, RSS ratio {rss_gib / TRL['rss_gib']:.2f}"
    )
    sys.stdout.flush()
    return rows


if __name__ == "__main__":
    main()
