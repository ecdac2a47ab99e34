"""The examples in examples/ run end to end at a tiny size, from Python and from their
recipes; a slow test shows the arithmetic example learning (reward rising)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from agentr1.cli import main as cli

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

TINY = [
    "model.tiny.hidden_size=32",
    "model.tiny.layers=1",
    "model.tiny.heads=2",
    "model.tiny.intermediate_size=64",
    "model.tiny.vocab_size=400",
    "sft.demos=8",
    "sft.batch_size=4",
    "train.tasks_per_step=2",
    "rollout.n_samples=2",
    "eval.max_tasks=4",
]


def example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTR1_CACHE", str(tmp_path / "cache"))


@pytest.mark.parametrize(
    ("name", "metric", "small"),
    [
        ("arithmetic_python", "correct", ["task.config.n_train=40", "task.config.n_test=4"]),
        ("unit_conversion", "close_enough", ["task.config.n_train=40", "task.config.n_test=4"]),
    ],
)
def test_the_example_trains_from_python(
    name: str, metric: str, small: list[str], tmp_path: Path
) -> None:
    run = tmp_path / "run"
    args = ["--sft-steps", "3", "--rl-steps", "2", "--run-dir", str(run), *TINY, *small]
    summary = example(name).main(args)
    assert summary["steps"] == 2
    assert metric in summary["eval_after"]["greedy"]["test"]["all"]
    sft = next(json.loads(x) for x in (run / "metrics.jsonl").open() if '"sft"' in x)
    assert 0.0 < sft[f"sft/demo_{metric}"] < 1.0  # the demonstrations are imperfect


@pytest.mark.parametrize("name", ["arithmetic_python", "unit_conversion"])
def test_the_example_trains_from_its_recipe(name: str, tmp_path: Path) -> None:
    run = tmp_path / "run"
    small = ["task.config.n_train=40", "task.config.n_test=4", "sft.steps=3", "train.steps=1"]
    rc = cli(["train", str(EXAMPLES / f"{name}.yaml"), *TINY, *small, f"train.run_dir={run}"])
    assert rc == 0
    assert json.loads((run / "summary.json").read_text())["steps"] == 1


def test_the_arithmetic_solver_runs_code_in_the_sandbox() -> None:
    """The demonstrations' program is what the python tool runs; its output is the answer."""
    import asyncio

    from agentr1.tools.python import PythonTool

    ex = example("arithmetic_python")
    spec = ex.make_task(ex.ArithmeticConfig(n_train=20, n_test=2, guess_prob=0.0))
    task = spec.splits["train"][0]
    out = asyncio.run(PythonTool()(code=task.metadata["code"]))
    assert out.ok and out.content == task.answers[0]
    solver = ex.Solver(0.0, seed=0)
    turn = solver.next_turn(task, [out.content])
    assert turn == f"<answer>{task.answers[0]}</answer>"
    assert ex.correct(turn.removeprefix("<answer>").removesuffix("</answer>"), task) == 1.0


@pytest.mark.slow
def test_the_arithmetic_example_learns_to_compute_with_the_tool(tmp_path: Path) -> None:
    """SFT on demonstrations that give up half the time, then GRPO: the policy learns to
    run code instead (its training reward and its held-out accuracy rise). 3-6 minutes on
    2 cores; seen on seeds 0, 1, 3 (benchmarks/RESULTS.md): reward 0.14-0.25 -> 0.85-0.92,
    greedy test accuracy 0.00 -> 0.92-0.98. Seed 2 fails on the AMD EPYC: its warm start
    never learns to copy the tool's result into the answer, which RL cannot fix in 40
    steps (issue 28's notes: the example's learning is not yet robust across seeds)."""
    run = tmp_path / "run"
    summary = example("arithmetic_python").main(["--run-dir", str(run), "eval.max_tasks=50"])
    rows = [json.loads(x) for x in (run / "metrics.jsonl").open()]
    rewards = [r["reward"] for r in rows if r.get("phase") == "rl"]
    calls = [r["tool_calls"] for r in rows if r.get("phase") == "rl"]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last > first + 0.3, f"reward did not rise: {[round(r, 2) for r in rewards]}"
    assert sum(calls[-5:]) > sum(calls[:5]) + 1.0  # by running code instead of giving up
    before = summary["eval_before"]["greedy"]["test"]["all"]["correct"]
    after = summary["eval_after"]["greedy"]["test"]["all"]["correct"]
    assert after > before + 0.4, (before, after)
