"""Evaluation: run episodes on a task split and report the task's metrics per group.

Groups are ``"all"`` plus one per value of each breakdown key of the tasks' metadata
(``breakdown=("hops", "type")`` gives ``hops=2``, ``type=bridge``, ...); the metrics are the
task's own (`agentr1.tasks.TaskSpec.metrics`). The same code serves the demo,
``agentr1 eval``, the paper's QA table and the RL loop's periodic evaluation.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentr1.backends.base import Generator
from agentr1.envs.base import ToolEnv
from agentr1.rollout.chat import ChatFormat
from agentr1.rollout.loop import RolloutConfig, run_rollout
from agentr1.types import Task, Trajectory

DEFAULT_METRICS = ("score",)
"""The metric of a task that names none: its outcome reward (`agentr1.envs.base.ToolEnv`)."""


@dataclass
class EvalResult:
    """Metrics of one evaluation, overall and per breakdown group.

    Attributes:
        by_group: ``{"all" | "<key>=<value>": {<metric>: .., "turns": .., "tool_calls": ..,
            "n": ..}}``.
        stop_reasons: fraction of episodes per stop reason.
        trajectories: the episodes (for logs).
        metric: the headline metric (the task's first).
    """

    by_group: dict[str, dict[str, float]]
    stop_reasons: dict[str, float]
    trajectories: list[Trajectory] = field(default_factory=list, repr=False)
    metric: str = DEFAULT_METRICS[0]

    @property
    def score(self) -> float:
        """The headline metric over every episode."""
        return self.by_group["all"].get(self.metric, 0.0)

    def value(self, metric: str, group: str = "all") -> float:
        """One metric of one group (0.0 where it was not measured)."""
        return self.by_group.get(group, {}).get(metric, 0.0)


def summarize(
    trajs: Sequence[Trajectory],
    tasks_by_id: dict[str, Task],
    metrics: Sequence[str] = DEFAULT_METRICS,
    breakdown: Sequence[str] = (),
) -> EvalResult:
    """Aggregate trajectories into an `EvalResult` (means of ``metrics`` per group)."""
    groups: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajs:
        groups["all"].append(t)
        meta = tasks_by_id[t.task_id].metadata
        for key in breakdown:
            if meta.get(key) is not None:
                groups[f"{key}={meta[key]}"].append(t)
    by_group = {}
    for name in sorted(groups, key=lambda g: (g != "all", g)):
        ts = groups[name]
        n = len(ts)
        row = {m: sum(t.metrics.get(m, 0.0) for t in ts) / n for m in metrics}
        row["turns"] = sum(t.num_turns for t in ts) / n
        row["tool_calls"] = sum(len(t.tool_log) for t in ts) / n
        row["n"] = float(n)
        by_group[name] = row
    stops = Counter(str(t.stop_reason) for t in trajs)
    total = max(1, len(trajs))
    stop_share = {k: v / total for k, v in sorted(stops.items())}
    return EvalResult(by_group, stop_share, list(trajs), metric=metrics[0])


def episode_record(
    t: Trajectory, task: Task, metrics: Sequence[str] = DEFAULT_METRICS
) -> dict[str, Any]:
    """One evaluated episode as a JSON-able dict: what paired comparisons
    (`agentr1.eval.compare`) and error analysis read, one line per question."""
    rec: dict[str, Any] = {
        "task_id": t.task_id,
        "question": task.question,
        "gold": list(task.answers),
        "answer": t.answer,
    }
    for m in metrics:
        rec[m] = t.metrics.get(m, 0.0)
    rec["stop_reason"] = str(t.stop_reason)
    rec["turns"] = t.num_turns
    rec["tool_calls"] = len(t.tool_log)
    return rec


def evaluate(
    tasks: Sequence[Task],
    make_env: Callable[[], ToolEnv],
    generator: Generator,
    chat: ChatFormat,
    rollout: RolloutConfig,
    temperature: float,
    n: int = 1,
    seed: int = 0,
    batch_tasks: int = 64,
    metrics: Sequence[str] = DEFAULT_METRICS,
    breakdown: Sequence[str] = (),
) -> EvalResult:
    """Run ``n`` episodes per task at ``temperature`` (0 = greedy) and summarize."""
    cfg = dataclasses.replace(rollout, n_samples=n, temperature=temperature, seed=seed)
    trajs: list[Trajectory] = []
    for s in range(0, len(tasks), batch_tasks):
        for g in run_rollout(tasks[s : s + batch_tasks], make_env, generator, chat, cfg):
            trajs.extend(g.trajectories)
    return summarize(trajs, {t.id: t for t in tasks}, metrics, breakdown)
