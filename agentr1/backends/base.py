"""The Generator protocol: token ids in, sampled token ids and their log-probs out.

Kept narrow on purpose so a faster engine (vLLM, a Ray actor pool) can replace the `hf`
backend without the rollout knowing.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal, Protocol


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one turn.

    Attributes:
        max_new_tokens: hard cap on sampled tokens per prompt.
        temperature: softmax temperature; 0 means greedy (log-probs are then those of
            the untempered distribution).
        top_p: nucleus sampling mass in (0, 1]; 1 disables it.
        stop: strings that end generation once the decoded output contains them; the
            token that completes the string is kept (tokens are never split).
        stop_token_ids: token ids that end generation; the stop token is kept.
        seed: optional seed for reproducible sampling.
        row_max_new_tokens: a cap per prompt of the call, each in [1, max_new_tokens]
            (an episode near its context limit gets less room than the others: one
            batched call serves them all); None = ``max_new_tokens`` for every row.
        row_seeds: a seed per prompt of the call (overrides ``seed``): each row's draws
            then depend on its own seed only, not on which rows share the call, so an
            episode samples the same tokens in one process or on any rollout worker.
    """

    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    row_max_new_tokens: tuple[int, ...] | None = None
    row_seeds: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        caps = self.row_max_new_tokens
        if caps is not None and not all(1 <= c <= self.max_new_tokens for c in caps):
            raise ValueError(
                f"row_max_new_tokens must each be in [1, max_new_tokens={self.max_new_tokens}]"
            )
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    def cap(self, row: int) -> int:
        """The most tokens row ``row`` of the call may sample."""
        caps = self.row_max_new_tokens
        return self.max_new_tokens if caps is None else caps[row]

    def check_rows(self, n: int) -> None:
        """Raise ValueError when ``row_max_new_tokens`` does not give one cap per prompt."""
        caps = self.row_max_new_tokens
        if caps is not None and len(caps) != n:
            raise ValueError(f"row_max_new_tokens has {len(caps)} caps for {n} prompts")
        if self.row_seeds is not None and len(self.row_seeds) != n:
            raise ValueError(f"row_seeds has {len(self.row_seeds)} seeds for {n} prompts")

    def select(self, rows: list[int]) -> SamplingParams:
        """These params for the sub-call of prompts ``rows`` (their caps and seeds)."""
        caps, seeds = self.row_max_new_tokens, self.row_seeds
        return replace(
            self,
            row_max_new_tokens=None if caps is None else tuple(caps[i] for i in rows),
            row_seeds=None if seeds is None else tuple(seeds[i] for i in rows),
        )


@dataclass
class Completion:
    """One sampled continuation.

    Attributes:
        token_ids: the sampled tokens, exactly as sampled, stop token included.
        logprobs: log-prob of each sampled token under the sampling distribution
            (temperature and top-p applied). Same length as ``token_ids``.
        finish_reason: "stop" (stop token or string) or "length" (hit max_new_tokens).
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: Literal["stop", "length"] = "stop"
    metrics: dict[str, float] = field(default_factory=dict)


class Generator(Protocol):
    """Anything that samples continuations of token-id prompts in a batch."""

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        """Sample one completion per prompt; the i-th completion continues ``prompts[i]``."""
        ...
