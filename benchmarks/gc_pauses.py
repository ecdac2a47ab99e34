"""What Python's cyclic garbage collector takes from the demo's RL steps, with the
setup's objects in its walk (plain) and frozen out of it (`agentr1.trainer.state.
settled_heap`, which `rl_steps` and `run_eval` run in), alternating in one process.

Runs the demo recipe's RL steps from a model (SFT off), ``--steps`` a setting and
``--rounds`` alternations, timing every collection (``gc.callbacks``). Reports per setting
the objects the collector tracks when its steps start, and per step the median wall
seconds and the mean collector seconds and collections (all, and full: generation 2;
a full collection comes every few steps, so a median would miss it).

    .venv/bin/agentr1 train recipes/demo.yaml train.steps=0 train.run_dir=runs/demo_sft
    .venv/bin/python benchmarks/gc_pauses.py --model runs/demo/final_model

Extra ``section.field=value`` overrides go to the recipe (e.g. ``train.tasks_per_step=4``).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import tempfile
import time
from contextlib import nullcontext
from typing import Any

from agentr1.config import Config, load_config
from agentr1.trainer.loop import close_run, rl_step
from agentr1.trainer.run import RunDir
from agentr1.trainer.setup import build_setup
from agentr1.trainer.state import TrainState, make_state, settled_heap

RECIPE = "recipes/demo.yaml"


class Collections:
    """Seconds and counts of the collector's passes during the object's ``with`` block
    (a ``gc.callbacks`` entry for that long)."""

    def __init__(self) -> None:
        self.seconds = self.full_seconds = 0.0
        self.count = self.full = 0
        self._t = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t = time.perf_counter()
            return
        took = time.perf_counter() - self._t
        self.seconds += took
        self.count += 1
        if info["generation"] == 2:
            self.full_seconds += took
            self.full += 1

    def __enter__(self) -> Collections:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)


def demo_rl(model: str, run_dir: str, overrides: list[str]) -> tuple[Config, RunDir, TrainState]:
    """The demo recipe's RL from ``model`` (SFT off, no trajectories logged) in
    ``run_dir``: its config, run directory and training state, before the first step."""
    cfg = load_config(
        RECIPE,
        [
            f"model.path={model}",
            "sft.enabled=false",
            f"train.run_dir={run_dir}",
            "train.log_trajectories=0",
            *overrides,
        ],
    )
    state = make_state(build_setup(cfg))
    return cfg, RunDir(cfg.train.run_dir, cfg, fresh=True), state


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", required=True, help="a model directory (the demo's SFT or final)")
    ap.add_argument("--steps", type=int, default=3, help="RL steps a setting and round")
    ap.add_argument("--rounds", type=int, default=3, help="alternations of the two settings")
    ap.add_argument("overrides", nargs="*", help="section.field=value for the recipe")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as run_dir:
        _, run, state = demo_rl(args.model, run_dir, args.overrides)
        rows: dict[str, list[dict[str, float]]] = {"plain": [], "settled": []}
        try:
            rl_step(state, run)  # the first step builds what the others reuse
            state.step += 1
            for _ in range(args.rounds):
                for name in rows:
                    heap = settled_heap() if name == "settled" else nullcontext()
                    with heap:
                        tracked = len(gc.get_objects())
                        for _ in range(args.steps):
                            with Collections() as c:
                                t0 = time.perf_counter()
                                rl_step(state, run)
                                wall = time.perf_counter() - t0
                            state.step += 1
                            rows[name].append(
                                {
                                    "step_s": wall,
                                    "gc_s": c.seconds,
                                    "full_gc_s": c.full_seconds,
                                    "collections": c.count,
                                    "full": c.full,
                                    "tracked": tracked,
                                }
                            )
        finally:
            close_run(run, state)
    out: dict[str, dict[str, float]] = {}
    for name, rs in rows.items():
        # means, but the step's median: full collections come every few steps
        med: dict[str, Any] = {k: statistics.mean(r[k] for r in rs) for k in rs[0]}
        med["step_s"] = statistics.median(r["step_s"] for r in rs)
        out[name] = med
        print(
            f"{name:>8}: {med['tracked']:,.0f} objects tracked; a step {med['step_s']:.3f} s,"
            f" the collector {med['gc_s']:.3f} s ({med['gc_s'] / med['step_s']:.1%}) in"
            f" {med['collections']:.1f} collections, {med['full']:.2f} full"
            f" ({med['full_gc_s']:.3f} s)"
        )
    return out


if __name__ == "__main__":
    main()
