"""Tools in killable worker processes (``isolation="process"``, `agentr1.tools.workers`):
a call that hangs is killed at its timeout, a crash or ``os._exit`` costs that call and
its process, and the next call is answered by a fresh process."""

from __future__ import annotations

import asyncio
import copy
import json
import pickle
from typing import Any

import pytest

from agentr1.envs.base import ToolEnv
from agentr1.tools import tool
from agentr1.tools.workers import ProcessCalls
from agentr1.types import Task
from tests.fault_tools import misbehave

TASK = Task(id="t", question="q", answers=["a"])


def run(how: str) -> Any:
    env = ToolEnv(tools=[misbehave])
    env.reset(TASK)
    body = json.dumps({"name": "misbehave", "arguments": {"how": how}})
    return asyncio.run(env.step(f"<tool_call>{body}</tool_call>")).tool_results[0]


def test_hangs_crashes_and_exits_cost_one_call_each() -> None:
    pool = misbehave._pool
    assert pool is not None
    first = run("pid")
    assert first.ok and run("pid").content == first.content  # the process is reused
    hung = run("hang")
    assert hung.metadata["error"] == "tool_timeout" and pool.killed == 1
    after = run("pid")
    assert after.ok and after.content != first.content  # a fresh process
    for how, kind, text in (
        ("exit", "tool_crashed", "exit code 3"),
        ("segv", "tool_crashed", "exit code -11"),
        ("sys_exit", "tool_exception", "ToolExit: the tool called sys.exit(4)"),
        ("raise", "tool_exception", "ValueError: bad input"),
    ):
        r = run(how)
        assert not r.ok and r.metadata["error"] == kind and text in r.content, (how, r)
        assert run("ok").content == "fine"
    pool.close()


def test_a_copy_gets_processes_of_its_own() -> None:
    """An env factory may deep-copy its tools, and Ray pickles them: the copy's pool
    starts empty instead of sharing (or trying to pickle) the original's pipes."""
    for clone in (copy.deepcopy(misbehave), pickle.loads(pickle.dumps(misbehave))):
        assert clone._pool is not misbehave._pool and clone._pool is not None
        assert clone._pool.started == 0 and clone._pool.target == misbehave._pool.target


def test_a_local_function_cannot_be_isolated_in_a_process() -> None:
    def local(x: int) -> str:
        """Local.

        Args:
            x: ignored.
        """
        return ""

    with pytest.raises(TypeError, match="top level of an importable module"):
        tool(local, isolation="process")
    with pytest.raises(ValueError, match="processes=0"):
        ProcessCalls(misbehave.fn, processes=0)
