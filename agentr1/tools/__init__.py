"""Tools: the Tool protocol, the `@tool` decorator, and the built-in tools."""

from agentr1.tools.base import FunctionTool, Tool, ToolArgumentError, tool, tool_schema
from agentr1.tools.calculator import calculator
from agentr1.tools.search import SearchTool, format_passages

__all__ = [
    "FunctionTool",
    "SearchTool",
    "Tool",
    "ToolArgumentError",
    "calculator",
    "format_passages",
    "tool",
    "tool_schema",
]
