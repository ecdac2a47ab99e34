"""The fault matrix of issue 29, one test per defect the fault-injection review found:
each failed before its fix (the defect is named in the docstring) and asserts what was
kept and what was reported. The 2,000-turn fuzz is in tests/integration."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import threading
import time
from typing import Any

import pytest

from agentr1.envs.base import ERROR_KINDS, ToolEnv
from agentr1.envs.parsers import HermesParser, ParsedTurn, strip_think
from agentr1.tools import tool
from agentr1.tools.calculator import CalculatorError, calculator, evaluate
from agentr1.tools.workers import THREADS
from agentr1.types import Task, json_line, valid_text

TASK = Task(id="t", question="q?", answers=["a"])


def step(env: ToolEnv, text: str) -> Any:
    env.reset(TASK)
    return asyncio.run(env.step(text))


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


# ------------------------------------------------------------------------ the parser


def test_a_huge_integer_in_a_call_is_a_parse_error() -> None:
    """A JSON integer of 5,000 digits raised ValueError out of the parser (Python's
    integer-string limit) and ended the episode as an error."""
    text = (
        '<tool_call>{"name": "calculator", "arguments": {"expression": '
        + "9" * 5000
        + "}}</tool_call>"
    )
    parsed = HermesParser().parse(text)
    assert parsed.calls == [] and [e.kind for e in parsed.errors] == ["malformed_json"]
    assert "number too large" in parsed.errors[0].message


def test_deep_nesting_in_a_call_is_a_parse_error() -> None:
    """Nesting 5,000 deep raised RecursionError out of the parser."""
    deep = "[" * 5000 + "]" * 5000
    for body in (
        '{"name": "calculator", "arguments": {"x": ' + deep + "}}",
        json.dumps({"name": "calculator", "arguments": '{"x": ' + deep + "}"}),  # double-encoded
    ):
        parsed = HermesParser().parse(f"<tool_call>{body}</tool_call>")
        kinds = [e.kind for e in parsed.errors]
        assert kinds in (["malformed_json"], ["bad_arguments"]), kinds
        assert parsed.calls == []


def test_an_answer_tag_inside_call_arguments_is_data_of_the_call() -> None:
    """``<answer>`` inside a tool call's JSON arguments ended the episode (91 of 2,000
    fuzzed turns)."""
    text = call("search", query="what is <answer>Paris</answer>?")
    parsed = HermesParser().parse(text)
    assert parsed.answer is None
    assert parsed.calls[0].arguments == {"query": "what is <answer>Paris</answer>?"}
    # An answer outside the calls still counts, before or after them.
    assert HermesParser().parse(text + " <answer>Rome</answer>").answer == "Rome"
    assert HermesParser().parse("<answer>Rome</answer>" + text).answer == "Rome"
    # An unclosed call swallows the rest of the turn: an answer in it is not the answer.
    assert HermesParser().parse("<tool_call>{<answer>x</answer>").answer is None


_THINK_RE = re.compile(r"<think>.*?</think>", re.DOTALL)


def test_think_stripping_is_linear_and_equals_the_regex() -> None:
    """``"<think>" * 30000`` took 22 s to strip (a regex restarting at every opening
    tag). The one-pass version gives the regex's result on every mix of tags."""
    import random

    rng = random.Random(0)
    pieces = ["<think>", "</think>", "a", " ", "<answer>x</answer>", "\n"]
    for _ in range(2000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
        assert strip_think(text) == _THINK_RE.sub("", text), text
    big = "<think>" * 30000
    assert strip_think(big) == big  # unclosed: kept, in one pass
    assert strip_think(big + "</think>tail") == "tail"


def test_a_parser_that_raises_costs_the_turn_not_the_episode() -> None:
    """A custom parser's exception escaped `ToolEnv.step`."""

    class Broken:
        def parse(self, text: str, turn_index: int = 0) -> ParsedTurn:
            raise RecursionError("maximum recursion depth exceeded")

    res = step(ToolEnv(tools=[calculator], parser=Broken()), "anything")
    assert not res.done and res.metrics["parse_errors"] == 1
    assert res.observation[0].content == "Error: the turn could not be read."


# ----------------------------------------------------------------------- tool output


def test_invalid_utf8_from_a_tool_becomes_replacement_characters() -> None:
    """A tool's output with undecodable bytes (a ``surrogateescape`` string) crashed the
    rollout with a TypeError in the tokenizer."""

    @tool
    def cat(path: str) -> str:
        """Read a file.

        Args:
            path: the file.
        """
        return b"caf\xc3\xa9 \xff\xfe end".decode("utf-8", "surrogateescape")

    res = step(ToolEnv(tools=[cat]), call("cat", path="x"))
    r = res.tool_results[0]
    assert r.ok and r.content == "café \ufffd\ufffd end" and r.metadata["invalid_text"]
    r.content.encode("utf-8")  # strict: no surrogate left


def test_valid_text_and_json_line_never_fail_on_content() -> None:
    assert valid_text("plain é") == "plain é"
    assert valid_text("\ud800 x \udfff") == "\ufffd x \ufffd"
    line = json_line({"arguments": {"q": "\ud83d"}, "ok": "日本"})
    assert json.loads(line) == {"arguments": {"q": "\ufffd"}, "ok": "日本"}


def test_truncated_observations_are_counted() -> None:
    """Truncated outputs were cut but not counted."""

    @tool
    def big(n: int) -> str:
        """Return n characters.

        Args:
            n: how many.
        """
        return "x" * n

    env = ToolEnv(tools=[big], max_observation_chars=100)
    res = step(env, call("big", n=1000) + call("big", n=10))
    assert res.metrics["observations_truncated"] == 1
    assert [r.metadata.get("truncated", False) for r in res.tool_results] == [True, False]


# ------------------------------------------------------------------------ calculator


@pytest.mark.parametrize("expr", ["round(1, -3*10**7)", "round(1, -10**99)", "round(1, 10**9)"])
def test_calculator_refuses_round_digits_that_hold_the_interpreter(expr: str) -> None:
    """``round(1, -3*10**7)`` took 31 s holding the interpreter lock (no timeout can
    stop it) and ``round(1, -10**99)`` never returned."""
    with pytest.raises(CalculatorError, match="digits must be within"):
        evaluate(expr)
    assert evaluate("round(1234.5678, 2)") == 1234.57 and evaluate("round(1234, -2)") == 1200


# ------------------------------------------------------------------- hung tools


def _hang_tool(release: threading.Event) -> Any:
    @tool(timeout_s=0.2)
    def hang(x: int) -> str:
        """Wait for a release.

        Args:
            x: ignored.
        """
        release.wait(60)
        return "released"

    return hang


def test_calls_that_never_return_cannot_starve_other_tools() -> None:
    """16 calls that never returned exhausted the shared 16-thread pool; then even
    ``calculator('1+1')`` timed out for the rest of the run."""
    release = threading.Event()
    hang = _hang_tool(release)
    hang.max_hung = 100
    try:
        env = ToolEnv(tools=[hang, calculator])
        for _ in range(5):  # 20 hung calls, 4 per turn
            res = step(env, "".join(call("hang", x=i) for i in range(4)))
            assert [r.metadata["error"] for r in res.tool_results] == ["tool_timeout"] * 4
        res = step(env, call("calculator", expression="1+1"))
        assert res.tool_results[0].ok and res.tool_results[0].content == "2"
    finally:
        release.set()


def test_a_tool_with_too_many_hung_calls_is_refused_until_one_returns() -> None:
    """Each hung call holds a thread: past ``max_hung`` the tool is refused, so a hanging
    tool cannot grow the pool without bound."""
    release = threading.Event()
    hang = _hang_tool(release)
    env = ToolEnv(tools=[hang])
    try:
        res = step(env, "".join(call("hang", x=i) for i in range(4)))
        assert [r.metadata["error"] for r in res.tool_results] == ["tool_timeout"] * 4
        started = THREADS.threads_started
        res = step(env, call("hang", x=5))
        assert res.tool_results[0].metadata["error"] == "tool_unavailable"
        assert "4 earlier calls have not returned" in res.tool_results[0].content
        assert res.metrics["tool_unavailable"] == 1 and "tool_unavailable" in ERROR_KINDS
        assert THREADS.threads_started == started  # refused without a thread
    finally:
        release.set()
    deadline = time.monotonic() + 10
    while hang._hung.count and time.monotonic() < deadline:
        time.sleep(0.01)
    assert hang._hung.count == 0
    release.clear()
    assert step(env, call("hang", x=6)).tool_results[0].metadata["error"] == "tool_timeout"
    release.set()


def test_an_async_tool_that_blocks_the_loop_is_timed_out() -> None:
    """An async tool that blocks its event loop ran 4.0 s on a 0.5 s timeout and was
    never timed out (it blocked the rollout's loop, where the timeout lives)."""
    release = threading.Event()

    @tool(timeout_s=0.2)
    async def blocking(x: int) -> str:
        """Block the loop.

        Args:
            x: ignored.
        """
        release.wait(60)  # a blocking call inside a coroutine
        return "late"

    try:
        res = step(ToolEnv(tools=[blocking]), call("blocking", x=1))
        assert res.tool_results[0].metadata["error"] == "tool_timeout"
    finally:
        release.set()


def test_an_async_tool_that_ignores_cancellation_is_timed_out() -> None:
    """One that swallowed its cancellation ran 5.5 s past a 0.5 s timeout."""
    release = threading.Event()

    @tool(timeout_s=0.2)
    async def stubborn(x: int) -> str:
        """Refuse to stop.

        Args:
            x: ignored.
        """
        while not release.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(0.01)
        return "late"

    try:
        res = step(ToolEnv(tools=[stubborn]), call("stubborn", x=1))
        assert res.tool_results[0].metadata["error"] == "tool_timeout"
    finally:
        release.set()


def test_inline_async_tools_share_the_rollout_loop() -> None:
    """``isolation="inline"``: the coroutine runs on the caller's loop (for clients bound
    to it); a sync function cannot be inline."""
    seen: list[Any] = []

    @tool(isolation="inline")
    async def where(x: int) -> str:
        """Say which loop runs it.

        Args:
            x: ignored.
        """
        seen.append(asyncio.get_running_loop())
        return "here"

    async def run() -> Any:
        env = ToolEnv(tools=[where])
        env.reset(TASK)
        res = await env.step(call("where", x=1))
        return res, asyncio.get_running_loop()

    res, loop = asyncio.run(run())
    assert res.tool_results[0].ok and seen == [loop]

    def sync(x: int) -> str:
        """Sync.

        Args:
            x: ignored.
        """
        return ""

    with pytest.raises(ValueError, match=r"inline.*async"):
        tool(sync, isolation="inline")


def test_keyboard_interrupt_in_a_tool_costs_the_call() -> None:
    """KeyboardInterrupt raised by a tool's code ended the whole run (like sys.exit)."""

    @tool
    def interrupt(x: int) -> str:
        """Raise KeyboardInterrupt.

        Args:
            x: ignored.
        """
        raise KeyboardInterrupt

    res = step(
        ToolEnv(tools=[interrupt, calculator]),
        call("interrupt", x=1) + call("calculator", expression="2*3"),
    )
    first, second = res.tool_results
    assert first.metadata["error"] == "tool_exception" and "KeyboardInterrupt" in first.content
    assert second.ok and second.content == "6"


def test_a_recipe_sets_where_a_tool_runs() -> None:
    """``task.tools: [{name: calculator, isolation: process}]``: a copy with the options;
    an unknown option is refused naming the valid ones."""
    from agentr1.tools.registry import resolve_tool

    (t,) = resolve_tool({"name": "calculator", "isolation": "process", "timeout_s": 3})
    assert t.isolation == "process" and t.timeout_s == 3 and calculator.isolation == "thread"
    assert t._pool is not None and t._pool.target == ("agentr1.tools.calculator", "calculator")
    with pytest.raises(ValueError, match=r"unknown option.*isolation, processes"):
        resolve_tool({"name": "calculator", "sandbox": True})
