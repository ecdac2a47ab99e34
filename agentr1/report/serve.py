"""``agentr1 report --serve RUN_DIR``: the report page on 127.0.0.1, fresh as the run writes.

Three GET (or HEAD) paths and nothing else:

    /              the page (`agentr1.report.html.render`), with the data as it is now
    /data.json     the data alone, which the page fetches when
    /version.json  says the run's files changed (sizes and modification times); the
                   page polls it every 3 s

Anything else is refused: another path is 404, another method 405, and a request whose
``Host`` is not the address served (a web page elsewhere trying DNS rebinding) 403. The
data is read again only when the files changed, once for all the requests that want it.
There is no authentication: keep the default loopback address.
"""

from __future__ import annotations

import hashlib
import json
import sys
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from agentr1.report.data import LOGS, MAX_STEPS, load_runs
from agentr1.report.html import embed_json, page_data, render

_WATCHED = (*LOGS, "summary.json", "config.yaml")


class ReportData:
    """The runs' data, read again when their files change (thread-safe)."""

    def __init__(self, run_dirs: list[str | Path], max_steps: int = MAX_STEPS) -> None:
        self.run_dirs = [Path(d) for d in run_dirs]
        self.max_steps = max_steps
        self._lock = threading.Lock()
        self._version: str | None = None
        self._runs: list[dict[str, Any]] = []
        self._reported: set[str] = set()

    def version(self) -> str:
        """A digest of the watched files' sizes and modification times."""
        parts = []
        for d in self.run_dirs:
            for name in _WATCHED:
                try:
                    st = (d / name).stat()
                    parts.append(f"{d}/{name}:{st.st_size}:{st.st_mtime_ns}")
                except OSError:
                    parts.append(f"{d}/{name}:-")
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]

    def current(self) -> tuple[str, list[dict[str, Any]]]:
        """(version, runs), the runs read again if the version changed."""
        with self._lock:
            v = self.version()
            if v != self._version:
                self._runs = load_runs(self.run_dirs, self.max_steps)  # type: ignore[arg-type]
                self._version = v
                for r in self._runs:
                    for s in r["skipped"]:
                        if s not in self._reported:
                            self._reported.add(s)
                            print(f"agentr1 report: skipped {s}", file=sys.stderr)
            return v, self._runs


def make_handler(data: ReportData, allowed_hosts: set[str]) -> type[BaseHTTPRequestHandler]:
    """The request handler class serving ``data``; ``allowed_hosts``: the Host header
    values accepted (empty: any)."""

    class Handler(BaseHTTPRequestHandler):
        server_version = "agentr1-report"
        sys_version = ""

        def _send(self, status: int, body: bytes, ctype: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.send_header("X-Content-Type-Options", "nosniff")
            self.send_header("X-Frame-Options", "DENY")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _refuse(self, status: HTTPStatus, why: str) -> None:
            self._send(status, f"{status.value} {status.phrase}: {why}\n".encode(), "text/plain")

        def do_GET(self) -> None:
            if allowed_hosts and self.headers.get("Host", "") not in allowed_hosts:
                return self._refuse(HTTPStatus.FORBIDDEN, "unexpected Host header")
            path = urlsplit(self.path).path
            if path in ("/", "/index.html"):
                v, runs = data.current()
                page = render(runs, live=v).encode()
                return self._send(HTTPStatus.OK, page, "text/html; charset=utf-8")
            if path == "/data.json":
                v, runs = data.current()
                body = embed_json(page_data(runs, live=v)).encode()
                return self._send(HTTPStatus.OK, body, "application/json")
            if path == "/version.json":
                body = json.dumps({"version": data.version()}).encode()
                return self._send(HTTPStatus.OK, body, "application/json")
            return self._refuse(HTTPStatus.NOT_FOUND, "only /, /data.json and /version.json")

        do_HEAD = do_GET

        def _not_allowed(self) -> None:
            self.send_response(HTTPStatus.METHOD_NOT_ALLOWED)
            self.send_header("Allow", "GET, HEAD")
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _not_allowed

        def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
            if str(code).isdigit() and int(code) >= 400:  # quiet unless refused
                super().log_request(code, size)

    return Handler


def make_server(
    run_dirs: list[str | Path],
    host: str = "127.0.0.1",
    port: int = 8760,
    max_steps: int = MAX_STEPS,
) -> ThreadingHTTPServer:
    """A server for the runs' report (not yet serving: call ``serve_forever``); port 0
    picks a free one (``server.server_address``). The runs are read once here, so that a
    path that is not a run directory fails before anything listens."""
    data = ReportData(run_dirs, max_steps)
    data.current()
    server = ThreadingHTTPServer((host, port), BaseHTTPRequestHandler)
    bound = server.server_address[1]
    loopback = host in ("127.0.0.1", "localhost")
    hosts = {f"127.0.0.1:{bound}", f"localhost:{bound}"} if loopback else set()
    server.RequestHandlerClass = make_handler(data, hosts)
    server.daemon_threads = True
    return server


def serve(
    run_dirs: list[str | Path],
    host: str = "127.0.0.1",
    port: int = 8760,
    max_steps: int = MAX_STEPS,
) -> None:
    """Serve until interrupted (Ctrl-C)."""
    server = make_server(run_dirs, host, port, max_steps)
    h, p = server.server_address[:2]
    print(f"agentr1 report: serving http://{h}:{p}/ (Ctrl-C stops)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
