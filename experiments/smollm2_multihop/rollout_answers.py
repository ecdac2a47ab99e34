"""How a run's training answers move over its steps: from its ``rollouts.jsonl`` (every
training episode, `RunDir.log_rollouts`), per block of RL steps, the yes / no questions
apart from the rest.

    PYTHONPATH=. .venv/bin/python experiments/smollm2_multihop/rollout_answers.py \\
        runs/multihop_real2T/grpo --block 4

For each block: episodes, EM, how many groups tie on the answer (every sample the same
outcome reward: their advantage comes from the process rewards only), the mean absolute
advantage, and for the yes / no questions the share of gold "yes" and of the answers
"yes", "no" and anything else. A model drifting to one word shows as "said yes" moving
away from "gold yes"; ties show whether that drift had any advantage behind it.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path
from typing import Any

from question_kinds import kind

from agentr1.fileio import read_jsonl

_FIELDS = ("step", "group", "question", "gold", "answer", "em", "outcome_reward", "advantage")


def read_rollouts(path: Path) -> list[dict[str, Any]]:
    """The lines of a ``rollouts.jsonl`` (or of the one in the run folder ``path``); a bad
    line is an error naming the file, the line and the field."""
    if path.is_dir():
        path = path / "rollouts.jsonl"
    if not path.is_file():
        raise SystemExit(f"{path}: no such file (runs log it with train.log_rollouts: true)")
    try:
        out = [rec for _, rec in read_jsonl(path, _FIELDS)]
    except ValueError as e:
        raise SystemExit(str(e)) from None
    if not out:
        raise SystemExit(f"{path}: no episodes")
    return out


def said(answer: Any) -> str:
    """``yes``, ``no``, or ``other`` (any other answer, or none)."""
    a = str(answer or "").strip().lower().rstrip(".!")
    return a if a in ("yes", "no") else "other"


def block_rows(records: list[dict[str, Any]], block: int) -> list[str]:
    """Markdown rows, one per ``block`` consecutive steps (step 0 first)."""
    if block <= 0:
        raise ValueError(f"--block must be positive (got {block})")
    groups: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        groups[(int(r["step"]), int(r["group"]))].append(r)
    blocks: dict[int, dict[bool, list[list[dict[str, Any]]]]] = defaultdict(
        lambda: {True: [], False: []}
    )
    for (step, _), eps in sorted(groups.items()):
        yn = kind(eps[0]["question"], list(eps[0]["gold"])) == "yes / no"
        blocks[step // block][yn].append(eps)
    rows = [
        "| steps | yes/no groups | episodes | gold yes | said yes / no / other | EM | tied "
        "| mean abs adv | other groups | EM | tied | mean abs adv |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def stats(gs: list[list[dict[str, Any]]]) -> tuple[str, str, str]:
        eps = [e for g in gs for e in g]
        if not eps:
            return "-", "-", "-"
        em = sum(float(e["em"]) for e in eps) / len(eps)
        tied = sum(len({float(e["outcome_reward"]) for e in g}) == 1 for g in gs)
        adv = sum(abs(float(e["advantage"])) for e in eps) / len(eps)
        return f"{em:.2f}", f"{tied}/{len(gs)}", f"{adv:.3f}"

    for b in sorted(blocks):
        yn, rest = blocks[b][True], blocks[b][False]
        eps = [e for g in yn for e in g]
        n = len(eps) or 1
        gold_yes = sum(any(str(a).strip().lower() == "yes" for a in g[0]["gold"]) for g in yn)
        words = [said(e["answer"]) for e in eps]
        mix = " / ".join(f"{words.count(w) / n:.2f}" for w in ("yes", "no", "other"))
        steps = f"{b * block}-{b * block + block - 1}" if block > 1 else str(b)
        rows.append(
            f"| {steps} | {len(yn)} | {len(eps)} | {gold_yes}/{len(yn)} | "
            f"{mix if eps else '-'} | {' | '.join(stats(yn))} | {len(rest)} | "
            f"{' | '.join(stats(rest))} |"
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("run", type=Path, help="a run folder or its rollouts.jsonl")
    ap.add_argument("--block", type=int, default=4, help="RL steps a row")
    args = ap.parse_args()
    print("\n".join(block_rows(read_rollouts(args.run), args.block)))


if __name__ == "__main__":
    main()
