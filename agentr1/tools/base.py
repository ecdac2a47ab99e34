"""The Tool protocol and the `@tool` decorator.

A Tool executes one action and reports what happened (`ToolResult`); it does not decide
what the result means for the episode — that is `ToolEnv`'s job.

`@tool` turns a typed, documented Python function into a Tool: the JSON schema of its
parameters (OpenAI function-calling convention, so chat templates that take ``tools=``
render it) comes from the type hints, and the descriptions from the Google-style
docstring. Every call has a timeout; where a call runs (a worker thread, a killable
process, or the rollout's event loop) is the tool's ``isolation``
(`agentr1.tools.workers`).
"""

from __future__ import annotations

import asyncio
import inspect
import pickle
import re
import types
import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from agentr1.tools.workers import (
    MAX_HUNG,
    THREADS,
    HungCalls,
    ProcessCalls,
    ToolProcessDied,
    ToolRaised,
    importable,
    resolve_function,
)
from agentr1.types import ToolResult

if TYPE_CHECKING:
    from agentr1.distributed.tools import RayCalls

Isolation = Literal["thread", "process", "inline", "ray"]
"""Where a `FunctionTool`'s calls run (`agentr1.tools.workers`)."""


class ToolExit(RuntimeError):
    """A tool called ``sys.exit`` (or raised ``KeyboardInterrupt`` on a worker thread):
    the call fails, the run goes on."""


async def contain_exit(call: Awaitable[Any]) -> Any:
    """Await a tool call, turning ``SystemExit`` into `ToolExit`. (asyncio re-raises a
    SystemExit out of the event loop, so it must not leave the tool's coroutine.)"""
    try:
        return await call
    except SystemExit as e:
        raise ToolExit(f"the tool called sys.exit({e.code!r})") from None


def _exit_guarded(fn: Callable[..., Any], arguments: dict[str, Any]) -> Any:
    """Run a tool in a worker thread with ``SystemExit`` and ``KeyboardInterrupt`` turned
    into `ToolExit` (a real Ctrl-C reaches the main thread, never this one, so here it is
    the tool's own raise); an async tool on an event loop of its own, so blocking it
    blocks only this thread."""
    try:
        if inspect.iscoroutinefunction(fn):
            return asyncio.run(fn(**arguments))
        return fn(**arguments)
    except SystemExit as e:
        raise ToolExit(f"the tool called sys.exit({e.code!r})") from None
    except KeyboardInterrupt:
        raise ToolExit("the tool raised KeyboardInterrupt") from None


class ToolArgumentError(ValueError):
    """Arguments that do not match the tool's schema; the message is shown to the model."""


@runtime_checkable
class Tool(Protocol):
    """Executes one action.

    Attributes:
        name: identifier the model uses to call it.
        description: one-paragraph description shown to the model.
        parameters: JSON schema (``{"type": "object", "properties": ..., "required": ...}``).
        timeout_s: seconds a call may take before it is abandoned. (A tool that queues its
            calls, such as the ``python`` pool, may also define ``call_timeout_s``, the
            limit of a whole call with its wait; `ToolEnv` then uses that.)
    """

    name: str
    description: str
    parameters: dict[str, Any]
    timeout_s: float

    async def __call__(self, **arguments: Any) -> ToolResult: ...


def tool_schema(t: Tool) -> dict[str, Any]:
    """The OpenAI-style entry for ``tools=`` in chat templates."""
    return {
        "type": "function",
        "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
    }


_JSON_TYPES: dict[Any, str] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    list: "array",
    dict: "object",
}


def _json_type(annotation: Any) -> dict[str, Any]:
    """JSON schema for one Python annotation (str/int/float/bool/list[X]/dict/Literal/Optional)."""
    origin = typing.get_origin(annotation)
    if annotation in _JSON_TYPES:
        return {"type": _JSON_TYPES[annotation]}
    if origin is typing.Literal:
        values = list(typing.get_args(annotation))
        return {"type": _JSON_TYPES[type(values[0])], "enum": values}
    if origin in (list, tuple):
        args = typing.get_args(annotation)
        return {"type": "array", "items": _json_type(args[0])} if args else {"type": "array"}
    if origin is dict:
        return {"type": "object"}
    if origin in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(members) == 1:
            return _json_type(members[0])
    raise TypeError(f"unsupported parameter annotation {annotation!r} for a tool")


_ARGS_HEADER = re.compile(r"^\s*(Args|Arguments|Parameters):\s*$")
_ARG_LINE = re.compile(r"^\s*(\w+)\s*(\([^)]*\))?\s*:\s*(.*)$")


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """Split a Google-style docstring into (description, {param: description})."""
    lines = inspect.cleandoc(doc).splitlines() if doc else []
    desc: list[str] = []
    params: dict[str, str] = {}
    i = 0
    while i < len(lines) and not _ARGS_HEADER.match(lines[i]):
        desc.append(lines[i])
        i += 1
    current: str | None = None
    base_indent: int | None = None
    for line in lines[i + 1 :]:
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        if base_indent is None:
            base_indent = indent
        if indent < base_indent:  # next section (Returns:, Raises:, ...)
            break
        m = _ARG_LINE.match(line)
        if indent == base_indent and m:
            current = m.group(1)
            params[current] = m.group(3).strip()
        elif current is not None:
            params[current] = f"{params[current]} {line.strip()}".strip()
    return " ".join(" ".join(desc).split()), params


def _check_type(value: Any, schema: dict[str, Any]) -> bool:
    kind = schema.get("type")
    if "enum" in schema and value not in schema["enum"]:
        return False
    if kind == "string":
        return isinstance(value, str)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "array":
        return isinstance(value, list) and all(
            _check_type(v, schema["items"]) for v in value if "items" in schema
        )
    if kind == "object":
        return isinstance(value, dict)
    return True


def validate_arguments(schema: dict[str, Any], arguments: Any) -> dict[str, Any]:
    """Check ``arguments`` against a tool's parameter schema.

    Raises:
        ToolArgumentError: with a message that tells the model what to fix.
    """
    if not isinstance(arguments, dict):
        raise ToolArgumentError(f"arguments must be a JSON object, got {type(arguments).__name__}")
    props: dict[str, Any] = schema.get("properties", {})
    problems = []
    missing = [p for p in schema.get("required", []) if p not in arguments]
    if missing:
        problems.append(f"missing required argument(s): {', '.join(missing)}")
    unknown = [a for a in arguments if a not in props]
    if unknown:
        problems.append(
            f"unknown argument(s): {', '.join(unknown)}; expected: {', '.join(props) or 'none'}"
        )
    if problems:
        raise ToolArgumentError("; ".join(problems))
    for key, value in arguments.items():
        if not _check_type(value, props[key]):
            want = props[key].get("enum") or props[key].get("type")
            raise ToolArgumentError(f"argument {key!r} must be {want}, got {value!r}")
    return arguments


@dataclass
class FunctionTool:
    """A Tool wrapping a Python function (sync or async); made by `@tool`.

    Attributes:
        fn, name, description, parameters: the function and what the model is shown.
        timeout_s: seconds a call may run.
        isolation: where calls run: "thread" (default), "process" (killable worker
            processes; the function must be importable), "inline" (async functions
            only: the rollout's event loop) or "ray" (killable Ray actors,
            `agentr1.distributed.tools`). See `agentr1.tools.workers`.
        processes: worker processes (or actors) with ``isolation="process"`` ("ray").
        max_hung: calls still running past their timeout (threads cannot be killed)
            before further calls are refused as ``tool_unavailable``.
    """

    fn: Callable[..., Any]
    name: str
    description: str
    parameters: dict[str, Any]
    timeout_s: float = 10.0
    isolation: Isolation = "thread"
    processes: int = 2
    max_hung: int = MAX_HUNG
    _hung: HungCalls = field(default_factory=HungCalls, init=False, repr=False, compare=False)
    _pool: ProcessCalls | RayCalls | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        if self.isolation not in ("thread", "process", "inline", "ray"):
            raise ValueError(
                f"tool {self.name}: isolation={self.isolation!r}; expected thread, process, "
                "inline or ray"
            )
        if self.isolation == "inline" and not inspect.iscoroutinefunction(self.fn):
            raise ValueError(
                f"tool {self.name}: isolation='inline' is for async functions (a sync one "
                "would block the rollout's event loop)"
            )
        if self.isolation == "process":
            self._pool = ProcessCalls(self.fn, self.processes)
        elif self.isolation == "ray":  # Ray actors: `agentr1.distributed.tools`
            from agentr1.distributed.tools import RayCalls

            self._pool = RayCalls(self.fn, self.processes)

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled (for another process, a Ray actor) with its settings; the function by
        reference when ``@tool`` at module level shadows its name (pickle cannot find it
        then); the copy's hung-call count and worker processes start afresh."""
        state = {f.name: getattr(self, f.name) for f in fields(self) if not f.name.startswith("_")}
        try:
            pickle.dumps(self.fn)
        except (pickle.PicklingError, AttributeError, TypeError):
            state["fn"] = importable(self.fn)
        return _rebuild_tool, (state,)

    @property
    def call_timeout_s(self) -> float:
        """The limit of a whole call for `ToolEnv`: the run's ``timeout_s``, plus a worker
        process's start with ``isolation="process"`` (the tool times its calls itself)."""
        if self._pool is not None:
            return self.timeout_s + self._pool.start_timeout_s
        return self.timeout_s

    async def __call__(self, **arguments: Any) -> ToolResult:
        """Run the function; validation, exceptions and timeouts are the caller's (ToolEnv)."""
        validate_arguments(self.parameters, arguments)
        if self._hung.count >= self.max_hung:
            return ToolResult(
                f"Error: {self.name} is unavailable: {self._hung.count} earlier calls have "
                "not returned.",
                ok=False,
                metadata={"error": "tool_unavailable"},
            )
        if self.isolation == "inline":
            coro: Awaitable[Any] = contain_exit(self.fn(**arguments))
            out = await asyncio.wait_for(coro, timeout=self.timeout_s)
        elif self._pool is not None:
            out = await self._in_process(arguments)
        else:
            fut = THREADS.submit(_exit_guarded, self.fn, arguments)
            try:
                out = await asyncio.wait_for(asyncio.wrap_future(fut), timeout=self.timeout_s)
            finally:
                if not fut.done():  # timed out or cancelled: the thread runs on
                    self._hung.abandon(fut)
        if isinstance(out, ToolResult | str):
            return out if isinstance(out, ToolResult) else ToolResult(content=out)
        if isinstance(out, bool | int | float):  # a number is an answer the model can read
            return ToolResult(content=str(out))
        # None, bytes or an arbitrary object has no text the model could use: say so.
        what = "nothing" if out is None else f"a {type(out).__name__}, not text"
        return ToolResult(
            f"Error: {self.name} returned {what}.", ok=False, metadata={"error": "tool_bad_output"}
        )

    async def _in_process(self, arguments: dict[str, Any]) -> Any:
        """The call in a worker process, which the pool kills past ``timeout_s``."""
        assert self._pool is not None
        try:
            return await asyncio.wrap_future(
                THREADS.submit(self._pool.call, arguments, self.timeout_s)
            )
        except ToolProcessDied as e:
            return ToolResult(
                f"Error: {self.name} failed: {e}.", ok=False, metadata={"error": "tool_crashed"}
            )
        except ToolRaised as e:
            return ToolResult(
                f"Error: {self.name} failed: {e.kind}: {e.message[:300]}",
                ok=False,
                metadata={"error": "tool_exception"},
            )


def _rebuild_tool(state: dict[str, Any]) -> FunctionTool:
    if isinstance(state["fn"], tuple):
        state = {**state, "fn": resolve_function(*state["fn"])}
    return FunctionTool(**state)


@typing.overload
def tool(
    fn: Callable[..., Any],
    *,
    name: str | None = None,
    timeout_s: float = 10.0,
    isolation: Isolation = "thread",
    processes: int = 2,
) -> FunctionTool: ...


@typing.overload
def tool(
    fn: None = None,
    *,
    name: str | None = None,
    timeout_s: float = 10.0,
    isolation: Isolation = "thread",
    processes: int = 2,
) -> Callable[[Callable[..., Any]], FunctionTool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    timeout_s: float = 10.0,
    isolation: Isolation = "thread",
    processes: int = 2,
) -> FunctionTool | Callable[[Callable[..., Any]], FunctionTool]:
    """Make a Tool from a typed function with a Google-style docstring.

    ``timeout_s`` limits each call; ``isolation`` says where calls run: "thread" (the
    default), "process" (``processes`` killable worker processes, for code that may hang
    in C, crash or leak; the function must be defined at module level) or "inline"
    (async functions on the rollout's event loop). See `agentr1.tools.workers`.

    >>> @tool
    ... def add(a: int, b: int = 0) -> str:
    ...     '''Add two integers.
    ...
    ...     Args:
    ...         a: first term.
    ...         b: second term.
    ...     '''
    ...     return str(a + b)
    >>> add.parameters["required"], add.parameters["properties"]["a"]
    (['a'], {'type': 'integer', 'description': 'first term.'})
    """

    def wrap(f: Callable[..., Any]) -> FunctionTool:
        description, param_docs = _parse_docstring(f.__doc__ or "")
        hints = typing.get_type_hints(f)
        props: dict[str, Any] = {}
        required: list[str] = []
        for pname, p in inspect.signature(f).parameters.items():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                raise TypeError(f"tool {f.__name__}: *args/**kwargs cannot be described")
            if pname not in hints:
                raise TypeError(f"tool {f.__name__}: parameter {pname!r} needs a type hint")
            prop = _json_type(hints[pname])
            if pname in param_docs:
                prop["description"] = param_docs[pname]
            props[pname] = prop
            if p.default is inspect.Parameter.empty:
                required.append(pname)
        if not description:
            raise TypeError(f"tool {f.__name__}: a docstring describing the tool is required")
        schema = {"type": "object", "properties": props, "required": required}
        return FunctionTool(
            fn=f,
            name=name or f.__name__,
            description=description,
            parameters=schema,
            timeout_s=timeout_s,
            isolation=isolation,
            processes=processes,
        )

    return wrap(fn) if fn is not None else wrap
