"""temperature_probe.py: what a GRPO group sees at each sampling temperature."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import temperature_probe

from tests.integration.test_qa_env import tiny_qa_recipe


def episode(reward: float, em: float, searches: int, answer: str | None) -> SimpleNamespace:
    return SimpleNamespace(
        total_reward=reward, metrics={"em": em}, tool_log=[None] * searches, answer=answer
    )


def test_group_summary_counts_groups_and_episodes() -> None:
    groups = [
        SimpleNamespace(trajectories=[episode(1.0, 1.0, 2, "a"), episode(0.2, 0.0, 1, "b")]),
        SimpleNamespace(trajectories=[episode(0.0, 0.0, 2, None), episode(0.0, 0.0, 0, "c")]),
    ]
    s = temperature_probe.group_summary(groups)
    assert s["em"] == 0.25 and s["reward"] == pytest.approx(0.3)
    assert s["mixed"] == 0.5  # the second group's rewards are all equal: no GRPO gradient
    assert s["any_em"] == 0.5 and s["searches"] == 1.25 and s["unanswered"] == 0.25


def test_the_script_runs_greedy_then_each_temperature(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model, recipe = tiny_qa_recipe(tmp_path, 6, tokens_per_turn=5)
    argv = ["--model", str(model), "--recipe", str(recipe), "--questions", "2", "--samples", "3"]
    out = temperature_probe.main([*argv, "--temperatures", "0.5", "1.0"])
    assert list(out) == [0.0, 0.5, 1.0]
    assert all(0 <= s["mixed"] <= 1 and 0 <= s["em"] <= 1 for s in out.values())
    printed = capsys.readouterr().out
    assert "| greedy | 1 |" in printed and "| 0.5 | 3 |" in printed and "| 1.0 | 3 |" in printed
    with pytest.raises(SystemExit):
        temperature_probe.main([*argv, "--temperatures", "0"])
