"""Tool calls in Ray actors (``isolation="ray"``, `agentr1.distributed.tools`): a hang is
killed at its timeout, a crash or ``os._exit`` costs one call and one actor, a raise is
an observation, and the next call is answered. Marked ``ray`` (``make test-ray``)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from typing import Any

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed here: make ray")

from agentr1.config import DistributedConfig  # noqa: E402
from agentr1.distributed.cluster import connect  # noqa: E402
from agentr1.distributed.tools import tools_on_actors  # noqa: E402
from agentr1.envs.base import ToolEnv  # noqa: E402
from agentr1.tasks import TaskSpec  # noqa: E402
from agentr1.tools import tool  # noqa: E402
from agentr1.types import Task  # noqa: E402

pytestmark = pytest.mark.ray

TASK = Task(id="t", question="q", answers=["a"])


@pytest.fixture(scope="module", autouse=True)
def cluster() -> Any:
    connect(DistributedConfig(num_cpus=2))
    yield
    ray.shutdown()


def make_tool() -> Any:
    secret = "closure value"  # defined in a function: "process" could not import it

    @tool(isolation="ray", processes=1, timeout_s=2.0)
    def misbehave(how: str) -> str:
        """Misbehave on request.

        Args:
            how: "ok", "hang", "exit", "kill", "sys_exit", "raise", "pid" or "secret".
        """
        if how == "hang":
            time.sleep(3600)
        if how == "exit":
            os._exit(3)
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if how == "sys_exit":
            sys.exit(4)
        if how == "raise":
            raise ValueError("bad input")
        if how == "pid":
            return str(os.getpid())
        return secret if how == "secret" else "fine"

    return misbehave


def call(env: ToolEnv, how: str) -> Any:
    body = json.dumps({"name": "misbehave", "arguments": {"how": how}})
    return asyncio.run(env.step(f"<tool_call>{body}</tool_call>")).tool_results[0]


def test_hangs_crashes_and_exits_cost_one_call_each() -> None:
    misbehave = make_tool()
    env = ToolEnv(tools=[misbehave])
    env.reset(TASK)
    pool = misbehave._pool
    first = call(env, "pid")
    assert first.ok and int(first.content) != os.getpid()  # another process
    assert call(env, "pid").content == first.content  # the actor is reused
    assert call(env, "secret").content == "closure value"  # shipped by value
    hung = call(env, "hang")
    assert hung.metadata["error"] == "tool_timeout" and pool.killed == 1
    after = call(env, "pid")
    assert after.ok and after.content != first.content  # a fresh actor
    for how, kind, text in (
        ("exit", "tool_crashed", "actor died"),
        ("kill", "tool_crashed", "actor died"),
        ("sys_exit", "tool_exception", "ToolExit: the tool called sys.exit(4)"),
        ("raise", "tool_exception", "ValueError: bad input"),
    ):
        r = call(env, how)
        assert not r.ok and r.metadata["error"] == kind and text in r.content, (how, r)
        assert call(env, "ok").content == "fine"
    pool.close()


def test_tool_actors_take_the_default_isolation_only() -> None:
    @tool
    def plain(x: int) -> str:
        """Echo.

        Args:
            x: a number.
        """
        return str(x + 1)

    @tool(isolation="inline")
    async def own_loop(x: int) -> str:
        """Echo on the rollout's loop.

        Args:
            x: a number.
        """
        return str(x)

    spec = TaskSpec(name="t", splits={"train": [TASK]}, tools=[plain, own_loop])
    moved = tools_on_actors(spec, DistributedConfig(tool_actors=3))
    by_name = {t.name: t for t in moved.tools}
    assert by_name["plain"].isolation == "ray" and by_name["plain"].processes == 3
    assert by_name["own_loop"].isolation == "inline"  # chosen by its author: kept
    env = ToolEnv(tools=list(moved.tools))
    env.reset(TASK)
    body = json.dumps({"name": "plain", "arguments": {"x": 41}})
    r = asyncio.run(env.step(f"<tool_call>{body}</tool_call>")).tool_results[0]
    assert r.ok and r.content == "42"
