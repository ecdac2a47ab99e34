"""Rewards: outcome metrics (EM, F1, cover-EM, format) and process rewards."""

from agentr1.rewards.qa import cover_exact_match, exact_match, f1_score, normalize_answer

__all__ = ["cover_exact_match", "exact_match", "f1_score", "normalize_answer"]
