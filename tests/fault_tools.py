"""Module-level tools for the fault tests: a worker process (``isolation="process"``)
imports its function by module and name, so these cannot live inside a test function."""

from __future__ import annotations

import os
import signal
import sys
import time

from agentr1.tools import tool


@tool(isolation="process", processes=1, timeout_s=1.0)
def misbehave(how: str) -> str:
    """Misbehave on request.

    Args:
        how: "ok", "hang", "exit" (os._exit), "segv", "sys_exit", "raise" or "pid".
    """
    if how == "hang":
        time.sleep(3600)
    if how == "exit":
        os._exit(3)
    if how == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    if how == "sys_exit":
        sys.exit(4)
    if how == "raise":
        raise ValueError("bad input")
    if how == "pid":
        return str(os.getpid())
    return "fine"
