"""The `mcp` tool factory: every tool of a Model Context Protocol server as agentr1 tools.

    task.tools: [{name: mcp, command: [python, my_server.py]}]        # a stdio server
    task.tools: [{name: mcp, url: "http://127.0.0.1:8000/mcp"}]        # streamable HTTP

`mcp_tools` connects once, lists the server's tools and returns one `MCPTool` per tool,
with the server's name, description and JSON schema (what the chat template renders).
The session lives in a background thread with its own event loop, so it outlives the
rollout's per-batch loops, and calls from any loop reach it. A server that dies, hangs
or refuses a call costs that call only: the observation says what happened
(``metadata["error"]``: ``mcp_error`` for a tool error the server reported,
``mcp_unavailable`` for a dead or unreachable server, ``mcp_timeout``), and the next
call starts the server again (stdio) or reconnects (HTTP).

Needs the ``mcp`` package (``pip install 'agentr1[mcp]'``), imported only here.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import logging
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agentr1.types import ToolResult

log = logging.getLogger(__name__)

INSTALL = "pip install 'agentr1[mcp]'  (or: pip install mcp)"


def _require_mcp() -> Any:
    try:
        import mcp
    except ImportError as e:
        raise ImportError(f"the mcp tool needs the mcp package: {INSTALL}") from e
    return mcp


def _field(obj: Any, *names: str) -> Any:
    """The first attribute of ``obj`` that exists (mcp 1.x camelCase, 2.x snake_case)."""
    for n in names:
        if hasattr(obj, n):
            return getattr(obj, n)
    return None


class MCPConnection:
    """One MCP client session, run in a daemon thread's event loop.

    Args:
        command: argv of a stdio server (``[python, server.py]``).
        url: address of a streamable-HTTP server (instead of ``command``).
        env: extra environment variables for a stdio server.
        log_file: where a stdio server's stderr goes (default: discarded).
        connect_timeout_s: seconds to start, initialize and list tools.
    """

    def __init__(
        self,
        command: Sequence[str] = (),
        url: str = "",
        env: dict[str, str] | None = None,
        log_file: str = "",
        connect_timeout_s: float = 30.0,
    ) -> None:
        if bool(command) == bool(url):
            raise ValueError("tool 'mcp': give exactly one of command (a stdio server) or url")
        _require_mcp()
        self.command, self.url, self.env = list(command), url, dict(env or {})
        self.log_file, self.connect_timeout_s = log_file, connect_timeout_s
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="mcp")
        self._thread.start()
        self._session: Any = None
        self._stop: asyncio.Event | None = None
        self._main_task: asyncio.Future[None] | None = None
        self._lock = threading.Lock()
        self.restarts = 0
        atexit.register(self.close)

    @property
    def where(self) -> str:
        return self.url or " ".join(self.command)

    # -------------------------------------------------------------- connection
    def _transport(self) -> Any:
        if self.url:
            from mcp.client import streamable_http

            client = _field(streamable_http, "streamable_http_client", "streamablehttp_client")
            return client(self.url)
        from mcp import StdioServerParameters
        from mcp.client.stdio import stdio_client

        params = StdioServerParameters(
            command=self.command[0], args=self.command[1:], env={**os.environ, **self.env}
        )
        errlog = open(self.log_file or os.devnull, "a", encoding="utf-8")  # noqa: SIM115
        return stdio_client(params, errlog=errlog)

    async def _run_session(self, ready: asyncio.Future[Any]) -> None:
        from mcp import ClientSession

        self._stop = stop = asyncio.Event()
        try:
            async with self._transport() as streams, ClientSession(streams[0], streams[1]) as s:
                await s.initialize()
                tools = await s.list_tools()
                self._session = s
                if not ready.done():
                    ready.set_result(tools)
                await stop.wait()
        except BaseException as e:  # the server died or never came up
            if not ready.done():
                ready.set_exception(e if isinstance(e, Exception) else RuntimeError(str(e)))
        finally:
            if self._stop is stop:
                self._session = None

    def _connect(self) -> Any:
        """Start (or restart) the session; returns the server's tool list."""

        async def start() -> Any:
            ready: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            self._main_task = asyncio.ensure_future(self._run_session(ready))
            return await ready

        fut = asyncio.run_coroutine_threadsafe(start(), self._loop)
        try:
            return fut.result(self.connect_timeout_s)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise TimeoutError(
                f"mcp server {self.where!r} did not start within {self.connect_timeout_s:g} s"
            ) from None

    def list_tools(self) -> list[Any]:
        """The server's tools (connecting if needed).

        Raises:
            RuntimeError: the server cannot be started or reached, with its command or URL.
        """
        with self._lock:
            try:
                listed = self._connect()
            except Exception as e:
                raise RuntimeError(f"mcp server {self.where!r}: {type(e).__name__}: {e}") from e
        return list(listed.tools)

    def _ensure(self) -> None:
        with self._lock:
            if self._session is None:
                self.restarts += 1
                log.warning("mcp server %r is not connected; starting it again", self.where)
                self._connect()

    # -------------------------------------------------------------- calls
    async def call(self, name: str, arguments: dict[str, Any]) -> Any:
        """Call tool ``name`` on the server from any event loop (reconnecting first when
        the session is gone); the server's result object."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._ensure)
        session = self._session
        if session is None:
            raise ConnectionError(f"mcp server {self.where!r} is not connected")
        fut = asyncio.run_coroutine_threadsafe(session.call_tool(name, arguments), self._loop)
        try:
            return await asyncio.wrap_future(fut)
        except asyncio.CancelledError:
            fut.cancel()
            raise
        except Exception:
            await loop.run_in_executor(None, self._check_alive, session)
            raise

    def _check_alive(self, session: Any) -> None:
        """After a failed call: ping the server; a session that does not answer is ended,
        so the next call starts a new one."""
        ping = asyncio.run_coroutine_threadsafe(session.send_ping(), self._loop)
        try:
            ping.result(5.0)
        except Exception:
            with self._lock:
                if self._session is session:
                    self._session = None
                    stop = self._stop
                    if stop is not None:
                        self._loop.call_soon_threadsafe(stop.set)

    def close(self) -> None:
        """End the session (and a stdio server) and the thread."""
        if not self._loop.is_running():
            return
        stop = self._stop
        if stop is not None:
            self._loop.call_soon_threadsafe(stop.set)
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(asyncio.sleep(0.2), self._loop).result(2)
        self._loop.call_soon_threadsafe(self._loop.stop)


@dataclass
class MCPTool:
    """One tool of an MCP server, as an agentr1 `Tool`.

    Attributes:
        connection: the server's session (shared by the server's tools).
        remote_name: the tool's name on the server.
        name: the name the model calls (``prefix`` + remote name).
        description: the server's description.
        parameters: the server's JSON schema of the arguments (the server validates them).
        timeout_s: seconds a call may take.
    """

    connection: MCPConnection
    remote_name: str
    name: str
    description: str
    parameters: dict[str, Any] = field(default_factory=dict)
    timeout_s: float = 30.0

    async def __call__(self, **arguments: Any) -> ToolResult:
        try:
            result = await asyncio.wait_for(
                self.connection.call(self.remote_name, arguments), self.timeout_s
            )
        except TimeoutError:
            return _error(
                "mcp_timeout", f"Error: {self.name} did not answer within {self.timeout_s:g} s."
            )
        except Exception as e:
            msg = str(e)[:300] or type(e).__name__
            return _error("mcp_unavailable", f"Error: the {self.name} server failed: {msg}")
        text = _result_text(result)
        if _field(result, "is_error", "isError"):
            return _error("mcp_error", text or f"Error: {self.name} failed.")
        return ToolResult(text or "(no output)", metadata={"server": self.connection.where})


def _result_text(result: Any) -> str:
    """The text of a call result (non-text content named by its type)."""
    parts = []
    for c in _field(result, "content") or []:
        text = _field(c, "text")
        parts.append(text if isinstance(text, str) else f"[{_field(c, 'type') or 'content'}]")
    return "\n".join(parts)


def _error(kind: str, message: str) -> ToolResult:
    return ToolResult(message, ok=False, metadata={"error": kind})


def _schema(tool: Any) -> dict[str, Any]:
    schema = _field(tool, "input_schema", "inputSchema") or {}
    out = {k: v for k, v in dict(schema).items() if k != "title"}
    out.setdefault("type", "object")
    out.setdefault("properties", {})
    return out


def mcp_tools(
    command: Sequence[str] | str = (),
    url: str = "",
    prefix: str = "",
    include: Sequence[str] = (),
    timeout_s: float = 30.0,
    env: dict[str, str] | None = None,
    log_file: str = "",
) -> list[MCPTool]:
    """Connect to an MCP server and wrap each of its tools.

    Args:
        command: a stdio server's argv (a string is split on whitespace).
        url: a streamable-HTTP server's address (instead of ``command``).
        prefix: put before every tool name (two servers with a tool of one name).
        include: only these tools (default: all).
        timeout_s: per call.
        env: extra environment variables of a stdio server.
        log_file: where a stdio server's stderr goes (default: discarded).

    Raises:
        ImportError: the mcp package is not installed (the install command named).
        RuntimeError: the server cannot be started or reached.
        ValueError: ``include`` names a tool the server does not have.
    """
    argv = command.split() if isinstance(command, str) else list(command)
    conn = MCPConnection(argv, url, env, log_file)
    listed = conn.list_tools()
    names = [str(_field(t, "name")) for t in listed]
    missing = [n for n in include if n not in names]
    if missing:
        raise ValueError(f"mcp server {conn.where!r} has no tool {missing}; it has {names}")
    return [
        MCPTool(
            connection=conn,
            remote_name=str(_field(t, "name")),
            name=prefix + str(_field(t, "name")),
            description=str(_field(t, "description") or ""),
            parameters=_schema(t),
            timeout_s=timeout_s,
        )
        for t in listed
        if not include or _field(t, "name") in include
    ]
