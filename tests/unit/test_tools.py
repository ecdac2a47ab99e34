"""The @tool decorator, argument validation, the calculator and the search tool."""

from __future__ import annotations

import asyncio
import re
import threading
from typing import Literal

import pytest

from agentr1.retrieval import BM25Retriever, Passage
from agentr1.tools import SearchTool, ToolArgumentError, tool, tool_schema
from agentr1.tools.calculator import CalculatorError, calculator, evaluate


@tool(timeout_s=3)
def lookup(
    name: str,
    limit: int = 3,
    mode: Literal["fast", "exact"] = "fast",
    tags: list[str] | None = None,
) -> str:
    """Look something up in a table.

    Args:
        name: what to look up; may span
            two lines.
        limit: how many rows.
        mode: matching mode.
        tags: optional filters.

    Returns:
        rows as text.
    """
    return f"{name}:{limit}:{mode}:{threading.current_thread().name}"


def test_schema_from_hints_and_docstring() -> None:
    s = tool_schema(lookup)
    assert s["function"]["name"] == "lookup"
    assert s["function"]["description"] == "Look something up in a table."
    assert s["function"]["parameters"] == {
        "type": "object",
        "properties": {
            "name": {"type": "string", "description": "what to look up; may span two lines."},
            "limit": {"type": "integer", "description": "how many rows."},
            "mode": {"type": "string", "enum": ["fast", "exact"], "description": "matching mode."},
            "tags": {
                "type": "array",
                "items": {"type": "string"},
                "description": "optional filters.",
            },
        },
        "required": ["name"],
    }


def test_sync_tool_runs_in_thread_pool() -> None:
    out = asyncio.run(lookup(name="x"))
    assert out.ok and out.content.startswith("x:3:fast:agentr1-tool")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({}, "missing required argument(s): name"),
        ({"name": "x", "bogus": 1}, "unknown argument(s): bogus"),
        ({"name": 3}, "argument 'name' must be string"),
        ({"name": "x", "limit": "3"}, "argument 'limit' must be integer"),
        ({"name": "x", "limit": True}, "argument 'limit' must be integer"),
        ({"name": "x", "mode": "slow"}, "argument 'mode' must be ['fast', 'exact']"),
        ({"name": "x", "tags": [1]}, "argument 'tags' must be array"),
    ],
)
def test_bad_arguments(args: dict, message: str) -> None:
    with pytest.raises(ToolArgumentError, match=re.escape(message)):
        asyncio.run(lookup(**args))


def test_decorator_rejects_undocumented_or_untyped() -> None:
    def undocumented(x: int) -> str:
        return str(x)

    with pytest.raises(TypeError, match="docstring"):
        tool(undocumented)

    def untyped(x):  # type: ignore[no-untyped-def]
        """Doc."""

    with pytest.raises(TypeError, match="type hint"):
        tool(untyped)


def test_timeout_applies_to_async_tools() -> None:
    @tool(timeout_s=0.1)
    async def sleepy() -> str:
        """Sleeps."""
        await asyncio.sleep(5)
        return "no"

    with pytest.raises(TimeoutError):
        asyncio.run(sleepy())


@pytest.mark.parametrize(
    ("expr", "value"),
    [
        ("1+2*3", 7),
        ("(1971 - 1934) * 2", 74),
        ("2**10", 1024),
        ("7/2", 3.5),
        ("-3 // 2", -2),
        ("sqrt(2)**2", pytest.approx(2.0)),
        ("max(1, 5, 3)", 5),
        ("pi > 3", None),
    ],
)
def test_calculator_values(expr: str, value: object) -> None:
    if value is None:
        with pytest.raises(CalculatorError):
            evaluate(expr)
    else:
        assert evaluate(expr) == value


@pytest.mark.parametrize(
    "expr",
    [
        "__import__('os').system('true')",
        "open('/etc/passwd')",
        "x",
        "1; 2",
        "().__class__",
        "9**9**9",
        "10**10000",
        "1/0",
        "lambda: 1",
        "[1, 2]",
        "'a' * 3",
        "True + 1",
        "1" * 300,
    ],
)
def test_calculator_refuses_unsafe_or_huge(expr: str) -> None:
    with pytest.raises(CalculatorError):
        evaluate(expr)


def test_calculator_tool_integer_output() -> None:
    assert asyncio.run(calculator(expression="10/2")).content == "5"


def test_search_tool_formats_and_reports_ids() -> None:
    r = BM25Retriever(
        [
            Passage("a", "Velmora", "Velmora is a city in Dranth."),
            Passage("b", "Dranth", "Dranth is a country."),
        ]
    )
    out = asyncio.run(SearchTool(r, top_k=1)(query="Velmora"))
    assert out.content == "[1] Velmora\nVelmora is a city in Dranth."
    assert out.metadata["passage_ids"] == ["a"] and out.metadata["titles"] == ["Velmora"]
    clipped = asyncio.run(SearchTool(r, top_k=1, max_words=3)(query="Velmora"))
    assert clipped.content == "[1] Velmora\nVelmora is a ..."
    assert asyncio.run(SearchTool(r)(query="zzz")).content == "No results found."
    empty = asyncio.run(SearchTool(r)(query="   "))
    assert not empty.ok and empty.metadata["error"] == "bad_arguments"
