"""The demo's rollouts with the `hf` sampler's decode settings on and off.

Runs the demo recipe's own rollout (`recipes/demo.yaml`: 16 questions x 8 samples, up to
5 turns of 48 tokens, the step's seeds) from a trained model, alternating in one process
five settings of the `hf` generator: the default (twins -- rows with the same tokens so
far -- decoded as one row, ``share_twins``; finished rows leave the decode batch,
``compact``; decode steps through the written-out `DecodePass`, ``fast_decode``, with the
native attention kernel, ``native_attention``), the default with every row decoded apart,
then also torch ops for the attention, with transformers' forward for decode steps, and
none of them. Every setting
samples the same episodes (row seeds: the draws do not depend on the batch) on the same machine
state. Reports per setting the median rollout seconds, decode passes, and the decode
batch's row-slots (rows fed per pass, summed) against the rows still live in them.

    .venv/bin/agentr1 train recipes/demo.yaml train.steps=0 train.run_dir=runs/demo_sft
    .venv/bin/python benchmarks/demo_rollout.py --model runs/demo_sft/final_model

(``train.steps=0`` runs the demo's SFT warm start and stops; ``runs/demo/final_model``,
after RL, gives the longer episodes of a trained agent.) Extra ``section.field=value``
overrides go to the recipe (e.g. ``train.tasks_per_step=4``).
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

import torch

from agentr1.backends import hf
from agentr1.config import load_config
from agentr1.rollout import RolloutStats, run_rollout
from agentr1.trainer.rollouts import step_rollout_config
from agentr1.trainer.setup import build_setup
from agentr1.trainer.state import make_state

RECIPE = "recipes/demo.yaml"


class PassLog:
    """Rows fed and rows live of every decode pass of an `HFGenerator` (a spy on its
    decode step: one token a row, a finished row fed the pad id)."""

    def __init__(self) -> None:
        self.fed = self.live = self.passes = 0
        self._step = hf.HFGenerator._decode_step

    def __enter__(self) -> PassLog:
        log, step = self, self._step

        def spy(gen: hf.HFGenerator, feed_B1: torch.Tensor, *args: Any) -> torch.Tensor:
            log.passes += 1
            log.fed += feed_B1.shape[0]
            log.live += int((feed_B1[:, 0] != gen.pad_id).sum())
            return step(gen, feed_B1, *args)

        hf.HFGenerator._decode_step = spy  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        hf.HFGenerator._decode_step = self._step  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", required=True, help="a model directory (the demo's SFT or final)")
    ap.add_argument("--steps", type=int, default=4, help="RL steps' rollouts per setting")
    ap.add_argument("--rounds", type=int, default=2, help="alternations of the two settings")
    ap.add_argument("overrides", nargs="*", help="section.field=value for the recipe")
    args = ap.parse_args(argv)
    cfg = load_config(RECIPE, [f"model.path={args.model}", "sft.enabled=false", *args.overrides])
    setup = build_setup(cfg)
    state = make_state(setup)
    gen = setup.generator
    assert isinstance(gen, hf.HFGenerator), "the demo samples with the hf backend"
    tasks = [state.sampler.sample(cfg.train.tasks_per_step) for _ in range(args.steps)]
    setup.policy.eval()
    settings = {  # name: (compact, fast_decode, native_attention, share_twins)
        "default": (True, True, True, True),
        "twins apart": (True, True, True, False),
        "torch attention": (True, True, False, False),
        "transformers' forward": (True, False, False, False),
        "neither": (False, False, False, False),
    }
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in settings}
    for _ in range(args.rounds):
        for name, (compact, fast, native, twins) in settings.items():
            gen.compact, gen.fast_decode, gen.native_attention = compact, fast, native
            gen.share_twins = twins
            for step, step_tasks in enumerate(tasks):
                stats = RolloutStats()
                with PassLog() as log:
                    cfg_step = step_rollout_config(state, step)
                    run_rollout(step_tasks, setup.make_env, gen, setup.chat, cfg_step, stats)
                rows[name].append(
                    {
                        "rollout_s": stats.total_s,
                        "generate_s": stats.generate_s,
                        "decode_s": stats.decode_s,
                        "prefill_s": stats.prefill_s,
                        "passes": log.passes,
                        "row_slots": log.fed,
                        "live": log.live,
                        "tokens": stats.generated_tokens,
                    }
                )
    out: dict[str, dict[str, float]] = {}
    for name, rs in rows.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        out[name] = med
        print(
            f"{name:>21}: rollout {med['rollout_s']:.3f} s (generate {med['generate_s']:.3f},"
            f" prefill {med['prefill_s']:.3f}, decode {med['decode_s']:.3f}),"
            f" {med['passes']:.0f} decode passes, {med['row_slots']:.0f} row-slots for"
            f" {med['live']:.0f} live ({med['live'] / med['row_slots']:.0%}),"
            f" {med['tokens']:.0f} tokens"
        )
    return out


if __name__ == "__main__":
    main()
