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


class CountingRetriever:
    """A retriever that records its calls; ``hang`` blocks a batch holding that query
    until ``release`` is set, ``fail`` makes a batch holding it raise."""

    def __init__(self, hang: str = "", fail: str = "") -> None:
        self.inner = BM25Retriever(
            [Passage(str(i), f"P{i}", f"passage number w{i} here") for i in range(20)]
        )
        self.batches: list[list[str]] = []
        self.singles: list[str] = []
        self.hang, self.fail = hang, fail
        self.release = threading.Event()

    def search(self, query: str, k: int) -> list[Passage]:
        self.singles.append(query)
        return self.inner.search(query, k)

    def search_batch(self, queries: list[str], k: int) -> list[list[Passage]]:
        self.batches.append(list(queries))
        if self.hang in queries:
            self.release.wait(10)
        if self.fail in queries:
            raise ConnectionError("retriever down")
        return self.inner.search_batch(queries, k)


def _concurrently(search: SearchTool, queries: list[str]) -> list[object]:
    async def main() -> list[object]:
        calls = (search(query=q) for q in queries)
        return list(await asyncio.gather(*calls, return_exceptions=True))

    return asyncio.run(main())


def test_search_tool_batches_the_queries_issued_together() -> None:
    """Many episodes' searches in one pass of the event loop: one `search_batch` with all
    of them, each call getting its own query's passages."""
    r = CountingRetriever()
    queries = [f"w{i}" for i in range(16)]
    outs = _concurrently(SearchTool(r, top_k=1), queries)
    assert r.batches == [queries] and not r.singles
    assert [o.metadata["passage_ids"] for o in outs] == [[str(i)] for i in range(16)]
    # later calls open a new batch; without batching, one search per query
    _concurrently(SearchTool(r, top_k=1), ["w3"])
    assert r.batches[-1] == ["w3"]
    unbatched = _concurrently(SearchTool(r, top_k=1, batch=False), queries[:4])
    assert sorted(r.singles) == queries[:4] and len(r.batches) == 2  # own threads: any order
    assert [o.metadata["passage_ids"] for o in unbatched] == [[str(i)] for i in range(4)]


def test_search_tool_batch_shares_its_failure_and_its_timeout() -> None:
    """A batch whose retriever call raises fails each of its calls with that error; one
    that hangs times each call out on its own timer, and the next batch is served."""
    r = CountingRetriever(fail="w2")
    outs = _concurrently(SearchTool(r, top_k=1), ["w1", "w2"])
    assert all(isinstance(o, ConnectionError) for o in outs)
    hung = CountingRetriever(hang="w5")
    try:
        t = SearchTool(hung, top_k=1, timeout_s=0.3)
        outs = _concurrently(t, ["w4", "w5"])
        assert all(isinstance(o, TimeoutError) for o in outs)
        t.timeout_s = 30.0  # the next batch, with room for a busy machine
        assert _concurrently(t, ["w6"])[0].metadata["passage_ids"] == ["6"]
    finally:
        hung.release.set()


def test_search_tool_pickles_and_copies_mid_batch() -> None:
    import copy
    import pickle

    async def main() -> None:
        t = SearchTool(CountingRetriever().inner, top_k=1)
        pending = asyncio.ensure_future(t(query="w1"))
        await asyncio.sleep(0)  # the call is in the open batch
        assert copy.deepcopy(t).top_k == 1 and pickle.loads(pickle.dumps(t)).batch
        assert (await pending).metadata["passage_ids"] == ["1"]

    asyncio.run(main())


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
