"""The sandboxed `python` tool: escape and exhaustion attempts are contained, reported as
observations, and the rollout goes on."""

from __future__ import annotations

import asyncio
import socket
import threading
from pathlib import Path

import pytest

from agentr1.envs.base import ToolEnv
from agentr1.rollout import RolloutConfig, run_rollout
from agentr1.tools.python import PythonTool
from agentr1.types import StopReason, Task, ToolResult
from tests.fakes import byte_chat

from .test_rollout import call, scripted

TOOL = PythonTool(timeout_s=30.0, cpu_s=1.0, memory_mb=256, max_output_chars=2000)
"""A wall clock far above the CPU limit, so a busy machine never turns a CPU-limit or a
refusal into a timeout."""


def run(code: str, tool: PythonTool = TOOL) -> ToolResult:
    return asyncio.run(tool(code=code))


def test_code_runs_and_its_output_is_the_observation() -> None:
    r = run("x = [i * i for i in range(5)]\nprint(sum(x))")
    assert r.ok and r.content == "30" and r.metadata["exit_code"] == 0
    r = run("import json, math\nprint(json.dumps({'pi': round(math.pi, 2)}))")
    assert r.ok and r.content == '{"pi": 3.14}'
    assert run("x = 1").content == "(no output)"


def test_an_exception_is_reported_with_the_models_own_traceback() -> None:
    r = run("def f(n):\n    return 10 / n\nprint(f(0))")
    assert not r.ok and r.metadata["error"] == "python_error"
    assert "ZeroDivisionError: division by zero" in r.content
    assert 'File "main.py", line 2, in f' in r.content
    assert "sandbox_boot" not in r.content  # the sandbox's own frames are not shown
    r = run("import sys\nprint('partial')\nsys.exit(3)")
    assert not r.ok and r.content.startswith("partial") and r.metadata["exit_code"] == 3


def test_shell_commands_do_not_run(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    r = run(f"import os\nos.system('touch {marker}')\nprint('after')")
    assert not r.ok and r.metadata["error"] == "python_blocked"
    assert "os.system is not allowed" in r.content and "after" not in r.content
    r = run(f"import subprocess\nsubprocess.run(['touch', '{marker}'])")
    assert r.metadata["error"] == "python_blocked"
    r = run(f"import ctypes\nctypes.CDLL(None).system(b'touch {marker}')")
    assert r.metadata["error"] == "python_blocked" and "ctypes is not allowed" in r.content
    r = run(f"import os\nos.execv('/bin/touch', ['touch', '{marker}'])")
    assert r.metadata["error"] == "python_blocked"
    assert not marker.exists()


def test_files_outside_the_scratch_directory_are_neither_read_nor_written(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET-42")
    r = run(f"print(open({str(secret)!r}).read())")
    assert not r.ok and "TOP-SECRET-42" not in r.content
    assert f"sandbox: {secret} is outside the working directory" in r.content
    r = run(f"import os\nprint(os.listdir({str(tmp_path)!r}))")
    assert "secret.txt" not in r.content and r.metadata["error"] == "python_blocked"
    target = tmp_path / "written.txt"
    r = run(f"open({str(target)!r}, 'w').write('x')")
    assert not r.ok and not target.exists()
    r = run(f"import os\nos.remove({str(secret)!r})")
    assert not r.ok and secret.exists()
    # the scratch directory itself is the model's to use
    r = run("open('notes.txt', 'w').write('kept')\nprint(open('notes.txt').read())")
    assert r.ok and r.content == "kept"


def test_a_fork_bomb_is_stopped_at_its_first_fork() -> None:
    r = run("import os\nwhile True:\n    os.fork()")
    assert not r.ok and r.metadata["error"] == "python_blocked"
    assert "os.fork is not allowed" in r.content


def test_an_endless_loop_hits_the_cpu_limit_and_a_sleep_the_wall_clock() -> None:
    r = run("while True:\n    pass")
    assert not r.ok and r.metadata["error"] == "python_cpu"
    assert "used more than 1 s of CPU" in r.content
    short = PythonTool(timeout_s=2.0, cpu_s=1.0)
    r = run("import time\nprint('started', flush=True)\ntime.sleep(600)", short)
    assert r.metadata["error"] == "python_timeout" and "no result within 2 s" in r.content
    assert "started" in r.content  # what it printed before is kept
    assert r.metadata["exit_code"] == -9  # killed, not waited for


def test_a_10_gb_allocation_is_refused_by_the_memory_cap() -> None:
    r = run("x = bytearray(10 * 2**30)\nprint('allocated')")
    assert not r.ok and r.metadata["error"] == "python_memory"
    assert "MemoryError" in r.content and "capped at 256 MiB" in r.content
    assert "allocated" not in r.content


def test_huge_output_is_cut_and_the_process_killed() -> None:
    # 10 MB, 5,000x the cap, under a CPU limit no machine reaches: 100 MB cost 0.35 s of
    # system time in page faults here and crossed TOOL's 1 s limit on a busy CI machine,
    # which then (rightly) reported python_cpu
    roomy = PythonTool(timeout_s=30.0, cpu_s=20.0, memory_mb=256, max_output_chars=2000)
    r = run("print('x' * 10**7)", roomy)
    assert not r.ok and r.metadata["error"] == "python_output"
    assert "printed more than 2000 characters" in r.content
    assert len(r.content) < 2200
    r = run("while True:\n    print('y' * 1000)", roomy)
    assert r.metadata["error"] == "python_output" and r.metadata["exit_code"] == -9


def test_no_network_connection_leaves_the_sandbox() -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.2)
    port = server.getsockname()[1]
    accepted: list[object] = []

    def accept() -> None:
        for _ in range(20):
            try:
                accepted.append(server.accept())
            except TimeoutError:
                continue

    waiter = threading.Thread(target=accept)
    waiter.start()
    r = run(
        f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('connected')"
    )
    waiter.join()
    server.close()
    assert not r.ok and "connected" not in r.content
    assert "network access is not allowed" in r.content
    assert accepted == []  # the server never saw a connection


def test_rebinding_the_sandboxs_code_is_refused() -> None:
    r = run("def f():\n    pass\nf.__code__ = (lambda: 1).__code__")
    assert r.metadata["error"] == "python_blocked" and "__code__" in r.content


def test_limits_are_checked_when_the_tool_is_made() -> None:
    with pytest.raises(ValueError, match="memory_mb=10: the interpreter needs at least 64"):
        PythonTool(memory_mb=10)
    with pytest.raises(ValueError, match="timeout_s and cpu_s must be > 0"):
        PythonTool(timeout_s=0)


def test_the_rollout_goes_on_after_every_contained_attempt() -> None:
    """Through ToolEnv and the real rollout: each attack is a tool message the model
    reads, its error kind is counted, and the episode continues to its answer."""
    attacks = [
        "import os\nos.system('echo hi')",
        "while True:\n    pass",
        "x = bytearray(10 * 2**30)",
        "print(21 * 2)",
    ]
    turns = [call("python", code=c) for c in attacks] + ["<answer>42</answer>"]
    env = lambda: ToolEnv(tools=[TOOL], system_prompt=None)  # noqa: E731
    chat = byte_chat()
    rc = RolloutConfig(max_turns=6, max_tokens_per_turn=400, max_context=20_000)
    (group,) = run_rollout([Task("t", "21 * 2?", ["42"])], env, scripted(turns), chat, rc)
    traj = group.trajectories[0]
    assert traj.stop_reason is StopReason.ANSWERED and traj.outcome_reward == 1.0
    kinds = [e.error for e in traj.tool_log]
    assert kinds == ["python_blocked", "python_cpu", "python_memory", None]
    assert traj.tool_log[-1].content == "42"
    assert traj.metrics["python_blocked"] == 1 and traj.metrics["python_cpu"] == 1


def test_calls_queued_behind_busy_slots_do_not_time_out() -> None:
    """Many episodes at once: calls wait for one of ``max_concurrent`` interpreters, and the
    waiting does not count against each run's wall clock (the env's limit is the whole
    call's, `call_timeout_s`)."""
    tool = PythonTool(timeout_s=1.0, cpu_s=1.0, max_concurrent=1)
    env = ToolEnv(tools=[tool], system_prompt=None)
    env.reset(Task("t", "?", ["a"]))

    async def many() -> list[ToolResult]:
        turns = [
            env.step(call("python", code="import time; time.sleep(0.3); print(7)"))
            for _ in range(6)
        ]
        steps = await asyncio.gather(*turns)
        return [r for s in steps for r in s.tool_results]

    results = asyncio.run(many())  # 6 x 0.3 s in one slot: ~1.8 s, more than timeout_s
    assert [r.content for r in results] == ["7"] * 6
    busy = PythonTool(max_concurrent=1, queue_s=0.2)

    async def crowded() -> list[ToolResult]:
        slow = "import time; time.sleep(2)"
        return list(await asyncio.gather(busy(code=slow), busy(code="print(1)")))

    first, second = asyncio.run(crowded())
    assert first.ok and second.metadata["error"] == "python_busy"
