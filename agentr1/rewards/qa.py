"""Outcome metrics for question answering, with the standard SQuAD normalization.

Each takes the prediction and the list of accepted gold answers (aliases) and returns the
best score over the golds. They are the evaluation metrics and, by default, the reward.
"""

from __future__ import annotations

import re
import string
from collections import Counter

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCT = set(string.punctuation)


def normalize_answer(s: str) -> str:
    """Lower-case, drop punctuation and articles, collapse whitespace (SQuAD v1.1).

    >>> normalize_answer("The  Eiffel-Tower!")
    'eiffeltower'
    >>> normalize_answer("An apple a day")
    'apple day'
    """
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def exact_match(prediction: str | None, golds: list[str]) -> float:
    """1.0 if the normalized prediction equals any normalized gold, else 0.0.

    >>> exact_match("the Paris", ["Paris", "City of Light"])
    1.0
    >>> exact_match(None, ["Paris"])
    0.0
    """
    if prediction is None:
        return 0.0
    p = normalize_answer(prediction)
    return float(any(p == normalize_answer(g) for g in golds))


def cover_exact_match(prediction: str | None, golds: list[str]) -> float:
    """1.0 if any normalized gold occurs as a whole-word span of the normalized prediction.

    >>> cover_exact_match("It was Paris, France", ["paris"])
    1.0
    >>> cover_exact_match("Parisian", ["paris"])
    0.0
    """
    if prediction is None:
        return 0.0
    p = f" {normalize_answer(prediction)} "
    return float(any(normalize_answer(g) and f" {normalize_answer(g)} " in p for g in golds))


def f1_score(prediction: str | None, golds: list[str]) -> float:
    """Token-level F1 between normalized prediction and the best gold (SQuAD).

    >>> round(f1_score("New York City", ["New York"]), 3)
    0.8
    >>> f1_score("", ["x"])
    0.0
    """
    if prediction is None:
        return 0.0
    pred = normalize_answer(prediction).split()
    best = 0.0
    for g in golds:
        gold = normalize_answer(g).split()
        common = Counter(pred) & Counter(gold)
        same = sum(common.values())
        if not pred or not gold:
            best = max(best, float(pred == gold))
            continue
        if same == 0:
            continue
        precision, recall = same / len(pred), same / len(gold)
        best = max(best, 2 * precision * recall / (precision + recall))
    return best


def format_valid(prediction: str | None) -> float:
    """1.0 if the episode ended with a non-empty ``<answer>...</answer>``, else 0.0.

    >>> format_valid("Paris"), format_valid("  "), format_valid(None)
    (1.0, 0.0, 0.0)
    """
    return float(prediction is not None and bool(prediction.strip()))
