"""Every advantage estimator with the same seed and budget, plus the seed paper's ablations.

Runs the demo recipe's SFT warm start once, then RL from that same warm-started model once
per variant (same world, same seed, same number of RL steps), and records a table like
the Agent-R1 paper's: EM per split and hop count after RL (greedy), steps, minutes (RL and
evaluation; the shared warm start is timed separately). Ablations:

  - process rewards on vs off: steps until the training EM (moving average over 5 steps)
    first reaches ``--target-em``;
  - loss mask / advantage mask off vs on (GRPO and PPO).

    .venv/bin/python experiments/smollm2_multihop/algorithms.py          # everything (long)
    .venv/bin/python experiments/smollm2_multihop/algorithms.py --variants grpo rloo --steps 60

Results go to stdout as markdown and to ``runs/bench_algorithms/results.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from agentr1 import metric_records, train
from agentr1.config import load_config

VARIANTS: dict[str, list[str]] = {
    "ppo": ["algo.estimator=gae"],
    "grpo": ["algo.estimator=grpo"],
    "dr_grpo": ["algo.estimator=dr_grpo", "algo.agg_mode=seq-mean-token-sum"],
    "reinforce_plus_plus": ["algo.estimator=reinforce_plus_plus"],
    "reinforce_plus_plus_baseline": ["algo.estimator=reinforce_plus_plus_baseline"],
    "rloo": ["algo.estimator=rloo"],
    "grpo+process": ["algo.estimator=grpo", "task.process.enabled=true"],
    "ppo+process": ["algo.estimator=gae", "task.process.enabled=true"],
    "grpo-no-loss-mask": ["algo.estimator=grpo", "algo.loss_mask=false"],
    "ppo-no-advantage-mask": ["algo.estimator=gae", "algo.advantage_mask=false"],
    "ppo-no-masks": ["algo.estimator=gae", "algo.loss_mask=false", "algo.advantage_mask=false"],
}


def steps_to(em: list[float], target: float, window: int = 5) -> int | None:
    """First step at which the moving average of training EM reaches ``target``."""
    for i in range(len(em)):
        lo = max(0, i - window + 1)
        if sum(em[lo : i + 1]) / (i + 1 - lo) >= target:
            return i + 1
    return None


def warm_start_model(root: Path, extra: list[str]) -> Path:
    """The demo's SFT warm start, trained once and reused by every variant."""
    run_dir = root / "warm_start"
    model = run_dir / "final_model"
    if not (model / "config.json").exists():
        cfg = load_config(None, [*extra, "train.steps=0", f"train.run_dir={run_dir}"])
        train(cfg)
    return model


def run_variant(
    name: str, overrides: list[str], steps: int, root: Path, warm: Path, extra: list[str]
) -> dict[str, Any]:
    run_dir = root / name
    cfg = load_config(
        None,
        [
            *extra,
            *overrides,
            f"model.path={warm}",
            "sft.enabled=false",
            f"train.steps={steps}",
            f"train.run_dir={run_dir}",
        ],
    )
    t0 = time.perf_counter()
    summary = train(cfg)
    em = [r["em"] for r in metric_records(run_dir, "rl")]
    return {
        "name": name,
        "summary": summary,
        "train_em": em,
        "minutes": (time.perf_counter() - t0) / 60,
    }


def table(results: list[dict[str, Any]], target: float) -> str:
    cols = [
        ("test", "hops=1"),
        ("test", "hops=2"),
        ("test", "hops=3"),
        ("test", "all"),
        ("test_ood", "all"),
    ]
    head = " | ".join(f"{s} {g}" for s, g in cols)
    lines = [
        f"| variant | {head} | steps to EM {target} | minutes |",
        "|---|" + "---|" * (len(cols) + 2),
    ]
    for r in results:
        greedy = r["summary"]["eval_after"]["greedy"]
        cells = [f"{greedy.get(s, {}).get(g, {}).get('em', float('nan')):.3f}" for s, g in cols]
        reach = steps_to(r["train_em"], target)
        lines.append(
            f"| {r['name']} | "
            + " | ".join(cells)
            + f" | {reach if reach is not None else '>' + str(len(r['train_em']))}"
            + f" | {r['minutes']:.1f} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--target-em", type=float, default=0.6)
    ap.add_argument("--out", default="runs/bench_algorithms")
    ap.add_argument("overrides", nargs="*", help="section.field=value for every run")
    args = ap.parse_args()
    root = Path(args.out)
    root.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    warm = warm_start_model(root, args.overrides)
    print(f"warm start: {warm} ({(time.perf_counter() - t0) / 60:.1f} min)", flush=True)
    results = []
    for name in args.variants:
        results.append(run_variant(name, VARIANTS[name], args.steps, root, warm, args.overrides))
        (root / "results.json").write_text(json.dumps(results, indent=1, default=float))
        print(table(results, args.target_em), flush=True)


if __name__ == "__main__":
    main()
