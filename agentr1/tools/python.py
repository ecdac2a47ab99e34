"""The `python` tool: run model-written code in a separate, limited process.

Every call starts a fresh interpreter (``python -I``) in a new scratch directory, with:

- a wall-clock limit (``timeout_s``: the whole process group is killed) and a CPU-time
  limit (``cpu_s``, RLIMIT_CPU);
- a memory cap (``memory_mb``, RLIMIT_AS: an allocation past it is a ``MemoryError``);
- an output cap (``max_output_chars`` of stdout and of stderr; past it the process is
  killed and the observation says so) and a file-size cap (``file_mb``);
- no network (its own network namespace where the kernel allows one, and sockets refused
  by an audit hook in any case);
- no new processes, no native calls (ctypes), no reads outside the scratch directory and
  the Python installation, no writes outside the scratch directory
  (`agentr1.tools.sandbox_boot` has the exact list).

The observation is what the code printed, then its error (the traceback of the model's
own code), or what limit stopped it. A call that failed or hit a limit is ``ok=False``
with ``metadata["error"]`` one of ``python_error`` (the code raised or exited non-zero),
``python_timeout``, ``python_cpu``, ``python_memory``, ``python_output``, ``python_blocked``
(a refused operation), so the run's metrics count each. As in Agent-R1's ReTool env and
verl's sandbox tool, the interpreter holds no state between calls: the model prints what
it needs. Imports no torch.

    task.tools: [{name: python, timeout_s: 5, memory_mb: 256}]
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentr1.tools.base import validate_arguments
from agentr1.types import ToolResult

BOOT = Path(__file__).with_name("sandbox_boot.py")
"""The script each call's interpreter runs first (`agentr1.tools.sandbox_boot`)."""

MAX_CODE_CHARS = 20_000
"""Longer code is refused before a process starts."""


@dataclass
class RunOutcome:
    """What one sandboxed run did.

    Attributes:
        stdout, stderr: what it printed (each cut at the output cap).
        exit_code: the process's exit status (negative: killed by that signal).
        limit: the limit that stopped it ("timeout", "cpu", "output"), or None.
        netns: whether it ran in a network namespace of its own.
    """

    stdout: str
    stderr: str
    exit_code: int
    limit: str | None
    netns: bool


@dataclass
class PythonTool:
    """Run Python code in a sandboxed process and return its output.

    Attributes:
        timeout_s: wall-clock seconds per call (the process group is killed after).
        cpu_s: CPU seconds per call (RLIMIT_CPU).
        memory_mb: address-space cap in MiB (RLIMIT_AS).
        max_output_chars: characters kept of stdout and of stderr.
        file_mb: largest file the code may write, in MiB (RLIMIT_FSIZE).
        network: allow sockets (off: no network at all).
        max_concurrent: calls running at once (more wait for a slot, up to ``queue_s``), so
            a rollout of many episodes does not start hundreds of interpreters together.
        queue_s: the longest a call waits for a slot; then it reports ``python_busy``.
            The waiting does not count against ``timeout_s``: the env's limit for a whole
            call is `call_timeout_s`.
        python: the interpreter (default: this one, so the same packages import).
    """

    timeout_s: float = 10.0
    cpu_s: float = 5.0
    memory_mb: int = 512
    max_output_chars: int = 4000
    file_mb: int = 16
    network: bool = False
    max_concurrent: int = max(1, os.cpu_count() or 1)
    queue_s: float = 600.0
    python: str = sys.executable
    name: str = "python"
    description: str = (
        "Run Python code in a fresh interpreter and return what it prints. Nothing is kept "
        "between calls, so print every result you need."
    )
    parameters: dict[str, Any] = field(
        default_factory=lambda: {
            "type": "object",
            "properties": {
                "code": {"type": "string", "description": "a Python program; print the results"}
            },
            "required": ["code"],
        }
    )
    _pool: concurrent.futures.ThreadPoolExecutor | None = field(
        default=None, init=False, repr=False
    )

    _pool: concurrent.futures.ThreadPoolExecutor | None = field(
        default=None, init=False, repr=False
    )

    def __post_init__(self) -> None:
        errors = []
        if not self.timeout_s > 0 or not self.cpu_s > 0:
            errors.append("timeout_s and cpu_s must be > 0")
        if self.memory_mb < 64:
            errors.append(f"memory_mb={self.memory_mb}: the interpreter needs at least 64")
        if self.max_output_chars < 1 or self.file_mb < 0 or self.max_concurrent < 1:
            errors.append("max_output_chars and max_concurrent must be >= 1, file_mb >= 0")
        if errors:
            raise ValueError("python tool: " + "; ".join(errors))

    @property
    def call_timeout_s(self) -> float:
        """What the env waits for one call: a slot, then the run (and a little to clean up)."""
        return self.queue_s + self.timeout_s + 5.0

    async def __call__(self, **arguments: Any) -> ToolResult:
        validate_arguments(self.parameters, arguments)
        code = arguments["code"]
        if len(code) > MAX_CODE_CHARS:
            return _failed("python_error", f"Error: code longer than {MAX_CODE_CHARS} characters.")
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                self.max_concurrent, thread_name_prefix="agentr1-python"
            )
        queued = time.monotonic()
        out = await asyncio.get_running_loop().run_in_executor(self._pool, self._slot, code, queued)
        if out is None:
            return _failed("python_busy", f"Error: no interpreter free within {self.queue_s:g} s.")
        return self.observation(out)

    def _slot(self, code: str, queued: float) -> RunOutcome | None:
        """In a pool thread: run, unless the call waited longer than ``queue_s`` for it."""
        if time.monotonic() - queued > self.queue_s:
            return None
        return self.run(code)

    def run(self, code: str) -> RunOutcome:
        """Run ``code`` in a fresh sandboxed interpreter (see the module docstring); blocks.

        A plain `subprocess.Popen` read with a selector under one deadline, from a worker
        thread: no asyncio child watcher (whose wake-up, across the rollout's per-batch
        event loops, was seen to miss an exit), so any event loop can await it."""
        scratch = Path(tempfile.mkdtemp(prefix="agentr1-python-"))
        try:
            (scratch / "main.py").write_text(code, encoding="utf-8", errors="surrogatepass")
            limits = {
                "cpu_s": max(1, round(self.cpu_s)),
                "memory_mb": self.memory_mb,
                "file_mb": self.file_mb,
                "network": self.network,
            }
            env = {
                "PATH": "/usr/bin:/bin",
                "HOME": str(scratch),
                "TMPDIR": str(scratch),
                "PYTHONIOENCODING": "utf-8",
                "PYTHONDONTWRITEBYTECODE": "1",
            }
            proc = subprocess.Popen(
                [self.python, "-I", str(BOOT), str(scratch), json.dumps(limits)],
                cwd=scratch,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
            try:
                out_b, err_b, limit = _collect(proc, self.max_output_chars * 4 + 4, self.timeout_s)
            finally:
                _kill_group(proc.pid)
                proc.wait()
            status = proc.returncode
            if status in (-signal.SIGXCPU, -signal.SIGKILL) and limit is None:
                limit = "cpu" if status == -signal.SIGXCPU else "timeout"
            netns = False
            with contextlib.suppress(OSError, ValueError, KeyError):
                netns = bool(json.loads((scratch / ".sandbox.json").read_text())["netns"])
            return RunOutcome(
                stdout=out_b.decode("utf-8", "replace")[: self.max_output_chars],
                stderr=err_b.decode("utf-8", "replace")[: self.max_output_chars],
                exit_code=status,
                limit=limit,
                netns=netns,
            )
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def observation(self, out: RunOutcome) -> ToolResult:
        """The tool message of one run: output, then the error or the limit."""
        meta: dict[str, Any] = {"exit_code": out.exit_code, "netns": out.netns}
        parts = [out.stdout.rstrip("\n")] if out.stdout.strip() else []
        kind: str | None = None
        if out.limit == "timeout":
            kind, note = "python_timeout", f"killed: no result within {self.timeout_s:g} s"
        elif out.limit == "cpu":
            kind, note = "python_cpu", f"killed: used more than {self.cpu_s:g} s of CPU"
        elif out.limit == "output":
            kind, note = (
                "python_output",
                f"killed: printed more than {self.max_output_chars} characters",
            )
        elif out.exit_code != 0:
            err = out.stderr.strip()
            if "MemoryError" in err or out.exit_code == -signal.SIGSEGV:
                kind = "python_memory"
            elif "PermissionError: sandbox:" in err:
                kind = "python_blocked"
            else:
                kind = "python_error"
            note = _last_lines(err, 12) or f"exit code {out.exit_code}"
            if kind == "python_memory":
                note += f"\n(memory is capped at {self.memory_mb} MiB)"
        elif out.stderr.strip():
            note = _last_lines(out.stderr.strip(), 12)
        else:
            note = ""
        if note:
            parts.append(("Error:\n" if kind else "stderr:\n") + note)
        content = "\n".join(parts) or "(no output)"
        if kind is None:
            return ToolResult(content, metadata=meta)
        meta["error"] = kind
        return ToolResult(content, ok=False, metadata=meta)


def _collect(
    proc: subprocess.Popen[bytes], cap: int, timeout: float
) -> tuple[bytes, bytes, str | None]:
    """(stdout, stderr, the limit hit or None) of ``proc``: read both pipes until they
    close, each up to ``cap`` bytes (past it the process group is killed: "output"), or
    until ``timeout`` seconds pass ("timeout")."""
    assert proc.stdout is not None and proc.stderr is not None
    bufs = {proc.stdout: bytearray(), proc.stderr: bytearray()}
    deadline = time.monotonic() + timeout
    limit: str | None = None
    with selectors.DefaultSelector() as sel:
        for stream in bufs:
            sel.register(stream, selectors.EVENT_READ)
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                limit = "timeout"
                break
            for key, _ in sel.select(left):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                buf = bufs[key.fileobj]  # type: ignore[index]
                buf += chunk
                if len(buf) > cap and limit is None:
                    limit = "output"
                    _kill_group(proc.pid)  # the pipes close; the loop drains to EOF
    for stream in bufs:
        stream.close()
    return bytes(bufs[proc.stdout][:cap]), bytes(bufs[proc.stderr][:cap]), limit


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _last_lines(text: str, n: int) -> str:
    lines = text.splitlines()
    return "\n".join(lines[-n:])


def _failed(kind: str, message: str) -> ToolResult:
    return ToolResult(message, ok=False, metadata={"error": kind})
