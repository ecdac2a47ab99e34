"""The run report: one self-contained ``report.html`` for one or more run directories
(docs/report.md).

    agentr1 report RUN_DIR [RUN_DIR ...] [-o report.html] [--max-steps N]
    agentr1 report --serve RUN_DIR [--port 8760]      the same page, refreshed as the run writes

`data` reads a run directory into plain JSON-able data, leaving out (and naming) what a
killed run left half-written; `html` renders the page with every script and style inline
(no network: the page sets a Content-Security-Policy that forbids it); `serve` serves it
on 127.0.0.1. A training run writes ``report.html`` at each evaluation and at its end
(`agentr1.trainer.run.RunDir`). Nothing here imports torch.
"""

from __future__ import annotations

from agentr1.report.data import ReportError, Skipped, load_runs
from agentr1.report.html import render, write_report

__all__ = ["ReportError", "Skipped", "load_runs", "render", "write_report"]
