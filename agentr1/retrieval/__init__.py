"""Retrieval: passages, the Retriever protocol, and its implementations (BM25 here)."""

from agentr1.retrieval.base import Passage, Retriever
from agentr1.retrieval.bm25 import BM25Retriever

__all__ = ["BM25Retriever", "Passage", "Retriever"]
