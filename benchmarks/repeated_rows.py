"""The demo's RL passes with repeated rows computed once and computed as every row,
alternating in one process (`agentr1.trainer.logprobs.distinct_rows`).

A GRPO group of a policy that is sure of itself samples the same episode several times.
This runs ``--steps`` RL steps of the demo recipe from a model (SFT off), keeps each
step's update call (`agentr1.trainer.update.rl_update`, its learner, batch and configs)
and reference pass inputs, then replays both on every kept batch, ``--rounds`` times, the
two settings taking turns within a round: collapsed (the default) and every row
(`distinct_rows` made to find none). A replayed update is a real update (it steps the
optimizer; the work does not change). Reports per batch its rows, distinct rows, real
and sampled tokens, and the copies' share of them; per setting the median seconds of the
update and of the reference pass; returns those medians and, under ``batches``, each
batch's facts.

    .venv/bin/agentr1 train recipes/demo.yaml train.steps=0 train.run_dir=runs/demo_sft
    .venv/bin/python benchmarks/repeated_rows.py --model runs/demo_sft/final_model

(``runs/demo/final_model``, after RL, gives a trained agent's batches.) Extra
``section.field=value`` overrides go to the recipe.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
from gc_pauses import demo_rl

from agentr1.trainer import logprobs
from agentr1.trainer import loop as trainer_loop
from agentr1.trainer.loop import close_run, rl_step
from agentr1.trainer.setup import train_autocast
from agentr1.trainer.update import rl_update

SETTINGS = ("collapsed", "every row")


@contextmanager
def every_row() -> Any:
    """`distinct_rows` finds no copies for as long as the block runs."""
    found = logprobs.distinct_rows
    logprobs.distinct_rows = lambda *_: None  # type: ignore[assignment]
    try:
        yield
    finally:
        logprobs.distinct_rows = found  # type: ignore[assignment]


def describe(batch: Any) -> dict[str, float]:
    """Rows, distinct rows, tokens and the copies' share of the real and sampled tokens."""
    ids, attn, mask = batch.input_ids_BT, batch.attention_mask_BT, batch.loss_mask_BT
    found = logprobs.distinct_rows(ids, attn)
    first = torch.arange(ids.shape[0]) if found is None else found[0]
    real, sampled = float(attn.sum()), float(mask.sum())
    return {
        "rows": float(ids.shape[0]),
        "distinct": float(first.shape[0]),
        "real": real,
        "sampled": sampled,
        "copies_real": 1 - float(attn[first].sum()) / real,
        "copies_sampled": 1 - float(mask[first].sum()) / max(sampled, 1.0),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", required=True, help="a model directory (the demo's SFT or final)")
    ap.add_argument("--steps", type=int, default=3, help="RL steps whose batches are replayed")
    ap.add_argument("--rounds", type=int, default=3, help="alternations of the two settings")
    ap.add_argument("overrides", nargs="*", help="section.field=value for the recipe")
    args = ap.parse_args(argv)
    kept: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def keep(*a: Any, **kw: Any) -> dict[str, float]:
        kept.append((a, kw))
        return rl_update(*a, **kw)

    with tempfile.TemporaryDirectory() as run_dir:
        cfg, run, state = demo_rl(args.model, run_dir, args.overrides)
        setup = state.setup
        trainer_loop.rl_update = keep  # type: ignore[assignment]
        try:
            for _ in range(args.steps):
                rl_step(state, run)
                state.step += 1
        finally:
            trainer_loop.rl_update = rl_update  # type: ignore[assignment]
            close_run(run, state)
        reference = state.reference if state.reference is not None else setup.policy
        times: dict[str, dict[str, list[float]]] = {
            s: {"update": [], "reference": []} for s in SETTINGS
        }
        batches = []
        for i, (a, kw) in enumerate(kept):
            facts = describe(a[1])
            batches.append(facts)
            print(
                f"batch {i}: {facts['rows']:.0f} rows, {facts['distinct']:.0f} distinct;"
                f" {facts['real']:.0f} real tokens ({facts['copies_real']:.0%} in copies),"
                f" {facts['sampled']:.0f} sampled ({facts['copies_sampled']:.0%} in copies)"
            )
            b = a[1]
            for _ in range(args.rounds):
                for name in SETTINGS:
                    with every_row() if name == "every row" else nullcontext():
                        t0 = time.perf_counter()
                        rl_update(*a, **kw)
                        t1 = time.perf_counter()
                        with train_autocast(cfg, reference):
                            logprobs.sorted_token_logprobs(
                                reference,
                                b.input_ids_BT,
                                b.attention_mask_BT,
                                b.loss_mask_BT,
                                cfg.rollout.temperature,
                                rows=cfg.optim.micro_batch_size,
                            )
                        t2 = time.perf_counter()
                    times[name]["update"].append(t1 - t0)
                    times[name]["reference"].append(t2 - t1)
    out: dict[str, Any] = {
        name: {phase: statistics.median(v) for phase, v in phases.items()}
        for name, phases in times.items()
    }
    for name in SETTINGS:
        med = out[name]
        print(f"{name:>10}: update {med['update']:.3f} s, reference {med['reference']:.3f} s")
    out["batches"] = batches
    return out


if __name__ == "__main__":
    main()
