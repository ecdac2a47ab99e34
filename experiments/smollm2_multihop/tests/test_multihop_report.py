"""``multihop_real.py report`` on synthetic run directories: the paper-shaped
table and the paired comparison of each RL run against the warm start."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import multihop_real
import pytest

STUDY = Path(__file__).resolve().parents[1]
ROOT = STUDY.parents[1]


def _summary(em: float, steps: int = 0) -> dict:
    group = {"all": {"em": em, "f1": em, "cover_em": em, "turns": 2.0, "tool_calls": 1.5, "n": 20}}
    splits = {s: group for s in ("hotpotqa", "2wiki", "musique")}
    return {"eval_after": {"greedy": splits}, "steps": steps}


def _episodes(path: Path, label: str, correct: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [
        {
            "label": label,
            "mode": "greedy",
            "split": s,
            "task_id": str(i),
            "em": float(i < correct),
            "f1": float(i < correct),
        }
        for s in ("hotpotqa", "2wiki", "musique")
        for i in range(20)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_report_pairs_rl_runs_with_the_warm_start(tmp_path: Path) -> None:
    (tmp_path / "warm_start").mkdir()
    (tmp_path / "warm_start" / "summary.json").write_text(json.dumps(_summary(0.1)))
    _episodes(tmp_path / "warm_start" / "eval_episodes.jsonl", "before", 2)
    (tmp_path / "grpo").mkdir()
    (tmp_path / "grpo" / "summary.json").write_text(json.dumps(_summary(0.5, 40)))
    _episodes(tmp_path / "grpo" / "reeval" / "eval_episodes.jsonl", "before", 10)
    # the copy kept before GRPO was extended: its own row and its own paired lines
    (tmp_path / "grpo_20steps").mkdir()
    (tmp_path / "grpo_20steps" / "summary.json").write_text(json.dumps(_summary(0.2, 20)))
    _episodes(tmp_path / "grpo_20steps" / "eval_episodes.jsonl", "after", 4)
    (tmp_path / "ppo").mkdir()  # no records: a row, but no paired lines
    (tmp_path / "ppo" / "summary.json").write_text(json.dumps(_summary(0.1, 20)))
    (tmp_path / "ppo_killed").mkdir()  # no summary: not a finished run, no row
    cmd = [sys.executable, str(STUDY / "multihop_real.py"), "report"]
    cmd += ["--root", str(tmp_path), "--docs", str(tmp_path / "docs")]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    md = (tmp_path / "results.md").read_text()
    assert "| SFT warm start | 0.100 / 0.100 / 0.100 |" in md and "| PPO, 20 steps |" in md
    table = md.split("Paired against")[0].strip().splitlines()[2:]
    table_rows = [x.split(" | ")[0] for x in table]
    assert table_rows == [
        "| SFT warm start", "| GRPO, 20 steps", "| GRPO, 40 steps", "| PPO, 20 steps"
    ]  # fmt: skip
    paired_part = md.split("Paired against the warm start")[1]
    pairs = [x for x in paired_part.splitlines() if x.startswith(("| GRPO", "| PPO"))]
    # per dataset, in domain, all three for each GRPO run; PPO has no records
    assert len(pairs) == 10 and all(x.startswith("| GRPO") for x in pairs)
    assert sum(x.startswith("| GRPO, 20 steps |") for x in pairs) == 5
    pairs = [x for x in pairs if x.startswith("| GRPO, 40 steps |")]
    cells = next(x for x in pairs if "| all three |" in x).split(" | ")
    assert cells[2] == "60" and cells[3].startswith("0.100 → 0.500 (+0.400 [")
    assert cells[4] == "24 / 0" and float(cells[5]) < 1e-6
    musique = next(x for x in pairs if "MuSiQue" in x).split(" | ")
    assert musique[2] == "20" and musique[4] == "8 / 0"


def test_keep_finished_copies_results_and_leaves_a_resumable_run(tmp_path: Path) -> None:
    keep_finished = multihop_real.keep_finished
    run = tmp_path / "grpo"
    (run / "final_model").mkdir(parents=True)
    (run / "final_model" / "model.safetensors").write_text("w")
    (run / "checkpoints" / "step_000020").mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps(_summary(0.2, 20)))
    _episodes(run / "eval_episodes.jsonl", "after", 3)
    (run / "metrics.jsonl").write_text('{"step": 19}\n')
    keep = keep_finished(run)
    assert keep == tmp_path / "grpo_20steps"
    assert sorted(p.name for p in keep.iterdir()) == [
        "eval_episodes.jsonl", "final_model", "metrics.jsonl", "summary.json"
    ]  # fmt: skip
    assert (keep / "final_model" / "model.safetensors").read_text() == "w"
    # the run keeps its checkpoints and metrics (a resume appends), loses its end markers
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints", "metrics.jsonl"]
    with pytest.raises(SystemExit, match="exists already"):
        (run / "summary.json").write_text(json.dumps(_summary(0.2, 20)))
        keep_finished(run)


def test_rl_defaults_yield_to_the_command_line() -> None:
    import argparse

    config = multihop_real.config
    args = argparse.Namespace(recipe=str(ROOT / "recipes" / "multihop_smollm2.yaml"), overrides=[])
    assert config(args, [], defaults=("eval.before=false",)).eval.before is False
    args.overrides = ["eval.before=true", "train.steps=3"]
    cfg = config(args, ["train.steps=5"], defaults=("eval.before=false",))
    assert cfg.eval.before is True and cfg.train.steps == 5  # extra still wins


def test_moving_average_skips_steps_that_did_not_log() -> None:
    moving_average = multihop_real.moving_average
    nan = float("nan")
    out = moving_average([1.0, 3.0, nan, 5.0, 7.0, 9.0, 11.0], width=3)
    assert out[:2] == [1.0, 2.0] and out[2] != out[2]  # NaN stays a gap
    assert out[3:] == [4.0, 6.0, 7.0, 9.0]  # the gap is not in its neighbours' means


def test_curves_draw_the_critic_only_for_the_run_that_has_one(tmp_path: Path) -> None:
    import argparse

    pytest.importorskip("matplotlib")
    plot = multihop_real.plot
    for name, extra in (("grpo", {}), ("ppo", {"value_explained_var": 0.1})):
        rows = [{"phase": "rl", "step": s, "f1": 0.1 * s, **extra} for s in range(4)]
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    drawn: dict[int, list[tuple[str, str]]] = {}  # per panel, in drawing order

    import matplotlib.axes

    real = matplotlib.axes.Axes.plot

    def spy(ax, *a, **kw):  # type: ignore[no-untyped-def]
        drawn.setdefault(id(ax), []).append((kw["label"], kw["color"]))
        return real(ax, *a, **kw)

    matplotlib.axes.Axes.plot = spy  # type: ignore[method-assign]
    try:
        png = plot(argparse.Namespace(root=tmp_path), tmp_path / "docs" / "curves.png")
    finally:
        matplotlib.axes.Axes.plot = real  # type: ignore[method-assign]
    assert png is not None and png.stat().st_size > 0
    both = [("GRPO", "C0"), ("PPO", "C1")]
    # F1 for both, the critic for PPO in GRPO's absence in the same colour, nothing else
    assert list(drawn.values()) == [both, [("PPO", "C1")]]
