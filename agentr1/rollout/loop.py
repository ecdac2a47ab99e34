"""The multi-turn rollout: batches of episodes, turn by turn, token in, token out.

Each episode: the env's opening messages are rendered once into prompt tokens; then,
until it stops, the policy samples a turn (kept exactly as sampled, ``loss_mask = 1``),
the env interprets it, and the segment that follows the turn in the chat template (tool
responses and glue) is tokenized once and appended with ``loss_mask = 0``.

All live episodes are sampled together in one `Generator.generate` call per turn, and
their env steps (tool calls) run concurrently. A generator with a ``session()`` context
(the ``hf`` one) is asked to keep each episode's KV cache from one turn to the next, so
a turn prefills only its tool response, not the whole history again.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from agentr1.backends.base import Completion, Generator, SamplingParams
from agentr1.envs.base import ToolEnv
from agentr1.rollout.chat import ChatFormat
from agentr1.types import (
    Message,
    StepResult,
    StopReason,
    Task,
    ToolLogEntry,
    Trajectory,
    TrajectoryGroup,
)


@dataclass(frozen=True)
class RolloutConfig:
    """Budgets and sampling for one rollout.

    Attributes:
        n_samples: episodes per task (the group size G for GRPO / RLOO).
        max_turns: agent turns per episode; the episode stops with ``max_turns`` after it.
        max_tokens_per_turn: sampled tokens per turn.
        max_context: total tokens per episode (prompt + turns + tool responses); a turn
            or tool response that would not fit stops the episode with ``max_context``.
        temperature: sampling temperature (0 = greedy).
        top_p: nucleus mass.
        stop: extra stop strings (the end-of-turn token always stops a turn).
        seed: sampling seed (None: not seeded).
    """

    n_samples: int = 1
    max_turns: int = 5
    max_tokens_per_turn: int = 256
    max_context: int = 4096
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None

    def __post_init__(self) -> None:
        for name in ("n_samples", "max_turns", "max_tokens_per_turn", "max_context"):
            if getattr(self, name) < 1:
                raise ValueError(f"rollout.{name} must be >= 1, got {getattr(self, name)}")


@dataclass
class RolloutStats:
    """What one rollout cost and produced (for logs and benchmarks)."""

    episodes: int = 0
    turns: int = 0
    generated_tokens: int = 0
    generate_s: float = 0.0
    env_s: float = 0.0
    total_s: float = 0.0
    prefill_s: float = 0.0
    """Of ``generate_s``: the generator's own clock of its prefills and its decode passes
    (``last_stats``, `agentr1.backends.hf.GenerationStats`), 0 where it keeps none."""
    decode_s: float = 0.0
    stop_reasons: dict[str, int] = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.total_s if self.total_s > 0 else 0.0

    @property
    def episodes_per_s(self) -> float:
        return self.episodes / self.total_s if self.total_s > 0 else 0.0


@dataclass
class _Episode:
    env: ToolEnv
    traj: Trajectory
    group: int = 0
    """The episode's group's position in the step (seeds its draws)."""


def row_seed(seed: int, group: int, sample: int, turn: int) -> int:
    """The sampling seed of one episode's turn: a function of the rollout's seed, the
    episode's group (its position in the step), its sample index and the turn only, so
    the episode draws the same tokens whichever episodes share its generate call, in one
    process or on any rollout worker."""
    key = f"{seed}:{group}:{sample}:{turn}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> 1


def run_rollout(
    tasks: Sequence[Task],
    make_env: Callable[[], ToolEnv],
    generator: Generator,
    chat: ChatFormat,
    cfg: RolloutConfig,
    stats: RolloutStats | None = None,
    group_ids: Sequence[int] | None = None,
) -> list[TrajectoryGroup]:
    """Run ``cfg.n_samples`` episodes per task to completion; one group per task.

    Every returned trajectory has a ``stop_reason``. Tool failures are observations, not
    exceptions; an env that raises ends only its own episode (``error``, turn masked out).
    ``group_ids`` are the tasks' positions in the whole step (default 0, 1, ...): a
    worker that runs some of a step's tasks passes theirs, and draws what one process
    would (`row_seed`).
    """
    stats = stats if stats is not None else RolloutStats()
    t0 = time.perf_counter()
    ids = list(range(len(tasks))) if group_ids is None else list(group_ids)
    if len(ids) != len(tasks):
        raise ValueError(f"{len(ids)} group ids for {len(tasks)} tasks")
    episodes: list[_Episode] = []
    for task, gid in zip(tasks, ids, strict=True):
        for g in range(cfg.n_samples):
            env = make_env()
            msgs = env.reset(task)
            traj = Trajectory(task_id=task.id, sample_index=g, messages=list(msgs))
            traj.append_prompt(chat.prompt_ids(msgs, env.tool_schemas))
            episodes.append(_Episode(env, traj, gid))
            if traj.prompt_len >= cfg.max_context:
                _finish(episodes[-1], StopReason.MAX_CONTEXT, None)

    session = getattr(generator, "session", None)
    loop = asyncio.new_event_loop()
    try:
        with session() if callable(session) else contextlib.nullcontext():
            _run_turns(episodes, generator, chat, cfg, stats, loop)
    finally:
        loop.close()

    stats.episodes += len(episodes)
    for e in episodes:
        key = str(e.traj.stop_reason)
        stats.stop_reasons[key] = stats.stop_reasons.get(key, 0) + 1
    stats.total_s += time.perf_counter() - t0
    groups: list[TrajectoryGroup] = []
    for i, task in enumerate(tasks):
        chunk = episodes[i * cfg.n_samples : (i + 1) * cfg.n_samples]
        groups.append(TrajectoryGroup(task=task, trajectories=[e.traj for e in chunk]))
    return groups


def _run_turns(
    episodes: list[_Episode],
    generator: Generator,
    chat: ChatFormat,
    cfg: RolloutConfig,
    stats: RolloutStats,
    loop: asyncio.AbstractEventLoop,
) -> None:
    """Sample a turn for every live episode, step their envs, until none is live."""
    while live := [e for e in episodes if e.traj.stop_reason is None]:
        # One batched call for every live episode; one near the context limit gets a
        # smaller cap of its own (splitting the batch by cap doubled the decode passes).
        caps = [min(cfg.max_tokens_per_turn, cfg.max_context - len(e.traj.token_ids)) for e in live]
        seed = cfg.seed
        params = SamplingParams(
            max_new_tokens=max(caps),
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            stop=cfg.stop,
            stop_token_ids=chat.stop_token_ids,
            row_max_new_tokens=None if min(caps) == max(caps) else tuple(caps),
            row_seeds=None
            if seed is None
            else tuple(
                row_seed(seed, e.group, e.traj.sample_index, e.traj.num_turns) for e in live
            ),
        )
        version = int(getattr(generator, "weight_version", 0))
        tg = time.perf_counter()
        outs = generator.generate([e.traj.token_ids for e in live], params)
        stats.generate_s += time.perf_counter() - tg
        clock = getattr(generator, "last_stats", None)
        stats.prefill_s += float(getattr(clock, "prefill_s", 0.0))
        stats.decode_s += float(getattr(clock, "decode_s", 0.0))
        if len(outs) != len(live):
            raise RuntimeError(
                f"generator returned {len(outs)} completions for {len(live)} prompts"
            )
        outs = [_within(out, cap) for out, cap in zip(outs, caps, strict=True)]
        te = time.perf_counter()
        steps = loop.run_until_complete(_step_all(live, outs, chat, version))
        stats.env_s += time.perf_counter() - te
        for e, out, step in zip(live, outs, steps, strict=True):
            stats.turns += 1
            stats.generated_tokens += len(out.token_ids)
            _advance(e, out, step, chat, cfg)


def _within(out: Completion, cap: int) -> Completion:
    """``out`` cut to ``cap`` tokens (finish "length"): a generator that does not know
    per-row caps must not push an episode past its context."""
    if len(out.token_ids) <= cap:
        return out
    return Completion(out.token_ids[:cap], out.logprobs[:cap], "length", dict(out.metrics))


async def _step_all(
    group: list[_Episode], outs: list[Completion], chat: ChatFormat, version: int
) -> list[StepResult | BaseException]:
    """Append each sampled turn (sampled by weights ``version``), then step every env
    concurrently."""
    texts = []
    for e, out in zip(group, outs, strict=True):
        text = chat.assistant_text(out.token_ids)
        e.traj.append_sampled(out.token_ids, out.logprobs, text, out.finish_reason, version)
        e.traj.messages.append(Message("assistant", text))
        texts.append(text)
    return list(
        await asyncio.gather(
            *(e.env.step(t) for e, t in zip(group, texts, strict=True)), return_exceptions=True
        )
    )


def _advance(
    e: _Episode,
    out: Completion,
    step: StepResult | BaseException,
    chat: ChatFormat,
    cfg: RolloutConfig,
) -> None:
    """Apply one env step to an episode: reward, logs, then continue or stop."""
    traj = e.traj
    turn_idx = traj.num_turns - 1
    if isinstance(step, BaseException):
        # An env bug ends this episode only; its turn is not trained on.
        traj.mask_turn(turn_idx)
        traj.metrics["env_errors"] = traj.metrics.get("env_errors", 0.0) + 1
        traj.turns[turn_idx].text += f"\n[env error: {type(step).__name__}: {step}]"
        _finish(e, StopReason.ERROR, None)
        return
    traj.turns[turn_idx].reward = step.reward
    if out.finish_reason == "length":  # truncation is never silent
        traj.metrics["truncated_turns"] = traj.metrics.get("truncated_turns", 0.0) + 1
    for k, v in step.metrics.items():
        traj.metrics[k] = traj.metrics.get(k, 0.0) + v
    for call, res in zip(step.tool_calls, step.tool_results, strict=True):
        traj.tool_log.append(
            ToolLogEntry(
                turn=turn_idx,
                name=call.name,
                arguments=call.arguments,
                ok=res.ok,
                content=res.content,
                error=res.metadata.get("error") if not res.ok else None,
            )
        )
    if step.done:
        _finish(e, step.stop_reason or StopReason.ERROR, step.answer)
        return
    if out.finish_reason == "length" and len(traj.token_ids) >= cfg.max_context:
        _finish(e, StopReason.MAX_CONTEXT, None)
        return
    if traj.num_turns >= cfg.max_turns:
        _finish(e, StopReason.MAX_TURNS, None)
        return
    ended = bool(out.token_ids) and out.token_ids[-1] == chat.end_of_turn_id
    obs = chat.observation_ids(step.observation, turn_ended=ended)
    # Leave room for at least one sampled token after the observation.
    if len(traj.token_ids) + len(obs) >= cfg.max_context:
        _finish(e, StopReason.MAX_CONTEXT, None)
        return
    traj.append_inserted(obs)
    traj.messages.extend(step.observation)


def _finish(e: _Episode, reason: StopReason, answer: str | None) -> None:
    traj = e.traj
    traj.stop_reason = reason
    traj.answer = answer
    reward, metrics = e.env.finish(answer)
    traj.outcome_reward = reward
    end = metrics.pop("process_end", 0.0)
    if end and traj.turns:
        traj.turns[-1].reward += end
    traj.metrics.update(metrics)
    traj.metrics["turns"] = float(traj.num_turns)
