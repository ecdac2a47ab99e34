"""Tool calls in a pool of Ray actors (``isolation="ray"``; ``distributed.tool_actors``
gives it to every ``@tool`` function of a run that did not choose): a call that hangs,
leaks or kills its process costs that call and one actor, which is replaced, never the
rollout worker or the run. The failure is an observation, as with ``"process"``
(`agentr1.tools.workers.ProcessCalls`, which this mirrors call for call):

- past ``timeout_s`` the actor is killed (its process ends) -> ``tool_timeout``;
- an actor whose process dies mid-call -> ``tool_crashed``;
- a function that raises -> ``tool_exception`` with its type and message.

Unlike ``"process"``, the function need not be importable: Ray ships it (closures
included) by value, once per actor. Tool actors reserve no CPU (``num_cpus=0``), so they
never wait behind the rollout workers for a slot of a small cluster.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from agentr1.config import DistributedConfig
from agentr1.distributed.cluster import connect
from agentr1.tools.workers import KillablePool, ToolProcessDied, ToolRaised


class ToolActor:
    """The body of one tool actor: runs the function it was given on each call."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def ready(self) -> bool:
        return True

    def run(self, arguments: dict[str, Any]) -> Any:
        from agentr1.tools.base import _exit_guarded

        return _exit_guarded(self.fn, arguments)


class RayCalls(KillablePool):
    """Up to ``actors`` Ray actors running one function; `call` blocks (run it on a
    worker thread), like `ProcessCalls.call`."""

    kinds = "actors"

    def __init__(
        self, fn: Callable[..., Any], actors: int = 2, start_timeout_s: float = 60.0
    ) -> None:
        super().__init__(actors, start_timeout_s)
        self.fn = fn
        self.actors = actors
        self._ray: Any = None
        self._cls: Any = None

    def _start(self) -> Any:
        if self._ray is None:
            self._ray = connect(DistributedConfig())  # the run's cluster, or a local one
            self._cls = self._ray.remote(num_cpus=0, max_restarts=0)(ToolActor)
        ray = self._ray
        actor = self._cls.remote(self.fn)
        self.started += 1
        ref = actor.ready.remote()
        done, _ = ray.wait([ref], timeout=self.start_timeout_s)
        if not done:
            ray.kill(actor)
            raise ToolProcessDied(f"the tool's actor did not start in {self.start_timeout_s:g} s")
        try:
            ray.get(ref)
        except ray.exceptions.RayError as e:
            raise ToolProcessDied(f"the tool's actor could not start: {_first_line(e)}") from None
        return actor

    def _discard(self, actor: Any) -> None:
        self._ray.kill(actor, no_restart=True)
        super()._discard(actor)

    def call(self, arguments: dict[str, Any], timeout_s: float) -> Any:
        """The function's value on ``arguments`` in an actor.

        Raises:
            TimeoutError: no answer within ``timeout_s`` (the actor was killed), or no
                actor free within ``timeout_s``.
            ToolProcessDied: the actor's process ended without answering.
            ToolRaised: the function raised (its exception's type name and message).
        """
        actor = self._acquire(time.monotonic() + timeout_s)
        ray = self._ray
        ref = actor.run.remote(arguments)
        done, _ = ray.wait([ref], timeout=timeout_s)
        if not done:
            self.killed += 1
            self._discard(actor)
            raise TimeoutError(f"no answer within {timeout_s:g} s (its actor was killed)")
        try:
            out = ray.get(ref)
        except ray.exceptions.RayActorError as e:
            self._discard(actor)
            raise ToolProcessDied(f"the tool's actor died ({_first_line(e)})") from None
        except ray.exceptions.RayTaskError as e:
            self._idle.put(actor)
            cause = e.cause if isinstance(e.cause, BaseException) else e
            raise ToolRaised(type(cause).__name__, str(cause)[:2000]) from None
        self._idle.put(actor)
        return out


def _first_line(e: BaseException) -> str:
    lines = [line for line in str(e).splitlines() if line.strip()]
    return f"{type(e).__name__}: {lines[0] if lines else ''}"[:300]


def tools_on_actors(spec: Any, d: DistributedConfig) -> Any:
    """``spec`` (a `TaskSpec`) with every ``@tool`` function that kept the default
    isolation moved to ``d.tool_actors`` Ray actors; other tools (a search client, the
    Python sandbox, MCP) keep their own arrangements. Joins the run's cluster first, so
    the actors start there."""
    import dataclasses

    from agentr1.tools.base import FunctionTool

    connect(d)
    tools = [
        dataclasses.replace(t, isolation="ray", processes=d.tool_actors)
        if isinstance(t, FunctionTool) and t.isolation == "thread"
        else t
        for t in spec.tools
    ]
    return spec.replace(tools=tools)
