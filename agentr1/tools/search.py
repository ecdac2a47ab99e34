"""The `search` tool: top-k passages from a Retriever, formatted for the model."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from dataclasses import dataclass, field
from typing import Any

from agentr1.retrieval.base import Passage, Retriever
from agentr1.tools.base import validate_arguments
from agentr1.tools.workers import THREADS, in_thread
from agentr1.types import ToolResult

log = logging.getLogger(__name__)

NO_RESULTS = "No results found."
MAX_QUERY_CHARS = 500


def clip_words(text: str, max_words: int) -> str:
    """The first ``max_words`` words of ``text``, with " ..." when words were cut; all of it
    when ``max_words`` is 0.

    >>> clip_words("Velmora is a small city.", 3)
    'Velmora is a ...'
    >>> clip_words("Velmora is a city.", 0)
    'Velmora is a city.'
    """
    if max_words <= 0:
        return text
    words = text.split()
    if len(words) <= max_words:
        return text
    return " ".join(words[:max_words]) + " ..."


def format_passages(passages: list[Passage], max_words: int = 0) -> str:
    """The observation text: ``[i] Title`` then the passage text (its first ``max_words``
    words; 0 = all), one block per passage.

    >>> format_passages([Passage("p1", "Velmora", "Velmora is a city.")])
    '[1] Velmora\\nVelmora is a city.'
    >>> format_passages([])
    'No results found.'
    """
    if not passages:
        return NO_RESULTS
    return "\n".join(
        f"[{i}] {p.title}\n{clip_words(p.text, max_words)}" for i, p in enumerate(passages, 1)
    )


@dataclass
class SearchTool:
    """Search a corpus for passages relevant to a query.

    Attributes:
        retriever: any `Retriever` (in-process BM25, dense, or a retrieval-server client).
        top_k: passages returned per call.
        timeout_s: seconds before a call is abandoned.
        max_words: words kept of each passage's text (0 = all). Wikipedia intros put the
            facts first; clipping keeps several searches inside a small context.
        batch: queries issued together go to the retriever as one ``search_batch`` call
            on one worker thread (see below); False = one ``search`` call, on its own
            thread, per query.

    A rollout steps every live episode's env at once, so a turn's searches arrive
    together: with ``batch`` the calls issued in one pass of the event loop are one
    ``retriever.search_batch`` (one thread hop instead of one per query, which on the
    demo's 2 cores cost more than the searches: its env steps 0.18 -> 0.06 s a rollout;
    and one request to a retrieval server, one encoder batch of a dense retriever). Each call
    keeps its own ``timeout_s``. The calls of a batch share its fate: if the retriever
    raises, each of them fails with that error, and if it hangs, each times out.
    """

    retriever: Retriever
    top_k: int = 3
    timeout_s: float = 10.0
    max_words: int = 0
    batch: bool = True
    name: str = "search"
    description: str = "Search the encyclopedia and return the most relevant passages for a query."
    parameters: dict[str, Any] = field(
        default_factory=lambda: {
            "type": "object",
            "properties": {
                "query": {
                    "type": "string",
                    "description": "what to look up, e.g. the name of a person or place",
                }
            },
            "required": ["query"],
        }
    )

    async def __call__(self, **arguments: Any) -> ToolResult:
        validate_arguments(self.parameters, arguments)
        query = str(arguments["query"]).strip()
        if not query:
            return ToolResult(
                content="Empty query: write what to search for.",
                ok=False,
                metadata={"error": "bad_arguments"},
            )
        query = query[:MAX_QUERY_CHARS]
        # On the tools' own threads (`agentr1.tools.workers`): a hung retriever cannot
        # exhaust asyncio's default executor, which the rest of the process shares.
        search = (
            self._batched(query)
            if self.batch
            else in_thread(self.retriever.search, query, self.top_k)
        )
        passages = await asyncio.wait_for(search, timeout=self.timeout_s)
        return ToolResult(
            content=format_passages(passages, self.max_words),
            metadata={
                "query": query,
                "passage_ids": [p.id for p in passages],
                "titles": [p.title for p in passages],
            },
        )

    async def _batched(self, query: str) -> list[Passage]:
        """``query``'s passages from the batch open in this pass of the event loop (one
        is opened, and flushed at the loop's next pass, by the first call)."""
        loop = asyncio.get_running_loop()
        open_ = self.__dict__.setdefault("_open", {})
        batch = open_.get(loop)
        if batch is None:
            batch = open_[loop] = []
            loop.call_soon(self._flush, loop)
        fut: asyncio.Future[list[Passage]] = loop.create_future()
        batch.append((query, fut))
        return await fut

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        """Send the loop's open batch to a worker thread as one ``search_batch``."""
        batch = self.__dict__["_open"].pop(loop)
        live = [(q, f) for q, f in batch if not f.done()]  # a cancelled call needs nothing
        if not live:
            return
        work = THREADS.submit(self.retriever.search_batch, [q for q, _ in live], self.top_k)

        def done(w: concurrent.futures.Future[list[list[Passage]]]) -> None:
            try:
                loop.call_soon_threadsafe(_deliver, live, w)
            except RuntimeError:  # the loop closed: every call of the batch timed out
                log.debug("search batch finished after its event loop closed")

        work.add_done_callback(done)

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without the open batches (futures of this process's event loops)."""
        return {k: v for k, v in self.__dict__.items() if k != "_open"}


def _deliver(
    batch: list[tuple[str, asyncio.Future[list[Passage]]]],
    work: concurrent.futures.Future[list[list[Passage]]],
) -> None:
    """Each call of a finished batch gets its passages, or the batch's error."""
    err = work.exception()
    found = None if err is not None else work.result()
    if err is None and (not isinstance(found, list) or len(found) != len(batch)):
        got = len(found) if isinstance(found, list) else type(found).__name__
        err = RuntimeError(f"search_batch returned {got} results for {len(batch)} queries")
    for i, (_, fut) in enumerate(batch):
        if fut.done():  # timed out meanwhile
            continue
        if err is not None:
            fut.set_exception(err)
        else:
            assert found is not None
            fut.set_result(found[i])


def search_tool(
    corpus: str = "",
    url: str = "",
    kind: str = "bm25",
    top_k: int = 3,
    max_words: int = 0,
    timeout_s: float = 10.0,
) -> SearchTool:
    """A `search` tool from a recipe: over a JSONL corpus file (one ``{"id", "title",
    "text"}`` a line) with a local retriever, or over an ``agentr1 serve retriever`` URL.

    ``task.tools: [{name: search, corpus: passages.jsonl, top_k: 3}]``

    Raises:
        ValueError: neither or both of ``corpus`` and ``url``; an unknown ``kind``.
    """
    if bool(corpus) == bool(url):
        raise ValueError(
            "tool 'search': give exactly one of corpus (a JSONL file of passages) or url (an "
            "`agentr1 serve retriever` address); a task with its own corpus provides 'search'"
        )
    retriever: Retriever
    if url:
        from agentr1.retrieval.client import RemoteRetriever

        retriever = RemoteRetriever(url)
    else:
        from agentr1.retrieval.server import RETRIEVER_KINDS, build_retriever, load_corpus_jsonl

        if kind not in RETRIEVER_KINDS:
            raise ValueError(
                f"tool 'search': kind {kind!r}; use one of {', '.join(RETRIEVER_KINDS)}"
            )
        retriever = build_retriever(kind, load_corpus_jsonl(corpus))
    return SearchTool(retriever, top_k=top_k, max_words=max_words, timeout_s=timeout_s)
