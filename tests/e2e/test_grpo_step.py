"""benchmarks/grpo_step.py: the timed GRPO steps run the real loop and report every phase."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.benchmark_scripts import benchmark
from tests.integration.test_qa_env import tiny_qa_recipe

grpo_step = benchmark("grpo_step")


def test_summary_is_the_median_of_the_steps_after_the_first() -> None:
    rows = [{k: v for k in (*grpo_step.PHASES, "response_len")} for v in (90.0, 1.0, 3.0, 2.0)]
    s = grpo_step.summarize(rows)
    assert s["time/step"] == s["response_len"] == 2.0  # the warm-up's 90 is left out
    assert grpo_step.summarize(rows[:1])["time/update"] == 90.0  # one step: it is all there is


def test_the_script_times_real_grpo_steps_on_a_tiny_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model, recipe = tiny_qa_recipe(tmp_path, 8, tokens_per_turn=6)
    rows = grpo_step.main(
        ["--model", str(model), "--recipe", str(recipe), "--steps", "2", "--samples", "3"]
    )
    assert len(rows) == 2  # the timed steps, not the one the run was configured to reach
    for r in rows:
        parts = [r.get(k, 0.0) for k in grpo_step.PHASES if k != "time/step"]
        assert min(parts) >= 0 and r["time/step"] >= sum(parts) - 1e-3 > 0  # steps time phases
        assert 0 < r["response_len"] <= 2 * 6  # sampled tokens within the turn budgets
    out = capsys.readouterr().out
    table = [line for line in out.splitlines() if line.startswith("| ") and "step" not in line]
    assert [line.split("|")[1].strip() for line in table] == ["0", "1"]  # a row per step
    assert "median of steps 1..1" in out and "peak RSS" in out and "step ratio" in out
    with pytest.raises(SystemExit):
        grpo_step.main(["--model", str(model), "--steps", "0"])


def test_a_missing_warm_start_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)  # no runs/ here
    with pytest.raises(SystemExit):
        grpo_step.main([])
    assert f"no {grpo_step.WARM_START}: make the recipe's warm start" in capsys.readouterr().err
