"""What a GRPO group sees at each sampling temperature: the rollout of a model on training
questions, G samples each, at several temperatures, next to its greedy episode.

    .venv/bin/python experiments/smollm2_multihop/temperature_probe.py --questions 12 --samples 4 \\
        task.config.data_dir=../shared/data/raw --temperatures 0.3 0.5 0.7 1.0

Reported per temperature: mean EM and reward of the samples (greedy's EM beside them),
the share of groups whose rewards are not all equal (only those give GRPO a gradient),
the share with at least one exact answer, searches per episode and the share of
episodes that end without an answer. Read with NOTES.md's RL sections: a policy whose
samples score far below its own greedy answer spends RL's signal on sharpening towards
that greedy answer, which a greedy evaluation does not see.

Extra ``section.field=value`` overrides go to the recipe.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from pathlib import Path
from typing import Any

from agentr1 import build_setup
from agentr1.config import load_config
from agentr1.rollout import run_rollout

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "multihop_smollm2.yaml"
WARM_START = "runs/multihop_real2/warm_start/final_model"


def check_warm_start(ap: argparse.ArgumentParser, model: str) -> None:
    """Stop with the command that makes it when ``model`` is the missing default warm start
    (``from_pretrained`` would take the path for a hub id and say so, unhelpfully)."""
    if model == WARM_START and not Path(WARM_START).is_dir():
        ap.error(
            f"no {WARM_START}: make the recipe's warm start first (experiments/smollm2_multihop/"
            "multihop_real.py warm --root runs/multihop_real2) or pass --model DIR"
        )


def group_summary(groups: list[Any]) -> dict[str, float]:
    """Means over episodes and shares over groups (see the module docstring)."""
    trajs = [t for g in groups for t in g.trajectories]
    rewards = [[t.total_reward for t in g.trajectories] for g in groups]
    return {
        "em": statistics.mean(t.metrics.get("em", 0.0) for t in trajs),
        "reward": statistics.mean(t.total_reward for t in trajs),
        "mixed": statistics.mean(float(max(r) - min(r) > 1e-9) for r in rewards),
        "any_em": statistics.mean(
            float(any(t.metrics.get("em", 0.0) == 1.0 for t in g.trajectories)) for g in groups
        ),
        "searches": statistics.mean(float(len(t.tool_log)) for t in trajs),
        "unanswered": statistics.mean(float(t.answer is None) for t in trajs),
    }


def main(argv: list[str] | None = None) -> dict[float, dict[str, float]]:
    """Run and print; returns the summary per temperature (0.0 = greedy, one sample)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default=WARM_START)
    ap.add_argument("--questions", type=int, default=12, help="training questions")
    ap.add_argument("--samples", type=int, default=4, help="episodes per question (group)")
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.3, 0.5, 0.7, 1.0])
    ap.add_argument("--recipe", default=str(RECIPE))
    ap.add_argument("overrides", nargs="*", help="section.field=value")
    args = ap.parse_args(argv)
    check_warm_start(ap, args.model)
    if any(t <= 0 for t in args.temperatures):
        ap.error("--temperatures must be > 0 (greedy is always run)")
    cfg = load_config(
        args.recipe, [*args.overrides, f"model.path={args.model}", "sft.enabled=false"]
    )
    setup = build_setup(cfg)
    tasks = setup.tasks["train"][: args.questions]
    out: dict[float, dict[str, float]] = {}
    print(f"{len(tasks)} training questions, {args.model}")
    print(
        "| T | samples | EM | reward | groups mixed | groups with an EM | searches | no answer | s |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for temp in [0.0, *args.temperatures]:
        n = 1 if temp == 0 else args.samples
        rcfg = dataclasses.replace(cfg.rollout, temperature=temp, n_samples=n, seed=0)
        t0 = time.perf_counter()
        groups = run_rollout(tasks, setup.make_env, setup.generator, setup.chat, rcfg)
        s = out[temp] = {**group_summary(groups), "s": time.perf_counter() - t0}
        mixed = "-" if n == 1 else f"{s['mixed']:.2f}"
        print(
            f"| {'greedy' if temp == 0 else temp} | {n} | {s['em']:.3f} | {s['reward']:.3f} | "
            f"{mixed} | {s['any_em']:.2f} | {s['searches']:.2f} | {s['unanswered']:.2f} | "
            f"{s['s']:.0f} |",
            flush=True,
        )
    return out


if __name__ == "__main__":
    main()
