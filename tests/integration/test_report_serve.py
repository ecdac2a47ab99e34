"""`agentr1 report --serve` (agentr1.report.serve) on a hand-written run directory: the
page, its data and version on 127.0.0.1, fresh when the run writes; every other request
refused."""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentr1.report import ReportError
from agentr1.report.serve import make_server
from tests.unit.test_report import write_run


@pytest.fixture()
def served(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    run_dir = write_run(tmp_path / "run")
    server = make_server([run_dir], port=0)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield run_dir, server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def request(
    port: int, method: str, path: str, host: str | None = None
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        headers = {} if host is None else {"Host": host}
        conn.request(method, path, headers=headers)
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def test_the_page_its_data_and_its_version(served: tuple[Path, int]) -> None:
    run_dir, port = served
    status, headers, body = request(port, "GET", "/")
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    page = body.decode()
    assert "connect-src 'self'" in page and '"live": true' in page
    status, _, body = request(port, "GET", "/data.json")
    data = json.loads(body)
    assert status == 200 and data["runs"][0]["rl"]["step"] == [0.0, 1.0, 2.0]
    version = json.loads(request(port, "GET", "/version.json")[2])["version"]
    assert version == data["data_version"]

    with open(run_dir / "metrics.jsonl", "a") as f:  # the run goes on
        f.write(json.dumps({"phase": "rl", "step": 3.0, "reward": 0.5}) + "\n")
    newer = json.loads(request(port, "GET", "/version.json?t=1")[2])["version"]
    assert newer != version
    data = json.loads(request(port, "GET", "/data.json")[2])
    assert data["runs"][0]["rl"]["step"][-1] == 3.0 and data["data_version"] == newer
    status, headers, body = request(port, "HEAD", "/")
    assert status == 200 and body == b"" and int(headers["Content-Length"]) > 0


@pytest.mark.parametrize(
    ("method", "path", "host", "status"),
    [
        ("GET", "/../../etc/passwd", None, 404),
        ("GET", "/metrics.jsonl", None, 404),
        ("GET", "/config.yaml", None, 404),
        ("POST", "/", None, 405),
        ("PUT", "/data.json", None, 405),
        ("DELETE", "/", None, 405),
        ("GET", "/", "evil.example:80", 403),  # DNS rebinding: another site's name
    ],
)
def test_anything_else_is_refused(
    served: tuple[Path, int], method: str, path: str, host: str | None, status: int
) -> None:
    _, port = served
    got, headers, _ = request(port, method, path, host)
    assert got == status
    if status == 405:
        assert headers["Allow"] == "GET, HEAD"


def test_a_path_that_is_no_run_fails_before_listening(tmp_path: Path) -> None:
    with pytest.raises(ReportError, match="not a run directory"):
        make_server([tmp_path], port=0)
