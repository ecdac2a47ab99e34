"""The retrieval server (validation, errors, locking), the HTTP client and its retries.

In-process tests use FastAPI's TestClient; client tests run a real uvicorn on a free port of
127.0.0.1 in a thread (`BackgroundServer`). The last test runs a small version of
``benchmarks/server_load.py`` with the server in its own process.
"""

from __future__ import annotations

import asyncio
import json
import pickle
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the retrieval server needs agentr1[serve]")
pytest.importorskip("httpx", reason="the retrieval client needs agentr1[serve]")

from fastapi.testclient import TestClient

from agentr1.envs.base import ToolEnv
from agentr1.retrieval import (
    BM25Retriever,
    Passage,
    RemoteRetriever,
    RetrievalRequestError,
    RetrieverUnavailable,
    RetrieverUnreachable,
    retriever_from_spec,
)
from agentr1.retrieval.server import (
    BackgroundServer,
    BodyLimit,
    create_app,
    load_corpus_jsonl,
    retriever_kind,
    search_r1_contents,
)
from agentr1.tools import SearchTool
from agentr1.types import Task

ROOT = Path(__file__).resolve().parents[2]

CORPUS = [
    Passage("velmora", "Velmora", "Velmora is a port city founded by the river guild."),
    Passage("ostrand", "Ostrand", "Ostrand is a mountain town known for its glass works."),
    Passage("kaleth", "Kaleth River", "The Kaleth river flows through Velmora to the sea."),
    Passage("mira", "Mira Tolan", "Mira Tolan was a painter born in Ostrand."),
    Passage("guild", "River guild", "The river guild built bridges and founded cities."),
]


class FlakyRetriever:
    """BM25 that raises on the query "boom" and for the first ``fail_first`` calls."""

    def __init__(self, fail_first: int = 0) -> None:
        self.inner = BM25Retriever(CORPUS)
        self.fail_first = fail_first
        self.calls = 0

    def __len__(self) -> int:
        return len(CORPUS)

    def search(self, query: str, k: int) -> list[Passage]:
        return self.search_batch([query], k)[0]

    def search_batch(self, queries: list[str], k: int) -> list[list[Passage]]:
        self.calls += 1
        if self.calls <= self.fail_first or "boom" in queries:
            raise RuntimeError("index shard offline")
        return self.inner.search_batch(queries, k)


class Scored(FlakyRetriever):
    """Scores 1, 1/2, 1/3, ... down the corpus, whatever the query."""

    def search_batch_scored(self, queries: list[str], k: int) -> list[list[tuple[Passage, float]]]:
        return [[(p, 1.0 / (i + 1)) for i, p in enumerate(CORPUS[:k])] for _ in queries]


class ConcurrencyProbe(FlakyRetriever):
    """Records the most searches that ever ran at once."""

    def __init__(self) -> None:
        super().__init__()
        self.active = 0
        self.peak = 0
        self._mu = threading.Lock()

    def search_batch(self, queries: list[str], k: int) -> list[list[Passage]]:
        with self._mu:
            self.calls += 1
            self.active += 1
            self.peak = max(self.peak, self.active)
        time.sleep(0.05)
        with self._mu:
            self.active -= 1
        return self.inner.search_batch(queries, k)


@pytest.fixture(scope="module")
def bm25() -> BM25Retriever:
    return BM25Retriever(CORPUS)


@pytest.fixture(scope="module")
def client(bm25: BM25Retriever) -> TestClient:
    return TestClient(create_app(bm25, max_batch=4, max_query_chars=50, max_top_k=5))


@pytest.fixture(scope="module")
def small_server(bm25: BM25Retriever) -> Iterator[BackgroundServer]:
    """A real server with the `client` fixture's small limits."""
    with BackgroundServer(create_app(bm25, max_batch=4, max_query_chars=50, max_top_k=5)) as srv:
        yield srv


@pytest.fixture
def served(bm25: BM25Retriever) -> Iterator[BackgroundServer]:
    with BackgroundServer(create_app(bm25)) as srv:
        yield srv


def dead_url() -> str:
    """A loopback URL nothing listens on (a port that was just free)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


# --- server ---------------------------------------------------------------------------------


def test_health(client: TestClient) -> None:
    r = client.get("/health")
    assert r.status_code == 200
    assert r.json() == {
        "status": "ok",
        "kind": "bm25",
        "corpus_size": 5,
        "limits": {"max_batch": 4, "max_query_chars": 50, "max_top_k": 5},
    }


def test_valid_batch(client: TestClient, bm25: BM25Retriever) -> None:
    queries = ["river guild", "glass works Ostrand", "zzz unknown"]
    r = client.post("/retrieve", json={"queries": queries, "top_k": 2})
    assert r.status_code == 200
    results = r.json()["results"]
    expected = bm25.search_batch(queries, 2)
    assert [[h["id"] for h in row] for row in results] == [[p.id for p in e] for e in expected]
    assert set(results[0][0]) == {"id", "title", "text"}  # BM25 reports no score
    assert results[2] == []


@pytest.mark.parametrize(
    ("body", "field", "says"),
    [
        ({"queries": [], "top_k": 2}, "queries", "at least 1"),
        ({"queries": ["a"] * 5}, "queries", "at most 4 queries"),
        ({"queries": ["river", ""]}, "queries[1]", "empty"),
        ({"queries": [" \t\n"]}, "queries[0]", "empty or whitespace"),
        ({"queries": ["x" * 51]}, "queries[0]", "at most 50 characters per query, got 51"),
        ({"queries": ["river"], "top_k": 0}, "top_k", "must be >= 1, got 0"),
        ({"queries": ["river"], "top_k": 6}, "top_k", "must be <= 5, got 6"),
        ({"queries": ["river"], "top_k": "2"}, "top_k", "must be an integer, got str"),
        ({"queries": ["river"], "top_k": True}, "top_k", "must be an integer, got bool"),
        ({"queries": ["river"], "top_k": 2.5}, "top_k", "must be an integer, got float"),
        ({"queries": ["river"], "top_k": None}, "top_k", "must be an integer, got null"),
        ({"queries": "river"}, "queries", "must be a list of strings, got str"),
        ({"queries": ["river", 7]}, "queries[1]", "must be a string, got int"),
        ({"top_k": 2}, "queries", "required field missing"),
        ({"queries": ["river"], "k": 2}, "k", "unknown field"),
        (["river"], "body", "must be a JSON object"),
        ("river", "body", "must be a JSON object"),
    ],
)
def test_invalid_input_is_422_naming_field_and_limit(
    client: TestClient, body: Any, field: str, says: str
) -> None:
    r = client.post("/retrieve", json=body)
    assert r.status_code == 422, r.text
    out = r.json()
    assert out["error"] == "invalid_request"
    assert any(e["field"] == field and says in e["message"] for e in out["errors"]), out
    assert f"{field}: " in out["message"]


@pytest.mark.parametrize(
    ("content", "status", "says"),
    [
        (b'{"queries": ["a",', 422, "invalid JSON"),
        (b"", 422, "required field missing"),
        (b'{"queries": ["\xff\xfe"]}', 400, "error parsing the body"),
        (json.dumps({"queries": ["y" * 200_000]}).encode(), 413, "the limit is"),
    ],
)
def test_malformed_bodies_are_4xx(
    client: TestClient, content: bytes, status: int, says: str
) -> None:
    r = client.post("/retrieve", content=content, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    assert says in r.json()["message"]


def test_wrong_method_and_path_are_4xx(client: TestClient) -> None:
    assert client.get("/retrieve").status_code == 405
    assert client.post("/search", json={}).status_code == 404


def test_retriever_exception_is_500_and_server_keeps_serving() -> None:
    app = create_app(FlakyRetriever())
    c = TestClient(app, raise_server_exceptions=False)
    r = c.post("/retrieve", json={"queries": ["boom"]})
    assert r.status_code == 500
    assert r.json() == {
        "error": "retriever_error",
        "message": "RuntimeError: index shard offline",
    }
    ok = c.post("/retrieve", json={"queries": ["glass"], "top_k": 1})
    assert ok.status_code == 200 and ok.json()["results"][0][0]["id"] == "ostrand"


def test_scores_are_sent_when_the_retriever_has_them() -> None:
    r = TestClient(create_app(Scored())).post("/retrieve", json={"queries": ["a"], "top_k": 2})
    assert [h["score"] for h in r.json()["results"][0]] == [1.0, 0.5]


@pytest.mark.parametrize(("thread_safe", "serialized"), [(None, True), (True, False)])
def test_searches_are_serialized_unless_thread_safe(
    thread_safe: bool | None, serialized: bool
) -> None:
    probe = ConcurrencyProbe()  # no ``thread_safe`` attribute: treated as unsafe
    with BackgroundServer(create_app(probe, thread_safe=thread_safe)) as srv:

        def hit() -> None:
            RemoteRetriever(srv.url).search("river", 1)

        threads = [threading.Thread(target=hit) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert probe.calls == 8
    assert (probe.peak == 1) is serialized


def test_retriever_kind_and_create_app_limits() -> None:
    assert retriever_kind(FlakyRetriever()) == "flaky"
    with pytest.raises(ValueError, match="max_top_k must be an integer >= 1"):
        create_app(FlakyRetriever(), max_top_k=0)


def test_load_corpus_jsonl(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text('{"id": 1, "title": "A", "text": "x"}\n\n{"id": "b", "text": "y"}\n')
    assert load_corpus_jsonl(path) == [Passage("1", "A", "x"), Passage("b", "", "y")]
    path.write_text('{"id": 1, "title": "A", "text": "x"}\n{"title": "B"}\n')
    with pytest.raises(ValueError, match=r"c.jsonl:2: want an object with id, title, text"):
        load_corpus_jsonl(path)


# --- body limit ---------------------------------------------------------------------------


def rss_mb() -> float:
    """This process's resident memory (Linux)."""
    with open("/proc/self/status") as f:
        line = next(x for x in f if x.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def chunked_query(n_mb: int) -> Iterator[bytes]:
    """A JSON body of one ``n_mb`` MB query, as an iterator: httpx sends it chunked."""
    yield b'{"queries": ["'
    chunk = b"x" * (1 << 20)
    for _ in range(n_mb):
        yield chunk
    yield b'"]}'


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads RSS from /proc")
def test_chunked_body_over_the_limit_is_413_without_reading_it(
    small_server: BackgroundServer,
) -> None:
    import httpx

    limit = 4 * (12 * 50 + 16) + 4096  # ServerLimits(4, 50, 5).max_body_bytes
    peak, done = [rss_mb()], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss_mb())
            time.sleep(0.002)

    base = peak[0]
    sampler = threading.Thread(target=sample)
    sampler.start()
    json_type = {"content-type": "application/json"}
    with httpx.Client(base_url=small_server.url, headers=json_type, timeout=30) as http:
        try:
            r = http.post("/retrieve", content=chunked_query(50))
        finally:
            done.set()
            sampler.join()
        assert r.status_code == 413, r.text
        assert r.json()["error"] == "request_too_large"
        assert f"the limit is {limit}" in r.json()["message"]
        # the server read about the limit, not the 50 MB (buffered, it grew by 150 MB)
        assert peak[0] - base < 25, f"RSS grew {peak[0] - base:.0f} MB"
        assert http.get("/health").status_code == 200
        ok = http.post("/retrieve", content=iter([b'{"queries": ', b'["glass"], "top_k": 1}']))
        assert ok.status_code == 200 and ok.json()["results"][0][0]["id"] == "ostrand"


class Recorder:
    """An ASGI app that records the request body it reads and answers 200."""

    def __init__(self) -> None:
        self.body: bytes | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        self.body = body
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def call_asgi(
    max_bytes: int, chunks: Iterator[bytes], content_length: int | None = None
) -> tuple[int, bytes, Recorder, int]:
    """Run one request through ``BodyLimit(Recorder(), max_bytes)``: (status, response
    body, the app, how many chunks were read)."""
    app, sent, reads = Recorder(), [], 0
    headers = [] if content_length is None else [(b"content-length", str(content_length).encode())]

    async def receive() -> dict[str, Any]:
        nonlocal reads
        reads += 1
        chunk = next(chunks, None)
        if chunk is None:
            return {"type": "http.request", "body": b"", "more_body": False}
        return {"type": "http.request", "body": chunk, "more_body": True}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/", "headers": headers}
    asyncio.run(BodyLimit(app, max_bytes)(scope, receive, send))
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, body, app, reads


def test_body_limit_stops_reading_at_the_chunk_that_passes_it() -> None:
    endless = iter(lambda: b"x" * 30, None)  # a client that never stops sending
    status, body, app, reads = call_asgi(100, endless)
    assert status == 413 and app.body is None
    assert reads == 4  # 30, 60, 90, 120 > 100: the fourth chunk ends it
    assert json.loads(body) == {
        "error": "request_too_large",
        "message": "body: 120+ bytes; the limit is 100",
    }


def test_body_limit_refuses_more_bytes_than_content_length_declared() -> None:
    status, body, app, reads = call_asgi(100, iter([b"x" * 8, b"x" * 8]), content_length=10)
    assert status == 413 and app.body is None and reads == 2
    assert json.loads(body)["message"] == "body: 16+ bytes; its Content-Length said 10"


def test_body_limit_hands_the_app_the_whole_body_within_the_limit() -> None:
    status, body, app, _ = call_asgi(100, iter([b"a" * 50, b"b" * 50]))
    assert (status, body, app.body) == (200, b"ok", b"a" * 50 + b"b" * 50)
    status, _, app, reads = call_asgi(100, iter([]), content_length=101)
    assert status == 413 and app.body is None and reads == 0  # refused before reading


# --- Search-R1's wire format -----------------------------------------------------------------


def post(srv: BackgroundServer, body: Any) -> tuple[int, Any]:
    import httpx

    r = httpx.post(f"{srv.url}/retrieve", json=body, timeout=10)
    return r.status_code, r.json()


def test_search_r1_contents_is_the_quoted_title_then_the_text() -> None:
    assert search_r1_contents(CORPUS[0]) == '"Velmora"\n' + CORPUS[0].text
    assert search_r1_contents(Passage("x", "Two\nlines", "t")) == '"Two lines"\nt'
    assert search_r1_contents(Passage("x", "", "t")) == '""\nt'


def test_search_r1_request_gets_search_r1_response(
    small_server: BackgroundServer, bm25: BM25Retriever
) -> None:
    queries = ["river guild", "zzz unknown"]
    (expected, _) = bm25.search_batch(queries, 2)
    status, out = post(small_server, {"queries": queries, "topk": 2, "return_scores": True})
    assert status == 200 and set(out) == {"result"}
    first, empty = out["result"]
    assert first == [
        {"document": {"id": p.id, "contents": f'"{p.title}"\n{p.text}'}, "score": None}
        for p in expected
    ]  # BM25 reports no score: null, the shape kept
    assert empty == []
    # return_scores false (the default): the documents themselves, no wrapper
    status, out = post(small_server, {"queries": queries, "topk": 2})
    assert status == 200 and out["result"][0] == [d["document"] for d in first]
    status, out = post(small_server, {"queries": ["river"], "return_scores": False})
    assert status == 200 and len(out["result"][0]) == 3  # topk defaults to 3, as theirs
    # our own shape is unchanged next to it
    status, out = post(small_server, {"queries": queries, "top_k": 2})
    assert status == 200 and set(out) == {"results"}
    assert [h["id"] for h in out["results"][0]] == [p.id for p in expected]


def test_search_r1_scores_are_floats_when_the_retriever_has_them() -> None:
    with BackgroundServer(create_app(Scored())) as srv:
        status, out = post(srv, {"queries": ["a", "b"], "topk": 2, "return_scores": True})
    assert status == 200
    assert [[h["score"] for h in row] for row in out["result"]] == [[1.0, 0.5], [1.0, 0.5]]
    assert out["result"][0][1]["document"] == {
        "id": "ostrand",
        "contents": '"Ostrand"\nOstrand is a mountain town known for its glass works.',
    }


@pytest.mark.parametrize(
    ("body", "field", "says"),
    [
        ({"queries": ["river"], "topk": 0}, "topk", "must be >= 1, got 0"),
        ({"queries": ["river"], "topk": 6}, "topk", "must be <= 5, got 6"),
        ({"queries": ["river"], "topk": "2"}, "topk", "must be an integer, got str"),
        ({"queries": ["river"], "topk": None}, "topk", "must be an integer, got null"),
        ({"queries": ["river"], "return_scores": 1}, "return_scores", "true or false, got int"),
        ({"queries": ["river"], "return_scores": "yes"}, "return_scores", "got str"),
        ({"queries": ["a"] * 5, "topk": 1}, "queries", "at most 4 queries"),
        ({"queries": ["x" * 51], "topk": 1}, "queries[0]", "at most 50 characters per query"),
        ({"queries": [" "], "topk": 1}, "queries[0]", "empty or whitespace"),
        ({"queries": [], "topk": 1}, "queries", "at least 1"),
        ({"topk": 1}, "queries", "required field missing"),
        (
            {"queries": ["river"], "topk": 1, "k": 2},
            "k",
            "unknown field; expected only 'queries', 'topk' and 'return_scores'",
        ),
        ({"queries": ["river"], "top_k": 1, "topk": 1}, "top_k", "Search-R1's topk"),
        ({"queries": ["river"], "top_k": 1, "topk": 1}, "topk", "agentr1's top_k"),
        ({"queries": ["river"], "top_k": 1, "return_scores": True}, "return_scores", "top_k"),
    ],
)
def test_bad_search_r1_requests_are_422_naming_the_field(
    small_server: BackgroundServer, body: Any, field: str, says: str
) -> None:
    status, out = post(small_server, body)
    assert status == 422, out
    assert out["error"] == "invalid_request"
    assert any(e["field"] == field and says in e["message"] for e in out["errors"]), out
    assert f"{field}: " in out["message"]


def test_mixed_shapes_name_both_fields(small_server: BackgroundServer) -> None:
    status, out = post(small_server, {"queries": ["river"], "top_k": 2, "topk": 2})
    assert status == 422 and [e["field"] for e in out["errors"]] == ["top_k", "topk"]
    assert out["message"].startswith("top_k: ") and "; topk: " in out["message"]


# --- client ---------------------------------------------------------------------------------


def test_remote_matches_in_process(served: BackgroundServer, bm25: BM25Retriever) -> None:
    queries = ["river guild", "painter", "   ", "glass", "Velmora sea", "guild bridges"]
    with RemoteRetriever(served.url, batch_size=2) as remote:  # 5 live queries -> 3 requests
        assert remote.search_batch(queries, 3) == bm25.search_batch(queries, 3)
        assert remote.search("painter", 1) == [CORPUS[3]]
        health = remote.health()
        assert (health.kind, health.corpus_size, health.max_top_k) == ("bm25", 5, 50)
        assert len(remote) == 5


def test_client_retries_5xx_then_succeeds() -> None:
    flaky = FlakyRetriever(fail_first=2)
    with BackgroundServer(create_app(flaky)) as srv:
        remote = RemoteRetriever(srv.url, retries=3, backoff_s=0.01)
        assert remote.search("glass", 1)[0].id == "ostrand"
    assert flaky.calls == 3  # two 500s, then the answer


def test_client_gives_up_after_retries_on_5xx() -> None:
    with BackgroundServer(create_app(FlakyRetriever())) as srv:
        remote = RemoteRetriever(srv.url, retries=2, backoff_s=0.01)
        with pytest.raises(RetrieverUnavailable, match="after 3 attempt") as e:
            remote.search("boom", 1)
    assert "HTTP 500" in e.value.last_error and "index shard offline" in e.value.last_error


def test_client_does_not_retry_4xx(served: BackgroundServer) -> None:
    sent: list[str] = []
    remote = RemoteRetriever(served.url, retries=3, backoff_s=0.01)
    remote.client.event_hooks["request"].append(lambda req: sent.append(str(req.url)))
    with pytest.raises(RetrievalRequestError, match="top_k: must be <= 50, got 51") as e:
        remote.search("river", 51)
    assert e.value.status == 422 and len(sent) == 1


def test_client_dead_port_raises_unavailable_with_url() -> None:
    url = dead_url()
    remote = RemoteRetriever(url, timeout_s=1, retries=2, backoff_s=0.01, check=False)
    with pytest.raises(RetrieverUnavailable) as e:
        remote.search("river", 3)
    assert e.value.url == f"{url}/retrieve" and e.value.attempts == 3
    assert url in str(e.value) and "ConnectError" in str(e.value)


def test_client_timeout_is_retried_then_unavailable() -> None:
    class Slow(FlakyRetriever):
        def search_batch(self, queries: list[str], k: int) -> list[list[Passage]]:
            time.sleep(0.5)
            return super().search_batch(queries, k)

    slow = Slow()
    with BackgroundServer(create_app(slow, thread_safe=True)) as srv:
        remote = RemoteRetriever(srv.url, timeout_s=0.1, retries=1, backoff_s=0.01)
        with pytest.raises(RetrieverUnavailable, match="ReadTimeout"):
            remote.search("river", 1)


def test_client_is_picklable(served: BackgroundServer) -> None:
    remote = RemoteRetriever(served.url)
    remote.search("river", 1)  # opens the connection pool
    copy = pickle.loads(pickle.dumps(remote))
    assert copy.search("glass", 1)[0].id == "ostrand"


def test_search_tool_turns_dead_server_into_an_observation() -> None:
    url = dead_url()
    remote = RemoteRetriever(url, timeout_s=1, retries=1, backoff_s=0.01, check=False)
    env = ToolEnv(tools=[SearchTool(remote)])
    env.reset(Task("t1", "Where is Velmora?", ["port city"]))
    turn = '<tool_call>{"name": "search", "arguments": {"query": "Velmora"}}</tool_call>'
    step = asyncio.run(env.step(turn))
    assert not step.done and step.metrics["tool_exception"] == 1.0
    (result,) = step.tool_results
    assert not result.ok and result.metadata["error"] == "tool_exception"
    assert "RetrieverUnavailable" in result.content and url in result.content
    assert step.observation[0].role == "tool" and step.observation[0].content == result.content


def test_client_checks_the_server_when_made() -> None:
    url = dead_url()
    with pytest.raises(RetrieverUnreachable) as e:
        RemoteRetriever(url, timeout_s=1, retries=1, backoff_s=0.01)
    assert isinstance(e.value, OSError) and e.value.url == url  # the CLIs catch OSError
    assert str(e.value) == (
        f"retriever {url}: no server answers (ConnectError: [Errno 111] Connection refused; "
        "2 attempt(s)); is `agentr1 serve retriever` running there?"
    )
    with pytest.raises(RetrieverUnreachable, match=url):
        retriever_from_spec(url, [])


def without_health(app: Any) -> Any:
    """``app`` with ``GET /health`` answering 404, as Search-R1's server does."""

    async def asgi(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/health":
            await send({"type": "http.response.start", "status": 404, "headers": []})
            await send({"type": "http.response.body", "body": b'{"detail": "Not Found"}'})
            return
        await app(scope, receive, send)

    return asgi


def test_client_speaks_search_r1(served: BackgroundServer, bm25: BM25Retriever) -> None:
    queries = ["river guild", "painter", "  ", "glass"]
    assert RemoteRetriever(served.url).protocol == "agentr1"
    remote = RemoteRetriever(served.url, protocol="search-r1", batch_size=2)
    assert remote.search_batch(queries, 3) == bm25.search_batch(queries, 3)  # passages intact
    with BackgroundServer(without_health(create_app(Scored()))) as srv:
        auto = RemoteRetriever(srv.url)
        assert auto.protocol == "search-r1"
        assert [(p.id, s) for p, s in auto.search_batch_scored(["a"], 2)[0]] == [
            ("velmora", 1.0),
            ("ostrand", 0.5),
        ]
        with pytest.raises(TypeError, match="Search-R1"):
            len(auto)
        with pytest.raises(ValueError, match=r"answered HTTP 404.*protocol='search-r1'"):
            RemoteRetriever(srv.url, protocol="agentr1")
    with pytest.raises(ValueError, match="protocol: 'grpc'"):
        RemoteRetriever(served.url, protocol="grpc")


def test_qa_eval_with_an_unreachable_retriever_says_so_in_one_line(tmp_path: Path) -> None:
    from tests.integration.test_qa_env import ircot_record, write_jsonl

    url = dead_url()
    data = write_jsonl(tmp_path / "q.jsonl", [ircot_record(0)])
    cmd = [sys.executable, "-c", "import sys; from agentr1.cli import main; sys.exit(main())"]
    cmd += ["qa-eval", "--model", "x", "--data", data, "--retriever", url, "--max-tasks", "1"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("agentr1 qa-eval:")]
    assert url in line and "is `agentr1 serve retriever` running there?" in line


# --- load ---------------------------------------------------------------------------------


def test_small_load_run(tmp_path: Path) -> None:
    out = tmp_path / "load.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "server_load.py")]
    cmd += ["--clients", "4", "--requests", "200", "--synthetic-size", "500", "--json", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert report["ok"] and report["requests"] == report["answered"] == 200
    assert not any(code.startswith("5") for code in report["status_counts"])
    assert {"200", "422"} <= set(report["status_counts"])


def test_a_server_that_stops_answering_is_an_os_error_the_commands_report() -> None:
    """A retrieval server that dies mid-run (naive RAG calls it outside any tool) ended
    ``qa-eval`` in a traceback: `RetrieverUnavailable` was a RuntimeError."""
    assert issubclass(RetrieverUnavailable, OSError)
