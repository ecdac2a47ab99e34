"""Paired comparison of two evaluations on the same questions: is B measurably better
than A, or is the difference noise?

Both evaluations score the same questions, so the honest test is paired: per question
``d_i = b_i - a_i`` (EM or F1), its mean with a percentile-bootstrap 95% interval over
questions, and for a 0/1 metric the exact two-sided sign test on the questions where
the two disagree (McNemar's exact test). With 40 questions per dataset a gain of one
question is 2.5 points of EM and nowhere near significant; this module says so in
numbers.

    agentr1 compare runs/a/eval_episodes.jsonl runs/b/eval_episodes.jsonl --metric em f1

Episode files are JSON lines with ``task_id`` and the metric (what `agentr1 eval` writes
to ``episodes.jsonl`` and a training run to ``eval_episodes.jsonl``); ``--where key=value``
picks one evaluation out of a file holding several (e.g. ``label=after``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from agentr1.fileio import read_jsonl


@dataclass(frozen=True)
class Paired:
    """B minus A on the same questions.

    Attributes:
        metric: the per-question score compared (``em``, ``f1``, ...).
        n: questions in both.
        mean_a, mean_b: the two means over those questions.
        diff: ``mean_b - mean_a``.
        ci_low, ci_high: percentile-bootstrap 95% interval of ``diff``.
        wins, losses, ties: questions where B scored higher / lower / the same.
        p_sign: exact two-sided sign-test p-value over wins vs losses (1.0 when none).
    """

    metric: str
    n: int
    mean_a: float
    mean_b: float
    diff: float
    ci_low: float
    ci_high: float
    wins: int
    losses: int
    ties: int
    p_sign: float

    @property
    def significant(self) -> bool:
        """The 95% interval excludes 0 and the sign test agrees (p < 0.05)."""
        return (self.ci_low > 0 or self.ci_high < 0) and self.p_sign < 0.05

    def line(self) -> str:
        """One markdown-friendly sentence."""
        verdict = "significant" if self.significant else "not significant"
        return (
            f"{self.metric}: {self.mean_a:.3f} -> {self.mean_b:.3f} ({self.diff:+.3f}, 95% CI "
            f"[{self.ci_low:+.3f}, {self.ci_high:+.3f}]); {self.wins} better, {self.losses} "
            f"worse, {self.ties} same of {self.n}; sign test p={self.p_sign:.3g} ({verdict})"
        )


def sign_test(wins: int, losses: int) -> float:
    """Exact two-sided binomial test of ``wins`` vs ``losses`` at p = 1/2.

    >>> sign_test(0, 0)
    1.0
    >>> round(sign_test(8, 1), 4)  # 2 * (1 + 9) / 512
    0.0391
    >>> sign_test(3, 3)
    1.0
    """
    n = wins + losses
    if n == 0:
        return 1.0
    k = min(wins, losses)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


def paired(
    a: Mapping[str, float],
    b: Mapping[str, float],
    metric: str = "em",
    n_boot: int = 10_000,
    seed: int = 0,
) -> Paired:
    """Compare per-question scores ``b`` against ``a`` (dicts task id -> score).

    Raises:
        ValueError: the two do not cover the same questions (a paired test on different
            questions would be meaningless), or there are none.
    """
    only_a, only_b = set(a) - set(b), set(b) - set(a)
    if only_a or only_b:
        raise ValueError(
            f"paired comparison needs the same questions: {len(only_a)} only in A "
            f"(e.g. {sorted(only_a)[:3]}), {len(only_b)} only in B (e.g. {sorted(only_b)[:3]})"
        )
    if not a:
        raise ValueError("paired comparison: no questions")
    ids = sorted(a)
    d = [b[i] - a[i] for i in ids]
    n = len(d)
    d_N = np.asarray(d)
    resampled_SN = np.random.default_rng(seed).integers(0, n, size=(n_boot, n))
    lo, hi = np.quantile(d_N[resampled_SN].mean(axis=1), [0.025, 0.975])
    wins = sum(x > 0 for x in d)
    losses = sum(x < 0 for x in d)
    return Paired(
        metric=metric,
        n=n,
        mean_a=sum(a[i] for i in ids) / n,
        mean_b=sum(b[i] for i in ids) / n,
        diff=sum(d) / n,
        ci_low=float(lo),
        ci_high=float(hi),
        wins=wins,
        losses=losses,
        ties=n - wins - losses,
        p_sign=sign_test(wins, losses),
    )


def load_records(
    path: str | Path, fields: Sequence[str], where: Mapping[str, str] | None = None
) -> dict[str, dict[str, Any]]:
    """``task_id -> record`` from an episodes JSONL file, keeping lines matching ``where``;
    each kept line must have ``task_id`` and ``fields``.

    Keys are ``<dataset or split>/<task_id>`` when the line names one, so the same id in
    two datasets stays two questions.

    Raises:
        ValueError: naming the file and line of a malformed record, a missing field, or a
            question scored twice under the filter (two evaluations mixed together); or
            the file when no line is kept.
    """
    path = Path(path)
    where = dict(where or {})
    out: dict[str, dict[str, Any]] = {}

    def matches(rec: dict[str, Any]) -> bool:
        return all(str(rec.get(k)) == v for k, v in where.items())

    for lineno, rec in read_jsonl(path, ("task_id", *fields), matches):
        group = rec.get("dataset", rec.get("split"))
        key = f"{group}/{rec['task_id']}" if group is not None else str(rec["task_id"])
        if key in out:
            raise ValueError(
                f"{path}:{lineno}: question {key!r} appears twice"
                + (f" with {where}" if where else "")
                + "; pick one evaluation with --where (e.g. label=after)"
            )
        out[key] = rec
    if not out:
        raise ValueError(f"{path}: no episodes" + (f" with {where}" if where else ""))
    return out


def load_scores(
    path: str | Path, metric: str, where: Mapping[str, str] | None = None
) -> dict[str, float]:
    """``task_id -> metric`` of `load_records` (same keys, filter and errors)."""
    return {k: float(r[metric]) for k, r in load_records(path, [metric], where).items()}


def compare_files(
    path_a: str | Path,
    path_b: str | Path,
    metrics: Sequence[str] = ("em", "f1"),
    where_a: Mapping[str, str] | None = None,
    where_b: Mapping[str, str] | None = None,
    common: bool = False,
) -> list[Paired]:
    """`paired` for every metric between two episode files.

    Args:
        common: pair only the questions both files have (e.g. a 40-question eval inside
            a 100-question one), instead of refusing files that differ; `Paired.n` says
            how many were paired.
    """
    out = []
    for m in metrics:
        a, b = load_scores(path_a, m, where_a), load_scores(path_b, m, where_b)
        if common:
            a = {k: v for k, v in a.items() if k in b}
            b = {k: v for k, v in b.items() if k in a}
        out.append(paired(a, b, m))
    return out
