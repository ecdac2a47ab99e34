"""The `search` tool: top-k passages from a Retriever, formatted for the model."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from agentr1.retrieval.base import Passage, Retriever
from agentr1.tools.base import validate_arguments
from agentr1.types import ToolResult

NO_RESULTS = "No results found."
MAX_QUERY_CHARS = 500


def format_passages(passages: list[Passage]) -> str:
    """The observation text: ``[i] Title`` then the passage text, one block per passage.

    >>> format_passages([Passage("p1", "Velmora", "Velmora is a city.")])
    '[1] Velmora\\nVelmora is a city.'
    >>> format_passages([])
    'No results found.'
    """
    if not passages:
        return NO_RESULTS
    return "\n".join(f"[{i}] {p.title}\n{p.text}" for i, p in enumerate(passages, 1))


@dataclass
class SearchTool:
    """Search a corpus for passages relevant to a query.

    Attributes:
        retriever: any `Retriever` (in-process BM25, dense, or a retrieval-server client).
        top_k: passages returned per call.
        timeout_s: seconds before a call is abandoned.
    """

    retriever: Retriever
    top_k: int = 3
    timeout_s: float = 10.0
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
        loop = asyncio.get_running_loop()
        passages = await asyncio.wait_for(
            loop.run_in_executor(None, self.retriever.search, query, self.top_k),
            timeout=self.timeout_s,
        )
        return ToolResult(
            content=format_passages(passages),
            metadata={"query": query, "passage_ids": [p.id for p in passages]},
        )
