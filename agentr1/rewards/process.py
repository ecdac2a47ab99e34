"""Process rewards: per-step rewards for intermediate actions (Agent-R1's extended MDP).

Each is a pure function of a `StepContext` (one step plus the episode so far) and returns
a float placed on the last token of that turn. `ProcessRewardConfig` combines them into
the env's ``process_reward`` hook; outcome-only and process-reward runs differ by one
switch (``enabled``).

Anything a policy could farm (e.g. "new evidence" by searching everything) is offered as
potential-based shaping, F = γΦ(s') − Φ(s) (Ng, Harada & Russell 1999). Φ here is the
fraction of the task's supporting passages (real QA: supporting titles) retrieved so far.
With γ = 1 the shaping terms telescope to Φ(s_T) − Φ(s_0) = Φ(s_T) over an episode.

Ng et al.'s guarantee (the optimal policy is unchanged) needs Φ = 0 at every terminal
state; ``evidence_at_end`` chooses:

- ``"keep"`` (the default): Φ(s_T) stays, so an episode earns up to ``evidence`` for the
  evidence it ends with, answered or not. A bonus, not policy-invariant: where answering
  rarely pays, a policy can prefer one more search to an answer.
- ``"zero"``: the episode's last turn also gets −``evidence``·Φ(s_T) (`ProcessRewardHook.
  terminal`), so the evidence terms sum to 0 over every episode. Provably invariant; it
  only moves credit to the turn that found the evidence (token-level estimators such as
  GAE and REINFORCE++ see it; episode-level advantages such as GRPO's do not).

``no_answer`` is a penalty for an episode that ends without an answer (turn limit, context
limit, or a turn with neither a call nor an answer). With an F1 or EM outcome a wrong answer
and no answer both score 0, so where answering rarely pays, one more search instead of an
answer costs nothing and (with ``"keep"``) can earn evidence: a run drifted that way (GRPO
at 3x the recipe's lr: 199 of 577 eval episodes ended at the turn limit, from 7).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from agentr1.data.splits import normalize_question
from agentr1.types import StepContext

ProcessReward = Callable[[StepContext], float]


def valid_call(ctx: StepContext) -> float:
    """1.0 if the turn made at least one tool call and every call and tag was well formed.

    >>> from agentr1.types import Task, ToolCall, ToolResult
    >>> t = Task("q", "?", ["a"])
    >>> valid_call(StepContext(t, 0, "", [ToolCall("search", {})], [ToolResult("x")], [], None))
    1.0
    >>> valid_call(StepContext(t, 0, "", [], [], ["malformed_json"], None))
    0.0
    """
    ok = bool(ctx.calls) and not ctx.parse_errors and all(r.ok for r in ctx.results)
    return float(ok)


def invalid_call(ctx: StepContext) -> float:
    """Number of malformed pieces and failed calls in the turn (to be penalized).

    >>> from agentr1.types import Task, ToolCall, ToolResult
    >>> t = Task("q", "?", ["a"])
    >>> invalid_call(StepContext(t, 0, "", [ToolCall("s", {})], [ToolResult("e", ok=False)],
    ...                          ["unclosed_tag"], None))
    2.0
    """
    return float(len(ctx.parse_errors) + sum(not r.ok for r in ctx.results))


def _queries(ctx: StepContext) -> list[str]:
    return [
        " ".join(str(c.arguments.get("query", "")).lower().split())
        for c in ctx.calls
        if c.name == "search"
    ]


def repeated_query(ctx: StepContext) -> float:
    """Number of search queries in this turn already issued earlier in the episode.

    >>> from agentr1.types import Task, ToolCall
    >>> t = Task("q", "?", ["a"])
    >>> first = StepContext(t, 0, "", [ToolCall("search", {"query": "Velmora"})], [], [], None)
    >>> again = StepContext(t, 1, "", [ToolCall("search", {"query": " velmora"})], [], [], None,
    ...                     previous=[first])
    >>> repeated_query(first), repeated_query(again)
    (0.0, 1.0)
    """
    seen = {q for p in ctx.previous for q in _queries(p)}
    return float(sum(q in seen for q in _queries(ctx)))


def _retrieved(ctx: StepContext, by_title: bool = False) -> set[str]:
    """Passage ids (or title keys) the turn's search results returned."""
    if by_title:
        return {
            normalize_question(str(t)) for r in ctx.results for t in r.metadata.get("titles", [])
        }
    return {str(i) for r in ctx.results for i in r.metadata.get("passage_ids", [])}


def evidence_potential(ctx: StepContext, upto_self: bool = True) -> float:
    """Φ: fraction of the task's supporting evidence retrieved in the episode up to and
    including this step (or before it).

    The evidence is the supporting passage ids (``metadata["supporting"]``, the embedded
    world) or else the supporting titles (``metadata["supporting_titles"]``, real QA data,
    matched against result titles by `normalize_question`, case and punctuation ignored, as
    the supporting-facts demonstrations match them). Tasks with neither have Φ = 0
    everywhere (the shaping is then inert).

    >>> from agentr1.types import Task, ToolCall, ToolResult
    >>> t = Task("q", "?", ["a"], metadata={"supporting_titles": ["Velmora", "Ostrin"]})
    >>> hit = ToolResult("[1] velmora", metadata={"titles": ["velmora"], "passage_ids": ["7"]})
    >>> evidence_potential(StepContext(t, 0, "", [ToolCall("search", {})], [hit], [], None))
    0.5
    """
    support = {str(i) for i in ctx.task.metadata.get("supporting", [])}
    by_title = not support
    if by_title:
        support = {
            normalize_question(str(t)) for t in ctx.task.metadata.get("supporting_titles", [])
        }
    if not support:
        return 0.0
    found: set[str] = set()
    for p in ctx.previous:
        found |= _retrieved(p, by_title)
    if upto_self:
        found |= _retrieved(ctx, by_title)
    return len(found & support) / len(support)


def new_evidence_shaping(ctx: StepContext, gamma: float = 1.0) -> float:
    """Potential-based shaping γΦ(s') − Φ(s) with Φ = `evidence_potential`."""
    return gamma * evidence_potential(ctx, True) - evidence_potential(ctx, False)


def new_evidence(ctx: StepContext) -> float:
    """Number of passages retrieved this turn that no earlier turn retrieved (plain, gameable)."""
    before: set[str] = set()
    for p in ctx.previous:
        before |= _retrieved(p)
    return float(len(_retrieved(ctx) - before))


@dataclass(frozen=True)
class ProcessRewardConfig:
    """Weights of the process rewards; ``enabled: false`` gives an outcome-only run.

    Attributes:
        enabled: add process rewards at all.
        valid_call: reward for a turn whose tool calls were all well formed and ran.
        invalid_call: penalty per malformed call / failed call (subtracted).
        repeated_query: penalty per search query repeated within an episode (subtracted).
        evidence: weight of the evidence term.
        evidence_mode: "potential" (shaping γΦ(s')−Φ(s) over supporting passages) or
            "plain" (count of new passages; can be farmed).
        evidence_at_end: with "potential", what the episode's end does with Φ(s_T):
            "keep" it (a net bonus of up to ``evidence``: can change the optimal policy) or
            "zero" it (the last turn pays it back: invariant, credit assignment only).
        gamma: discount used by the potential-based shaping.
        no_answer: penalty (subtracted) for an episode that ends without an answer, on its
            last turn; 0 leaves a missing answer scored like a wrong one.
    """

    enabled: bool = False
    valid_call: float = 0.05
    invalid_call: float = 0.1
    repeated_query: float = 0.1
    evidence: float = 0.2
    evidence_mode: Literal["potential", "plain"] = "potential"
    evidence_at_end: Literal["keep", "zero"] = "keep"
    gamma: float = 1.0
    no_answer: float = 0.0

    def build(self) -> ProcessRewardHook | None:
        """The env hook, or None when disabled."""
        return ProcessRewardHook(self) if self.enabled else None


@dataclass(frozen=True)
class ProcessRewardHook:
    """The env's process-reward hook: a reward per step, and one at the episode's end."""

    cfg: ProcessRewardConfig

    def __call__(self, ctx: StepContext) -> float:
        cfg = self.cfg
        r = cfg.valid_call * valid_call(ctx)
        r -= cfg.invalid_call * invalid_call(ctx)
        r -= cfg.repeated_query * repeated_query(ctx)
        if cfg.evidence_mode == "potential":
            r += cfg.evidence * new_evidence_shaping(ctx, cfg.gamma)
        else:
            r += cfg.evidence * new_evidence(ctx)
        return r

    def terminal(self, history: Sequence[StepContext], answer: str | None = None) -> float:
        """Added to the last turn when the episode ends, however it ends (answer, turn or
        context limit): −``evidence``·Φ(s_T) with ``evidence_at_end="zero"`` (the step into
        a terminal state whose Φ is 0), minus ``no_answer`` when ``answer`` is missing or
        blank; else 0."""
        cfg = self.cfg
        if not history:
            return 0.0
        r = 0.0
        if cfg.evidence_mode == "potential" and cfg.evidence_at_end == "zero":
            r -= cfg.evidence * evidence_potential(history[-1], True)
        if answer is None or not answer.strip():
            r -= cfg.no_answer
        return r
