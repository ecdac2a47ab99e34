"""The `mcp` tool factory against a small MCP server the test starts (stdio): the server's
tools with their schemas, tool errors, and a server that dies mid-episode."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

pytest.importorskip("mcp", reason="the mcp extra is not installed (pip install 'agentr1[mcp]')")

from agentr1.envs.base import ToolEnv
from agentr1.rollout import RolloutConfig, run_rollout
from agentr1.tools.mcp import mcp_tools
from agentr1.tools.registry import resolve_tools
from agentr1.types import StopReason, Task
from tests.fakes import byte_chat

from .test_rollout import call, scripted

SERVER = '''
import os, sys
try:
    from mcp.server.mcpserver import MCPServer as Server   # mcp 2.x
except ImportError:
    from mcp.server.fastmcp import FastMCP as Server        # mcp 1.x

server = Server("toy")


@server.tool()
def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


@server.tool()
def divide(a: float, b: float) -> str:
    """Divide a by b."""
    return str(a / b)


@server.tool()
def crash() -> str:
    """End the server process at once."""
    os._exit(3)


if __name__ == "__main__":
    server.run()
'''


HTTP_SERVER = """
import sys
try:
    from mcp.server.mcpserver import MCPServer as Server   # mcp 2.x
    V2 = True
except ImportError:
    from mcp.server.fastmcp import FastMCP as Server        # mcp 1.x
    V2 = False
port = int(sys.argv[1])
server = Server("toy") if V2 else Server("toy", host="127.0.0.1", port=port)


@server.tool()
def add(a: int, b: int) -> str:
    \"\"\"Add two integers.\"\"\"
    return str(a + b)


if V2:
    server.run("streamable-http", host="127.0.0.1", port=port)
else:
    server.run(transport="streamable-http")
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    path = tmp_path_factory.mktemp("mcp") / "toy_server.py"
    path.write_text(SERVER)
    return [sys.executable, str(path)]


def test_the_servers_tools_come_with_their_schemas(server: list[str]) -> None:
    tools = mcp_tools(server, timeout_s=20)
    by = {t.name: t for t in tools}
    assert sorted(by) == ["add", "crash", "divide"]
    assert by["add"].description == "Add two integers."
    params = by["add"].parameters
    assert params["type"] == "object" and params["required"] == ["a", "b"]
    assert params["properties"]["a"]["type"] == "integer"
    assert asyncio.run(by["add"](a=2, b=3)).content == "5"
    prefixed = mcp_tools(server, prefix="toy_", include=["add"])
    assert [t.name for t in prefixed] == ["toy_add"]
    with pytest.raises(ValueError, match=r"has no tool \['mul'\]"):
        mcp_tools(server, include=["mul"])


def test_a_tool_error_is_an_observation(server: list[str]) -> None:
    (divide,) = mcp_tools(server, include=["divide"])
    r = asyncio.run(divide(a=1, b=0))
    assert not r.ok and r.metadata["error"] == "mcp_error" and "divide" in r.content  # its text
    r = asyncio.run(divide(a="x", b=1))
    assert not r.ok and r.metadata["error"] == "mcp_error"


def test_a_server_that_dies_mid_episode_is_an_observation_and_comes_back(
    server: list[str],
) -> None:
    (tools,) = [resolve_tools([{"name": "mcp", "command": server, "timeout_s": 20}])]
    env = lambda: ToolEnv(tools=tools, system_prompt=None)  # noqa: E731
    turns = [
        call("add", a=1, b=2),
        call("crash"),  # the server process exits during this call
        call("add", a=20, b=22),  # the next call starts it again
        "<answer>42</answer>",
    ]
    rc = RolloutConfig(max_turns=5, max_tokens_per_turn=300, max_context=20_000)
    (group,) = run_rollout([Task("t", "20 + 22?", ["42"])], env, scripted(turns), byte_chat(), rc)
    traj = group.trajectories[0]
    assert traj.stop_reason is StopReason.ANSWERED and traj.outcome_reward == 1.0
    log = traj.tool_log
    assert [e.ok for e in log] == [True, False, True]
    assert log[1].error == "mcp_unavailable" and "server failed" in log[1].content
    assert log[2].content == "42"
    assert tools[0].connection.restarts == 1  # type: ignore[attr-defined]


def test_a_server_that_cannot_start_is_named(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=r"mcp server '.*no_such_server\.py'"):
        mcp_tools([sys.executable, str(tmp_path / "no_such_server.py")])
    with pytest.raises(ValueError, match="exactly one of command"):
        mcp_tools()


def test_a_streamable_http_server_and_its_death(tmp_path: Path) -> None:
    import socket
    import subprocess
    import time

    (tmp_path / "http_server.py").write_text(HTTP_SERVER)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, str(tmp_path / "http_server.py"), str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(300):  # until it listens
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        (add,) = mcp_tools(url=f"http://127.0.0.1:{port}/mcp")
        assert add.name == "add" and asyncio.run(add(a=2, b=40)).content == "42"
    finally:
        proc.kill()
        proc.wait()
    r = asyncio.run(add(a=1, b=1))  # the server is gone: one failed call, no exception
    assert not r.ok and r.metadata["error"] == "mcp_unavailable"
