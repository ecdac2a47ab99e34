"""Unit conversion with a tool you write (`@tool`) and a reward you write (a plain function).

The shortest complete task: a typed, documented function becomes the tool (its JSON schema
comes from the type hints and the docstring), a function ``(answer, task) -> float`` is
the reward and the reported metric, and a tiny scripted policy gives the warm start.

    .venv/bin/python examples/unit_conversion.py                        # train (CPU, minutes)
    .venv/bin/python examples/unit_conversion.py --rl-steps 2 --sft-steps 20 --run-dir /tmp/u
    .venv/bin/agentr1 train examples/unit_conversion.yaml               # the same, from a recipe
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from agentr1 import Demonstrations, Task, TaskSpec, load_config, tool, train

FACTORS = {"inches": 2.54, "feet": 30.48, "yards": 91.44}
"""Centimetres per unit."""


@tool
def to_centimetres(value: float, unit: Literal["inches", "feet", "yards"]) -> str:
    """Convert a length to centimetres.

    Args:
        value: the length.
        unit: its unit.
    """
    return f"{value * FACTORS[unit]:.2f}"


def close_enough(answer: str | None, task: Task) -> float:
    """1.0 when the answer is the gold number within 0.01 (a trailing "cm" is allowed).

    >>> close_enough("76.20 cm", Task("t", "?", ["76.2"])), close_enough("76", Task("t", "?", ["76.2"]))
    (1.0, 0.0)
    """
    text = (answer or "").strip().removesuffix("cm").strip()
    try:
        return float(abs(float(text) - float(task.answers[0])) < 0.01)
    except ValueError:
        return 0.0


@dataclass(frozen=True)
class UnitsConfig:
    """``task.config`` of this task."""

    n_train: int = 1000
    """Training questions."""
    n_test: int = 100
    """Held-out questions."""
    guess_prob: float = 0.5
    """Share of demonstrations that answer with the number unconverted (wrong)."""
    seed: int = 0
    """Seed of the questions and the guesses."""


def question(rng: random.Random, k: int) -> Task:
    value, unit = rng.randint(2, 60), rng.choice(sorted(FACTORS))
    gold = f"{value * FACTORS[unit]:.2f}"
    return Task(
        f"units-{k:05d}",
        f"How many centimetres are {value} {unit}?",
        [gold],
        {"unit": unit, "value": value},
    )


class Converter:
    """Calls the tool, then answers what it returned; sometimes guesses without it."""

    def __init__(self, guess_prob: float, seed: int) -> None:
        self.guess_prob, self.rng = guess_prob, random.Random(seed)

    def next_turn(self, task: Task, observations: list[str]) -> str:
        if observations:
            return f"<answer>{observations[-1].strip()}</answer>"
        if self.rng.random() < self.guess_prob:
            return f"<answer>{task.metadata['value']}</answer>"
        args = f'{{"value": {task.metadata["value"]}, "unit": "{task.metadata["unit"]}"}}'
        return f'<tool_call>{{"name": "to_centimetres", "arguments": {args}}}</tool_call>'


def make_task(cfg: UnitsConfig) -> TaskSpec:
    rng = random.Random(cfg.seed)
    tasks = [question(rng, k) for k in range(cfg.n_train + cfg.n_test)]
    train_set = tasks[: cfg.n_train]
    solver = Converter(0.0, 0)

    def texts() -> list[str]:  # what a tokenizer built from scratch is trained on
        out = []
        for t in tasks:
            out += [t.question, solver.next_turn(t, []), solver.next_turn(t, [t.answers[0]])]
        return out

    return TaskSpec(
        name="units",
        splits={"train": train_set, "test": tasks[cfg.n_train :]},
        tools=[to_centimetres],
        outcome_reward=close_enough,
        metrics={"close_enough": close_enough},
        breakdown=("unit",),
        system_prompt=None,
        demonstrations=lambda seed: [Demonstrations(train_set, Converter(cfg.guess_prob, seed))],
        tokenizer_texts=texts,
    )


RECIPE = Path(__file__).with_name("unit_conversion.yaml")


def main(argv: list[str] | None = None) -> dict[str, object]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sft-steps", type=int, default=None)
    ap.add_argument("--rl-steps", type=int, default=None)
    ap.add_argument("--run-dir", default="runs/units")
    ap.add_argument("overrides", nargs="*", help="section.field=value, as for agentr1 train")
    args = ap.parse_args(argv)
    overrides = [f"train.run_dir={args.run_dir}", *args.overrides]
    if args.sft_steps is not None:
        overrides.append(f"sft.steps={args.sft_steps}")
    if args.rl_steps is not None:
        overrides.append(f"train.steps={args.rl_steps}")
    config = load_config(RECIPE, overrides)  # task.config.* overrides are checked here too
    return train(config, task=make_task(UnitsConfig(**config.task.config)))


if __name__ == "__main__":
    main()
