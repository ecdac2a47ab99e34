"""Tools: the Tool protocol, the `@tool` decorator, and the registry of built-in tools.

Built-ins, by the name a recipe's ``task.tools`` takes: ``calculator``
(`agentr1.tools.calculator`), ``python`` (a sandboxed interpreter,
`agentr1.tools.python`), ``mcp`` (the tools of a Model Context Protocol server,
`agentr1.tools.mcp`) and ``search`` (`agentr1.tools.search`). ``from agentr1.tools import
calculator`` is the module; the tool object is ``agentr1.tools.calculator.calculator``.
"""

from agentr1.tools.base import FunctionTool, Tool, ToolArgumentError, tool, tool_schema
from agentr1.tools.registry import TOOLS, register_tool, resolve_tools
from agentr1.tools.search import SearchTool, format_passages

__all__ = [
    "TOOLS",
    "FunctionTool",
    "SearchTool",
    "Tool",
    "ToolArgumentError",
    "format_passages",
    "register_tool",
    "resolve_tools",
    "tool",
    "tool_schema",
]
