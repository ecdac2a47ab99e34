"""Evaluation: run episodes on a task split and report EM / F1 / cover-EM per group.

Groups are the task's ``metadata["hops"]`` (and ``"all"``); the same code serves the demo,
`agentr1 eval` and the RL loop's periodic evaluation.
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


@dataclass
class EvalResult:
    """Metrics of one evaluation, overall and per hop count.

    Attributes:
        by_group: ``{"all" | "hops=N": {"em": .., "f1": .., "cover_em": .., "turns": ..,
            "tool_calls": .., "n": ..}}``.
        stop_reasons: fraction of episodes per stop reason.
        trajectories: the episodes (for logs).
    """

    by_group: dict[str, dict[str, float]]
    stop_reasons: dict[str, float]
    trajectories: list[Trajectory] = field(default_factory=list, repr=False)

    @property
    def em(self) -> float:
        return self.by_group["all"]["em"]


def summarize(trajs: Sequence[Trajectory], tasks_by_id: dict[str, Task]) -> EvalResult:
    """Aggregate trajectories into an `EvalResult`."""
    groups: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajs:
        groups["all"].append(t)
        meta = tasks_by_id[t.task_id].metadata
        if meta.get("hops") is not None:
            groups[f"hops={meta['hops']}"].append(t)
        if meta.get("type") is not None:
            groups[f"type={meta['type']}"].append(t)
    by_group = {}
    for name in sorted(groups, key=lambda g: (g != "all", g)):
        ts = groups[name]
        n = len(ts)
        by_group[name] = {
            "em": sum(t.metrics.get("em", 0.0) for t in ts) / n,
            "f1": sum(t.metrics.get("f1", 0.0) for t in ts) / n,
            "cover_em": sum(t.metrics.get("cover_em", 0.0) for t in ts) / n,
            "turns": sum(t.num_turns for t in ts) / n,
            "tool_calls": sum(len(t.tool_log) for t in ts) / n,
            "n": float(n),
        }
    stops = Counter(str(t.stop_reason) for t in trajs)
    total = max(1, len(trajs))
    return EvalResult(by_group, {k: v / total for k, v in sorted(stops.items())}, list(trajs))


def episode_record(t: Trajectory, task: Task) -> dict[str, Any]:
    """One evaluated episode as a JSON-able dict: what paired comparisons
    (`agentr1.eval.compare`) and error analysis read, one line per question."""
    return {
        "task_id": t.task_id,
        "question": task.question,
        "gold": list(task.answers),
        "answer": t.answer,
        "em": t.metrics.get("em", 0.0),
        "f1": t.metrics.get("f1", 0.0),
        "cover_em": t.metrics.get("cover_em", 0.0),
        "stop_reason": str(t.stop_reason),
        "turns": t.num_turns,
        "tool_calls": len(t.tool_log),
    }


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
) -> EvalResult:
    """Run ``n`` episodes per task at ``temperature`` (0 = greedy) and summarize."""
    cfg = dataclasses.replace(rollout, n_samples=n, temperature=temperature, seed=seed)
    trajs: list[Trajectory] = []
    for s in range(0, len(tasks), batch_tasks):
        for g in run_rollout(tasks[s : s + batch_tasks], make_env, generator, chat, cfg):
            trajs.extend(g.trajectories)
    return summarize(trajs, {t.id: t for t in tasks})
