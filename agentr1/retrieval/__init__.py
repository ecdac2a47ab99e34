"""Retrieval: passages, the Retriever protocol, and its implementations.

- `BM25Retriever`: sparse, in memory (bm25s).
- `DenseRetriever`: all-MiniLM-L6-v2 embeddings, exact cosine top-k, on-disk cache.
- `HybridRetriever`: reciprocal rank fusion of any retrievers (default BM25 + dense).
- `RemoteRetriever`: any of them behind the HTTP server in `agentr1.retrieval.server`.

Heavy dependencies (transformers, fastapi, uvicorn, httpx) are imported on first use.
"""

from agentr1.retrieval.base import Passage, Retriever
from agentr1.retrieval.bm25 import BM25Retriever
from agentr1.retrieval.client import RemoteRetriever, RetrievalRequestError, RetrieverUnavailable
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
    "reciprocal_rank_fusion",
]
