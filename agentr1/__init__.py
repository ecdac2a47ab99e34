"""agentr1: train tool-using LLM agents with reinforcement learning on multi-turn tasks.

The public API, enough to train an agent on a task of your own:

    from agentr1 import Config, Task, TaskSpec, load_config, tool, train

    @tool
    def to_cm(inches: float) -> str:
        '''Convert inches to centimetres.

        Args:
            inches: a length in inches.
        '''
        return f"{inches * 2.54:.2f}"

    spec = TaskSpec(name="units", splits={"train": [...], "test": [...]}, tools=[to_cm])
    summary = train(load_config("recipe.yaml"), task=spec)

- `Message`: one chat message (what `ToolEnv.reset` returns and observations are).
- `tool` / `Tool`: a tool is a typed, documented function (or any object with ``name``,
  ``description``, a JSON-schema ``parameters`` and an async ``__call__``).
- `TaskSpec`: what a task gives the trainer (splits, tools, rewards, metrics, optional
  demonstrations); `Task`: one problem. `register_task` names a task factory for recipes
  (``task.name: units``); a recipe may also name it by import path or file.
- `ToolEnv`: the environment that runs a turn's tool calls and scores the episode (subclass
  it for other turn formats or episode logic; `TaskSpec.make_env`).
- `Demonstrations` / `ScriptedPolicy`: a scripted agent for the SFT warm start.
- `Config` / `load_config`: the typed run configuration, from a YAML recipe and overrides.
- `train`, `evaluate`: run a training job; evaluate a model on a task's splits.
- `build_setup` / `Setup`: everything a run builds (task, model, tokenizer, chat format,
  generator, environment factory) without training, for scripts and notebooks that
  probe a model on a task; `token_logprobs`: the trainer's log-probs of given tokens.
- `TaskSampler` / `demo_picks`: the seeded order a run draws its training tasks in (RL)
  and the tasks its SFT warm start demonstrates; `metric_records`: a run's
  ``metrics.jsonl`` rows of one phase, resumed steps de-duplicated.

``import agentr1`` imports nothing heavy (no torch): each name loads on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "tool": "agentr1.tools.base",
    "Tool": "agentr1.tools.base",
    "ToolEnv": "agentr1.envs.base",
    "TaskSpec": "agentr1.tasks.base",
    "TaskContext": "agentr1.tasks.base",
    "Demonstrations": "agentr1.tasks.base",
    "ScriptedPolicy": "agentr1.tasks.base",
    "register_task": "agentr1.tasks.registry",
    "Task": "agentr1.types",
    "Message": "agentr1.types",
    "StepContext": "agentr1.types",
    "ToolResult": "agentr1.types",
    "Config": "agentr1.config",
    "load_config": "agentr1.config",
    "train": "agentr1.trainer.loop",
    "evaluate": "agentr1.trainer.evaluation",
    "build_setup": "agentr1.trainer.setup",
    "Setup": "agentr1.trainer.setup",
    "token_logprobs": "agentr1.trainer.logprobs",
    "TaskSampler": "agentr1.trainer.sampling",
    "demo_picks": "agentr1.trainer.sampling",
    "metric_records": "agentr1.trainer.run",
}

__all__ = [
    "Config",
    "Demonstrations",
    "Message",
    "ScriptedPolicy",
    "Setup",
    "StepContext",
    "Task",
    "TaskContext",
    "TaskSampler",
    "TaskSpec",
    "Tool",
    "ToolEnv",
    "ToolResult",
    "build_setup",
    "demo_picks",
    "evaluate",
    "load_config",
    "metric_records",
    "register_task",
    "token_logprobs",
    "tool",
    "train",
]

if TYPE_CHECKING:
    from agentr1.config import Config, load_config
    from agentr1.envs.base import ToolEnv
    from agentr1.tasks.base import Demonstrations, ScriptedPolicy, TaskContext, TaskSpec
    from agentr1.tasks.registry import register_task
    from agentr1.tools.base import Tool, tool
    from agentr1.trainer.evaluation import evaluate
    from agentr1.trainer.logprobs import token_logprobs
    from agentr1.trainer.loop import train
    from agentr1.trainer.run import metric_records
    from agentr1.trainer.sampling import TaskSampler, demo_picks
    from agentr1.trainer.setup import Setup, build_setup
    from agentr1.types import Message, StepContext, Task, ToolResult


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'agentr1' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
