"""Tasks by name or import path, their typed config sections, and recipe-level overrides.

A task is made by a *factory*: a function (or class) returning a `TaskSpec`. Its first
parameter, when annotated with a dataclass, is the task's own config section
(``task.config`` in a recipe), built and checked like every other field: an unknown key
or a bad value names ``task.config.<field>``. A parameter annotated `TaskContext` (or
named ``ctx``) gets the run's seed, turn budget and warm-start flag.

    @register_task("units")
    def make_task(cfg: UnitsConfig, ctx: TaskContext) -> TaskSpec: ...

    task:
      name: units                     # or my_pkg.units:make_task, or units.py next to the recipe
      config: {n_train: 500}          # -> UnitsConfig(n_train=500)
      tools: [calculator]             # replaces the task's tools (names, paths, or {name, options})
      outcome_reward: my_pkg.rewards:close_enough

Imports no torch.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentr1 import configutil
from agentr1.registry import Registry
from agentr1.tasks.base import TaskContext, TaskSpec

TASKS: Registry[Any] = Registry(
    "task",
    builtins={
        "world": "agentr1.tasks.world:make_task",
        "multihop_qa": "agentr1.tasks.multihop_qa:make_task",
    },
    default_attr="make_task",
)
"""Task factories (or ready `TaskSpec` values) by name."""


def register_task(name: str) -> Callable[[Any], Any]:
    """Register a task factory (or a `TaskSpec`) under ``name``; a taken name raises."""
    return TASKS.register(name)


def task_names() -> list[str]:
    """Registered task names, sorted."""
    return TASKS.names()


@dataclass(frozen=True)
class TaskFactory:
    """A resolved ``task.name``.

    Attributes:
        ref: what the recipe said.
        target: the factory, or a ready `TaskSpec`.
        config_cls: the dataclass of its config section (None: it takes none).
        context_param: whether it takes a `TaskContext`.
    """

    ref: str
    target: Any
    config_cls: type | None
    context_param: bool

    def config(self, data: Mapping[str, Any] | None, where: str = "task.config") -> Any:
        """The typed config from a recipe's section (defaults where absent).

        Raises:
            configutil.ConfigError: an unknown field or a bad value, named by its path, or
                a section for a task that takes none.
        """
        data = dict(data or {})
        if self.config_cls is None:
            if data:
                raise configutil.ConfigError(
                    f"{where}: task {self.ref!r} takes no config; got {', '.join(sorted(data))}"
                )
            return None
        cfg: Any = configutil.build(self.config_cls, data, where)
        check = getattr(cfg, "validate", None)
        if callable(check):
            try:
                check()
            except ValueError as e:
                raise configutil.ConfigError(f"{where}: {e}") from None
        return cfg

    def build(self, config: Any, ctx: TaskContext) -> TaskSpec:
        """Call the factory (or return the ready spec).

        Raises:
            TypeError: the factory returned something that is not a `TaskSpec`.
        """
        if isinstance(self.target, TaskSpec):
            return self.target
        args: list[Any] = []
        if self.config_cls is not None:
            args.append(config)
        if self.context_param:
            args.append(ctx)
        spec = self.target(*args)
        if not isinstance(spec, TaskSpec):
            raise TypeError(
                f"task {self.ref!r}: the factory returned {type(spec).__name__}, not a TaskSpec"
            )
        return spec


def _inspect_factory(ref: str, target: Any) -> TaskFactory:
    """Find a factory's config dataclass and context parameter from its signature."""
    if isinstance(target, TaskSpec):
        return TaskFactory(ref, target, None, False)
    if not callable(target):
        raise configutil.ConfigError(
            f"task.name: {ref!r} is {type(target).__name__}, not a task factory or a TaskSpec"
        )
    fn = target.__init__ if inspect.isclass(target) else target
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # unresolvable annotations: fall back to the raw ones
        hints = getattr(fn, "__annotations__", {})
    params = [
        p
        for p in inspect.signature(target).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    config_cls, context = None, False
    for i, p in enumerate(params):
        hint = hints.get(p.name)
        if hint is TaskContext or p.name in ("ctx", "context"):
            context = True
        elif i == 0 and isinstance(hint, type) and dataclasses.is_dataclass(hint):
            config_cls = hint
        elif p.default is inspect.Parameter.empty:
            raise configutil.ConfigError(
                f"task.name: factory {ref!r} parameter {p.name!r}: expected its config "
                "dataclass first and/or a TaskContext (ctx), nothing else without a default"
            )
    return TaskFactory(ref, target, config_cls, context)


def resolve_task(ref: str, base_dirs: Iterable[str | Path] = ()) -> TaskFactory:
    """The factory ``task.name`` refers to (a registered name, ``module:attr`` or a file).

    Raises:
        ValueError: one line naming the reference and the valid names, or what did not
            resolve.
    """
    target = TASKS.resolve(ref, [Path(d) for d in base_dirs])
    return _inspect_factory(ref, target)


def task_config(section: Any) -> Any:
    """The typed config of a recipe's ``task`` section (its task's config dataclass, or
    None for a task that takes none)."""
    return resolve_task(section.name).config(section.config)


def build_task(section: Any, ctx: TaskContext, base_dirs: Iterable[str | Path] = ()) -> TaskSpec:
    """The `TaskSpec` a recipe's ``task`` section describes, with its overrides applied
    (`apply_overrides`).

    Args:
        section: a `agentr1.config.TaskConfig`.
        ctx: the run's `TaskContext`.
        base_dirs: folders relative file references are looked for in (then the cwd).
    """
    factory = resolve_task(section.name, base_dirs)
    spec = factory.build(factory.config(section.config), ctx)
    return apply_overrides(spec, section, base_dirs)


def apply_overrides(spec: TaskSpec, section: Any, base_dirs: Iterable[str | Path] = ()) -> TaskSpec:
    """A recipe's choices on top of a task: ``tools`` (replace the task's when given),
    ``outcome_reward`` (replace when given), ``system_prompt`` (replace when not None),
    and the process rewards (``process`` and ``process_rewards``, added to the task's own).

    Raises:
        ValueError: an entry that does not resolve, naming it and what is valid.
    """
    from agentr1.rewards import combine_process_rewards, outcome_reward, weighted_process_reward
    from agentr1.tools.registry import resolve_tools

    dirs = tuple(str(d) for d in base_dirs)
    changes: dict[str, Any] = {}
    if section.tools:
        changes["tools"] = resolve_tools(section.tools, provided=spec.tools, base_dirs=dirs)
    if section.outcome_reward:
        changes["outcome_reward"] = outcome_reward(section.outcome_reward, dirs)
    if section.system_prompt is not None:
        changes["system_prompt"] = section.system_prompt
    process = combine_process_rewards(
        spec.process_reward,
        section.process.build(),
        weighted_process_reward(section.process_rewards, dirs),
    )
    if process is not spec.process_reward:
        changes["process_reward"] = process
    return spec.replace(**changes) if changes else spec


@dataclass(frozen=True)
class Command:
    """A subcommand a plug-in adds to ``agentr1`` (e.g. ``agentr1 qa-eval``).

    Attributes:
        help: one line for ``agentr1 --help``.
        add_arguments: fills the subcommand's ``argparse`` parser.
        run: runs it on the parsed arguments; returns the exit status.
        description: the subcommand's ``--help`` text (default: ``help``).
    """

    help: str
    add_arguments: Callable[[Any], None]
    run: Callable[[Any], int]
    description: str = ""


COMMANDS: Registry[Command] = Registry(
    "command", builtins={"qa-eval": "agentr1.tasks.multihop_qa.cli:QA_EVAL"}
)
"""Subcommands plug-ins add to the ``agentr1`` command line, by name."""


def register_command(name: str) -> Callable[[Command], Command]:
    """Register a plug-in subcommand (`Command`) under ``name``."""
    return COMMANDS.register(name)
