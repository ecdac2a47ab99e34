"""Does a model know which relation a kin question's next search needs?

The demo's world asks "Who is the maternal grandfather of X?": search "mother of X",
then "father of" the mother. A model that copies its last call's relation instead
("mother of" the mother) gets every mixed chain wrong (maternal grandfather, paternal
grandmother) and every same-relation chain right, and GRPO cannot mend it once every
sample of a group repeats the mistake (`benchmarks/RESULTS.md`, "Kin relations").

For every kin question of the chosen splits the script runs the oracle's episode through
the real rollout (`agentr1.tasks.world.oracle_generator`: its searches, the true tool
responses, token for token what SFT trains on), then reads the model's next-token
distribution at each search after the first: at the first token where the call with the
right relation ("father of Y") and the call with the other one ("mother of Y") differ.
It prints, per kin term and search, the mean of P(right) / (P(right) + P(other)) and the
share of questions where the right relation is the likelier: 0.5 is a model that ignores
the question, 1.0 one that reads it.

    .venv/bin/agentr1 train recipes/demo.yaml train.steps=0 train.run_dir=runs/demo_sft
    .venv/bin/python benchmarks/kin_probe.py --model runs/demo_sft/final_model runs/demo/final_model

(``train.steps=0`` stops after the SFT warm start.) Extra ``section.field=value``
overrides go to the recipe, before the options, e.g. ``task.config.world.seed=3`` for the
world a run used.
"""

from __future__ import annotations

import argparse
import collections
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from agentr1.config import load_config
from agentr1.rollout import RolloutConfig, run_rollout
from agentr1.rollout.chat import ChatFormat
from agentr1.tasks.world import SPLITS, World, oracle_generator
from agentr1.tasks.world.schema import KIN, KIN_TERMS
from agentr1.trainer.setup import Setup, build_setup
from agentr1.types import Task, Trajectory

RECIPE = "recipes/demo.yaml"


@dataclass(frozen=True)
class Choice:
    """One kin search of an oracle episode: where the relation is chosen, and the two ids."""

    group: str
    """"<kin term>, search <k>" (k counts from 1)."""
    position: int
    """Index in the episode's tokens of the first token where the two calls differ."""
    right: int
    """That token of the call with the right relation."""
    other: int
    """That token of the call with the other relation."""


def kin_term(question: str) -> str | None:
    """The longest kin term the question uses ("paternal grandmother"), else None."""
    found = [t for t in KIN_TERMS.values() if t in question]
    return max(found, key=len) if found else None


def choices(traj: Trajectory, task: Task, world: World, chat: ChatFormat) -> list[Choice]:
    """The kin searches after the first in ``traj``, an oracle episode of ``task``."""
    term = kin_term(task.question)
    plan = world.plans[task.id]
    out = []
    for k, (step, turn) in enumerate(zip(plan.steps, traj.turns, strict=False)):
        if k == 0 or step.read not in KIN or term is None:
            continue
        other = KIN[1 - KIN.index(step.read)]
        right_text, here = turn.text, f'"{step.read} of '
        if here not in right_text:
            raise ValueError(f"{task.id}: search {k + 1} is {right_text!r}, not a {here} call")
        a = chat.encode(right_text)
        b = chat.encode(right_text.replace(here, f'"{other} of ', 1))
        j = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
        if traj.token_ids[turn.start : turn.start + j + 1] != a[: j + 1]:
            raise ValueError(f"{task.id}: search {k + 1}'s tokens are not its text's encoding")
        out.append(Choice(f"{term}, search {k + 1}", turn.start + j, a[j], b[j]))
    return out


@torch.no_grad()
def probe(model: Callable[..., Any], rows: Sequence[tuple[Trajectory, list[Choice]]]) -> dict:
    """Per group, P(right) / (P(right) + P(other)) of each choice, from one forward pass
    of ``model`` (a causal LM: ``model(ids).logits``) per episode."""
    out: dict[str, list[float]] = collections.defaultdict(list)
    for traj, picks in rows:
        if not picks:
            continue
        ids = torch.tensor([traj.token_ids[: max(c.position for c in picks)]])
        logits = model(ids).logits[0].float()
        for c in picks:  # the distribution over token ``position`` is read at position - 1
            right, other = logits[c.position - 1, c.right], logits[c.position - 1, c.other]
            out[c.group].append(torch.sigmoid(right - other).item())
    return out


def oracle_episodes(setup: Setup, split: str) -> list[tuple[Task, Trajectory, list[Choice]]]:
    """The oracle's episode of each kin question of ``split`` (no early answers, no
    notes), through ``setup``'s env and chat format, with its choices."""
    world: World = setup.task.extras["world"]
    gen = oracle_generator(world, setup.chat, early_answer_prob=0.0, notes=False)
    rcfg = RolloutConfig(n_samples=1, max_turns=6, max_tokens_per_turn=64, max_context=1024)
    tasks = [t for t in world.tasks(split) if kin_term(t.question)]
    groups = run_rollout(tasks, setup.make_env, gen, setup.chat, rcfg)
    return [
        (task, g.trajectories[0], choices(g.trajectories[0], task, world, setup.chat))
        for task, g in zip(tasks, groups, strict=True)
    ]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", nargs="+", required=True, help="model directories")
    ap.add_argument("--recipe", default=RECIPE)
    ap.add_argument("--split", nargs="+", default=["train", "test"], choices=SPLITS)
    ap.add_argument("overrides", nargs="*", help="section.field=value")
    args = ap.parse_args(argv)
    print("| model | split | kin term, search | questions | mean P(right) | right likelier |")
    print("|---|---|---|---|---|---|")
    for path in args.model:
        cfg = load_config(args.recipe, [*args.overrides, f"model.path={path}", "sft.enabled=false"])
        setup = build_setup(cfg)
        for split in args.split:
            rows = [(traj, picks) for _, traj, picks in oracle_episodes(setup, split)]
            for group, ps in sorted(probe(setup.policy.eval(), rows).items()):
                mean = sum(ps) / len(ps)
                likelier = sum(p > 0.5 for p in ps) / len(ps)
                print(f"| {path} | {split} | {group} | {len(ps)} | {mean:.3f} | {likelier:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
