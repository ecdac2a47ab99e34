"""Evaluation of a policy on a task's splits: greedy and sampled, with the task's metrics.

`run_eval` is what the RL loop calls before, during and after training; `evaluate` is the
same for a model on its own (``agentr1 eval RECIPE --model DIR``, or from Python):

    from agentr1 import evaluate, load_config
    results = evaluate(load_config("recipes/demo.yaml"), model="runs/demo/final_model")
    results["greedy"]["test"].score      # the task's headline metric, e.g. EM

Every episode can go to a JSONL file (one line per question: answer, metrics, stop
reason) for paired comparisons (`agentr1 compare`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentr1.eval.evaluate import EvalResult, episode_record
from agentr1.eval.evaluate import evaluate as evaluate_tasks
from agentr1.fileio import write_atomic
from agentr1.trainer.state import settled_heap
from agentr1.types import Task, json_line

if TYPE_CHECKING:
    from agentr1.config import Config
    from agentr1.tasks import TaskSpec
    from agentr1.trainer.run import RunDir
    from agentr1.trainer.setup import Setup

log = logging.getLogger(__name__)


@settled_heap()  # the setup's objects out of the garbage collector's walk
def run_eval(
    setup: Setup, label: str, run: RunDir | None = None, step: int | None = None
) -> dict[str, dict[str, EvalResult]]:
    """Greedy and sampled evaluation on every configured split; with ``run``, every
    episode also goes to ``eval_episodes.jsonl`` under ``label`` and ``step`` (the RL step
    of the weights) for paired tests."""
    cfg = setup.cfg
    setup.policy.eval()
    out: dict[str, dict[str, EvalResult]] = {"greedy": {}, "sampled": {}}
    for split in setup.eval_splits():
        tasks = eval_tasks(setup, split)
        modes = [("greedy", 0.0, 1, 1)]
        if cfg.eval.sampled_n:
            modes.append(("sampled", cfg.eval.temperature, cfg.eval.sampled_n, 2))
        for mode, temperature, n, seed in modes:
            res = evaluate_tasks(
                tasks,
                setup.make_env,
                setup.generator,
                setup.chat,
                cfg.rollout,
                temperature,
                n,
                seed=seed,
                batch_tasks=cfg.eval.batch_tasks,
                metrics=setup.task.metric_names,
                breakdown=setup.task.breakdown,
            )
            out[mode][split] = res
    if run is not None:
        log_eval(setup, run, label, out, step)
    scores = {k: {s: round(r.score, 4) for s, r in v.items()} for k, v in out.items()}
    log.info("eval %s (%s): %s", label, setup.task.primary_metric, scores)
    return out


def eval_tasks(setup: Setup, split: str) -> list[Task]:
    """The questions `run_eval` scores on ``split``: the first ``eval.max_tasks``."""
    tasks = list(setup.task.splits[split])
    return tasks[: setup.cfg.eval.max_tasks] if setup.cfg.eval.max_tasks else tasks


def log_eval(
    setup: Setup, run: RunDir, label: str, res: dict[str, dict[str, EvalResult]], step: int | None
) -> None:
    """Every episode of a `run_eval` result to ``eval_episodes.jsonl`` under ``label``;
    the first ``eval.log_trajectories`` greedy episodes of each split, tokens and all, to
    ``trajectories.jsonl`` (the report's viewer)."""
    for mode, per in res.items():
        for split, r in per.items():
            tasks = eval_tasks(setup, split)
            run.log_eval_episodes(label, mode, split, r, tasks, step, setup.task.metric_names)
    shown = setup.cfg.eval.log_trajectories
    for split, r in res.get("greedy", {}).items() if shown else ():
        run.log_eval_trajectories(label, split, step, r.trajectories[:shown], setup.chat.decode)


def eval_record(res: dict[str, dict[str, EvalResult]]) -> dict[str, Any]:
    return {mode: {s: r.by_group for s, r in per.items()} for mode, per in res.items()}


def evaluate(
    config: Config,
    task: TaskSpec | None = None,
    model: str | None = None,
    splits: list[str] | None = None,
    out: str | Path | None = None,
) -> dict[str, dict[str, EvalResult]]:
    """Evaluate a model on a task's evaluation splits, greedy (and sampled when
    ``config.eval.sampled_n`` > 0), with the task's metrics and breakdown.

    Args:
        config: a validated `agentr1.Config` (its ``rollout`` budgets and ``eval``
            settings apply; no training happens).
        task: the task (`agentr1.TaskSpec`); None = the one ``config.task`` names.
        model: a model directory, hub id or alias; None = ``config.model.path``.
        splits: the splits to evaluate; None = ``config.eval.splits`` or the task's own.
        out: a folder for ``results.json``, ``results.md`` and ``episodes.jsonl``.

    Returns:
        ``{"greedy" | "sampled": {split: EvalResult}}``.
    """
    from agentr1.trainer.setup import build_setup

    changes: dict[str, Any] = {}
    if model is not None:
        changes["model"] = dataclasses.replace(config.model, path=model)
    if splits is not None:
        changes["eval"] = dataclasses.replace(config.eval, splits=tuple(splits))
    cfg = dataclasses.replace(config, **changes) if changes else config
    setup = build_setup(cfg, task)
    res = run_eval(setup, "eval")
    if out is not None:
        write_eval_report(setup, Path(out), res)
    return res


def write_eval_report(setup: Setup, out: Path, res: dict[str, dict[str, EvalResult]]) -> Path:
    """``results.json`` (metrics per mode, split and group), ``results.md`` (a table of the
    task's metrics per split) and ``episodes.jsonl`` under ``out``; returns results.md."""
    out.mkdir(parents=True, exist_ok=True)
    names = setup.task.metric_names
    record = {
        "task": setup.task.name,
        "model": setup.cfg.model.path,
        "metrics": names,
        "results": eval_record(res),
        "stop_reasons": {m: {s: r.stop_reasons for s, r in per.items()} for m, per in res.items()},
    }
    write_atomic(out / "results.json", json.dumps(record, indent=1) + "\n")
    lines = [
        f"# Evaluation: {setup.task.name}",
        "",
        f"Model `{setup.cfg.model.path}`.",
        "",
        "| mode | split | group | n | " + " | ".join(names) + " | turns | tool calls |",
        "|---|---|---|---|" + "---|" * (len(names) + 2),
    ]
    for mode, per in res.items():
        for split, r in per.items():
            for group, row in r.by_group.items():
                cells = " | ".join(f"{row.get(m, 0.0):.3f}" for m in names)
                lines.append(
                    f"| {mode} | {split} | {group} | {int(row['n'])} | {cells} | "
                    f"{row['turns']:.2f} | {row['tool_calls']:.2f} |"
                )
    md = out / "results.md"
    write_atomic(md, "\n".join(lines) + "\n")
    rows = []
    for mode, per in res.items():
        for split, r in per.items():
            by_id = {t.id: t for t in setup.task.splits[split]}
            for t in r.trajectories:
                rec = {"mode": mode, "split": split, **episode_record(t, by_id[t.task_id], names)}
                rec["text"] = setup.chat.decode(t.token_ids[t.prompt_len :])
                rows.append(json_line(rec) + "\n")
    write_atomic(out / "episodes.jsonl", "".join(rows))
    return md
