"""The report of a tiny real run: what the loop logs per token for the viewer, the
report.html it writes at each evaluation and at its end, and `agentr1 report`."""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentr1.cli import main
from agentr1.config import load_config
from agentr1.report.data import load_run
from agentr1.trainer import loop
from agentr1.trainer import run as run_module
from tests.e2e.test_train_loop import SMALL

STEPS = 3


def tiny_run(root: Path, steps: int = STEPS) -> tuple[Path, list[str]]:
    """A real run of the embedded world (`SMALL`, ``steps`` RL steps, an evaluation at
    step 2) whose first group gets rewards 1 / 0 (the tiny model earns none), so that
    the update moves its tokens; and the phases after which report.html was written."""
    run_dir = root / "run"
    written: list[str] = []
    real_collate, real_log, real_write = (
        loop.collate_groups,
        run_module.RunDir.log_metrics,
        run_module.RunDir.write_report,
    )

    def rewarded(groups: Any, pad_id: int) -> Any:
        for g in groups[:1]:
            for t in g.trajectories:
                t.outcome_reward = float(t.sample_index == 0)
        return real_collate(groups, pad_id)

    def log_metrics(self: Any, record: dict[str, Any]) -> None:
        written.append(f"logged {record.get('phase')}")
        real_log(self, record)

    def write_report(self: Any) -> Any:
        written.append("report")
        return real_write(self)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(loop, "collate_groups", rewarded)
        mp.setattr(run_module.RunDir, "log_metrics", log_metrics)
        mp.setattr(run_module.RunDir, "write_report", write_report)
        overrides = [f"train.steps={steps}", "train.eval_every=2", f"train.run_dir={run_dir}"]
        loop.train(load_config(None, [*SMALL, "sft.steps=5", *overrides]))
    return run_dir, written


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, list[str]]]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AGENTR1_CACHE", str(tmp_path_factory.getbasetemp() / "agentr1-cache"))
        yield tiny_run(tmp_path_factory.mktemp("report"))


def records(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run_dir / "trajectories.jsonl").read_text().splitlines()]


def test_the_run_writes_its_report_at_each_evaluation_and_at_the_end(
    tiny: tuple[Path, list[str]],
) -> None:
    run_dir, written = tiny
    assert (run_dir / "report.html").stat().st_size > 0
    reports = [i for i, w in enumerate(written) if w == "report"]
    assert [written[i - 1] for i in reports] == [
        "logged eval_before",
        "logged eval",
        "logged eval_after",  # then finish() writes the final one
    ]
    assert written[-1] == "report"


def test_the_loop_logs_each_token_of_the_first_group(tiny: tuple[Path, list[str]]) -> None:
    """Every sample of the first task's group, each step: layers exactly where the loss
    mask is 1, GRPO's advantage the same on every token of an episode and equal to
    rollouts.jsonl's mean, a k3 KL >= 0, ratios that the update moved off 1."""
    run_dir, _ = tiny
    recs = records(run_dir)
    rl = [r for r in recs if r["label"] == "rl"]
    assert [(r["step"], r["group"], r["sample_index"]) for r in rl] == [
        (s, 0, i) for s in range(STEPS) for i in range(2)
    ]
    rollouts = {
        (r["step"], r["group"], r["sample"]): r
        for r in map(json.loads, (run_dir / "rollouts.jsonl").read_text().splitlines())
    }
    moved = []
    for r in rl:
        n, mask = len(r["token_ids"]), r["loss_mask"]
        assert len(r["pieces"]) == n and "".join(r["pieces"]) == r["text"]
        assert set(r["layers"]) == {"advantage", "ratio", "kl"}
        for name, values in r["layers"].items():
            assert len(values) == n
            assert [v is not None for v in values] == [m == 1 for m in mask], name
        adv = [v for v in r["layers"]["advantage"] if v is not None]
        assert len(set(adv)) == 1
        mean = rollouts[(r["step"], r["group"], r["sample_index"])]["advantage"]
        assert adv[0] == pytest.approx(mean, rel=1e-3, abs=1e-6)
        assert (adv[0] > 0) == (r["sample_index"] == 0)  # rewards 1 / 0
        assert all(v >= 0 for v in r["layers"]["kl"] if v is not None)
        moved += [abs(math.log(v)) for v in r["layers"]["ratio"] if v is not None]
    assert max(moved) > 1e-3
    evaluated = [r for r in recs if r["label"] != "rl"]
    assert {(r["label"], r["split"]) for r in evaluated} == {
        (label, split) for label in ("before", "step 2", "after") for split in ("test", "test_ood")
    }
    assert all("layers" not in r and len(r["pieces"]) == len(r["token_ids"]) for r in evaluated)


def test_the_report_reads_the_run(tiny: tuple[Path, list[str]]) -> None:
    run_dir, _ = tiny
    run = load_run(run_dir)
    assert run["skipped"] == [] and run["task"] == "world"
    assert run["rl"]["step"] == [float(s) for s in range(STEPS)]
    assert [e["label"] for e in run["evals"]] == ["before", "step 2", "after"]
    assert run["metric_names"][0] == "em"
    rl = [e for e in run["episodes"] if e["label"] == "rl"]
    assert len(rl) == 2 * STEPS and all(e["gold"] and e["advantage"] is not None for e in rl)
    assert set(rl[0]["layers"]) == {"logprob", "advantage", "ratio", "kl"}
    assert run["shown"] == {"rl": STEPS, "rl_shown": STEPS, "evals": 3, "evals_shown": 3}
    few = load_run(run_dir, max_steps=2)
    assert sorted({e["step"] for e in few["episodes"] if e["label"] == "rl"}) == [0, STEPS - 1]


def test_agentr1_report_overlays_several_runs(
    tiny: tuple[Path, list[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir, _ = tiny
    other = tmp_path / "other"
    shutil.copytree(run_dir, other, ignore=shutil.ignore_patterns("checkpoints", "*_model"))
    out = tmp_path / "both.html"
    assert main(["report", str(run_dir), str(other), "-o", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out.resolve())
    page = out.read_text(encoding="utf-8")
    assert page.count('"name": "run"') == 1 and '"name": "other"' in page
    assert main(["report", str(tmp_path / "nope")]) == 2
    assert "no such run directory" in capsys.readouterr().err


def test_the_size_benchmark_measures_a_run(tiny: tuple[Path, list[str]]) -> None:
    from tests.benchmark_scripts import benchmark

    sizes = benchmark("report_size").measure(tiny[0])
    assert sizes["rl_steps"] == STEPS and sizes["episodes_per_step"] == 2
    assert 30 < sizes["log_bytes_per_token"] < 200
    assert sizes["report_html"] == (tiny[0] / "report.html").stat().st_size
    assert sizes["log_1000_steps_MB"] == pytest.approx(sizes["log_bytes_per_rl_step"] / 1000)
