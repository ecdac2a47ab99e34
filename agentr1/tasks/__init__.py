"""Tasks: the protocol the trainer takes (`TaskSpec`) and the registry of task plug-ins.

The built-in tasks are plug-ins through this same API: ``world`` (the embedded multi-hop
world, `agentr1.tasks.world`) and ``multihop_qa`` (HotpotQA / 2Wiki / MuSiQue with a
search tool, `agentr1.tasks.multihop_qa`). A user's task is a factory returning a
`TaskSpec`, named in a recipe by `register_task` name, import path or file.
"""

from agentr1.tasks.base import (
    Demonstrations,
    ScriptedPolicy,
    TaskContext,
    TaskSpec,
)
from agentr1.tasks.demos import policy_generator
from agentr1.tasks.registry import (
    TASKS,
    TaskFactory,
    apply_overrides,
    build_task,
    register_task,
    resolve_task,
    task_config,
    task_names,
)

__all__ = [
    "TASKS",
    "Demonstrations",
    "ScriptedPolicy",
    "TaskContext",
    "TaskFactory",
    "TaskSpec",
    "apply_overrides",
    "build_task",
    "policy_generator",
    "register_task",
    "resolve_task",
    "task_config",
    "task_names",
]
