"""Rewards: outcome metrics (EM, F1, cover-EM, format) and process rewards, by name.

Two registries, the mechanism every plug-in kind shares (`agentr1.registry`):

- `OUTCOME_REWARDS`: ``(answer or None, task) -> float``, placed on the episode's last
  sampled token. ``task.outcome_reward: f1`` in a recipe, or an import path
  (``my_pkg.rewards:close_enough``).
- `PROCESS_REWARDS`: ``StepContext -> float``, placed on the last token of the turn that
  earned it. ``task.process_rewards: {invalid_call: -0.1, my_pkg.rewards:brevity: 0.05}``
  sums the named functions with those weights (`weighted_process_reward`).

The outcome reward equals the evaluation metric unless a recipe says otherwise.
`ANSWER_METRICS` are the per-episode metrics of tasks with short text answers (EM, F1,
cover-EM) that the built-in tasks report.
"""

from collections.abc import Callable, Mapping

from agentr1.registry import Registry
from agentr1.rewards.process import (
    ProcessRewardConfig,
    ProcessRewardHook,
    invalid_call,
    new_evidence,
    new_evidence_shaping,
    repeated_query,
    valid_call,
)
from agentr1.rewards.qa import (
    cover_exact_match,
    exact_match,
    f1_score,
    format_valid,
    normalize_answer,
)
from agentr1.types import StepContext, Task

OutcomeReward = Callable[[str | None, Task], float]
"""An outcome reward: (final answer or None, task) -> reward on the last sampled token."""

ProcessReward = Callable[[StepContext], float]
"""A process reward: one step's context -> reward placed on that turn's last token."""


def em(answer: str | None, task: Task) -> float:
    """Exact match against any gold answer (SQuAD normalization).

    >>> em("the Paris", Task("q", "?", ["Paris"]))
    1.0
    """
    return exact_match(answer, task.answers)


def f1(answer: str | None, task: Task) -> float:
    """Best token F1 against the gold answers."""
    return f1_score(answer, task.answers)


def cover_em(answer: str | None, task: Task) -> float:
    """1.0 when a gold answer is contained in the answer."""
    return cover_exact_match(answer, task.answers)


def em_format(answer: str | None, task: Task) -> float:
    """EM for the answer plus a small bonus (0.1) for a well-formed final answer."""
    return exact_match(answer, task.answers) + 0.1 * format_valid(answer)


OUTCOME_REWARDS: Registry[OutcomeReward] = Registry("outcome reward")
for _name, _fn in (("em", em), ("f1", f1), ("cover_em", cover_em), ("em_format", em_format)):
    OUTCOME_REWARDS.add(_name, _fn)

PROCESS_REWARDS: Registry[ProcessReward] = Registry("process reward")
for _name, _pfn in (
    ("valid_call", valid_call),
    ("invalid_call", invalid_call),
    ("repeated_query", repeated_query),
    ("new_evidence", new_evidence),
    ("evidence_shaping", new_evidence_shaping),
):
    PROCESS_REWARDS.add(_name, _pfn)

ANSWER_METRICS: Mapping[str, OutcomeReward] = {"em": em, "f1": f1, "cover_em": cover_em}
"""EM, F1 and cover-EM of a short text answer: the built-in QA-style tasks' metrics."""


def outcome_reward(ref: str, base_dirs: tuple[str, ...] = ()) -> OutcomeReward:
    """The outcome reward a recipe names (a registered name or an import path).

    Raises:
        ValueError: an unknown name (the valid ones listed) or a path that does not
            resolve, or an object that is not callable.
    """
    from pathlib import Path

    fn = OUTCOME_REWARDS.resolve(ref, [Path(d) for d in base_dirs])
    if not callable(fn):
        raise ValueError(f"outcome reward {ref!r}: {fn!r} is not a function (answer, task)")
    return fn  # type: ignore[no-any-return]


class WeightedProcessReward:
    """Sums process rewards with weights; a ``terminal`` of any part is summed too.

    Attributes:
        parts: (weight, reward function) pairs.
    """

    def __init__(self, parts: list[tuple[float, ProcessReward]]) -> None:
        self.parts = parts

    def __call__(self, ctx: StepContext) -> float:
        return sum(w * float(fn(ctx)) for w, fn in self.parts)

    def terminal(self, history: list[StepContext], answer: str | None = None) -> float:
        total = 0.0
        for w, fn in self.parts:
            end = getattr(fn, "terminal", None)
            if end is not None:
                total += w * float(end(history, answer))
        return total


def weighted_process_reward(
    weights: Mapping[str, float], base_dirs: tuple[str, ...] = ()
) -> WeightedProcessReward | None:
    """The process rewards a recipe names, with their weights (None when there are none).

    Raises:
        ValueError: an unknown name or an unresolved path, naming it and the valid names.
    """
    from pathlib import Path

    parts: list[tuple[float, ProcessReward]] = []
    for ref, w in weights.items():
        fn = PROCESS_REWARDS.resolve(ref, [Path(d) for d in base_dirs])
        if not callable(fn):
            raise ValueError(f"process reward {ref!r}: {fn!r} is not a function (StepContext)")
        parts.append((float(w), fn))
    return WeightedProcessReward(parts) if parts else None


def combine_process_rewards(*hooks: ProcessReward | None) -> ProcessReward | None:
    """One hook from several (None entries dropped): sums steps and terminals."""
    present = [h for h in hooks if h is not None]
    if not present:
        return None
    if len(present) == 1:
        return present[0]
    return WeightedProcessReward([(1.0, h) for h in present])


__all__ = [
    "ANSWER_METRICS",
    "OUTCOME_REWARDS",
    "PROCESS_REWARDS",
    "OutcomeReward",
    "ProcessReward",
    "ProcessRewardConfig",
    "ProcessRewardHook",
    "WeightedProcessReward",
    "combine_process_rewards",
    "cover_exact_match",
    "em",
    "exact_match",
    "f1",
    "f1_score",
    "format_valid",
    "normalize_answer",
    "outcome_reward",
    "weighted_process_reward",
]
