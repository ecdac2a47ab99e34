"""Tools by name or import path, for recipes: ``task.tools: [calculator, python, ...]``.

An entry is a name or import path, or a mapping with ``name`` and the options of a tool
factory (``{name: python, timeout_s: 5}``) or of a `@tool` (`FUNCTION_TOOL_OPTIONS`:
``{name: calculator, isolation: process}``). A name resolves, in order, to a tool the task
itself provides (its ``search`` over its own corpus), a registered tool (`TOOLS`), or an
import path / file (``my_pkg.tools:convert``, ``my_tools.py:convert``). What it names is a
`Tool` (used as is), or a factory called with the options, returning one tool or several
(an MCP server's tools). Imports no torch.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentr1.registry import Registry, UnknownNameError, is_reference
from agentr1.tools.base import FunctionTool, Tool

FUNCTION_TOOL_OPTIONS = ("timeout_s", "isolation", "processes", "max_hung")
"""What a recipe may set on a `@tool` (``{name: calculator, isolation: process}``)."""

TOOLS: Registry[Any] = Registry(
    "tool",
    builtins={
        "calculator": "agentr1.tools.calculator:calculator",
        "python": "agentr1.tools.python:PythonTool",
        "mcp": "agentr1.tools.mcp:mcp_tools",
        "search": "agentr1.tools.search:search_tool",
    },
)
"""Built-in and registered tools (or tool factories) by name."""


def register_tool(name: str) -> Any:
    """Register a `Tool` or a tool factory under ``name`` (a taken name raises)."""
    return TOOLS.register(name)


def _is_tool(obj: Any) -> bool:
    return isinstance(obj, Tool) and isinstance(getattr(obj, "parameters", None), dict)


def _options_of(fn: Any) -> str:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return "?"
    return ", ".join(p for p in params if p != "self") or "none"


def resolve_tool(
    entry: str | Mapping[str, Any],
    provided: Sequence[Tool] = (),
    base_dirs: Sequence[str] = (),
) -> list[Tool]:
    """The tool(s) one ``task.tools`` entry names (see the module docstring).

    Raises:
        ValueError: one line naming the entry and what is valid (the task's tools, the
            registered names, a factory's options).
    """
    if isinstance(entry, Mapping):
        options = dict(entry)
        name = options.pop("name", None)
        if not isinstance(name, str) or not name:
            raise ValueError(f"task.tools entry {dict(entry)!r}: needs a 'name'")
    else:
        name, options = entry, {}
    own = {t.name: t for t in provided}
    if name in own and not options:
        return [own[name]]
    try:
        obj = TOOLS.resolve(name, [Path(d) for d in base_dirs])
    except UnknownNameError:
        mine = ", ".join(sorted(own)) or "none"
        raise UnknownNameError(
            f"unknown tool {name!r}: not a tool of this task ({mine}) nor a registered one "
            f"({', '.join(TOOLS.names())}), or an import path such as 'my_pkg.tools:name'"
        ) from None
    if isinstance(obj, FunctionTool) and options:
        bad = sorted(set(options) - set(FUNCTION_TOOL_OPTIONS))
        if bad:
            raise ValueError(
                f"tool {name!r}: unknown option(s) {', '.join(bad)}; a @tool takes "
                f"{', '.join(FUNCTION_TOOL_OPTIONS)}"
            )
        return [dataclasses.replace(obj, **options)]
    if _is_tool(obj):
        if options:
            raise ValueError(f"tool {name!r} is a ready tool and takes no options ({options})")
        return [obj]
    if not callable(obj):
        raise ValueError(f"tool {name!r}: {type(obj).__name__} is neither a Tool nor a factory")
    try:
        made = obj(**options)
    except TypeError as e:
        raise ValueError(f"tool {name!r}: {e} (options: {_options_of(obj)})") from None
    tools = list(made) if isinstance(made, list | tuple) else [made]
    bad = [t for t in tools if not _is_tool(t)]
    if bad:
        raise ValueError(f"tool {name!r}: the factory returned {bad[0]!r}, not a Tool")
    return tools


def resolve_tools(
    entries: Sequence[str | Mapping[str, Any]],
    provided: Sequence[Tool] = (),
    base_dirs: Sequence[str] = (),
) -> list[Tool]:
    """Every entry's tools, in order; duplicate tool names are refused."""
    out: list[Tool] = []
    for entry in entries:
        out.extend(resolve_tool(entry, provided, base_dirs))
    names = [t.name for t in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"task.tools: tool names must be unique, {dup} given twice")
    return out


__all__ = ["TOOLS", "is_reference", "register_tool", "resolve_tool", "resolve_tools"]
