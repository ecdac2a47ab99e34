"""The run directory: config, metrics, trajectories, checkpoints, plots and the report.

runs/<name>/
  config.yaml          the resolved config
  metrics.jsonl        one JSON object per SFT phase / RL step / evaluation, with its wall_time
  trajectories.jsonl   sampled episodes (whole groups) and evaluated ones: tokens, text pieces,
                       tool calls, rewards, masks, per-token layers (`agentr1.trainer.tokenlog`)
  rollouts.jsonl       every training episode in one line: question, answer, rewards, advantage
  checkpoints/         atomic checkpoints (step_XXXXXX/)
  plots/training.png   reward, EM, KL, entropy, lengths, tool calls, stop reasons
  report.md            the summary table
  report.html          curves, evaluations, the token-level trajectory viewer (`agentr1.report`),
                       written at each evaluation and at the end
  tb/ wandb/ mlflow.db mlruns/  the experiment trackers ``log.trackers`` chooses (`agentr1.trackers`)
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from agentr1 import configutil
from agentr1.eval.evaluate import DEFAULT_METRICS, EvalResult, episode_record
from agentr1.fileio import remove_partial, write_atomic
from agentr1.trackers import make_trackers
from agentr1.types import Task, Trajectory, TrajectoryGroup, json_line

log = logging.getLogger(__name__)

SFT_DIR = "sft"
"""The warm start's checkpoints, under the run's ``checkpoints/`` (`agentr1.trainer.sft`)."""


class _Bar:
    """tqdm with ETA when available and a terminal or log is attached."""

    def __init__(self, total: int, desc: str, initial: int = 0) -> None:
        from tqdm import tqdm

        self._bar = tqdm(
            total=total,
            desc=desc,
            initial=initial,
            file=sys.stderr,
            dynamic_ncols=True,
            mininterval=1.0,
        )

    def update_with(self, **postfix: float) -> None:
        self._bar.set_postfix({k: f"{v:.3g}" for k, v in postfix.items()}, refresh=False)
        self._bar.update(1)

    def close(self) -> None:
        self._bar.close()


def metric_records(run_dir: Path, phase: str) -> list[dict[str, Any]]:
    """The rows of ``run_dir/metrics.jsonl`` of one phase (``"rl"``: one per RL step), in
    order; none when the run has not logged any.

    A resumed run logs again the steps after its checkpoint; the rows a killed attempt
    logged for them are superseded: of rows with the same ``step``, the last one is kept
    (rows without a step are all kept, in order).
    """
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    with open(path, encoding="utf-8") as f:
        rows = [r for r in map(json.loads, f) if r.get("phase") == phase]
    last = {r["step"]: i for i, r in enumerate(rows) if "step" in r}
    return [r for i, r in enumerate(rows) if "step" not in r or last[r["step"]] == i]


class RunDir:
    """Owns the files of one run."""

    OWNED = (
        "metrics.jsonl",
        "trajectories.jsonl",
        "rollouts.jsonl",
        "eval_episodes.jsonl",
        "checkpoints",
        "plots",
        "report.md",
        "report.html",
        "summary.json",
        "final_model",
        "best_model",
    )

    LOGS = ("metrics.jsonl", "rollouts.jsonl", "trajectories.jsonl", "eval_episodes.jsonl")
    """The logs a run appends to; a checkpoint records their sizes (`log_sizes`)."""

    def __init__(self, path: str | Path, cfg: Any, fresh: bool) -> None:
        self.dir = Path(path)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.started, self.elapsed_before = time.time(), 0.0
        remove_partial(self.dir)
        if fresh:  # remove only what a previous run of ours wrote here
            for name in self.OWNED:
                p = self.dir / name
                if p.is_dir():
                    shutil.rmtree(p)
                elif p.exists():
                    p.unlink()
        shown = configutil.to_dict(cfg)
        (self.dir / "config.yaml").write_text(yaml.safe_dump(shown, sort_keys=False))
        # The trackers live here, in the driver: every row reaches them from one place.
        self.trackers = make_trackers(getattr(cfg, "log", None), self.dir)
        self.trackers.log_config(shown)
        self.ckpt_dir = self.checkpoints_of(self.dir)
        for d in (self.ckpt_dir, self.ckpt_dir / SFT_DIR):
            remove_partial(d)

    @staticmethod
    def checkpoints_of(run_dir: str | Path) -> Path:
        """The checkpoint folder of a run directory."""
        return Path(run_dir) / "checkpoints"

    def log_metrics(self, record: dict[str, Any]) -> None:
        """Append one row to ``metrics.jsonl``, stamped with ``wall_time`` (Unix seconds)
        and ``elapsed_s`` (seconds of the run so far, resumed attempts counted once)."""
        row = {
            **record,
            "wall_time": round(time.time(), 3),
            "elapsed_s": round(self.elapsed_s(), 3),
        }
        with open(self.dir / "metrics.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(row, default=float) + "\n")
        self.trackers.log_row(row)
        if record.get("phase") in ("eval_before", "eval"):  # the one after RL: `finish`
            self.write_report()

    def write_report(self) -> Path | None:
        """Write ``report.html`` (`agentr1.report`: curves, evaluations, the trajectory
        viewer) as the logs are now; a report that fails is logged, never the run's end."""
        try:
            from agentr1.report import write_report

            path = write_report([self.dir], self.dir / "report.html", quiet=True)
        except Exception as e:  # the report is a view of the logs; the logs are the record
            log.warning("report.html not written: %s: %s", type(e).__name__, e)
            return None
        return path

    def log_trajectories(
        self,
        step: int,
        groups: Sequence[TrajectoryGroup],
        decode: Callable[[Sequence[int]], str],
        layers: Sequence[dict[str, Any]] = (),
    ) -> None:
        """Append the episodes of an RL step's ``groups`` to ``trajectories.jsonl``, one
        line each (`trajectory_line`: split ``train``, label ``rl``), with the per-token
        ``layers`` of `agentr1.trainer.tokenlog.token_layers` in the groups' order (none:
        the episodes' own mask and log-probs only)."""
        trajs = [(gi, t) for gi, g in enumerate(groups) for t in g.trajectories]
        if layers and len(layers) != len(trajs):
            raise ValueError(f"{len(trajs)} episodes but {len(layers)} rows of token layers")
        with open(self.dir / "trajectories.jsonl", "a", encoding="utf-8") as f:
            for i, (gi, t) in enumerate(trajs):
                t.metrics["rl_step"] = float(step)
                where = {"step": step, "split": "train", "label": "rl", "group": gi}
                f.write(trajectory_line(where, t, decode, layers[i] if layers else None))
        if self.trackers:
            texts = [decode(g.trajectories[0].token_ids) for g in groups if g.trajectories]
            self.trackers.log_texts("rl/samples", step, texts)

    def log_eval_trajectories(
        self,
        label: str,
        split: str,
        step: int | None,
        trajs: Sequence[Trajectory],
        decode: Callable[[Sequence[int]], str],
    ) -> None:
        """Append evaluated episodes (greedy) to ``trajectories.jsonl`` under ``split`` and
        ``label`` ("before", "step N", "after"), ``group`` their index in the evaluation."""
        with open(self.dir / "trajectories.jsonl", "a", encoding="utf-8") as f:
            for gi, t in enumerate(trajs):
                where = {"step": step, "split": split, "label": label, "group": gi}
                f.write(trajectory_line(where, t, decode, None))

    def log_rollouts(
        self,
        step: int,
        groups: Sequence[TrajectoryGroup],
        advantages: Sequence[float],
        metrics: Sequence[str] = DEFAULT_METRICS,
    ) -> None:
        """Append one line per episode of an RL step: `episode_record` plus ``step``,
        ``group``, ``sample``, the rewards and ``advantage`` (the episode's mean over its
        trained tokens, in the order of the groups' trajectories). A resumed run first
        drops the lines of the steps it will run again (`prepare_resume`)."""
        trajs = [(gi, g.task, t) for gi, g in enumerate(groups) for t in g.trajectories]
        if len(trajs) != len(advantages):
            raise ValueError(f"{len(trajs)} episodes but {len(advantages)} advantages")
        with open(self.dir / "rollouts.jsonl", "a", encoding="utf-8") as f:
            for (gi, task, t), adv in zip(trajs, advantages, strict=True):
                rec: dict[str, Any] = {"step": step, "group": gi, "sample": t.sample_index}
                rec.update(episode_record(t, task, metrics))
                rec["reward"] = t.total_reward
                rec["outcome_reward"] = t.outcome_reward
                rec["process_reward"] = sum(t.step_rewards)
                rec["advantage"] = adv
                f.write(json_line(rec) + "\n")

    def elapsed_s(self) -> float:
        """Seconds this run has been going: this attempt's, plus those of the attempts
        before the checkpoint it resumed from (`resume_from`)."""
        return self.elapsed_before + time.time() - self.started

    def checkpoint_facts(self) -> dict[str, Any]:
        """What a checkpoint's meta records of the run directory: the logs' sizes and the
        elapsed seconds."""
        return {"logs": self.log_sizes(), "elapsed_s": round(self.elapsed_s(), 3)}

    def resume_from(self, meta: dict[str, Any]) -> None:
        """Continue from a checkpoint's `checkpoint_facts`: cut the logs back to their
        sizes then, count the elapsed time from its figure."""
        self.truncate_logs(meta.get("logs"))
        self.elapsed_before = float(meta.get("elapsed_s", 0.0))
        self.started = time.time()

    def log_sizes(self) -> dict[str, int]:
        """Bytes of each log (`LOGS`) now: what a checkpoint records, so that a resume
        from it drops whatever a killed attempt logged after it (`truncate_logs`)."""
        return {n: (self.dir / n).stat().st_size for n in self.LOGS if (self.dir / n).exists()}

    def truncate_logs(self, sizes: dict[str, int] | None) -> None:
        """Cut each log back to its size in ``sizes`` (a checkpoint's `log_sizes`; a log
        it does not list did not exist then and is removed): the rows, episodes and
        torn last line a killed attempt wrote after the checkpoint go, so a resumed run
        logs each step, SFT and evaluation once. None (an older checkpoint): nothing."""
        if sizes is None:
            return
        for name in self.LOGS:
            path = self.dir / name
            if not path.exists():
                continue
            keep, size = sizes.get(name, 0), path.stat().st_size
            if size > keep:
                with open(path, "r+b") as f:
                    f.truncate(keep)
                log.info("resume: %s cut from %d to %d bytes (the checkpoint's)", path, size, keep)
            elif size < keep:
                log.warning(
                    "%s is shorter (%d bytes) than at the checkpoint (%d)", path, size, keep
                )

    def prepare_resume(self, step: int) -> None:
        """Before a run resumes from its step-``step`` checkpoint, make the episode logs
        say what happened once: rollouts.jsonl and trajectories.jsonl keep the steps
        before ``step``; eval_episodes.jsonl (and the evaluated episodes of
        trajectories.jsonl) drops the "step N" evaluations with N > ``step`` (they run
        again) and renames an earlier attempt's "after" to "after (step K)", K the step
        it evaluated, so that ``--where label=...`` picks one evaluation per question."""

        def rollout(rec: dict[str, Any]) -> dict[str, Any] | None:
            return rec if rec["step"] < step else None

        def sampled(rec: dict[str, Any]) -> dict[str, Any] | None:
            if rec.get("label", "rl") != "rl":  # an evaluation's episodes
                return evaluated(rec)
            return rec if rec["metrics"]["rl_step"] < step else None

        def evaluated(rec: dict[str, Any]) -> dict[str, Any] | None:
            label = rec["label"]
            if label.startswith("step ") and int(label[5:]) > step:
                return None
            if label == "after":
                rec["label"] = f"after (step {rec.get('step', step)})"
            return rec

        self._rewrite("rollouts.jsonl", rollout)
        self._rewrite("trajectories.jsonl", sampled)
        self._rewrite("eval_episodes.jsonl", evaluated)

    def _rewrite(self, name: str, keep: Callable[[dict[str, Any]], dict[str, Any] | None]) -> None:
        """Rewrite a JSONL log through ``keep`` (None drops a line), beside the file and
        renamed into place. A line that is not a record (a kill mid-write tears the last
        one) is dropped with a warning."""
        path = self.dir / name
        if not path.exists():
            return
        out = []
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                try:
                    rec = keep(json.loads(line))
                except (ValueError, KeyError, TypeError, AttributeError):
                    log.warning("%s:%d: not a record, dropped", path, lineno)
                    continue
                if rec is not None:
                    out.append(json_line(rec) + "\n")
        write_atomic(path, "".join(out))

    def log_eval_episodes(
        self,
        label: str,
        mode: str,
        split: str,
        res: EvalResult,
        tasks: Sequence[Task],
        step: int | None = None,
        metrics: Sequence[str] = DEFAULT_METRICS,
    ) -> None:
        """Append one line per evaluated episode (`episode_record`) to
        ``eval_episodes.jsonl``, tagged with ``label`` ("before", "after", "step N"), the
        mode (greedy / sampled), the split and the RL ``step`` of the weights evaluated."""
        by_id = {t.id: t for t in tasks}
        with open(self.dir / "eval_episodes.jsonl", "a", encoding="utf-8") as f:
            for t in res.trajectories:
                rec: dict[str, Any] = {"label": label, "mode": mode, "split": split}
                if step is not None:
                    rec["step"] = step
                rec.update(episode_record(t, by_id[t.task_id], metrics))
                f.write(json_line(rec) + "\n")

    def progress(self, total: int, desc: str, initial: int = 0) -> _Bar:
        return _Bar(total, desc, initial)

    def records(self, phase: str) -> list[dict[str, Any]]:
        return metric_records(self.dir, phase)

    def plot(self, metric: str = "em") -> Path | None:
        """Training curves as one PNG (skipped when there are no RL steps); ``metric`` is
        the task's headline metric."""
        rows = self.records("rl")
        if not rows:
            return None
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        steps = [r["step"] for r in rows]
        panels = [
            ("reward", "reward (outcome + process)"),
            (metric, f"{metric} (train rollouts)"),
            ("kl", "KL to reference"),
            ("entropy", "entropy"),
            ("response_len", "sampled tokens / episode"),
            ("tool_calls", "tool calls / episode"),
        ]
        fig, axes = plt.subplots(2, 4, figsize=(18, 7))
        flat = list(axes.flat)
        for ax, (key, title) in zip(flat, panels, strict=False):
            ys = [r.get(key, math.nan) for r in rows]
            ax.plot(steps, ys)
            ax.set_title(title)
            ax.set_xlabel("RL step")
        ax = flat[len(panels)]
        reasons = sorted({k for r in rows for k in r if k.startswith("stop/")})
        bottom = [0.0] * len(rows)
        for k in reasons:
            ys = [r.get(k, 0.0) for r in rows]
            ax.bar(steps, ys, bottom=bottom, label=k[5:], width=1.0)
            bottom = [b + y for b, y in zip(bottom, ys, strict=True)]
        ax.set_title("stop reasons")
        ax.legend(fontsize=7)
        ax = flat[len(panels) + 1]
        for k in sorted(k for k in rows[0] if k.startswith("time/") and k != "time/step"):
            ax.plot(steps, [r.get(k, math.nan) for r in rows], label=k[5:])
        ax.set_title("seconds per phase")
        ax.legend(fontsize=7)
        fig.tight_layout()
        out = self.dir / "plots" / "training.png"
        out.parent.mkdir(exist_ok=True)
        fig.savefig(out, dpi=80)
        plt.close(fig)
        return out

    def finish(self, summary: dict[str, Any], metric: str = "em") -> str:
        """Write summary.json, plots and report.md (tables of the task's headline
        ``metric``); print and return the table."""
        write_atomic(self.dir / "summary.json", json.dumps(summary, indent=1, default=float))
        self.plot(metric)
        table = summary_table(summary, metric)
        write_atomic(self.dir / "report.md", f"# Run report\n\n{table}\n")
        print("\n" + table, flush=True)
        report = self.write_report()
        if report is not None:
            print(f"\nreport: {report.resolve()}", flush=True)
        self.close()
        return table

    def close(self) -> None:
        """Flush and finish the trackers (`finish` does; idempotent)."""
        self.trackers.close()


def trajectory_line(
    where: dict[str, Any],
    t: Trajectory,
    decode: Callable[[Sequence[int]], str],
    layers: dict[str, Any] | None,
) -> str:
    """One line of ``trajectories.jsonl``: ``where`` (step, split, label, group) first,
    then the trajectory (`Trajectory.to_json`, with its decoded ``text``), the text of
    each token (``pieces``, `agentr1.trainer.tokenlog.token_pieces`) and, for an RL
    episode, its per-token ``layers`` (docs/report.md)."""
    from agentr1.trainer.tokenlog import token_pieces

    rec = {**where, **json.loads(t.to_json(decode(t.token_ids)))}
    rec["pieces"] = token_pieces(t.token_ids, decode)
    if layers:
        rec["layers"] = layers
    return json_line(rec) + "\n"


def summary_table(summary: dict[str, Any], metric: str = "em") -> str:
    """Markdown: ``metric`` per split and breakdown group, greedy and sampled, before and
    after RL; groups of the task's last breakdown key (e.g. ``type=``) get a table of
    their own, greedy only."""
    before, after = summary.get("eval_before", {}), summary.get("eval_after", {})
    cols: list[tuple[str, str]] = []
    for rec in (before, after):
        for per_split in rec.values():
            for split, groups in per_split.items():
                for g in groups:
                    if (split, g) not in cols:
                        cols.append((split, g))
    keys = list(dict.fromkeys(g.split("=", 1)[0] for _, g in cols if "=" in g))
    last = keys[-1] if len(keys) > 1 else None
    main = [c for c in cols if last is None or not c[1].startswith(f"{last}=")]
    extra = [c for c in cols if c not in main]
    lines = _metric_rows(main, before, after, ("greedy", "sampled"), metric)
    if extra:
        lines += ["", *_metric_rows(extra, before, after, ("greedy",), metric)]
    if "minutes" in summary:
        lines.append(
            f"\n{summary.get('steps', 0)} RL steps, {summary['minutes']:.1f} minutes in total."
        )
    return "\n".join(lines)


def _metric_rows(
    cols: list[tuple[str, str]],
    before: dict[str, Any],
    after: dict[str, Any],
    modes: tuple[str, ...],
    metric: str,
) -> list[str]:
    head = "EM" if metric == "em" else metric
    lines = [
        f"| {head} | " + " | ".join(f"{s} {g}" for s, g in cols) + " |",
        "|---|" + "---|" * len(cols),
    ]
    for when, rec in (("before RL", before), ("after RL", after)):
        for mode in modes:
            per_split = rec.get(mode, {})
            cells = []
            for s, g in cols:
                v = per_split.get(s, {}).get(g, {}).get(metric)
                cells.append("" if v is None else f"{v:.3f}")
            if any(cells):  # a mode the run did not evaluate (sampled_n: 0) gets no row
                lines.append(f"| {mode}, {when} | " + " | ".join(cells) + " |")
    return lines
