"""The best model of a run (``train.keep_best``) and writing a model directory atomically.

After each evaluation whose greedy headline metric (the task's first metric, mean over
the evaluated splits) beats every earlier one, ``best_model/`` is rewritten with the
weights and a `BEST_MARKER` naming the step and score; the run's summary records the
choice. On resume, a ``best_model/`` written after the checkpoint is adopted when its
recorded score is the best (`adopt_best_on_disk`).
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

from agentr1 import lora
from agentr1.eval.evaluate import EvalResult
from agentr1.trainer.run import RunDir
from agentr1.trainer.setup import Setup

log = logging.getLogger(__name__)


BEST_MARKER = "selection.json"
"""In ``best_model/``: which evaluation chose it (``{"step", "greedy_<metric>"}``, the
task's headline metric), written with the weights, so a resumed run knows what the
directory holds."""


def best_key(setup: Setup) -> str:
    """The summary key of the best model's score: ``greedy_<headline metric>``."""
    return f"greedy_{setup.task.primary_metric}"


def save_model(setup: Setup, path: Path, note: dict[str, Any] | None = None) -> None:
    """The policy as a plain HF model (adapters folded in) and its tokenizer at ``path``,
    written beside it and renamed into place: a kill mid-write leaves the old one.
    ``note`` goes in as `BEST_MARKER`, in the same rename."""
    tmp, old = path.with_name(path.name + ".tmp"), path.with_name(path.name + ".old")
    shutil.rmtree(tmp, ignore_errors=True)
    merged = lora.merged_state_dict(setup.policy) if lora.lora_modules(setup.policy) else None
    try:
        setup.policy.save_pretrained(tmp, safe_serialization=True, state_dict=merged)
        setup.tokenizer.save_pretrained(tmp)
        if note is not None:
            (tmp / BEST_MARKER).write_text(json.dumps(note) + "\n")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # no partial model left beside the old one
        raise
    shutil.rmtree(old, ignore_errors=True)
    if path.exists():
        path.rename(old)
    tmp.rename(path)
    shutil.rmtree(old, ignore_errors=True)


def keep_if_best(
    setup: Setup,
    run: RunDir,
    summary: dict[str, Any],
    res: dict[str, dict[str, EvalResult]],
    step: int,
) -> None:
    """With ``train.keep_best``: when this evaluation's greedy headline metric (mean over
    the splits) beats every earlier one, write ``best_model/`` and record it in
    ``summary``. A model that cannot be written is logged and counted
    (``best_model_errors``), not fatal; the next evaluation tries again."""
    if not setup.cfg.train.keep_best or not res["greedy"]:
        return
    key = best_key(setup)
    score = sum(r.score for r in res["greedy"].values()) / len(res["greedy"])
    best = summary.get("best_model")
    if best is not None and score <= best[key]:
        return
    choice = {"step": step, key: score}
    try:
        save_model(setup, run.dir / "best_model", note=choice)
    except (OSError, RuntimeError) as e:
        summary["best_model_errors"] = summary.get("best_model_errors", 0) + 1
        log.error(
            "best model (step %d, %s %.3f) not written: %s: %s",
            step,
            key,
            score,
            type(e).__name__,
            e,
        )
        return
    summary["best_model"] = choice
    log.info("best model so far: step %d, %s %.3f -> %s", step, key, score, run.dir / "best_model")


def adopt_best_on_disk(setup: Setup, run: RunDir, summary: dict[str, Any]) -> None:
    """On resume: a killed attempt may have written ``best_model/`` after the checkpoint
    being resumed, so the summary restored with it does not know that model. It was
    evaluated like any other, so when its score beats the summary's choice it becomes the
    choice (``"before_resume": true``); the steps run again may still beat it."""
    marker = run.dir / "best_model" / BEST_MARKER
    if not marker.exists():
        return
    key = best_key(setup)
    try:
        on_disk = json.loads(marker.read_text())
        score, step = float(on_disk[key]), int(on_disk["step"])
    except (ValueError, KeyError, TypeError) as e:
        log.warning(
            "%s: unreadable (%s); best_model/ will be rewritten by the next best", marker, e
        )
        return
    best = summary.get("best_model")
    if best is None or score > best[key]:
        summary["best_model"] = {"step": step, key: score, "before_resume": True}
        log.info("best_model/ from before the resume: step %d, %s %.3f", step, key, score)
    elif step != best["step"]:
        log.warning(
            "best_model/ holds step %d (%s %.3f), not the recorded step %d (%.3f); "
            "the next better evaluation rewrites it",
            step,
            key,
            score,
            best["step"],
            best[key],
        )
