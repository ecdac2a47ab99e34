"""The `search` tool: top-k passages from a Retriever, formatted for the model."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from agentr1.retrieval.base import Passage, Retriever
from agentr1.tools.base import validate_arguments
from agentr1.tools.workers import in_thread
from agentr1.types import ToolResult

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
    """

    retriever: Retriever
    top_k: int = 3
    timeout_s: float = 10.0
    max_words: int = 0
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
        passages = await asyncio.wait_for(
            in_thread(self.retriever.search, query, self.top_k), timeout=self.timeout_s
        )
        return ToolResult(
            content=format_passages(passages, self.max_words),
            metadata={
                "query": query,
                "passage_ids": [p.id for p in passages],
                "titles": [p.title for p in passages],
            },
        )


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
