"""The task plug-in API: a task the package has never seen trains from a recipe that names
its file and from Python; every wrong reference is one line naming what is valid; the
trainer, eval and CLI know no task by name."""

from __future__ import annotations

import ast
import json
import textwrap
from pathlib import Path

import pytest

from agentr1 import Task, TaskSpec, ToolEnv, load_config, tool, train
from agentr1.cli import main
from agentr1.configutil import ConfigError
from agentr1.envs.prompts import default_system_prompt
from agentr1.registry import ImportPathError, Registry, UnknownNameError
from agentr1.rewards import OUTCOME_REWARDS, PROCESS_REWARDS
from agentr1.tasks import TASKS, TaskContext, register_task, resolve_task
from agentr1.tools.registry import TOOLS, resolve_tools
from agentr1.trainer.run import summary_table

ROOT = Path(__file__).resolve().parents[2]

UNITS_TASK = '''
"""A user's task, in a file outside the agentr1 package."""
from dataclasses import dataclass

from agentr1 import Demonstrations, Task, TaskSpec, tool


@tool
def to_cm(inches: float) -> str:
    """Convert inches to centimetres.

    Args:
        inches: a length in inches.
    """
    return f"{inches * 2.54:.2f}"


def close_enough(answer, task):
    try:
        return float(abs(float((answer or "").replace("cm", "")) - float(task.answers[0])) < 0.01)
    except ValueError:
        return 0.0


@dataclass(frozen=True)
class UnitsConfig:
    n: int = 12


class Converter:
    def next_turn(self, task, observations):
        if observations:
            return "<answer>" + observations[-1].strip() + " cm</answer>"
        inches = task.question.split()[4]
        return '<tool_call>{"name": "to_cm", "arguments": {"inches": ' + inches + '}}</tool_call>'


def make_task(cfg: UnitsConfig) -> TaskSpec:
    tasks = [
        Task(f"u{i}", f"How many cm is {i + 2} inches?", [f"{(i + 2) * 2.54:.2f}"])
        for i in range(cfg.n)
    ]
    return TaskSpec(
        name="units",
        splits={"train": tasks[: cfg.n // 2], "test": tasks[cfg.n // 2 :]},
        tools=[to_cm],
        outcome_reward=close_enough,
        metrics={"correct": close_enough},
        system_prompt=None,
        demonstrations=lambda seed: [Demonstrations(tasks[: cfg.n // 2], Converter())],
    )
'''

TINY = [
    "model.tiny.hidden_size=32",
    "model.tiny.layers=1",
    "model.tiny.heads=2",
    "model.tiny.intermediate_size=64",
    "model.tiny.vocab_size=300",
    "model.tiny.max_positions=384",
    "sft.steps=3",
    "sft.demos=6",
    "sft.batch_size=3",
    "rollout.n_samples=2",
    "rollout.max_turns=2",
    "rollout.max_tokens_per_turn=64",
    "rollout.max_context=384",
    "train.steps=2",
    "train.tasks_per_step=2",
    "train.checkpoint_every=0",
    "eval.sampled_n=0",
]


@pytest.fixture
def user_task(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("AGENTR1_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "units_task.py").write_text(UNITS_TASK)
    (folder / "recipe.yaml").write_text(
        "task:\n  name: units_task.py\n  config: {n: 12}\nmodel:\n  path: tiny\n"
    )
    return folder


def test_a_task_in_a_file_trains_from_a_recipe_that_names_it(
    user_task: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "run"
    monkeypatch.chdir(tmp_path)  # the file is found next to the recipe, not in the cwd
    rc = main(["train", str(user_task / "recipe.yaml"), *TINY, f"train.run_dir={run}"])
    assert rc == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 2
    # the task's own metric, no EM, no hops column
    assert set(summary["eval_after"]["greedy"]["test"]["all"]) == {
        "correct",
        "turns",
        "tool_calls",
        "n",
    }
    sft = next(json.loads(x) for x in (run / "metrics.jsonl").open() if '"sft"' in x)
    assert sft["sft/demo_correct"] == 1.0  # the scripted converter is always right
    report = (run / "report.md").read_text()
    assert "| correct |" in report and "EM" not in report and "hops" not in report
    saved = (run / "config.yaml").read_text()
    assert str(user_task / "units_task.py") in saved  # anchored: config.yaml finds it again


def test_the_same_task_trains_from_python(user_task: Path, tmp_path: Path) -> None:
    from agentr1.registry import load_file_module

    module = load_file_module(user_task / "units_task.py")
    spec = module.make_task(module.UnitsConfig(n=8))
    cfg = load_config(None, [*TINY, f"train.run_dir={tmp_path / 'run'}"])
    summary = train(cfg, task=spec)
    assert summary["steps"] == 2
    assert "correct" in summary["eval_after"]["greedy"]["test"]["all"]
    # config.yaml says the task came from Python, not the default task.name
    assert "python:units" in (tmp_path / "run" / "config.yaml").read_text()


def test_trainer_eval_and_cli_import_no_built_in_task() -> None:
    """The trainer, the evaluation and the CLI see only the task protocol."""
    files = [*sorted((ROOT / "agentr1" / "trainer").glob("*.py"))]
    files += [*sorted((ROOT / "agentr1" / "eval").glob("*.py")), ROOT / "agentr1" / "cli.py"]
    offenders = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for n in names:
                if n.startswith(("agentr1.tasks.world", "agentr1.tasks.multihop_qa")):
                    offenders.append(f"{path.relative_to(ROOT)}: {n}")
                if n in ("agentr1.tasks.world", "agentr1.tasks.multihop_qa"):
                    offenders.append(f"{path.relative_to(ROOT)}: {n}")
    assert offenders == []
    assert len(files) > 10


# ---------------------------------------------------------------------- wrong references
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["task.name=units"], "task.name: unknown task 'units'; valid: multihop_qa, world, or an import path"),
        (["task.name=no_such_pkg.tasks:make"], "task 'no_such_pkg.tasks:make': cannot import module 'no_such_pkg.tasks'"),
        (["task.name=agentr1.rewards:nope"], "agentr1.rewards has no attribute 'nope' (it defines: "),
        (["task.name=missing_task.py"], "task 'missing_task.py': no such file (looked in"),
        (["task.config.wrld={}"], "task.config.wrld: unknown field; valid fields of WorldTaskConfig: "),
        (["task.config.top_k=0"], "task.config: top_k must be >= 1"),
        (["task.outcome_reward=exact"], "task.outcome_reward: unknown outcome reward 'exact'; valid: cover_em, em, em_format, f1"),
        (["task.process_rewards={valid_cal: 1}"], "task.process_rewards: unknown process reward 'valid_cal'; valid: evidence_shaping, invalid_call"),
        (["task.process_rewards={valid_call: big}"], "task.process_rewards: weights must be numbers"),
        (["algo.estimator=my_pkg.adv:gae2"], "algo.estimator: advantage estimator 'my_pkg.adv:gae2': cannot import module 'my_pkg.adv'"),
    ],
)  # fmt: skip
def test_every_wrong_reference_is_one_line_naming_what_is_valid(
    overrides: list[str], message: str
) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(None, overrides)
    text = str(e.value)
    assert message in text
    problem = next(line for line in text.splitlines() if message in line)
    assert problem.strip().startswith("- ")  # one line of the error list


def test_a_wrong_tool_names_the_tasks_tools_and_the_registered_ones() -> None:
    with pytest.raises(ValueError) as e:
        resolve_tools(["serach"], provided=[_echo])
    assert str(e.value) == (
        "unknown tool 'serach': not a tool of this task (echo) nor a registered one "
        "(calculator, mcp, python, search), or an import path such as 'my_pkg.tools:name'"
    )
    with pytest.raises(
        ValueError, match=r"tool 'python': .*unexpected keyword argument 'timeout'.*options: "
    ):
        resolve_tools([{"name": "python", "timeout": 3}])
    with pytest.raises(ImportPathError, match=r"tool 'agentr1\.tools\.calculator:calc'"):
        resolve_tools(["agentr1.tools.calculator:calc"])
    with pytest.raises(ValueError, match=r"given twice"):
        resolve_tools(["calculator", "agentr1.tools.calculator:calculator"])


def test_tools_by_name_path_and_options() -> None:
    tools = resolve_tools(
        ["echo", "calculator", {"name": "python", "timeout_s": 3}], provided=[_echo]
    )
    assert [t.name for t in tools] == ["echo", "calculator", "python"]
    assert tools[0] is _echo and tools[2].timeout_s == 3  # type: ignore[attr-defined]
    (calc,) = resolve_tools(["agentr1.tools.calculator:calculator"])
    assert calc is TOOLS.get("calculator")


def test_a_recipe_swaps_the_tools_and_the_reward_of_a_task(tmp_path: Path) -> None:
    from agentr1.tasks.registry import build_task

    (tmp_path / "rewards.py").write_text("def always(answer, task):\n    return 0.5\n")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "task:\n  name: world\n  tools: [search, calculator]\n"
        "  outcome_reward: rewards.py:always\n  process_rewards: {invalid_call: -0.5}\n"
    )
    cfg = load_config(recipe, ["task.config.world.n_train=30", "task.config.world.n_test=3"])
    spec = build_task(cfg.task, TaskContext(warm_start=False))
    assert [t.name for t in spec.tools] == ["search", "calculator"]
    assert spec.outcome_reward(None, Task("t", "?", ["a"])) == 0.5
    assert spec.metric_names == ["em", "f1", "cover_em"]  # the task's metrics stay
    env = spec.env_factory()()
    env.reset(spec.splits["train"][0])
    import asyncio

    step = asyncio.run(env.step('<tool_call>{"name": "nope", "arguments": {}}</tool_call>'))
    assert step.reward == -0.5  # one failed call, weight -0.5


def test_registries_refuse_duplicates_and_list_names() -> None:
    reg: Registry[int] = Registry("thing", builtins={"lazy": "json:dumps"})
    reg.add("a", 1)
    with pytest.raises(ValueError, match="'a' is already registered"):
        reg.add("a", 2)
    with pytest.raises(ValueError, match="'lazy' is already registered"):
        reg.add("lazy", 3)
    with pytest.raises(ValueError, match=r"without '\.', ':' or '/'"):
        reg.add("my.thing", 4)
    assert reg.names() == ["a", "lazy"]
    with pytest.raises(UnknownNameError, match="unknown thing 'b'; valid: a, lazy"):
        reg.resolve("b")
    for registry, name in (
        (TASKS, "world"),
        (OUTCOME_REWARDS, "em"),
        (PROCESS_REWARDS, "valid_call"),
    ):
        with pytest.raises(ValueError, match="already registered"):
            registry.add(name, lambda *a: 0.0)
    with pytest.raises(ValueError, match="already registered"):
        register_task("multihop_qa")(lambda: None)


def test_a_file_that_fails_to_import_names_the_line(tmp_path: Path) -> None:
    bad = tmp_path / "broken_task.py"
    bad.write_text("x = 1\ny = undefined_name\n")
    with pytest.raises(
        ImportPathError, match=r"importing .*broken_task.py failed \(line 2\): NameError"
    ):
        resolve_task(str(bad))
    with pytest.raises(ConfigError, match=r"task\.config: task .* takes no config; got a"):
        spec_file = tmp_path / "ready.py"
        spec_file.write_text(
            "from agentr1 import Task, TaskSpec\n"
            "TASK = TaskSpec('r', {'train': [Task('t', 'q', ['a'])]})\n"
        )
        load_config(None, [f"task.name={spec_file}:TASK", "task.config={a: 1}"])


# ---------------------------------------------------------------------- the protocol
@tool(name="echo")
def _echo(text: str) -> str:
    """Repeat the text.

    Args:
        text: what to repeat.
    """
    return text


def test_the_default_system_prompt_is_built_from_the_tools() -> None:
    listed = default_system_prompt([_echo])
    assert '"name": "echo"' in listed and "- echo(text: string): Repeat the text." in listed
    assert "search" not in listed and "encyclopedia" not in listed
    assert "Tools:" not in default_system_prompt([_echo], listed=False)
    env = ToolEnv(tools=[_echo])  # "auto" by default
    assert env.system_prompt == listed


def test_the_chat_format_knows_whether_its_template_renders_tools() -> None:
    from agentr1.rollout.chat import ChatFormat
    from agentr1.templates import CHATML_TOOLS_MINIMAL, QWEN25_TOOLS
    from tests.fakes import ByteTokenizer

    def fmt(template: str) -> ChatFormat:
        from agentr1.templates import render_template

        def render(msgs, tools, gen):  # type: ignore[no-untyped-def]
            return render_template(template, msgs, tools, gen)

        return ChatFormat(render, ByteTokenizer(), "<|im_end|>", 2)

    assert fmt(QWEN25_TOOLS).renders_tools
    assert not fmt(CHATML_TOOLS_MINIMAL).renders_tools


def test_a_task_with_its_own_metric_reports_it_not_em() -> None:
    def close(answer: str | None, task: Task) -> float:
        return float((answer or "").startswith(task.answers[0]))

    spec = TaskSpec("units", {"train": [Task("t", "?", ["511.76"])]}, outcome_reward=close)
    env = spec.env_factory()()
    env.reset(spec.splits["train"][0])
    reward, metrics = env.finish("511.76 cm")
    assert reward == 1.0 and metrics == {"score": 1.0}  # no string EM of 0.0 beside it
    named = spec.replace(metrics={"close": close})
    env = named.env_factory()()
    env.reset(named.splits["train"][0])
    assert env.finish("511.76 cm")[1] == {"close": 1.0}
    summary = {"eval_after": {"greedy": {"test": {"all": {"close": 0.5}}}}}
    table = summary_table(summary, "close")
    assert table.splitlines()[0] == "| close | test all |" and "0.500" in table


def test_a_bad_task_spec_is_refused_with_the_reason() -> None:
    t = [Task("t", "?", ["a"])]
    with pytest.raises(ValueError, match="needs a non-empty 'train' split"):
        TaskSpec("x", {"test": t})
    with pytest.raises(ValueError, match=r"metrics \['reward'\]: names the run logs itself"):
        TaskSpec("x", {"train": t}, metrics={"reward": lambda a, k: 0.0})
    with pytest.raises(ValueError, match="eval_splits: 'dev' is not a split"):
        TaskSpec("x", {"train": t}, eval_splits=["dev"])


def test_eval_splits_a_task_lacks_are_refused_by_name(user_task: Path) -> None:
    from agentr1.trainer.setup import load_task

    cfg = load_config(user_task / "recipe.yaml", ["eval.splits=[dev]"])
    with pytest.raises(
        ConfigError, match=r"eval.splits \['dev'\] are not splits of task 'units' \(train, test\)"
    ):
        load_task(cfg)


def test_agentr1_eval_runs_any_task(
    user_task: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "eval"
    # an override after an option is an override too
    rc = main(["eval", str(user_task / "recipe.yaml"), *TINY[:-1], "--out", str(out), TINY[-1]])
    assert rc == 0, capsys.readouterr().err
    res = json.loads((out / "results.json").read_text())
    assert res["task"] == "units" and res["metrics"] == ["correct"]
    assert res["results"]["greedy"]["test"]["all"]["n"] == 6.0
    lines = (out / "episodes.jsonl").read_text().splitlines()
    assert len(lines) == 6 and "correct" in json.loads(lines[0])
    # QA question files with a recipe: said (without a recipe they run `agentr1 qa-eval`)
    rc = main(["eval", str(user_task / "recipe.yaml"), "--model", "x", "--dataset", "hotpotqa"])
    assert rc == 2 and "agentr1 qa-eval" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["eval", str(user_task / "recipe.yaml"), "--nope"])
    assert "unrecognized arguments: --nope" in capsys.readouterr().err


def test_calculator_import_is_the_module() -> None:
    from agentr1.tools import calculator

    assert calculator.__name__ == "agentr1.tools.calculator"
    assert calculator.calculator.name == "calculator"


def test_public_api_is_documented_and_light() -> None:
    import subprocess
    import sys

    import agentr1

    for name in agentr1.__all__:
        doc = getattr(agentr1, name).__doc__ or ""
        assert len(doc.split()) >= 8, f"agentr1.{name} needs a docstring a user can work from"
    code = "import sys, agentr1; assert 'torch' not in sys.modules, 'import agentr1 imported torch'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_no_docstring_points_outside_the_repository() -> None:
    """Design notes the code cites live in the repository (docs/design.md)."""
    cited = []
    for path in (ROOT / "agentr1").rglob("*.py"):
        text = path.read_text()
        if "DESIGN.md" in text:
            cited.append(str(path.relative_to(ROOT)))
    assert cited == []
    assert (ROOT / "docs" / "design.md").is_file()


def test_envs_base_documents_finish_as_it_is() -> None:
    src = textwrap.dedent((ROOT / "agentr1" / "envs" / "base.py").read_text())
    assert "finish(stop_reason)" not in src and "finish(answer)" in src


def test_the_readme_example_trains_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README's "Your own task" code and recipe, copied as a user would, at a tiny size."""
    import re

    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Your own task", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    shell = re.search(r"```bash\n(.*?)```", section, re.DOTALL)
    assert code is not None and shell is not None
    monkeypatch.setenv("AGENTR1_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "units_task.py").write_text(code.group(1))
    printf = re.search(r"printf '(.*?)' > (\S+)", shell.group(1))
    assert printf is not None
    recipe = tmp_path / printf.group(2)
    recipe.write_text(printf.group(1).encode().decode("unicode_escape"))
    room = ["model.tiny.max_positions=1024", "rollout.max_context=1024"]  # its "auto" prompt
    rc = main(["train", str(recipe), *TINY, *room, f"train.run_dir={tmp_path / 'run'}"])
    assert rc == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert "correct" in summary["eval_after"]["greedy"]["test"]["all"]
    sft = next(json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").open() if '"sft"' in x)
    assert sft["sft/demo_correct"] == 1.0  # the README's scripted converter is right
