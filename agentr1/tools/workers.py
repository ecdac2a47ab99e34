"""Where tool code runs, so that a tool that hangs or crashes costs its call, never the run.

A rollout's event loop must stay free to time calls out, and a call that never returns
must not take capacity from the calls after it. Three places, chosen per tool
(`FunctionTool.isolation`):

- ``"thread"`` (the default): a worker thread of `THREADS`, a pool that starts another
  thread whenever every one is busy, so 16 (or 1,000) calls that never return cannot
  starve ``calculator('1+1')``; a thread that is abandoned past its timeout keeps running
  until it returns (Python cannot kill a thread), and a tool with `MAX_HUNG` such calls
  is refused until one returns, so a hanging tool cannot grow the pool without bound.
  The threads are daemons: a hung call does not keep the process alive at exit. An async
  tool runs here on an event loop of its own, so one that blocks (``time.sleep`` in a
  coroutine) or ignores cancellation is timed out like a sync one.
- ``"process"``: a pool of worker processes (`ProcessCalls`) that a timeout kills: a call
  past its limit, a segfault, ``os._exit`` or a leak costs that call and one process,
  which is replaced. The function must be importable (defined at module level) and its
  arguments and result picklable. The cost is a process start (spawned, ~0.5 s, once per
  process) and a pickle round trip per call.
- ``"inline"`` (async tools only): the rollout's own event loop, for a tool that shares
  state with it (a client bound to the loop); a blocking tool then blocks every episode.

- ``"ray"``: a pool of Ray actors (`agentr1.distributed.tools.RayCalls`), killed like the
  worker processes past a timeout or replaced when they die; the function travels by
  value, so it need not be importable. ``distributed.tool_actors`` gives this isolation
  to every ``@tool`` function of a run that kept the default.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib
import logging
import multiprocessing
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

MAX_HUNG = 4
"""Calls of one tool that may still be running past their timeout; more are refused."""

MAX_IDLE_THREADS = 16
"""Idle worker threads kept for reuse; past this an idle thread ends."""


class Workers:
    """Daemon threads, one per call in flight: an idle one is reused, else one is started.

    Unlike a `concurrent.futures.ThreadPoolExecutor`, it never queues a call behind busy
    threads, and its threads do not block interpreter exit.
    """

    def __init__(self, name: str, max_idle: int = MAX_IDLE_THREADS) -> None:
        self.name = name
        self.max_idle = max_idle
        self._lock = threading.Lock()
        self._idle: list[queue.SimpleQueue[Any]] = []
        self._started = 0

    @property
    def threads_started(self) -> int:
        """Threads started so far (for tests and metrics)."""
        return self._started

    def submit(self, fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future[Any]:
        """Run ``fn(*args)`` on a worker thread; its future."""
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self._lock:
            inbox = self._idle.pop() if self._idle else None
            if inbox is None:
                self._started += 1
                n = self._started
        if inbox is None:
            inbox = queue.SimpleQueue()
            t = threading.Thread(
                target=self._work, args=(inbox,), name=f"{self.name}-{n}", daemon=True
            )
            t.start()
        inbox.put((fut, fn, args))
        return fut

    def _work(self, inbox: queue.SimpleQueue[Any]) -> None:
        while True:
            fut, fn, args = inbox.get()
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn(*args))
                except BaseException as e:  # the thread serves the next call whatever happens
                    fut.set_exception(e)
            with self._lock:
                if len(self._idle) >= self.max_idle:
                    return
                self._idle.append(inbox)


THREADS = Workers("agentr1-tool")
"""The worker threads of every ``"thread"`` tool (and of `SearchTool`'s retriever calls)."""


async def in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """``await fn(*args)`` run on `THREADS` (cancelling the await abandons the thread)."""
    return await asyncio.wrap_future(THREADS.submit(fn, *args))


class HungCalls:
    """How many calls of one tool are still running past their timeout (thread-safe).
    Not copied with its tool (`FunctionTool.__reduce__`): a copy starts at zero."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0

    def abandon(self, fut: concurrent.futures.Future[Any]) -> None:
        """Count ``fut``'s call as hung until it finishes."""
        with self._lock:
            self.count += 1
        fut.add_done_callback(self._returned)

    def _returned(self, _: object) -> None:
        with self._lock:
            self.count -= 1


# ------------------------------------------------------------------------ processes


class ToolProcessDied(RuntimeError):
    """The process running a call ended without answering (a crash, ``os._exit``)."""


class ToolRaised(RuntimeError):
    """The function raised in its worker process.

    Attributes:
        kind: the exception's type name ("ToolExit" for ``sys.exit``).
        message: its message.
    """

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message


def importable(fn: Callable[..., Any]) -> tuple[str, str]:
    """``(module, qualified name)`` by which a worker process finds ``fn``.

    Raises:
        TypeError: ``fn`` is local to a function or a lambda (a process cannot import it).
    """
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not module or "<" in qualname:
        raise TypeError(
            f"isolation='process' needs a function defined at the top level of an "
            f"importable module; {module}.{qualname} is not"
        )
    return module, qualname


def resolve_function(module: str, qualname: str) -> Callable[..., Any]:
    """The function `importable` named (a `@tool`'s own function when the name holds the
    tool)."""
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    fn: Callable[..., Any] = getattr(obj, "fn", obj)  # a `@tool`'s function, by its name
    return fn


def _serve(conn: Any, module: str, qualname: str) -> None:
    """A worker process: import the function, answer ``arguments`` with
    ``("ok", value)`` or ``("error", type name, message)`` until the pipe closes."""
    try:
        fn = resolve_function(module, qualname)
    except BaseException as e:
        conn.send(("error", type(e).__name__, f"cannot import {module}.{qualname}: {e}"))
        return
    conn.send(("ready",))
    while True:
        try:
            arguments = conn.recv()
        except EOFError:
            return
        try:
            value = fn(**arguments)
            if asyncio.iscoroutine(value):
                value = asyncio.run(value)
            conn.send(("ok", value))
        except SystemExit as e:
            conn.send(("error", "ToolExit", f"the tool called sys.exit({e.code!r})"))
        except BaseException as e:
            try:
                conn.send(("error", type(e).__name__, str(e)[:2000]))
            except Exception:  # an unpicklable exception or result
                conn.send(("error", type(e).__name__, "the tool's result could not be sent"))


class KillablePool:
    """Up to ``size`` killable workers of one function (processes, Ray actors): an idle
    one is reused, another started while fewer than ``size`` run, else the call waits
    for one to come free. Subclasses start (`_start`) and discard (`_discard`) them."""

    kinds = "workers"
    """What its workers are, in messages ("processes", "actors")."""

    def __init__(self, size: int, start_timeout_s: float) -> None:
        if size < 1:
            raise ValueError(f"{self.kinds}={size}: expected >= 1")
        self.size = size
        self.start_timeout_s = start_timeout_s
        self._idle: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._running = 0
        self.started = 0
        self.killed = 0

    def _start(self) -> Any:
        raise NotImplementedError

    def _discard(self, worker: Any) -> None:
        """Kill ``worker`` and free its place; subclasses kill, then call this."""
        with self._lock:
            self._running -= 1

    def _acquire(self, deadline: float) -> Any:
        """An idle worker, a new one, or the first to come free before ``deadline``.

        Raises:
            TimeoutError: every worker stayed busy until ``deadline``."""
        while True:
            try:
                return self._idle.get_nowait()
            except queue.Empty:
                pass
            with self._lock:
                can_start = self._running < self.size
                if can_start:
                    self._running += 1
            if can_start:
                try:
                    return self._start()
                except BaseException:
                    with self._lock:
                        self._running -= 1
                    raise
            wait = deadline - time.monotonic()
            if wait <= 0:
                raise TimeoutError(f"all {self.size} of the tool's {self.kinds} stayed busy")
            try:
                return self._idle.get(timeout=min(wait, 0.05))
            except queue.Empty:
                continue

    def close(self) -> None:
        """Stop the idle workers (busy ones end when their call does)."""
        while True:
            try:
                worker = self._idle.get_nowait()
            except queue.Empty:
                return
            self._discard(worker)


class ProcessCalls(KillablePool):
    """A pool of up to ``processes`` worker processes running one function.

    `call` blocks (run it on a worker thread): it takes an idle process (starting one if
    fewer than ``processes`` run), sends the arguments, and waits at most ``timeout_s``
    for the answer; past it the process is killed and replaced on the next call. A
    process that dies mid-call costs that call (`ToolProcessDied`).
    """

    kinds = "processes"

    def __init__(
        self, fn: Callable[..., Any], processes: int = 2, start_timeout_s: float = 60.0
    ) -> None:
        super().__init__(processes, start_timeout_s)
        self.target = importable(fn)
        self.processes = processes

    def _start(self) -> tuple[Any, Any]:
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_serve, args=(child, *self.target), daemon=True)
        proc.start()
        child.close()
        self.started += 1
        if not parent.poll(self.start_timeout_s):
            _kill(proc)
            raise ToolProcessDied(f"the tool's process did not start in {self.start_timeout_s:g} s")
        try:
            first = parent.recv()
        except EOFError:
            _kill(proc)
            raise ToolProcessDied(
                f"the tool's process ended at start (exit code {proc.exitcode})"
            ) from None
        if first[0] != "ready":
            _kill(proc)
            raise ToolProcessDied(first[2])
        return proc, parent

    def _discard(self, worker: tuple[Any, Any]) -> None:
        proc, conn = worker
        _kill(proc)
        conn.close()
        super()._discard(worker)

    def call(self, arguments: dict[str, Any], timeout_s: float) -> Any:
        """The function's value on ``arguments`` in a worker process.

        Raises:
            TimeoutError: no answer within ``timeout_s`` (the process was killed), or no
                process free within ``timeout_s``.
            ToolProcessDied: the process ended without answering.
            ToolRaised: the function raised (its exception's type name and message).
        """
        proc, conn = self._acquire(time.monotonic() + timeout_s)
        try:
            conn.send(arguments)
            answered = conn.poll(timeout_s)
            reply = conn.recv() if answered else None
        except (EOFError, OSError):  # the pipe closed: the process is gone
            proc.join(timeout=1)
            code = proc.exitcode if proc.exitcode is not None else "unknown"
            self._discard((proc, conn))
            raise ToolProcessDied(f"the tool's process died (exit code {code})") from None
        if reply is None:
            self.killed += 1
            self._discard((proc, conn))
            raise TimeoutError(f"no answer within {timeout_s:g} s (its process was killed)")
        self._idle.put((proc, conn))
        if reply[0] == "ok":
            return reply[1]
        raise ToolRaised(reply[1], reply[2])


def _kill(proc: Any) -> None:
    if proc.is_alive():
        proc.kill()
    proc.join(timeout=5)
