"""A run directory as the report's data: plain JSON-able dicts, read robustly.

A run killed mid-write leaves a torn last line; a disk or an editor may leave garbage or
bytes that are not UTF-8. Every log here is read line by line: a line that is not a JSON
object (or not the record its file holds) is left out and named in a `Skipped` (file,
line, reason), and the report shows what the rest says. `load_runs` returns one dict per
run directory (`load_run`):

    name, path            the folder
    task, metric_names    the task and its metrics (the evaluation records' keys, the
                          headline metric first)
    config, summary       config.yaml and summary.json (None where absent or unreadable)
    rl                    metrics.jsonl's RL rows as columns {"step": [...], key: [...]}
                          (None where a row lacks the key; of rows with the same step, the
                          last: a resumed run's)
    evals                 metrics.jsonl's evaluations: [{"label", "step", "record"}]
                          (record: mode -> split -> group -> metric -> value)
    episodes              the episodes of trajectories.jsonl (`episode`) of at most
                          ``max_steps`` RL steps and ``max_steps`` evaluations, evenly spread
    shown                 how many RL steps / evaluations the log has and the page holds
    skipped               what was left out, as "file:line: reason" strings

Nothing here imports torch.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

MAX_STEPS = 30
"""RL steps (and, apart, evaluations) whose episodes the page holds by default: about
60 KB a step of the demo's (docs/report.md)."""

MAX_TOOL_TEXT = 2000
"""Characters of a tool result the tool-call list keeps (its tokens show all of it)."""

LOGS = ("metrics.jsonl", "trajectories.jsonl", "rollouts.jsonl", "eval_episodes.jsonl")
"""The files a report reads besides config.yaml and summary.json."""

_NOT_METRICS = {"turns", "tool_calls", "n"}
_RUN_KEYS = {"phase", "wall_time", "elapsed_s", "step"}


class ReportError(ValueError):
    """A report that cannot be made (not a run directory); the message names the path."""


@dataclass(frozen=True)
class Skipped:
    """A line (0: the whole file) left out of a report, and why."""

    file: str
    line: int
    reason: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where}: {self.reason}"


def read_lines(path: Path) -> Iterator[tuple[int, bytes, bool]]:
    """(line number, bytes, whether the line ended with a newline) of each line."""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            yield lineno, raw, raw.endswith(b"\n")


def parse_line(path: Path, lineno: int, raw: bytes, complete: bool) -> dict[str, Any] | Skipped:
    """One JSONL line as a dict, or why it is not one."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return Skipped(str(path), lineno, f"not UTF-8 (byte {e.start} of the line)")
    try:
        rec = json.loads(text)
    except json.JSONDecodeError as e:
        if not complete:
            why = "truncated last line (a run killed mid-write?)"
        else:
            why = f"not JSON ({e.msg}, column {e.colno})"
        return Skipped(str(path), lineno, why)
    if not isinstance(rec, dict):
        return Skipped(str(path), lineno, f"a JSON {type(rec).__name__}, not an object")
    return rec


def read_jsonl(path: Path, skipped: list[Skipped]) -> list[tuple[int, dict[str, Any]]]:
    """(line number, record) of every readable line; the others go to ``skipped``."""
    out = []
    for lineno, raw, complete in read_lines(path):
        if not raw.strip():
            continue
        rec = parse_line(path, lineno, raw, complete)
        if isinstance(rec, Skipped):
            skipped.append(rec)
        else:
            out.append((lineno, rec))
    return out


def clean(value: Any) -> Any:
    """``value`` with every NaN / inf as None (JSON has neither; metrics.jsonl may)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean(v) for v in value]
    return value


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return float(v) if math.isfinite(v) else None


# ---------------------------------------------------------------------------- metrics
def _metrics(path: Path, skipped: list[Skipped]) -> tuple[dict[str, list[Any]], list[dict]]:
    """The RL rows as columns and the evaluations of metrics.jsonl."""
    rl: dict[float, dict[str, Any]] = {}
    evals: list[dict[str, Any]] = []
    if not path.exists():
        return {"step": []}, evals
    for lineno, r in read_jsonl(path, skipped):
        phase = r.get("phase")
        if phase == "rl":
            step = _number(r.get("step"))
            if step is None:
                skipped.append(Skipped(str(path), lineno, "an RL row without a step"))
                continue
            rl.pop(step, None)  # a resumed run's row replaces the killed attempt's
            rl[step] = r
        elif phase in ("eval_before", "eval", "eval_after"):
            record = {k: v for k, v in r.items() if k not in _RUN_KEYS and isinstance(v, dict)}
            step = _number(r.get("step"))
            label = {"eval_before": "before", "eval_after": "after"}.get(phase)
            evals.append(
                {
                    "label": label or f"step {int(step or 0)}",
                    "step": 0 if phase == "eval_before" else step,
                    "record": record,
                }
            )
    rows = [rl[s] for s in sorted(rl)]
    keys = list(dict.fromkeys(k for r in rows for k in r if k not in ("phase",)))
    cols = {k: [_number(r.get(k)) for r in rows] for k in keys}
    cols = {k: v for k, v in cols.items() if any(x is not None for x in v)}
    cols["step"] = [_number(r["step"]) for r in rows]
    last = cols["step"][-1] if rows else None
    for e in evals:  # the evaluation after RL: the weights after the last step
        if e["label"] == "after" and e["step"] is None:
            e["step"] = None if last is None else last + 1
    return cols, evals


def metric_names(evals: list[dict[str, Any]], summary: dict[str, Any] | None) -> list[str]:
    """The task's metrics, headline first: the keys of an evaluation's groups."""
    records = [e["record"] for e in evals]
    if summary:
        records += [summary.get(k) or {} for k in ("eval_before", "eval_after")]
    for rec in records:
        for per_split in rec.values():
            for groups in (per_split or {}).values():
                for row in (groups or {}).values():
                    if isinstance(row, dict):
                        return [k for k in row if k not in _NOT_METRICS]
    return []


# ---------------------------------------------------------------------------- episodes
_PREFIX = re.compile(rb'^\{"step": (null|-?\d+), "split": "([^"\\]*)", "label": "([^"\\]*)"')


def _where(path: Path, lineno: int, raw: bytes, complete: bool) -> tuple[str, Any] | Skipped:
    """Which RL step or evaluation a trajectories.jsonl line belongs to, from its first
    keys when they are as the trainer writes them (no need to parse the whole line)."""
    m = _PREFIX.match(raw)
    if m:
        label = m.group(3).decode()
        return ("rl", int(m.group(1))) if label == "rl" else ("eval", label)
    rec = parse_line(path, lineno, raw, complete)
    if isinstance(rec, Skipped):
        return rec
    label = rec.get("label")
    if label is None:  # written before evaluations were logged: an RL episode
        step = rec.get("step", (rec.get("metrics") or {}).get("rl_step"))
        return ("rl", int(step)) if _number(step) is not None else ("rl", -1)
    return ("rl", int(rec.get("step") or 0)) if label == "rl" else ("eval", str(label))


def spread(items: list[Any], k: int) -> list[Any]:
    """At most ``k`` of ``items``, evenly spaced, the first and the last included.

    >>> spread(list(range(10)), 4)
    [0, 3, 6, 9]
    """
    if k <= 0:
        return []
    if len(items) <= k:
        return list(items)
    if k == 1:
        return [items[-1]]
    return [items[round(i * (len(items) - 1) / (k - 1))] for i in range(k)]


def episode(rec: dict[str, Any], path: Path, lineno: int) -> dict[str, Any] | Skipped:
    """One logged episode for the viewer, or why the record is not one: tokens (ids and
    ``pieces``), ``loss_mask``, sampled ``logprobs``, the ``layers``, turns, tool calls,
    rewards, stop reason; the text and messages are left out (the pieces hold them)."""

    def bad(why: str) -> Skipped:
        return Skipped(str(path), lineno, why)

    ids, mask = rec.get("token_ids"), rec.get("loss_mask")
    if not isinstance(ids, list) or not isinstance(mask, list):
        return bad("not a trajectory (no token_ids / loss_mask)")
    n = len(ids)
    if len(mask) != n:
        return bad(f"{n} token_ids but {len(mask)} loss_mask values")
    pieces = rec.get("pieces")
    if not isinstance(pieces, list) or len(pieces) != n:
        pieces = [f"[{i}]" for i in ids]  # an older log: ids only
    layers = {}
    for name, values in (rec.get("layers") or {}).items():
        if isinstance(values, list) and len(values) == n:
            layers[name] = values
    lps = rec.get("logprobs")
    if isinstance(lps, list) and len(lps) == n:
        layers = {"logprob": [lp if m else None for lp, m in zip(lps, mask, strict=True)]} | layers
    turns = [t for t in rec.get("turns") or [] if isinstance(t, dict)]
    tools = []
    for e in rec.get("tool_log") or []:
        if isinstance(e, dict):
            content = str(e.get("content", ""))
            if len(content) > MAX_TOOL_TEXT:
                content = content[:MAX_TOOL_TEXT] + " …"
            tools.append({**e, "content": content})
    messages = [m for m in rec.get("messages") or [] if isinstance(m, dict)]
    question = next((m.get("content") for m in messages if m.get("role") == "user"), None)
    outcome = _number(rec.get("outcome_reward")) or 0.0
    reward = outcome + sum(_number(t.get("reward")) or 0.0 for t in turns)
    label = rec.get("label") or "rl"
    step = rec.get("step", (rec.get("metrics") or {}).get("rl_step"))
    return {
        "step": _number(step),
        "split": rec.get("split") or "train",
        "label": label,
        "group": rec.get("group", 0),
        "sample": rec.get("sample_index", 0),
        "task_id": rec.get("task_id"),
        "question": question,
        "prompt_len": rec.get("prompt_len", 0),
        "token_ids": ids,
        "pieces": pieces,
        "loss_mask": mask,
        "layers": layers,
        "turns": [
            {k: t.get(k) for k in ("start", "end", "obs_end", "reward", "finish")} for t in turns
        ],
        "tool_log": tools,
        "reward": reward,
        "outcome_reward": outcome,
        "stop_reason": rec.get("stop_reason"),
        "answer": rec.get("answer"),
        "tool_errors": sum(1 for e in tools if not e.get("ok", True)),
        "metrics": {k: v for k, v in (rec.get("metrics") or {}).items() if _number(v) is not None},
    }


def _episodes(
    path: Path, max_steps: int, skipped: list[Skipped]
) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The episodes of the RL steps and evaluations `spread` picks, and the counts."""
    if not path.exists():
        return [], {"rl": 0, "rl_shown": 0, "evals": 0, "evals_shown": 0}
    where: list[tuple[int, tuple[str, Any]]] = []
    for lineno, raw, complete in read_lines(path):
        if not raw.strip():
            continue
        w = _where(path, lineno, raw, complete)
        if isinstance(w, Skipped):
            skipped.append(w)
        else:
            where.append((lineno, w))
    steps = sorted({v for _, (kind, v) in where if kind == "rl"})
    labels = list(dict.fromkeys(v for _, (kind, v) in where if kind == "eval"))
    keep = {("rl", s) for s in spread(steps, max_steps)}
    keep |= {("eval", label) for label in spread(labels, max_steps)}
    wanted = {lineno for lineno, w in where if w in keep}
    out = []
    for lineno, raw, complete in read_lines(path):
        if lineno not in wanted:
            continue
        rec = parse_line(path, lineno, raw, complete)
        ep = rec if isinstance(rec, Skipped) else episode(rec, path, lineno)
        if isinstance(ep, Skipped):
            skipped.append(ep)
        else:
            out.append(ep)
    counts = {
        "rl": len(steps),
        "rl_shown": min(len(steps), max(max_steps, 0)),
        "evals": len(labels),
        "evals_shown": min(len(labels), max(max_steps, 0)),
    }
    return out, counts


def _join_rollouts(run_dir: Path, episodes: list[dict[str, Any]], skipped: list[Skipped]) -> None:
    """Gold answers and the episode's mean advantage from rollouts.jsonl (RL episodes) and
    gold answers from eval_episodes.jsonl (evaluated ones)."""
    rl = {(e["step"], e["group"], e["sample"]): e for e in episodes if e["label"] == "rl"}
    path = run_dir / "rollouts.jsonl"
    prefix = re.compile(rb'^\{"step": (-?\d+), "group": (\d+), "sample": (\d+)')
    if rl and path.exists():
        for lineno, raw, complete in read_lines(path):
            m = prefix.match(raw)
            if m and (float(m.group(1)), int(m.group(2)), int(m.group(3))) not in rl:
                continue
            rec = parse_line(path, lineno, raw, complete) if raw.strip() else None
            if isinstance(rec, Skipped):
                skipped.append(rec)
            elif rec is not None:
                key = (_number(rec.get("step")), rec.get("group"), rec.get("sample"))
                if key in rl:
                    rl[key]["gold"] = rec.get("gold")
                    rl[key]["advantage"] = _number(rec.get("advantage"))
    evals = {(e["label"], e["split"], e["task_id"]): e for e in episodes if e["label"] != "rl"}
    path = run_dir / "eval_episodes.jsonl"
    if evals and path.exists():
        for _, rec in read_jsonl(path, skipped):
            key = (rec.get("label"), rec.get("split"), rec.get("task_id"))
            if rec.get("mode") == "greedy" and key in evals:
                evals[key]["gold"] = rec.get("gold")


def _json_file(path: Path, skipped: list[Skipped]) -> Any:
    """config.yaml or summary.json, None where absent or unreadable (named in ``skipped``)."""
    if not path.exists():
        return None
    try:
        text = path.read_bytes().decode("utf-8")
        return yaml.safe_load(text) if path.suffix == ".yaml" else json.loads(text)
    except (OSError, UnicodeDecodeError, ValueError, yaml.YAMLError) as e:
        skipped.append(Skipped(str(path), 0, f"unreadable ({type(e).__name__}: {e})"))
    return None


def load_run(run_dir: str | Path, max_steps: int = MAX_STEPS) -> dict[str, Any]:
    """One run directory as the report's data (module docstring).

    Raises:
        ReportError: ``run_dir`` is not a folder with a metrics.jsonl or trajectories.jsonl.
    """
    d = Path(run_dir)
    if not d.is_dir():
        raise ReportError(f"{d}: no such run directory")
    if not any((d / n).exists() for n in LOGS[:2]):
        raise ReportError(f"{d}: not a run directory (no metrics.jsonl or trajectories.jsonl)")
    skipped: list[Skipped] = []
    config = _json_file(d / "config.yaml", skipped)
    summary = _json_file(d / "summary.json", skipped)
    rl, evals = _metrics(d / "metrics.jsonl", skipped)
    episodes, shown = _episodes(d / "trajectories.jsonl", max_steps, skipped)
    _join_rollouts(d, episodes, skipped)
    task = (summary or {}).get("task") or ((config or {}).get("task") or {}).get("name")
    return clean(
        {
            "name": d.resolve().name,
            "path": str(d),
            "task": task,
            "metric_names": metric_names(evals, summary),
            "config": config if isinstance(config, dict) else None,
            "summary": summary if isinstance(summary, dict) else None,
            "rl": rl,
            "evals": evals,
            "episodes": episodes,
            "shown": shown,
            "skipped": [str(s) for s in skipped],
        }
    )


def load_runs(run_dirs: list[str | Path], max_steps: int = MAX_STEPS) -> list[dict[str, Any]]:
    """`load_run` of each directory, in order; two with the same folder name get the
    path instead, so the page can tell them apart."""
    runs = [load_run(d, max_steps) for d in run_dirs]
    names = [r["name"] for r in runs]
    for r in runs:
        if names.count(r["name"]) > 1:
            r["name"] = r["path"]
    return runs
