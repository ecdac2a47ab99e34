"""Experiment trackers: TensorBoard, Weights & Biases and MLflow, fed by the run directory.

`RunDir` (agentr1.trainer.run) owns the run's files and, in the driver process only, a
`Trackers` fan-out built by `make_trackers` from ``log.trackers``. Every row it appends to
metrics.jsonl reaches each tracker as scalars named ``<phase>/<metric>`` (``rl/reward``,
``eval_after/greedy/test/all/em``: an evaluation's nested dicts flattened with "/"), an
evaluation also as a table (mode, split, group, metrics), the sampled trajectories as
text, and the config once. Each backend is an optional extra imported when chosen
(``make trackers`` installs all three):

  tensorboard   torch's SummaryWriter -> <run_dir>/tb (read: tensorboard --logdir)
  wandb         wandb.init(dir=<run_dir>) -> <run_dir>/wandb; WANDB_MODE=offline keeps it
                on disk (`wandb sync` uploads it later)
  mlflow        MlflowClient on a local SQLite store <run_dir>/mlflow.db, artifacts in
                <run_dir>/mlruns (mlflow ui --backend-store-uri sqlite:///<run_dir>/mlflow.db);
                MLFLOW_TRACKING_URI, when set, names another store or a server

A tracker is not worth a crashed run: one that raises is disabled with one warning and
the run goes on with the rest (the run directory's files are the record).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger(__name__)

Table = tuple[list[str], list[list[Any]]]
"""Column names and rows."""


class Tracker(Protocol):
    """One experiment tracker; `Trackers` decides names and steps, the backend writes."""

    name: str

    def log_scalars(self, step: int, scalars: dict[str, float]) -> None:
        """Numbers keyed ``<phase>/<metric>`` at ``step``."""

    def log_table(self, key: str, step: int, columns: list[str], rows: list[list[Any]]) -> None:
        """A small table (an evaluation's metrics per mode, split and group)."""

    def log_text(self, key: str, step: int, text: str) -> None:
        """Free text (a sampled trajectory, decoded)."""

    def log_config(self, config: dict[str, Any]) -> None:
        """The run's resolved config, once at the start."""

    def close(self) -> None:
        """Flush and finish; the tracker is not used after."""


def flatten(record: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """The numbers of a (nested) record keyed by their "/"-joined path; strings, None,
    booleans and non-finite numbers are left out (a tracker plots numbers).

    >>> flatten({"reward": 0.5, "greedy": {"test": {"all": {"em": 1}}}, "s": "x", "n": None})
    {'reward': 0.5, 'greedy/test/all/em': 1.0}
    """
    out: dict[str, float] = {}
    for k, v in record.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out |= flatten(v, f"{key}/")
        elif isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
            out[key] = float(v)
    return out


def eval_table(record: dict[str, Any]) -> Table:
    """An `eval_record` (``{mode: {split: {group: {metric: value}}}}``) as one table."""
    rows = [
        (mode, split, group, metrics)
        for mode, per_split in record.items()
        if isinstance(per_split, dict)
        for split, groups in per_split.items()
        if isinstance(groups, dict)
        for group, metrics in groups.items()
        if isinstance(metrics, dict)
    ]
    names = list(dict.fromkeys(m for *_, metrics in rows for m in metrics))
    return (
        ["mode", "split", "group", *names],
        [
            [mode, split, group, *(metrics.get(m) for m in names)]
            for mode, split, group, metrics in rows
        ],
    )


NOT_SCALARS = ("phase", "step", "wall_time", "elapsed_s")
"""Row fields that are the row's coordinates, not metrics."""

EVAL_PHASES = ("eval_before", "eval", "eval_after")


class Trackers:
    """The fan-out: each call goes to every live tracker; one that raises is warned about
    once and disabled."""

    def __init__(self, trackers: Sequence[Tracker] = ()) -> None:
        self.live: list[Tracker] = list(trackers)
        self.step = 0
        """The step of a row without one (SFT, evaluations before / after RL): the last
        step seen, so every tracker's step only grows."""

    def __bool__(self) -> bool:
        return bool(self.live)

    def _each(self, call: Callable[[Tracker], None]) -> None:
        for t in list(self.live):
            try:
                call(t)
            except Exception as e:  # any tracker failure: disable it, keep the run
                log.warning(
                    "tracker %s failed (%s: %s); disabled for this run", t.name, type(e).__name__, e
                )
                self.live.remove(t)
                with contextlib.suppress(Exception):  # it failed already
                    t.close()

    def log_row(self, row: dict[str, Any]) -> None:
        """One metrics.jsonl row: its numbers as ``<phase>/...`` scalars at its step; an
        evaluation's also as a table."""
        if not self.live:
            return
        phase = str(row.get("phase", "run"))
        if isinstance(row.get("step"), int | float):
            self.step = max(self.step, int(row["step"]))
        step = self.step
        metrics = {k: v for k, v in row.items() if k not in NOT_SCALARS}
        scalars = {f"{phase}/{k}": v for k, v in flatten(metrics).items()}
        # SFT keys already say "sft/...": no "sft/sft/..."
        scalars = {k.replace("sft/sft/", "sft/", 1): v for k, v in scalars.items()}
        if scalars:
            self._each(lambda t: t.log_scalars(step, scalars))
        if phase in EVAL_PHASES:
            columns, rows = eval_table(metrics)
            if rows:
                self._each(lambda t: t.log_table(f"{phase}/table", step, columns, rows))

    def log_texts(self, key: str, step: int, texts: Sequence[str]) -> None:
        if self.live and texts:
            text = "\n\n---\n\n".join(texts)
            self._each(lambda t: t.log_text(key, step, text))

    def log_config(self, config: dict[str, Any]) -> None:
        self._each(lambda t: t.log_config(config))

    def close(self) -> None:
        self._each(lambda t: t.close())
        self.live = []


def markdown_table(columns: list[str], rows: list[list[Any]]) -> str:
    def cell(v: Any) -> str:
        return f"{v:.4g}" if isinstance(v, float) else ("" if v is None else str(v))

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


# ------------------------------------------------------------------------ the backends
class TensorBoardTracker:
    """torch's SummaryWriter (needs the ``tensorboard`` package): event files in ``logdir``."""

    name = "tensorboard"

    def __init__(self, logdir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(logdir))

    def log_scalars(self, step: int, scalars: dict[str, float]) -> None:
        for k, v in scalars.items():
            self.writer.add_scalar(k, v, step)

    def log_table(self, key: str, step: int, columns: list[str], rows: list[list[Any]]) -> None:
        self.writer.add_text(key, markdown_table(columns, rows), step)

    def log_text(self, key: str, step: int, text: str) -> None:
        # TensorBoard renders text as markdown: indent to keep the transcript verbatim.
        self.writer.add_text(key, "\n".join("    " + line for line in text.splitlines()), step)

    def log_config(self, config: dict[str, Any]) -> None:
        self.writer.add_text("config", "```\n" + json.dumps(config, indent=1) + "\n```", 0)

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    """A Weights & Biases run in ``dir`` (``WANDB_MODE=offline``: on disk only)."""

    name = "wandb"

    def __init__(self, dir: Path, project: str, run_name: str) -> None:
        """``dir``: where W&B makes its ``wandb/`` folder."""
        import wandb

        dir.mkdir(parents=True, exist_ok=True)
        self.wandb: Any = wandb  # typed loosely: its stubs vary between releases
        self.run: Any = wandb.init(
            dir=str(dir), project=project, name=run_name, reinit="create_new"
        )

    def log_scalars(self, step: int, scalars: dict[str, float]) -> None:
        self.run.log(scalars, step=step)

    def log_table(self, key: str, step: int, columns: list[str], rows: list[list[Any]]) -> None:
        self.run.log({key: self.wandb.Table(columns=columns, data=rows)}, step=step)

    def log_text(self, key: str, step: int, text: str) -> None:
        self.run.log(
            {key: self.wandb.Table(columns=["step", "text"], data=[[step, text]])}, step=step
        )

    def log_config(self, config: dict[str, Any]) -> None:
        self.run.config.update(config, allow_val_change=True)

    def close(self) -> None:
        self.run.finish()


_MLFLOW_BAD = re.compile(r"[^\w./\- :]")
"""Characters MLflow refuses in metric and param names ("=" of ``type=bridge`` groups)."""


class MlflowTracker:
    """An MLflow run in the tracking store ``uri`` (a folder: MLflow's file store)."""

    name = "mlflow"

    def __init__(self, uri: str, experiment: str, run_name: str, artifacts: Path) -> None:
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=uri)
        exp = self.client.get_experiment_by_name(experiment)
        exp_id = (
            exp.experiment_id
            if exp
            else self.client.create_experiment(experiment, artifact_location=artifacts.as_uri())
        )
        self.run_id = self.client.create_run(exp_id, run_name=run_name).info.run_id

    def log_scalars(self, step: int, scalars: dict[str, float]) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(_MLFLOW_BAD.sub("_", k), v, now, step) for k, v in scalars.items()]
        for i in range(0, len(metrics), 1000):  # log_batch takes at most 1000 metrics
            self.client.log_batch(self.run_id, metrics=metrics[i : i + 1000])

    def log_table(self, key: str, step: int, columns: list[str], rows: list[list[Any]]) -> None:
        self.client.log_dict(
            self.run_id, {"columns": columns, "rows": rows}, f"tables/{key}/step_{step:06d}.json"
        )

    def log_text(self, key: str, step: int, text: str) -> None:
        self.client.log_text(self.run_id, text, f"text/{key}/step_{step:06d}.txt")

    def log_config(self, config: dict[str, Any]) -> None:
        from mlflow.entities import Param

        self.client.log_dict(self.run_id, config, "config.json")
        flat = _flat_params(config)
        params = [Param(_MLFLOW_BAD.sub("_", k), v[:500]) for k, v in flat.items()]
        for i in range(0, len(params), 100):  # log_batch takes at most 100 params
            self.client.log_batch(self.run_id, params=params[i : i + 100])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def _flat_params(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in config.items():
        if isinstance(v, dict) and v:
            out |= _flat_params(v, f"{prefix}{k}.")
        else:
            out[f"{prefix}{k}"] = json.dumps(v, default=str)
    return out


def mlflow_uri(base: Path) -> str:
    """``MLFLOW_TRACKING_URI`` when set (a server), else a SQLite store in
    ``base/mlflow.db``: MLflow 3 refuses its old folder store unless
    ``MLFLOW_ALLOW_FILE_STORE=true``, and SQLite is the local store it maintains."""
    base.mkdir(parents=True, exist_ok=True)
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{(base / 'mlflow.db').resolve()}"


def make_trackers(cfg: Any, run_dir: Path) -> Trackers:
    """The trackers ``cfg`` (a `agentr1.config.LogConfig`; None = none) names, writing
    under ``cfg.tracker_dir`` or else ``run_dir``. One that fails to start is warned about
    and left out."""
    names: Sequence[str] = getattr(cfg, "trackers", ()) if cfg is not None else ()
    if not names:
        return Trackers()
    base = Path(cfg.tracker_dir) if cfg.tracker_dir else Path(run_dir)
    run_name = cfg.run_name or Path(run_dir).resolve().name
    starts: dict[str, Callable[[], Tracker]] = {
        "tensorboard": lambda: TensorBoardTracker(base / "tb"),
        "wandb": lambda: WandbTracker(base, cfg.project, run_name),
        "mlflow": lambda: MlflowTracker(
            mlflow_uri(base), cfg.project, run_name, (base / "mlruns").resolve()
        ),
    }
    live: list[Tracker] = []
    for name in names:
        try:
            live.append(starts[name]())
        except Exception as e:  # a tracker that cannot start is not worth the run
            log.warning(
                "tracker %s did not start (%s: %s); the run goes on without it",
                name,
                type(e).__name__,
                e,
            )
    return Trackers(live)
