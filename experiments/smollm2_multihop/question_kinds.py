"""Where a difference between two models comes from: greedy records of the same questions
(``fresh_eval.py``'s ``OUT/<name>.jsonl``, or ``eval_episodes.jsonl``) split by question
kind, each model paired against the first.

    PYTHONPATH=. .venv/bin/python experiments/smollm2_multihop/question_kinds.py \\
        runs/multihop_real2N/outside/warm.jsonl runs/multihop_real2N/outside/grpo_nostd.jsonl

The kind is a keyword rule on the question (`kind`), yes/no by the gold answer; it looks
at no model. Prints a markdown table per model (n, EM of both, better / worse, tool calls)
and the answers each model gives most often to the nationality / country questions.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path
from typing import Any

from agentr1.eval.compare import load_records

KINDS = ("nationality / country", "yes / no", "date or comparison", "who", "place", "other")
_RULES = (
    ("nationality / country", r"\b(nationality|nationalities|country|countries|citizen)"),
    (
        "date or comparison",
        r"\b(first|later|earlier|older|younger|date|when|what year|which year)\b",
    ),
    ("who", r"\b(who|whom)\b"),
    ("place", r"\b(where|place|city|town)\b"),
)


def kind(question: str, gold: list[str]) -> str:
    """The question's kind: yes / no when a gold answer is "yes" or "no", else the first
    rule of `_RULES` whose pattern the lower-cased question matches, else "other"."""
    if any(g.strip().lower() in ("yes", "no") for g in gold):
        return "yes / no"
    q = question.lower()
    return next((name for name, pattern in _RULES if re.search(pattern, q)), "other")


def read_records(path: Path) -> dict[str, dict[str, Any]]:
    """``<split or dataset>/<task_id>`` -> record (`load_records`: errors name the file
    and line)."""
    return load_records(path, ("question", "gold", "answer", "em"))


def kind_table(ref: dict[str, dict[str, Any]], other: dict[str, dict[str, Any]]) -> list[str]:
    """Markdown rows: per kind (and all) n, EM of ``ref`` and ``other``, better / worse, and
    tool calls a question of each, on ``other``'s questions: ``ref`` must hold all of them
    and may hold more (records of a larger pool reused, as `fresh_eval` reuses them)."""
    missing = sorted(other.keys() - ref.keys())
    if missing:
        raise ValueError(
            f"the reference's records lack {len(missing)} of this model's questions "
            f"(e.g. {missing[0]})"
        )
    ref = {k: ref[k] for k in other}
    rows = [
        "| kind | n | reference EM | EM | better / worse | tool calls (reference → this) "
        "| one answer for all (its EM) |",
        "|---|---|---|---|---|---|---|",
    ]
    by_kind: dict[str, list[str]] = {k: [] for k in KINDS}
    for key, rec in ref.items():
        by_kind[kind(rec["question"], list(rec["gold"]))].append(key)
    for name, keys in [*by_kind.items(), ("all", list(ref))]:
        if not keys:
            continue
        a = [float(ref[k]["em"]) for k in keys]
        b = [float(other[k]["em"]) for k in keys]
        better = sum(y > x for x, y in zip(a, b, strict=True))
        worse = sum(y < x for x, y in zip(a, b, strict=True))
        calls_a = sum(float(ref[k].get("tool_calls", 0)) for k in keys) / len(keys)
        calls_b = sum(float(other[k].get("tool_calls", 0)) for k in keys) / len(keys)
        rows.append(
            f"| {name} | {len(keys)} | {sum(a) / len(a):.3f} | {sum(b) / len(b):.3f} "
            f"| {better} / {worse} | {calls_a:.2f} → {calls_b:.2f} | "
            + "{} ({:.3f}) |".format(*best_constant([ref[k] for k in keys]))
        )
    return rows


def best_constant(records: list[dict[str, Any]]) -> tuple[str, float]:
    """The one answer that, given to every question of ``records``, scores the highest EM
    (chosen among their gold answers, knowing them: an upper bound on what a habit can
    score, e.g. "American" on a pool of nationality questions), and that EM."""
    from agentr1.rewards.qa import exact_match, normalize_answer

    if not records:
        raise ValueError("no records")
    seen: dict[str, str] = {}
    for r in records:
        for g in r["gold"]:
            seen.setdefault(normalize_answer(str(g)), str(g))
    golds = [[str(g) for g in r["gold"]] for r in records]
    scores = {a: sum(exact_match(a, gs) for gs in golds) / len(golds) for a in seen.values()}
    best = max(scores, key=lambda a: (scores[a], a))
    return best, scores[best]


def top_answers(records: dict[str, dict[str, Any]], of_kind: str, n: int = 6) -> str:
    """The ``n`` answers given most often to questions of ``of_kind``, with counts (right
    ones in brackets)."""
    said: Counter[str] = Counter()
    right: Counter[str] = Counter()
    for rec in records.values():
        if kind(rec["question"], list(rec["gold"])) != of_kind:
            continue
        answer = str(rec["answer"] or "").strip() or "(none)"
        said[answer] += 1
        right[answer] += int(float(rec["em"]) > 0)
    return ", ".join(f"{a} {c} ({right[a]})" for a, c in said.most_common(n))


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("records", nargs="+", type=Path, help="the reference first")
    args = ap.parse_args()
    if len(args.records) < 2:
        ap.error("give the reference's records and at least one model's")
    ref = read_records(args.records[0])
    print(f"reference: {args.records[0]} ({len(ref)} questions)")
    nat = KINDS[0]
    for path in args.records[1:]:
        other = read_records(path)
        print(f"\n## {path} ({len(other)} questions)\n")
        print("\n".join(kind_table(ref, other)))
        print(f"\n{nat} answers: {top_answers(other, nat)}")
        print(f"reference's on them: {top_answers({k: ref[k] for k in other}, nat)}")


if __name__ == "__main__":
    main()
