"""Retrieval: passages, the Retriever protocol, and its implementations.

- `BM25Retriever`: sparse, in memory (bm25s).
- `DenseRetriever`: all-MiniLM-L6-v2 embeddings, exact cosine top-k, on-disk cache.
- `HybridRetriever`: reciprocal rank fusion of any retrievers (default BM25 + dense).
- `RemoteRetriever`: any of them behind the HTTP server in `agentr1.retrieval.server`.

Heavy dependencies (transformers, fastapi, uvicorn, httpx) are imported on first use.
"""

from collections.abc import Sequence

from agentr1.retrieval.base import Passage, Retriever
from agentr1.retrieval.bm25 import BM25Retriever
from agentr1.retrieval.client import (
    RemoteRetriever,
    RetrievalRequestError,
    RetrieverUnavailable,
    RetrieverUnreachable,
)
from agentr1.retrieval.dense import DenseRetriever, MiniLMEncoder
from agentr1.retrieval.hybrid import HybridRetriever, reciprocal_rank_fusion

__all__ = [
    "BM25Retriever",
    "DenseRetriever",
    "HybridRetriever",
    "MiniLMEncoder",
    "Passage",
    "RemoteRetriever",
    "RetrievalRequestError",
    "Retriever",
    "RetrieverUnavailable",
    "RetrieverUnreachable",
    "reciprocal_rank_fusion",
    "retriever_from_spec",
]


def retriever_from_spec(spec: str, passages: Sequence[Passage]) -> Retriever:
    """A retriever from its config string.

    Args:
        spec: "bm25", "dense" (all-MiniLM-L6-v2, embeddings cached on disk), "hybrid"
            (RRF of both), or an ``http(s)://`` URL of ``agentr1 serve retriever`` (then
            ``passages`` is not used: the server holds its own corpus; it is asked at once).
        passages: the corpus for the local kinds.

    Raises:
        ValueError: an unknown spec, naming the valid ones.
        RetrieverUnreachable: a URL where no server answers (an ``OSError``).
    """
    if spec.startswith(("http://", "https://")):
        from agentr1.retrieval.client import RemoteRetriever

        return RemoteRetriever(spec)
    from agentr1.retrieval.server import RETRIEVER_KINDS, build_retriever

    if spec not in RETRIEVER_KINDS:
        raise ValueError(
            f"retriever {spec!r} is unknown: use one of {', '.join(RETRIEVER_KINDS)} or an "
            "http:// URL of `agentr1 serve retriever`"
        )
    return build_retriever(spec, list(passages))
