"""ToolEnv: interprets agent turns — runs tool calls, decides transitions and rewards.

A Tool executes; the ToolEnv says what it means. One ToolEnv instance runs one episode:
``reset(task)`` gives the opening messages, each ``await step(text)`` interprets one agent
turn, and ``finish(answer)`` scores the outcome when the episode ends: the outcome reward
and the task's per-episode metrics (``metrics``; by default one, ``score`` = the outcome
reward, so a report never shows a metric the task did not ask for).

Failure policy (docs/design.md §3): malformed calls, unknown tools, bad arguments, tool
exceptions, timeouts and garbage outputs become tool messages the model reads plus
counters in ``StepResult.metrics``. Nothing a model writes or a tool does raises out of
``step``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentr1.envs.parsers import HermesParser, ParsedTurn, ParseError, TurnParser
from agentr1.envs.prompts import AUTO, resolve_system_prompt
from agentr1.rewards import OutcomeReward, ProcessReward, em
from agentr1.tools.base import Tool, ToolArgumentError, contain_exit, tool_schema
from agentr1.types import (
    Message,
    StepContext,
    StepResult,
    StopReason,
    Task,
    ToolCall,
    ToolResult,
    valid_text,
)

EpisodeMetric = Callable[[str | None, Task], float]
"""A per-episode metric: (final answer or None, task) -> value (reported, averaged)."""

__all__ = ["ERROR_KINDS", "EpisodeMetric", "OutcomeReward", "ProcessReward", "ToolEnv", "em_reward"]

ERROR_KINDS = (
    "parse_errors",
    "unknown_tool",
    "bad_arguments",
    "tool_exception",
    "tool_timeout",
    "tool_bad_output",
    "tool_unavailable",
    "tool_crashed",
)
"""What can go wrong in a turn, each counted per step: a malformed call (``parse_errors``),
a call of no tool, arguments the schema refuses, a tool that raised, ran past its
timeout, returned no text, was refused because too many of its calls still hang, or
whose worker process died (`agentr1.tools.workers`)."""


em_reward = em
"""The default outcome reward: exact match against ``Task.answers``."""


@dataclass
class ToolEnv:
    """A multi-turn environment where the agent acts by calling tools.

    Attributes:
        tools: the tools the agent may call, by their ``name``.
        parser: reads agent turns (Hermes/Qwen tags by default).
        system_prompt: first message of every episode; "auto" (the default) builds it from
            the tools (`agentr1.envs.prompts.default_system_prompt`); None or "": none.
        process_reward: per-step reward hook (None: no process reward).
        outcome_reward: final reward from (answer, task); exact match by default.
        metrics: per-episode metrics by name, each (answer, task) -> float; None = one,
            ``score``, the outcome reward itself.
        max_observation_chars: tool outputs longer than this are cut (and counted).
        default_timeout_s: timeout for tools that declare none.
    """

    tools: Sequence[Tool]
    parser: TurnParser = field(default_factory=HermesParser)
    system_prompt: str | None = AUTO
    process_reward: ProcessReward | None = None
    outcome_reward: OutcomeReward = em_reward
    metrics: Mapping[str, EpisodeMetric] | None = None
    max_observation_chars: int = 4000
    default_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        names = [t.name for t in self.tools]
        if len(set(names)) != len(names):
            raise ValueError(f"tool names must be unique, got {names}")
        self._by_name = {t.name: t for t in self.tools}
        self.system_prompt = resolve_system_prompt(self.system_prompt, self.tools)
        self.task: Task | None = None
        self.history: list[StepContext] = []

    @property
    def tool_schemas(self) -> list[dict[str, Any]]:
        """OpenAI-style tool schemas for chat templates that render ``tools=``."""
        return [tool_schema(t) for t in self.tools]

    def reset(self, task: Task) -> list[Message]:
        """Start an episode on ``task``; returns the opening messages."""
        self.task = task
        self.history = []
        msgs = [Message("system", self.system_prompt)] if self.system_prompt else []
        return [*msgs, Message("user", task.question)]

    async def step(self, text: str) -> StepResult:
        """Interpret one agent turn. Never raises on model or tool behaviour."""
        if self.task is None:
            raise RuntimeError("ToolEnv.step called before reset(task)")
        turn = len(self.history)
        try:
            parsed = self.parser.parse(text, turn)
        except Exception as err:  # a parser's bug costs this turn's calls, not the episode
            raw = f"{type(err).__name__}: {str(err)[:200]}"
            parsed = ParsedTurn(
                errors=[ParseError("parser_error", raw, "Error: the turn could not be read.")]
            )
        metrics: dict[str, float] = dict.fromkeys(ERROR_KINDS, 0.0)
        metrics["parse_errors"] = float(len(parsed.errors))
        metrics["tool_calls"] = float(len(parsed.calls))
        metrics["observations_truncated"] = 0.0

        results: list[ToolResult] = []
        observation: list[Message] = []
        done, stop = False, None
        if parsed.answer is not None:
            # An answer ends the episode; calls in the same turn are not executed.
            done, stop = True, StopReason.ANSWERED
            metrics["tool_calls"] = 0.0
            metrics["calls_ignored"] = float(len(parsed.calls))
            calls: list[ToolCall] = []
        elif not parsed.calls and not parsed.errors:
            done, stop = True, StopReason.NO_TOOL_CALL
            calls = []
        else:
            calls = parsed.calls
            results = list(await asyncio.gather(*(self._run(c) for c in calls)))
            for c, r in zip(calls, results, strict=True):
                if not r.ok:
                    kind = str(r.metadata.get("error", "tool_exception"))
                    metrics[kind] = metrics.get(kind, 0.0) + 1
                if r.metadata.get("truncated"):
                    metrics["observations_truncated"] += 1
                observation.append(Message("tool", r.content, name=c.name, tool_call_id=c.id))
            for e in parsed.errors:
                observation.append(Message("tool", e.message, name="error"))

        ctx = StepContext(
            task=self.task,
            turn=turn,
            text=text,
            calls=calls,
            results=results,
            parse_errors=[e.kind for e in parsed.errors],
            answer=parsed.answer,
            previous=list(self.history),
        )
        reward = self._process_reward(ctx, metrics)
        self.history.append(ctx)
        return StepResult(
            observation=observation,
            reward=reward,
            done=done,
            stop_reason=stop,
            tool_calls=calls,
            tool_results=results,
            answer=parsed.answer,
            metrics=metrics,
        )

    def finish(self, answer: str | None) -> tuple[float, dict[str, float]]:
        """Score the episode's outcome: (outcome reward, the task's metrics by name).

        A metric or reward function that raises scores 0 and is counted
        (``metric_errors`` / ``reward_errors``), never ends the run. If the process-reward
        hook has a ``terminal(history, answer)`` (`ProcessRewardHook`), its value is in the
        metrics as ``process_end``: the rollout moves it onto the last turn's reward (it is
        a process reward of the step into the terminal state)."""
        assert self.task is not None, "finish called before reset"
        metrics: dict[str, float] = {}
        try:
            reward = float(self.outcome_reward(answer, self.task))
        except Exception:  # a broken reward function must not kill the run: count it
            metrics["reward_errors"] = 1.0
            reward = 0.0
        if self.metrics is None:
            metrics["score"] = reward
        else:
            for name, fn in self.metrics.items():
                try:
                    metrics[name] = float(fn(answer, self.task))
                except Exception:
                    metrics[name] = 0.0
                    metrics["metric_errors"] = metrics.get("metric_errors", 0.0) + 1
        terminal = getattr(self.process_reward, "terminal", None)
        if terminal is not None:
            try:
                metrics["process_end"] = float(terminal(self.history, answer))
            except Exception:
                metrics["reward_errors"] = metrics.get("reward_errors", 0.0) + 1
        return reward, metrics

    def _process_reward(self, ctx: StepContext, metrics: dict[str, float]) -> float:
        if self.process_reward is None:
            return 0.0
        try:
            return float(self.process_reward(ctx))
        except Exception:
            metrics["reward_errors"] = metrics.get("reward_errors", 0.0) + 1
            return 0.0

    async def _run(self, call: ToolCall) -> ToolResult:
        """Execute one call; every failure becomes a ToolResult with ``ok=False``, no
        observation (an error's included) is longer than ``max_observation_chars``, and
        each is valid Unicode (`valid_text`: a tool's undecodable bytes become U+FFFD)."""
        result = self._clip(await self._execute(call))
        content = valid_text(result.content)
        if content is result.content:
            return result
        return ToolResult(content, ok=result.ok, metadata={**result.metadata, "invalid_text": True})

    async def _execute(self, call: ToolCall) -> ToolResult:
        t = self._by_name.get(call.name)
        if t is None:
            known = ", ".join(sorted(self._by_name)) or "none"
            return _error(
                "unknown_tool", f"Error: unknown tool {call.name!r}. Available tools: {known}."
            )
        # A tool that queues its calls (a process pool) says how long a whole call may take.
        limit = getattr(t, "call_timeout_s", None) or getattr(t, "timeout_s", 0)
        timeout = float(limit or self.default_timeout_s)
        try:
            out: Any = await asyncio.wait_for(contain_exit(t(**call.arguments)), timeout=timeout)
        except ToolArgumentError as e:
            return _error("bad_arguments", f"Error: bad arguments for {call.name}: {e}")
        except TypeError as e:  # a plain callable rejecting the keywords
            return _error("bad_arguments", f"Error: bad arguments for {call.name}: {e}")
        except TimeoutError:
            return _error(
                "tool_timeout", f"Error: {call.name} did not answer within {timeout:g} s."
            )
        except Exception as e:  # sys.exit in a tool too (`contain_exit`): the call, not the run
            msg = str(e)[:300]
            return _error("tool_exception", f"Error: {call.name} failed: {type(e).__name__}: {msg}")
        if isinstance(out, str):
            out = ToolResult(content=out)
        if not isinstance(out, ToolResult) or not isinstance(out.content, str):
            return _error("tool_bad_output", f"Error: {call.name} returned no readable text.")
        return out

    def _clip(self, result: ToolResult) -> ToolResult:
        """``result`` cut to ``max_observation_chars`` (marked and counted as truncated)."""
        if len(result.content) <= self.max_observation_chars:
            return result
        cut = result.content[: self.max_observation_chars] + " ...[truncated]"
        return ToolResult(cut, ok=result.ok, metadata={**result.metadata, "truncated": True})


def _error(kind: str, message: str) -> ToolResult:
    return ToolResult(content=message, ok=False, metadata={"error": kind})
