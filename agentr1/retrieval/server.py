r"""An HTTP retrieval server: any `Retriever` behind ``POST /retrieve`` and ``GET /health``.

Run it with ``agentr1 serve retriever --corpus passages.jsonl --kind bm25`` or `serve`; query
it with `agentr1.retrieval.client.RemoteRetriever`. It binds 127.0.0.1 unless told otherwise:
it has no authentication.

API::

    POST /retrieve  {"queries": ["who wrote ...", ...], "top_k": 3}
        200 {"results": [[{"id": "...", "title": "...", "text": "...", "score": 0.71}, ...], ...]}
            one list per query, best first; "score" only when the retriever reports scores
        422 {"error": "invalid_request", "message": "top_k: must be <= 50, got 1000",
             "errors": [{"field": "top_k", "message": "..."}]}     bad input, never retried
        413 {"error": "request_too_large", ...}                      body over the byte limit
        500 {"error": "retriever_error", "message": "ValueError: ..."}  the server keeps serving
    GET /health     {"status": "ok", "kind": "bm25", "corpus_size": 5000, "limits": {...}}

Search-R1's wire format, which Search-R1 and Agent-R1 clients send, is served on the same
path (as in ``search_r1/search/retrieval_server.py`` of PeterGriffinJin/Search-R1); a body
with ``topk`` or ``return_scores`` is one::

    POST /retrieve  {"queries": ["who wrote ...", ...], "topk": 3, "return_scores": true}
        200 {"result": [[{"document": {"id": "...", "contents": "\"Title\"\ntext"},
                          "score": 0.71}, ...], ...]}
    POST /retrieve  {"queries": [...], "topk": 3}             (return_scores false, the default)
        200 {"result": [[{"id": "...", "contents": "\"Title\"\ntext"}, ...], ...]}

``contents`` is their corpora's: the title in double quotes on the first line, then the text.
``score`` is null when the retriever reports none. ``topk`` defaults to 3 and has the limits
of ``top_k``; a body with both ``top_k`` and ``topk`` (or ``return_scores``) is a 422 naming
both.

Bad input of any shape (malformed JSON, wrong types, empty or blank queries, too many or
too long queries, top_k out of range, unknown fields) gets a 4xx whose message names the
field and the limit; a 5xx means the retriever itself failed.

fastapi and uvicorn are imported lazily (``pip install agentr1[serve]``). This module has no
``from __future__ import annotations``: FastAPI reads the endpoint's annotations at runtime,
and the request models are classes local to `create_app`.
"""

import contextlib
import json
import logging
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from agentr1.retrieval.base import Passage, Retriever

if TYPE_CHECKING:
    from fastapi import FastAPI

log = logging.getLogger(__name__)

DEFAULT_PORT = 8765
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class ServerLimits:
    """What one ``/retrieve`` request may ask for.

    Attributes:
        max_batch: queries per request; more would hold the (locked) retriever for long.
        max_query_chars: characters per query; longer text is not a search query.
        max_top_k: passages per query; more would bloat responses with no use to a model.
    """

    max_batch: int = 64
    max_query_chars: int = 1000
    max_top_k: int = 50

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")

    @property
    def max_body_bytes(self) -> int:
        """A generous byte bound for a valid request (12 bytes per char covers JSON escapes)."""
        return self.max_batch * (12 * self.max_query_chars + 16) + 4096


def retriever_kind(retriever: Retriever) -> str:
    """A short name for ``/health``: the ``kind`` attribute, else the class name minus "Retriever".

    >>> class BM25Retriever: ...
    >>> retriever_kind(BM25Retriever())
    'bm25'
    """
    kind = getattr(retriever, "kind", None)
    if isinstance(kind, str):
        return kind
    return type(retriever).__name__.removesuffix("Retriever").lower() or "unknown"


Hits = list[list[tuple[Passage, float | None]]]
"""Per query, ``(passage, score)`` best first; score None when the retriever reports none."""

SEARCH_R1_FIELDS = ("topk", "return_scores")
"""Fields only Search-R1's request has: a body with one of them is answered in its shape."""


def _search(retriever: Retriever, queries: list[str], k: int) -> Hits:
    """Hits per query, with scores when the retriever offers them."""
    scored = getattr(retriever, "search_batch_scored", None)
    if callable(scored):
        hits: Hits = scored(queries, k)
    else:
        hits = [[(p, None) for p in ps] for ps in retriever.search_batch(queries, k)]
    if len(hits) != len(queries):
        raise RuntimeError(
            f"retriever returned {len(hits)} result lists for {len(queries)} queries"
        )
    return hits


def _agentr1_response(hits: Hits) -> dict[str, Any]:
    """``{"results": [[{id, title, text, score?}, ...], ...]}``."""
    return {
        "results": [
            [
                {"id": p.id, "title": p.title, "text": p.text}
                | ({"score": float(s)} if s is not None else {})
                for p, s in row
            ]
            for row in hits
        ]
    }


def search_r1_contents(passage: Passage) -> str:
    """Search-R1's ``contents``: the title in double quotes on the first line, then the text.

    Their clients read the first line as the title and the rest as the text, so a newline in
    a title becomes a space.

    >>> search_r1_contents(Passage("7", "Velmora", "A port city."))
    '"Velmora"\\nA port city.'
    """
    title = passage.title.replace("\r", " ").replace("\n", " ")
    return f'"{title}"\n{passage.text}'


def _search_r1_response(hits: Hits, return_scores: bool) -> dict[str, Any]:
    """``{"result": [...]}`` as Search-R1's server answers: per query a list of documents
    ``{id, contents}``, each wrapped as ``{"document": ..., "score": ...}`` with
    ``return_scores``."""
    result: list[list[dict[str, Any]]] = []
    for row in hits:
        docs = [({"id": p.id, "contents": search_r1_contents(p)}, s) for p, s in row]
        if return_scores:
            result.append(
                [{"document": d, "score": float(s) if s is not None else None} for d, s in docs]
            )
        else:
            result.append([d for d, _ in docs])
    return {"result": result}


AGENTR1_FIELDS = "'queries' and 'top_k'"
SEARCH_R1_ALL_FIELDS = "'queries', 'topk' and 'return_scores'"


def _field(loc: tuple[Any, ...]) -> str:
    """``("body", "queries", 2)`` -> ``"queries[2]"``; the request body itself -> ``"body"``."""
    parts = [str(p) for p in loc if p != "body"]
    if not parts:
        return "body"
    out = parts[0]
    for p in parts[1:]:
        out += f"[{p}]" if p.isdigit() else f".{p}"
    return out


def _describe(err: dict[str, Any], limits: ServerLimits) -> dict[str, str]:
    """One pydantic error as ``{"field", "message"}``, worded for a person (``err["fields"]``,
    when there, names the request shape's fields for an unknown one)."""
    field = _field(tuple(err.get("loc", ())))
    kind, ctx, got = err.get("type", ""), err.get("ctx") or {}, err.get("input")
    got_type = type(got).__name__ if got is not None else "null"
    if kind == "missing":
        msg = "required field missing"
    elif kind == "extra_forbidden":
        msg = f"unknown field; expected only {err.get('fields', AGENTR1_FIELDS)}"
    elif kind == "mixed_shapes" and field == "top_k":
        msg = (
            f"agentr1's field, in one request with Search-R1's {ctx.get('theirs')}: send "
            '{"queries", "top_k"} or {"queries", "topk", "return_scores"}'
        )
    elif kind == "mixed_shapes":
        msg = "Search-R1's field, in one request with agentr1's top_k"
    elif kind == "too_short" and field == "queries":
        msg = "must hold at least 1 query"
    elif kind == "too_long" and field == "queries":
        msg = f"at most {limits.max_batch} queries per request, got {ctx.get('actual_length')}"
    elif kind == "string_too_long":
        n = len(got) if isinstance(got, str) else "more"
        msg = f"at most {limits.max_query_chars} characters per query, got {n}"
    elif kind == "greater_than_equal":
        msg = f"must be >= {ctx.get('ge')}, got {got!r}"
    elif kind == "less_than_equal":
        msg = f"must be <= {ctx.get('le')}, got {got!r}"
    elif kind == "int_type":
        msg = f"must be an integer, got {got_type}"
    elif kind == "bool_type":
        msg = f"must be true or false, got {got_type}"
    elif kind == "string_type":
        msg = f"must be a string, got {got_type}"
    elif kind == "list_type":
        msg = f"must be a list of strings, got {got_type}"
    elif kind in ("model_attributes_type", "dict_type", "model_type"):
        msg = 'must be a JSON object like {"queries": ["..."], "top_k": 3}'
    elif kind == "json_invalid":
        field = "body"
        msg = f"invalid JSON: {ctx.get('error', err.get('msg', ''))}"
    else:
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
    return {"field": field, "message": msg}


def create_app(
    retriever: Retriever,
    max_batch: int = 64,
    max_query_chars: int = 1000,
    max_top_k: int = 50,
    *,
    kind: str | None = None,
    thread_safe: bool | None = None,
) -> "FastAPI":
    """A FastAPI app serving ``retriever`` (see the module docstring for the API).

    Args:
        retriever: any `Retriever`; ``search_batch_scored`` is used when present.
        max_batch, max_query_chars, max_top_k: request limits (`ServerLimits`).
        kind: name shown by ``/health``; None: `retriever_kind`.
        thread_safe: whether searches may run concurrently; None: the retriever's
            ``thread_safe`` attribute, default False (one search at a time, under a lock).
    """
    from fastapi import Body, FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError
    from starlette.exceptions import HTTPException

    limits = ServerLimits(max_batch, max_query_chars, max_top_k)
    if thread_safe is None:
        thread_safe = bool(getattr(retriever, "thread_safe", False))
    guard: contextlib.AbstractContextManager[Any] = (
        contextlib.nullcontext() if thread_safe else threading.Lock()
    )
    corpus_size = len(retriever) if hasattr(retriever, "__len__") else None  # type: ignore[arg-type]
    health = {
        "status": "ok",
        "kind": kind or retriever_kind(retriever),
        "corpus_size": corpus_size,
        "limits": asdict(limits),
    }

    def _not_blank(q: str) -> str:
        if not q.strip():
            raise ValueError("empty or whitespace: write what to search for")
        return q

    Query = Annotated[str, Field(max_length=limits.max_query_chars), AfterValidator(_not_blank)]

    class RetrieveRequest(BaseModel):
        """Body of ``POST /retrieve``; strict: ``"3"`` is not an integer, ``true`` not one."""

        model_config = ConfigDict(extra="forbid", strict=True)
        queries: list[Query] = Field(min_length=1, max_length=limits.max_batch)
        top_k: int = Field(default=3, ge=1, le=limits.max_top_k)

    class SearchR1Request(BaseModel):
        """Search-R1's body of ``POST /retrieve``, as strict as `RetrieveRequest`."""

        model_config = ConfigDict(extra="forbid", strict=True)
        queries: list[Query] = Field(min_length=1, max_length=limits.max_batch)
        topk: int = Field(default=3, ge=1, le=limits.max_top_k)
        return_scores: bool = False

    def parse(body: Any) -> RetrieveRequest | SearchR1Request:
        """The request in the shape its fields show (see the module docstring).

        Raises:
            RequestValidationError: the body fits neither shape, or mixes them.
        """
        model: type[RetrieveRequest] | type[SearchR1Request] = RetrieveRequest
        if isinstance(body, dict):
            theirs = [f for f in SEARCH_R1_FIELDS if f in body]
            if theirs and "top_k" in body:
                ctx = {"theirs": " and ".join(theirs)}
                raise RequestValidationError(
                    [
                        {"type": "mixed_shapes", "loc": ("body", f), "ctx": ctx}
                        for f in ["top_k", *theirs]
                    ]
                )
            if theirs:
                model = SearchR1Request
        try:
            return model.model_validate(body)
        except ValidationError as e:
            fields = AGENTR1_FIELDS if model is RetrieveRequest else SEARCH_R1_ALL_FIELDS
            errors = [{**err, "loc": ("body", *err["loc"]), "fields": fields} for err in e.errors()]
            raise RequestValidationError(errors) from None

    app = FastAPI(title="agentr1 retriever", version="1")
    app.state.limits = limits
    app.state.retriever = retriever

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [_describe(e, limits) for e in exc.errors()]
        message = "; ".join(f"{e['field']}: {e['message']}" for e in errors)
        return JSONResponse(
            status_code=422,
            content={"error": "invalid_request", "message": message, "errors": errors},
        )

    @app.exception_handler(HTTPException)
    async def _http_error(_: Request, exc: HTTPException) -> JSONResponse:
        # Starlette's own 4xx (unparseable body, unknown path, wrong method), in our format.
        return JSONResponse(
            status_code=exc.status_code,
            content={"error": "bad_request", "message": str(exc.detail)},
            headers=getattr(exc, "headers", None),
        )

    @app.exception_handler(Exception)
    async def _crash(_: Request, exc: Exception) -> JSONResponse:
        log.error("unhandled %s: %s", type(exc).__name__, exc)
        return JSONResponse(
            status_code=500,
            content={"error": "internal_error", "message": f"{type(exc).__name__}: {exc}"},
        )

    @app.get("/health")
    def _health() -> dict[str, Any]:
        return health

    @app.post("/retrieve")
    def _retrieve(body: Annotated[Any, Body()]) -> Any:
        # A plain ``def``: FastAPI runs it in its thread pool, off the event loop.
        req = parse(body)
        k = req.top_k if isinstance(req, RetrieveRequest) else req.topk
        try:
            with guard:
                hits = _search(retriever, req.queries, k)
        except Exception as e:  # the retriever failed; say so and keep serving
            log.exception("retriever failed on %d queries", len(req.queries))
            return JSONResponse(
                status_code=500,
                content={"error": "retriever_error", "message": f"{type(e).__name__}: {e}"[:500]},
            )
        if isinstance(req, SearchR1Request):
            return _search_r1_response(hits, req.return_scores)
        return _agentr1_response(hits)

    app.add_middleware(BodyLimit, max_bytes=limits.max_body_bytes)
    return app


class BodyLimit:
    """ASGI middleware: a request body over ``max_bytes`` gets 413, whatever its framing.

    A Content-Length over the limit is refused before the body is read. Any other body
    (``Transfer-Encoding: chunked``, or a Content-Length that understates it) is read here,
    counting, before the app sees it: the chunk that passes the limit, or the declared
    length, ends the request with 413 and the rest is never read. So a request costs at
    most ``max_bytes`` plus one chunk; the app gets the body it would have read.
    """

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or []).get(b"content-length", b"")
        declared = int(length) if length.isdigit() else None
        if declared is not None and declared > self.max_bytes:
            await _too_large(f"body: {declared} bytes; the limit is {self.max_bytes}", send)
            return
        chunks: list[bytes] = []
        received = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left: let the app see it
                break
            chunk = message.get("body", b"")
            received += len(chunk)
            if received > self.max_bytes:
                await _too_large(f"body: {received}+ bytes; the limit is {self.max_bytes}", send)
                return
            if declared is not None and received > declared:
                await _too_large(
                    f"body: {received}+ bytes; its Content-Length said {declared}", send
                )
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                message = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
                break
        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return message

        await self.app(scope, replay, send)


async def _too_large(message: str, send: Any) -> None:
    """Send a 413 in the server's error format."""
    body = json.dumps({"error": "request_too_large", "message": message}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 413, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def serve(
    retriever: Retriever,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    log_level: str = "warning",
    max_batch: int = 64,
    max_query_chars: int = 1000,
    max_top_k: int = 50,
) -> None:
    """Serve ``retriever`` until interrupted (blocking).

    Binds 127.0.0.1 by default: the server has no authentication, so exposing it on another
    interface is a deliberate choice, and is logged as a warning.
    """
    import uvicorn

    if host not in LOOPBACK_HOSTS:
        log.warning("retrieval server bound to %s: reachable beyond this machine", host)
    app = create_app(retriever, max_batch, max_query_chars, max_top_k)
    uvicorn.run(app, host=host, port=port, log_level=log_level, access_log=False)


class BackgroundServer:
    """A uvicorn server for ``app`` in a daemon thread (tests, notebooks, in-process eval).

    Usage: ``with BackgroundServer(create_app(retriever)) as srv: RemoteRetriever(srv.url)``.

    Args:
        app: an ASGI app, e.g. from `create_app`.
        host: interface to bind (loopback by default).
        port: 0 picks a free port; read it back from `url`.
    """

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0) -> None:
        import uvicorn

        config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True, name="retriever")
        self.host = host
        self.port = port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 10.0) -> "BackgroundServer":
        """Start and wait until the socket listens."""
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"retrieval server did not start on {self.host}:{self.port}")
            time.sleep(0.01)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)

    def __enter__(self) -> "BackgroundServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


RETRIEVER_KINDS = ("bm25", "dense", "hybrid")
"""Kinds `build_retriever` (and ``agentr1 serve retriever --kind``) can build."""


def load_corpus_jsonl(path: str | Path) -> list[Passage]:
    """Passages from a JSONL file, one ``{"id", "title", "text"}`` object per line.

    Blank lines are skipped; ``id`` may be a string or an integer; ``title`` defaults to "".

    Raises:
        ValueError: naming the line of a malformed record, or for an empty file.
    """
    passages: list[Passage] = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                pid, text = rec["id"], rec["text"]
                title = rec.get("title", "")
            except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
                raise ValueError(f"{path}:{n}: want an object with id, title, text ({e})") from e
            if not isinstance(pid, str | int) or not isinstance(text, str):
                raise ValueError(f"{path}:{n}: id must be a string or integer, text a string")
            passages.append(Passage(str(pid), str(title or ""), text))
    if not passages:
        raise ValueError(f"{path}: no passages")
    return passages


def build_retriever(
    kind: str, passages: list[Passage], model: str | Path | None = None
) -> Retriever:
    """A retriever of ``kind`` (one of `RETRIEVER_KINDS`) over ``passages``.

    Args:
        kind: bm25, dense or hybrid (BM25 + dense, RRF).
        passages: the corpus.
        model: dense model directory or hub id (None: the packaged all-MiniLM-L6-v2).
    """
    if kind == "bm25":
        from agentr1.retrieval.bm25 import BM25Retriever

        return BM25Retriever(passages)
    if kind == "dense":
        from agentr1.retrieval.dense import DenseRetriever

        return DenseRetriever(passages, model=model)
    if kind == "hybrid":
        from agentr1.retrieval.hybrid import HybridRetriever

        return HybridRetriever.bm25_dense(passages, model=model)
    raise ValueError(f"unknown retriever kind {kind!r}; choose one of {', '.join(RETRIEVER_KINDS)}")
