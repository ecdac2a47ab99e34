"""RL steps of the demo recipe with its episodes sampled in this process, by 1 or 2 Ray
rollout workers, and by 2 workers one step ahead (``async.max_staleness: 1``).

The demo recipe (embedded defaults: 16 tasks x 8 samples a step, the tiny Llama) after a
short SFT warm start done once (``--sft-steps``) and shared by every setting, so each
setting starts from the same weights and samples real multi-turn episodes. Each setting
runs ``--steps`` RL steps; the figure is the median of all but the first (the first
starts the workers). Reported per setting: step s, the rollout phase's share (for async:
the time the trainer waited for its batch), update s, steps/s, and the weight sync.

On this 2-core machine the point is the overhead of workers and of the object store, not
a speed-up: the driver's update and the workers' sampling share the same two cores.

    .venv/bin/python benchmarks/distributed.py                 # every setting
    .venv/bin/python benchmarks/distributed.py --steps 6 --json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import tempfile
import time
from pathlib import Path

SETTINGS: dict[str, list[str]] = {
    "in-process": [],
    "1 worker": ["distributed.rollout_workers=1"],
    "2 workers": ["distributed.rollout_workers=2"],
    "2 workers, async k=1": ["distributed.rollout_workers=2", "async.max_staleness=1"],
}


def run(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    from agentr1.config import load_config
    from agentr1.trainer.loop import rl_step
    from agentr1.trainer.run import RunDir
    from agentr1.trainer.setup import build_setup
    from agentr1.trainer.sft import warm_start
    from agentr1.trainer.state import make_state

    base = [
        f"sft.steps={args.sft_steps}",
        "train.log_trajectories=0",
        "train.log_rollouts=false",
        f"train.threads={args.threads}",
        "distributed.num_cpus=2",
        "distributed.worker_threads=1",
    ]
    tmp = Path(tempfile.mkdtemp(prefix="agentr1-bench-dist-"))
    cfg = load_config(None, [*base, f"train.run_dir={tmp / 'warm'}"])
    setup = build_setup(cfg)
    warm_start(setup, RunDir(cfg.train.run_dir, cfg, fresh=True))
    warm = {k: v.clone() for k, v in setup.policy.state_dict().items()}
    out: dict[str, dict[str, float]] = {}
    for name, extra in SETTINGS.items():
        if args.only and name not in args.only:
            continue
        scfg = load_config(None, [*base, *extra, f"train.run_dir={tmp / name.replace(' ', '_')}"])
        setup.policy.load_state_dict(warm)
        setup.sync_sampler()
        s = make_state(dataclasses.replace(setup, cfg=scfg))
        run_dir = RunDir(scfg.train.run_dir, scfg, fresh=True)
        rows = []
        try:
            for _ in range(args.steps):
                t0 = time.perf_counter()
                m = rl_step(s, run_dir)
                m["wall"] = time.perf_counter() - t0
                rows.append(m)
                s.step += 1
        finally:
            if s.rollouts is not None:
                s.rollouts.close()
        later = rows[1:]
        episodes = scfg.train.tasks_per_step * scfg.rollout.n_samples

        def med(key: str, rows: list[dict[str, float]] = later) -> float:
            return statistics.median(r.get(key, 0.0) for r in rows)

        out[name] = {
            "step_s": med("wall"),
            "rollout_s": med("time/rollout"),
            "update_s": med("time/update"),
            "sync_s": med("time/sync_sampler"),
            "steps_per_s": 1 / med("wall"),
            "sampled_tokens": med("response_len") * episodes,
            "tokens": med("episode_len") * episodes,
            "reward": statistics.mean(r["reward"] for r in rows),
            "staleness_mean": med("async/staleness_mean"),
        }
        print(name, json.dumps({k: round(v, 3) for k, v in out[name].items()}), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--sft-steps", type=int, default=300)
    ap.add_argument("--threads", type=int, default=2, help="torch threads of the driver")
    ap.add_argument("--only", nargs="*", help="settings to run (default: all)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    results = run(args)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    base = results.get("in-process", {}).get("step_s")
    print(
        "\n| setting | step s | rollout s | update s | weight sync s | steps/s | vs in-process "
        "| sampled / all tokens a step |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        ratio = f"{r['step_s'] / base:.2f}x" if base else "-"
        print(
            f"| {name} | {r['step_s']:.2f} | {r['rollout_s']:.2f} | {r['update_s']:.2f} | "
            f"{r['sync_s']:.3f} | {r['steps_per_s']:.2f} | {ratio} | "
            f"{r['sampled_tokens']:,.0f} / {r['tokens']:,.0f} |"
        )


if __name__ == "__main__":
    main()
