"""`RemoteRetriever`: the `Retriever` protocol over HTTP, against `agentr1.retrieval.server`
(or a Search-R1 retrieval server, ``protocol="search-r1"``; see `RemoteRetriever`).

Failure policy:

- a retriever is checked when it is made: ``GET /health`` (with the retries below); no
  answer at all raises `RetrieverUnreachable`, a `ConnectionError` (so an ``OSError``, which
  the CLIs report in one line) naming the URL;
- connection errors, timeouts and 5xx answers are retried ``retries`` times with exponential
  backoff (``backoff_s``, 2x, 4x, ...); if every attempt fails, `RetrieverUnavailable` names
  the URL and the last error;
- 4xx answers mean the request itself is wrong: never retried, raised at once as
  `RetrievalRequestError` carrying the server's message.

Worst-case time of one call: ``(retries + 1) * timeout_s + backoff_s * (2**retries - 1)``;
keep a `SearchTool`'s ``timeout_s`` above it, or the tool times out first (also handled:
the model reads a timeout message).

httpx is imported lazily (``pip install agentr1[serve]``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from agentr1.retrieval.base import Passage

log = logging.getLogger(__name__)


class RetrieverUnavailable(ConnectionError):
    """The retrieval server did not answer usefully after every retry. An `OSError`, so
    the commands report it in one line (a search tool's call reports it to the model).

    Attributes:
        url: the endpoint that was tried.
        attempts: how many requests were sent.
        last_error: what went wrong the last time.
    """

    def __init__(self, url: str, attempts: int, last_error: str) -> None:
        super().__init__(
            f"retrieval server {url} unavailable after {attempts} attempt(s): {last_error}"
        )
        self.url = url
        self.attempts = attempts
        self.last_error = last_error


class RetrieverUnreachable(ConnectionError):
    """No server answers at a `RemoteRetriever`'s URL when it is made.

    A ``ConnectionError`` (an ``OSError``), as `RetrieverUnavailable` (a server that stops
    answering later), so that a command given a wrong ``--retriever`` URL stops with this
    one line before any work.

    Attributes:
        url: the server's base URL.
        reason: the last error, and how many attempts were made.
    """

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(
            f"retriever {url}: no server answers ({reason}); is `agentr1 serve retriever` "
            "running there?"
        )
        self.url = url
        self.reason = reason


class RetrievalRequestError(ValueError):
    """The server rejected the request (4xx); retrying would not help.

    Attributes:
        status: the HTTP status code.
        message: the server's explanation (names the field and the limit).
    """

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"retrieval request rejected (HTTP {status}): {message}")
        self.status = status
        self.message = message


@dataclass(frozen=True)
class ServerHealth:
    """What ``GET /health`` reports.

    Attributes:
        status: "ok" when serving.
        kind: the retriever kind (bm25, dense, hybrid, ...).
        corpus_size: passages in the index (None if the retriever does not say).
        max_batch, max_query_chars, max_top_k: the server's request limits.
    """

    status: str
    kind: str
    corpus_size: int | None
    max_batch: int
    max_query_chars: int
    max_top_k: int


PROTOCOLS = ("auto", "agentr1", "search-r1")
"""Wire formats `RemoteRetriever` speaks (see `agentr1.retrieval.server`)."""


def passage_from_search_r1(doc: Any) -> Passage:
    """A Search-R1 document as a `Passage`: ``contents`` is the title in double quotes on
    the first line, then the text (`agentr1.retrieval.server.search_r1_contents`).

    >>> passage_from_search_r1({"id": "7", "contents": '"Velmora"\\nA port city.'})
    Passage(id='7', title='Velmora', text='A port city.')
    >>> passage_from_search_r1({"contents": "no title line"})
    Passage(id='', title='', text='no title line')
    """
    if not isinstance(doc, dict):
        raise TypeError(f"a Search-R1 document is an object, got {type(doc).__name__}")
    contents = str(doc.get("contents", ""))
    first, newline, rest = contents.partition("\n")
    title, text = (first.strip().strip('"'), rest) if newline else ("", contents)
    return Passage(str(doc.get("id", "")), title, text)


def _chunks(items: list[int], size: int) -> Iterator[list[int]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _server_message(response: Any) -> str:
    """The ``message`` of a JSON error body, else the raw text (cut)."""
    try:
        body = response.json()
    except ValueError:
        return str(response.text[:300] or response.reason_phrase)
    if isinstance(body, dict):
        return str(body.get("message") or body.get("detail") or body)[:1000]
    return str(body)[:300]


class RemoteRetriever:
    """A `Retriever` whose index lives in a retrieval server.

    Thread-safe: one pooled ``httpx.Client`` serves all threads (a `SearchTool` calls it
    from a thread pool). Picklable: the connection pool is rebuilt after unpickling.

    Args:
        url: base URL of the server, e.g. ``http://127.0.0.1:8765``.
        timeout_s: per-request timeout (connect and read).
        retries: extra attempts after the first, for connection errors, timeouts and 5xx.
        backoff_s: sleep before the first retry; doubles on each further one.
        batch_size: queries per request; larger batches are split (keep it at or under the
            server's ``max_batch``).
        protocol: the wire format: "agentr1" (``{"queries", "top_k"}``), "search-r1"
            (``{"queries", "topk", "return_scores"}``, PeterGriffinJin/Search-R1's
            ``search_r1/search/retrieval_server.py``, which has no ``/health``), or "auto":
            agentr1 if ``GET /health`` answers, search-r1 if it is a 404 (agentr1 when
            ``check`` is off).
        check: ask the server at once (``GET /health``, with the retries), so that a wrong
            URL fails here, as `RetrieverUnreachable`, not at the first search.

    Raises:
        ValueError: a bad argument.
        RetrieverUnreachable: with ``check``, no server answers at ``url``.
    """

    thread_safe = True
    kind = "remote"

    def __init__(
        self,
        url: str,
        timeout_s: float = 5.0,
        retries: int = 3,
        backoff_s: float = 0.2,
        batch_size: int = 64,
        protocol: str = "auto",
        check: bool = True,
    ) -> None:
        if timeout_s <= 0 or retries < 0 or backoff_s < 0 or batch_size < 1:
            raise ValueError(
                f"need timeout_s > 0, retries >= 0, backoff_s >= 0, batch_size >= 1; got "
                f"{timeout_s}, {retries}, {backoff_s}, {batch_size}"
            )
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol: {protocol!r}; use one of {', '.join(PROTOCOLS)}")
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.batch_size = batch_size
        self._client: Any = None
        self._client_lock = threading.Lock()
        self.protocol = "agentr1" if protocol == "auto" and not check else protocol
        if check:
            self.connect()

    def connect(self) -> str:
        """Check that a server answers at `url` and settle an "auto" `protocol`; returns it.

        Raises:
            RetrieverUnreachable: no HTTP answer after every retry (or only 5xx).
            ValueError: ``GET /health`` is a 4xx, unless a Search-R1 server is allowed (a
                404 for "auto", any 4xx for "search-r1").
        """
        try:
            self._request("GET", "/health")
            found = "agentr1"
        except RetrieverUnavailable as e:
            raise RetrieverUnreachable(
                self.url, f"{e.last_error}; {e.attempts} attempt(s)"
            ) from None
        except RetrievalRequestError as e:
            # Search-R1's server serves /retrieve only: any answer shows it is there
            if not (self.protocol == "search-r1" or (self.protocol == "auto" and e.status == 404)):
                raise ValueError(
                    f"retriever {self.url}: GET /health answered HTTP {e.status}, not "
                    "`agentr1 serve retriever` (a Search-R1 server? protocol='search-r1')"
                ) from None
            found = "search-r1"
        if self.protocol == "auto":
            self.protocol = found
        return self.protocol

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_client"] = None
        del state["_client_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._client_lock = threading.Lock()

    @property
    def client(self) -> Any:
        """The shared ``httpx.Client``, created on first use."""
        with self._client_lock:
            if self._client is None:
                import httpx

                self._client = httpx.Client(timeout=self.timeout_s)
            return self._client

    def close(self) -> None:
        """Close the connection pool (a later call opens a new one)."""
        with self._client_lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    def __enter__(self) -> RemoteRetriever:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """Send one request with retries; returns the decoded JSON of a 2xx answer.

        Raises:
            RetrievalRequestError: a 4xx answer (not retried).
            RetrieverUnavailable: no 2xx after ``retries + 1`` attempts.
        """
        import httpx

        url = f"{self.url}{path}"
        last = ""
        attempts = self.retries + 1
        for attempt in range(attempts):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                response = self.client.request(method, url, json=body)
            except httpx.TransportError as e:  # refused, reset, timed out, protocol error
                last = f"{type(e).__name__}: {e}"
                log.debug("retrieval %s attempt %d: %s", url, attempt + 1, last)
                continue
            if response.status_code >= 500:
                last = f"HTTP {response.status_code}: {_server_message(response)}"
                log.debug("retrieval %s attempt %d: %s", url, attempt + 1, last)
                continue
            if response.status_code >= 400:
                raise RetrievalRequestError(response.status_code, _server_message(response))
            try:
                return response.json()
            except ValueError:
                last = f"HTTP {response.status_code} with a body that is not JSON"
        raise RetrieverUnavailable(url, attempts, last)

    def health(self) -> ServerHealth:
        """The server's ``/health`` report (an agentr1 server's; Search-R1's has none)."""
        h = self._request("GET", "/health")
        limits = h.get("limits", {})
        return ServerHealth(
            status=str(h["status"]),
            kind=str(h["kind"]),
            corpus_size=h.get("corpus_size"),
            max_batch=int(limits.get("max_batch", 0)),
            max_query_chars=int(limits.get("max_query_chars", 0)),
            max_top_k=int(limits.get("max_top_k", 0)),
        )

    def __len__(self) -> int:
        """Corpus size as reported by the server."""
        if self.protocol == "search-r1":
            raise TypeError("a Search-R1 retrieval server does not report its corpus size")
        size = self.health().corpus_size
        if size is None:
            raise TypeError("the retrieval server does not report its corpus size")
        return size

    def search(self, query: str, k: int) -> list[Passage]:
        return self.search_batch([query], k)[0]

    def search_batch(self, queries: list[str], k: int) -> list[list[Passage]]:
        return [[p for p, _ in hits] for hits in self.search_batch_scored(queries, k)]

    def search_batch_scored(
        self, queries: list[str], k: int
    ) -> list[list[tuple[Passage, float | None]]]:
        """``(passage, score)`` per query, best first; score None when the server sends none.

        Blank queries get an empty list without a request, as in the in-process retrievers
        (the server rejects them).
        """
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        out: list[list[tuple[Passage, float | None]]] = [[] for _ in queries]
        live = [i for i, q in enumerate(queries) if q.strip()]
        for chunk in _chunks(live, self.batch_size):
            texts = [queries[i] for i in chunk]
            for i, hits in zip(chunk, self._post(texts, k), strict=True):
                out[i] = hits
        return out

    def _post(self, texts: list[str], k: int) -> list[list[tuple[Passage, float | None]]]:
        """One ``POST /retrieve`` in `protocol`'s format, decoded."""
        search_r1 = self.protocol == "search-r1"
        if search_r1:
            body = self._request(
                "POST", "/retrieve", {"queries": texts, "topk": k, "return_scores": True}
            )
        else:
            body = self._request("POST", "/retrieve", {"queries": texts, "top_k": k})
        key = "result" if search_r1 else "results"
        results = body.get(key) if isinstance(body, dict) else None
        if not isinstance(results, list) or len(results) != len(texts):
            raise RetrieverUnavailable(
                self.url, 1, f"malformed answer: expected {len(texts)} result lists in {key!r}"
            )
        try:
            if search_r1:
                return [
                    [(passage_from_search_r1(h["document"]), h.get("score")) for h in hits]
                    for hits in results
                ]
            return [
                [(Passage(h["id"], h["title"], h["text"]), h.get("score")) for h in hits]
                for hits in results
            ]
        except (KeyError, TypeError, AttributeError) as e:
            raise RetrieverUnavailable(
                self.url, 1, f"malformed answer: {type(e).__name__}: {e}"
            ) from None
