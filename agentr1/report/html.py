"""The report page: one HTML file with its data, script and style inline.

The data goes in a ``<script type="application/json">`` block with every ``<``, ``>``
and ``&`` written as a JSON escape, so no text of a run (a tool's output, a model's
turn) can close the block or open a tag; the script builds the page with DOM text nodes
only (never ``innerHTML`` of data). A Content-Security-Policy forbids every network
request except, for the served page (`agentr1.report.serve`), its own origin.
"""

from __future__ import annotations

import html
import json
import sys
import time
from importlib import resources
from pathlib import Path
from typing import Any

from agentr1.fileio import write_atomic
from agentr1.report.data import MAX_STEPS, load_runs

_CSP = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "img-src data:; connect-src {connect}; base-uri 'none'; form-action 'none'"
)


def _static(name: str) -> str:
    return resources.files("agentr1.report").joinpath("static", name).read_text(encoding="utf-8")


def embed_json(data: Any) -> str:
    """``data`` as JSON safe inside an HTML ``<script>`` block: ``<``, ``>``, ``&`` and
    the JavaScript line separators as ``\\uXXXX`` escapes (JSON.parse reads them back).

    >>> embed_json({"t": "</script><b>"})
    '{"t": "\\\\u003c/script\\\\u003e\\\\u003cb\\\\u003e"}'
    """
    text = json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(", ", ": "))
    for ch, esc in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026")):
        text = text.replace(ch, esc)
    return text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def page_data(runs: list[dict[str, Any]], live: str | None = None) -> dict[str, Any]:
    """What the page's script reads: the runs and, served, the version of the files they
    were read from (the page polls for a newer one)."""
    return {
        "format": 1,
        "generated": time.strftime("%Y-%m-%d %H:%M:%S"),
        "live": live is not None,
        "data_version": live,
        "runs": runs,
    }


def render(runs: list[dict[str, Any]], title: str | None = None, live: str | None = None) -> str:
    """The whole page for runs loaded by `agentr1.report.data.load_runs`; ``live`` (the
    served page: the data's version) lets it fetch fresh data from its own origin."""
    title = title or "agentr1 report: " + ", ".join(str(r["name"]) for r in runs)
    csp = _CSP.format(connect="'none'" if live is None else "'self'")
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{html.escape(csp, quote=False)}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)}</title>
<style>
{_static("report.css")}
</style>
</head>
<body>
<header><h1>{html.escape(title)}</h1><p id="meta"></p></header>
<div id="skipped" hidden></div>
<nav><a href="#curves">curves</a> <a href="#evals">evaluations</a> <a href="#viewer">trajectories</a></nav>
<section id="curves"><h2>Training curves</h2><div id="panels"></div></section>
<section id="evals"><h2>Evaluations</h2><div id="eval-tables"></div></section>
<section id="viewer"><h2>Trajectories</h2><div id="viewer-body"></div></section>
<div id="tip" hidden></div>
<script type="application/json" id="report-data">{embed_json(page_data(runs, live))}</script>
<script>
{_static("report.js")}
</script>
</body>
</html>
"""


def write_report(
    run_dirs: list[str | Path],
    out: str | Path | None = None,
    max_steps: int = MAX_STEPS,
    quiet: bool = False,
) -> Path:
    """Read the run directories, write the page to ``out`` (default: the first run's
    ``report.html``) atomically, and name on stderr every line it left out (unless
    ``quiet``); returns the path written.

    Raises:
        ReportError: a path that is not a run directory.
    """
    runs = load_runs(run_dirs, max_steps)
    path = Path(out) if out is not None else Path(run_dirs[0]) / "report.html"
    write_atomic(path, render(runs))
    if not quiet:
        for r in runs:
            for s in r["skipped"]:
                print(f"agentr1 report: skipped {s}", file=sys.stderr)
    return path
