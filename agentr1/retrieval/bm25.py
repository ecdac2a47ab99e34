"""BM25 retrieval over an in-memory corpus, backed by `bm25s`."""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from agentr1.retrieval.base import Passage

_TOKEN = re.compile(r"\w+", re.UNICODE)


def tokenize(text: str) -> list[str]:
    """Lower-cased word tokens; the same function indexes passages and queries."""
    return _TOKEN.findall(text.lower())


def _import_bm25s() -> Any:
    """``bm25s``, imported with JAX hidden from it.

    Where JAX is installed, bm25s imports it and runs a top-k at import time: on a GPU
    machine that starts JAX's GPU backend, which takes 75% of the GPU's memory before the
    policy is loaded (seen on an H200: the paper recipe's first step ran out of memory
    with 105 GiB held outside PyTorch). agentr1 selects the top k with numpy, the same
    on every machine, so bm25s never needs JAX. A JAX the program imported itself is
    left alone (its memory is its own choice).
    """
    if "bm25s" in sys.modules:
        return sys.modules["bm25s"]
    hide = "jax" not in sys.modules
    if hide:
        sys.modules["jax"] = None  # type: ignore[assignment]  # `import jax` raises ImportError
    try:
        import bm25s
    finally:
        if hide:
            del sys.modules["jax"]
    return bm25s


class BM25Retriever:
    """Okapi BM25 over ``title + text`` of each passage.

    Args:
        passages: the corpus; ids must be unique.
        k1, b: the usual BM25 parameters.
        index_text: the text indexed for a passage (default: ``title + " " + text``).
    """

    def __init__(
        self,
        passages: Sequence[Passage],
        k1: float = 1.5,
        b: float = 0.75,
        index_text: Callable[[Passage], str] | None = None,
    ) -> None:
        bm25s = _import_bm25s()  # imported here: only retrieval users pay for it

        # bm25s sets its logger to DEBUG on import, which would print every index build
        # through the application's handlers; its own levels come back only when asked.
        logging.getLogger("bm25s").setLevel(logging.WARNING)

        if not passages:
            raise ValueError("BM25Retriever needs at least one passage")
        ids = [p.id for p in passages]
        if len(set(ids)) != len(ids):
            dup = next(i for i in ids if ids.count(i) > 1)
            raise ValueError(f"duplicate passage id {dup!r}: passage ids must be unique")
        self.passages = list(passages)
        self._index = bm25s.BM25(k1=k1, b=b)
        text = index_text or (lambda p: f"{p.title} {p.text}")
        corpus_tokens = [tokenize(text(p)) for p in self.passages]
        self._index.index(corpus_tokens, show_progress=False)

    def __len__(self) -> int:
        return len(self.passages)

    def search(self, query: str, k: int) -> list[Passage]:
        return self.search_batch([query], k)[0]

    def search_batch(self, queries: list[str], k: int) -> list[list[Passage]]:
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        k = min(k, len(self.passages))
        out: list[list[Passage]] = [[] for _ in queries]
        tokenized = [tokenize(q) for q in queries]
        live = [i for i, toks in enumerate(tokenized) if toks]  # empty queries match nothing
        if not live:
            return out
        docs, scores = self._index.retrieve(
            [tokenized[i] for i in live],
            k=k,
            show_progress=False,
            n_threads=0,
            backend_selection="numpy",  # the same top-k on every machine (see _import_bm25s)
        )
        for row, i in enumerate(live):
            out[i] = [
                self.passages[int(d)]
                for d, s in zip(np.asarray(docs[row]), np.asarray(scores[row]), strict=True)
                if s > 0
            ]
        return out
