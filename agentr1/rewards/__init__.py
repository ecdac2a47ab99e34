"""Rewards: outcome metrics (EM, F1, cover-EM, format) and process rewards.

The outcome reward equals the evaluation metric unless a recipe says otherwise
(`OUTCOME_REWARDS` maps the names a recipe may use to functions of (answer, task)).
"""

from collections.abc import Callable

from agentr1.rewards.process import ProcessRewardConfig, ProcessRewardHook
from agentr1.rewards.qa import (
    cover_exact_match,
    exact_match,
    f1_score,
    format_valid,
    normalize_answer,
)
from agentr1.types import Task

OUTCOME_REWARDS: dict[str, Callable[[str | None, Task], float]] = {
    "em": lambda a, t: exact_match(a, t.answers),
    "f1": lambda a, t: f1_score(a, t.answers),
    "cover_em": lambda a, t: cover_exact_match(a, t.answers),
    # EM for the answer plus a small bonus for a well-formed final answer.
    "em_format": lambda a, t: exact_match(a, t.answers) + 0.1 * format_valid(a),
}

__all__ = [
    "OUTCOME_REWARDS",
    "ProcessRewardConfig",
    "ProcessRewardHook",
    "cover_exact_match",
    "exact_match",
    "f1_score",
    "format_valid",
    "normalize_answer",
]
