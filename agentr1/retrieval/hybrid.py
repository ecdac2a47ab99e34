"""Hybrid retrieval: reciprocal rank fusion (RRF) of several retrievers' rankings.

RRF (Cormack, Clarke & Büttcher, SIGIR 2009) scores a passage d over rankings r = 1..R as

    score(d) = sum_r  w_r / (rrf_k + rank_r(d))

where ``rank_r(d)`` is d's 1-based position in ranking r (terms for rankings that miss d
are 0) and ``rrf_k = 60`` damps the weight of the very top ranks. It needs only ranks, so
BM25 scores and cosine similarities never have to be put on one scale.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentr1.retrieval.base import Passage, Retriever


@dataclass(frozen=True)
class Fused:
    """One entry of a fused ranking.

    Attributes:
        id: the passage id.
        score: its RRF score.
        best_rank: its best 1-based rank over the input rankings.
    """

    id: str
    score: float
    best_rank: int


def reciprocal_rank_fusion(
    rankings: Sequence[Sequence[str]],
    rrf_k: float = 60.0,
    weights: Sequence[float] | None = None,
) -> list[Fused]:
    """Fuse rankings of ids (best first) into one, best first.

    A repeated id inside one ranking counts once, at its first (best) position. Ties in
    score go to the better best rank, then to the ranking listed first that reaches it: the
    order is deterministic (no two ids share a position in one ranking).

    Args:
        rankings: R lists of ids, each best first.
        rrf_k: the RRF constant (> 0).
        weights: one weight per ranking; None: all 1.

    >>> [(f.id, round(f.score, 5)) for f in reciprocal_rank_fusion([["a", "b"], ["b", "c"]])]
    [('b', 0.03252), ('a', 0.01639), ('c', 0.01613)]
    """
    if rrf_k <= 0:
        raise ValueError(f"rrf_k must be > 0, got {rrf_k}")
    if weights is None:
        weights = [1.0] * len(rankings)
    if len(weights) != len(rankings):
        raise ValueError(f"{len(weights)} weights for {len(rankings)} rankings")
    score: dict[str, float] = {}
    best: dict[str, tuple[int, int]] = {}  # id -> (best rank, first ranking index)
    for r, (ranking, w) in enumerate(zip(rankings, weights, strict=True)):
        seen: set[str] = set()
        for rank, pid in enumerate(ranking, start=1):
            if pid in seen:
                continue
            seen.add(pid)
            score[pid] = score.get(pid, 0.0) + w / (rrf_k + rank)
            if pid not in best or rank < best[pid][0]:
                best[pid] = (rank, r)
    # Round before comparing: sums of the same terms in another order must tie exactly.
    order = sorted(score, key=lambda pid: (-round(score[pid], 12), *best[pid]))
    return [Fused(pid, score[pid], best[pid][0]) for pid in order]


class HybridRetriever:
    """RRF over any retrievers; each contributes its top ``depth`` candidates.

    Args:
        retrievers: the retrievers to fuse (at least one), e.g. BM25 and dense.
        rrf_k: the RRF constant.
        depth: candidates taken from each retriever per query: ``max(k, depth)``.
        weights: one weight per retriever; None: all 1.
    """

    kind = "hybrid"

    def __init__(
        self,
        retrievers: Sequence[Retriever],
        rrf_k: float = 60.0,
        depth: int = 20,
        weights: Sequence[float] | None = None,
    ) -> None:
        if not retrievers:
            raise ValueError("HybridRetriever needs at least one retriever")
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        if weights is not None and len(weights) != len(retrievers):
            raise ValueError(f"{len(weights)} weights for {len(retrievers)} retrievers")
        if rrf_k <= 0:
            raise ValueError(f"rrf_k must be > 0, got {rrf_k}")
        self.retrievers = list(retrievers)
        self.rrf_k = rrf_k
        self.depth = depth
        self.weights = list(weights) if weights is not None else None

    @classmethod
    def bm25_dense(
        cls,
        passages: Sequence[Passage],
        model: str | Path | None = None,
        cache: Path | str | bool | None = None,
        **kwargs: Any,
    ) -> HybridRetriever:
        """The default pairing: BM25 + all-MiniLM-L6-v2 over the same passages."""
        from agentr1.retrieval.bm25 import BM25Retriever
        from agentr1.retrieval.dense import DenseRetriever

        dense = DenseRetriever(passages, model=model, cache=cache)
        return cls([BM25Retriever(passages), dense], **kwargs)

    @property
    def thread_safe(self) -> bool:
        """Safe to call from several threads only if every fused retriever is."""
        return all(getattr(r, "thread_safe", False) for r in self.retrievers)

    def __len__(self) -> int:
        """Corpus size of the first retriever (they are expected to share one corpus)."""
        return len(self.retrievers[0])  # type: ignore[arg-type]

    def search(self, query: str, k: int) -> list[Passage]:
        return self.search_batch([query], k)[0]

    def search_batch(self, queries: list[str], k: int) -> list[list[Passage]]:
        return [[p for p, _ in hits] for hits in self.search_batch_scored(queries, k)]

    def search_batch_scored(self, queries: list[str], k: int) -> list[list[tuple[Passage, float]]]:
        """``(passage, RRF score)`` pairs per query, best first, at most k, no duplicates."""
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        depth = max(k, self.depth)
        per_retriever = [r.search_batch(queries, depth) for r in self.retrievers]
        out: list[list[tuple[Passage, float]]] = []
        for q in range(len(queries)):
            lists = [results[q] for results in per_retriever]
            by_id = {p.id: p for ranking in lists for p in ranking}
            fused = reciprocal_rank_fusion(
                [[p.id for p in ranking] for ranking in lists], self.rrf_k, self.weights
            )
            out.append([(by_id[f.id], f.score) for f in fused[:k]])
        return out
