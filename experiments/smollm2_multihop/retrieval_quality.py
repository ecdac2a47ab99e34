"""Retrieval quality on the multi-hop eval sets: does search on the question find the gold?

For each dataset with gold paragraphs (HotpotQA IRCoT dev, 2Wiki MIGRES, MuSiQue MIGRES)
and each retriever (BM25, dense all-MiniLM-L6-v2, hybrid = RRF of the two), the question
text is the query, over one corpus: the union of the context paragraphs of every question
file with context in the data directory (`corpus_paragraphs`, ~17.5K passages; the same
corpus `task.kind: qa` recipes search, so the dense embedding cache is shared).

Metrics, each averaged over questions, for k in ``--k`` (default 1, 5, 10):

- ``recall@k``: fraction of the question's gold paragraphs in the top k;
- ``all@k``: 1 if every gold paragraph is in the top k (what a one-shot Naive RAG needs);
- ``answer@k``: 1 if a gold answer occurs, as whole words after SQuAD normalization, in
  the title or text of a top-k passage (cover-EM over the passages; "yes"/"no" answers of
  comparison questions rarely occur, so this undercounts them).

    .venv/bin/python experiments/smollm2_multihop/retrieval_quality.py  # all three
    .venv/bin/python experiments/smollm2_multihop/retrieval_quality.py --retrievers bm25 \\
        --json out.json

Dense embedding of the corpus takes ~8-15 min on one core the first time (cached after).
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from agentr1.data import QASample, corpus_paragraphs, default_data_dir, load_file, qa_files
from agentr1.retrieval.base import Passage, Retriever
from agentr1.rewards.qa import cover_exact_match

EVAL_FILES = {
    "hotpotqa": "hotpotqa/ircot_hotpotqa_dev_subsampled_500.jsonl",
    "2wiki": "2wikimultihopqa/migres_2wiki_train_500_decomposed.json",
    "musique": "musique/migres_musique_dev_200.jsonl",
}
"""Dataset column -> question file (relative to the data directory)."""


@dataclass
class Scores:
    """Quality of one retriever on one dataset; each dict maps k -> mean over questions."""

    dataset: str
    retriever: str
    questions: int
    recall: dict[int, float]
    all_gold: dict[int, float]
    answer: dict[int, float]
    seconds: float


def score(
    samples: list[QASample], hits: list[list[Passage]], ks: list[int]
) -> tuple[dict[int, float], dict[int, float], dict[int, float]]:
    """(recall@k, all@k, answer@k) averaged over samples; ``hits[i]`` ranks sample i's query.

    >>> from agentr1.data import Paragraph
    >>> s = QASample("1", "q?", ("Paris",), "toy", context=(
    ...     Paragraph("A", "x", True), Paragraph("B", "Paris y", True)))
    >>> gold = [Passage(p.id, p.title, p.text) for p in s.context]
    >>> score([s], [[gold[1], Passage("z", "Z", "z"), gold[0]]], [1, 3])
    ({1: 0.5, 3: 1.0}, {1: 0.0, 3: 1.0}, {1: 1.0, 3: 1.0})
    """
    recall = dict.fromkeys(ks, 0.0)
    all_gold = dict.fromkeys(ks, 0.0)
    answer = dict.fromkeys(ks, 0.0)
    for s, ranked in zip(samples, hits, strict=True):
        gold = set(s.supporting_ids)
        for k in ks:
            top = ranked[:k]
            found = gold & {p.id for p in top}
            recall[k] += len(found) / len(gold) if gold else 0.0
            all_gold[k] += float(bool(gold) and found == gold)
            text = " ".join(f"{p.title} {p.text}" for p in top)
            answer[k] += cover_exact_match(text, list(s.answers))
    n = max(1, len(samples))
    return (
        {k: v / n for k, v in recall.items()},
        {k: v / n for k, v in all_gold.items()},
        {k: v / n for k, v in answer.items()},
    )


def build(kind: str, passages: list[Passage], cache: dict[str, Retriever]) -> Retriever:
    """One retriever per kind; the hybrid reuses the BM25 and dense instances."""
    if kind not in cache:
        if kind == "bm25":
            from agentr1.retrieval.bm25 import BM25Retriever

            cache[kind] = BM25Retriever(passages)
        elif kind == "dense":
            from agentr1.retrieval.dense import DenseRetriever

            cache[kind] = DenseRetriever(passages)
        elif kind == "hybrid":
            from agentr1.retrieval.hybrid import HybridRetriever

            parts = [build("bm25", passages, cache), build("dense", passages, cache)]
            cache[kind] = HybridRetriever(parts)
        else:
            raise ValueError(f"unknown retriever {kind!r}; choose bm25, dense or hybrid")
    return cache[kind]


def markdown(rows: list[Scores], ks: list[int]) -> str:
    """One table: a row per (dataset, retriever); recall@k, all@k and answer@k columns."""
    head = ["dataset", "retriever", "n"]
    head += [f"recall@{k}" for k in ks] + [f"all@{k}" for k in ks] + [f"answer@{k}" for k in ks]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r.dataset, r.retriever, str(r.questions)]
        for d in (r.recall, r.all_gold, r.answer):
            cells += [f"{d[k]:.3f}" for k in ks]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--data-dir", default=None, help="raw data (default: agentr1.data's)")
    ap.add_argument("--retrievers", nargs="+", default=["bm25", "dense", "hybrid"])
    ap.add_argument("--k", nargs="+", type=int, default=[1, 5, 10])
    ap.add_argument("--max-questions", type=int, default=0, help="per dataset (0 = all)")
    ap.add_argument("--json", default=None, help="also write the scores here")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    root = Path(args.data_dir) if args.data_dir else default_data_dir()

    t0 = time.perf_counter()
    with_context = [s for p in qa_files(root) for s in load_file(p) if s.context]
    passages = corpus_paragraphs(with_context)
    evalsets = {name: load_file(root / rel) for name, rel in EVAL_FILES.items()}
    if args.max_questions:
        evalsets = {n: s[: args.max_questions] for n, s in evalsets.items()}
    print(f"corpus: {len(passages)} passages ({time.perf_counter() - t0:.1f} s to load)")

    ks = sorted(set(args.k))
    cache: dict[str, Retriever] = {}
    rows: list[Scores] = []
    for kind in args.retrievers:
        tb = time.perf_counter()
        retriever = build(kind, passages, cache)
        print(f"{kind}: built in {time.perf_counter() - tb:.1f} s")
        for name, samples in evalsets.items():
            ts = time.perf_counter()
            hits = retriever.search_batch([s.question for s in samples], max(ks))
            rec, allg, ans = score(samples, hits, ks)
            rows.append(Scores(name, kind, len(samples), rec, allg, ans, time.perf_counter() - ts))
    print(markdown(rows, ks))
    if args.json:
        out = {"corpus_passages": len(passages), "ks": ks, "rows": [asdict(r) for r in rows]}
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
