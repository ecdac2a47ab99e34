"""The RL loop (docs/design.md §6), read top to bottom like the algorithm:

    sample tasks -> rollout groups -> score (reference log-probs, values)
    -> advantages -> K epochs of minibatch updates -> eval -> log -> checkpoint

every phase timed. `train(cfg, task=None)` runs the SFT warm start (if enabled and not
resuming), the evaluation before RL, the RL steps, the evaluation after, and writes the
run directory. The task is a value (`agentr1.tasks.TaskSpec`): the one ``cfg.task``
names, or one given in Python; the loop reads its metrics from it and names none itself.

The parts: `state` (what is carried between steps and checkpointed, resume), `scoring`
(masks, reference / old log-probs, values, advantages), `update` (the optimizer steps),
`sft` (the warm start), `best` (the best model), `evaluation`, `run` (the run directory).

Notation: B = rows (episodes) in a step, T = tokens.
"""

from __future__ import annotations

import dataclasses
import logging
import resource
import sys
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch

from agentr1 import lora
from agentr1.config import Config
from agentr1.envs.base import ERROR_KINDS
from agentr1.eval.evaluate import EvalResult
from agentr1.rollout.collate import collate_groups
from agentr1.rollout.loop import RolloutStats
from agentr1.tasks import TaskSpec
from agentr1.trainer import best, tokenlog
from agentr1.trainer.checkpoint import latest_checkpoint, update_checkpoint_meta, write_failed
from agentr1.trainer.evaluation import eval_record, log_eval, run_eval
from agentr1.trainer.rollouts import make_rollouts
from agentr1.trainer.run import RunDir
from agentr1.trainer.scoring import update_batch
from agentr1.trainer.setup import Setup, build_setup, train_autocast
from agentr1.trainer.sft import drop_sft_checkpoints, resume_warm_start
from agentr1.trainer.state import (
    Timer,
    TrainState,
    checkpoint,
    has_checkpoint,
    make_state,
    release_training_state,
    restore,
    save_reference,
    settled_heap,
)
from agentr1.trainer.tokenlog import token_layers
from agentr1.trainer.update import rl_update
from agentr1.types import Trajectory, TrajectoryGroup

log = logging.getLogger(__name__)

Evaluated = tuple[int, dict[str, dict[str, EvalResult]]]
"""(step, the evaluation's results per mode and split)."""


# ---------------------------------------------------------------------------- one step
def sample_rollouts(
    s: TrainState, timer: Timer
) -> tuple[list[TrajectoryGroup], RolloutStats, dict[str, float]]:
    """Sample tasks and run n_samples episodes for each (one group per task), here or on
    the rollout workers (`agentr1.trainer.rollouts`); with staleness metrics."""
    if s.rollouts is None:  # the first step: the workers start from these weights
        s.rollouts = make_rollouts(s)
    return s.rollouts.batch(s, timer)


def memory_metrics(device: torch.device) -> dict[str, float]:
    """``mem/peak_rss_gib``: the process's peak resident memory so far; on CUDA,
    ``mem/gpu_peak_gib``: the most the step allocated on the policy's GPU (PyTorch's
    allocator; the step resets it) and ``mem/gpu_reserved_gib`` what the allocator holds."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB (bytes on macOS)
    out = {"mem/peak_rss_gib": peak / (2**30 if sys.platform == "darwin" else 2**20)}
    if device.type == "cuda":
        out["mem/gpu_peak_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
        out["mem/gpu_reserved_gib"] = torch.cuda.memory_reserved(device) / 2**30
    return out


def rl_step(s: TrainState, run: RunDir) -> dict[str, float]:
    """One RL step: rollout -> score -> advantages -> update -> sampler sync; its metrics."""
    cfg = s.setup.cfg
    timer = Timer()
    t0 = time.perf_counter()
    device = s.setup.policy.device
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    groups, stats, async_metrics = sample_rollouts(s, timer)
    batch = collate_groups(groups, s.setup.pad_id).to(device)
    ub, scores, adv_metrics = update_batch(s, batch, timer)
    tap = tokenlog.tap_for(s, batch, scores.old_BT)  # the logged rows' log-probs before
    train_policy = s.step >= cfg.algo.critic_warmup_steps or s.critic is None
    with timer("update"):
        update = rl_update if s.group is None else s.group.update  # data-parallel ranks
        upd = update(
            s.learner,
            ub,
            cfg.algo,
            cfg.optim,
            temperature=cfg.rollout.temperature,
            generator=s.update_rng,
            train_policy=train_policy,
            autocast=lambda: train_autocast(cfg, s.setup.policy),
            **({"tap": tap} if tap is not None else {}),
        )
    if tap is not None:
        changed = train_policy and upd["skipped_updates"] == 0
        logged = tokenlog.before_from_tap(s, batch, tap, ub.loss_mask_BT, changed)
        scores = dataclasses.replace(scores, logged_BT=logged)
    with timer("sync_sampler"):
        s.rollouts.synced(s, s.step + 1)
    names = s.setup.task.metric_names
    metrics = {"step": float(s.step), **rollout_metrics(groups, stats, names), **async_metrics}
    metrics |= adv_metrics | upd
    if scores.old_BT is not None:
        # Token in, token out: the trainer's log-probs should match the sampler's.
        diff_BT = (scores.old_BT - batch.old_logprobs_BT).abs() * batch.loss_mask_BT
        metrics["logprob_mismatch"] = float(diff_BT.sum() / batch.loss_mask_BT.sum().clamp(min=1))
    metrics |= timer.times
    metrics["time/step"] = time.perf_counter() - t0
    metrics |= memory_metrics(device)
    if cfg.train.log_rollouts:
        # Mean advantage over each episode's trained tokens: the direction it pushed.
        adv_B = ub.advantages_BT.sum(1) / ub.loss_mask_BT.sum(1).clamp(min=1)
        run.log_rollouts(s.step, groups, adv_B.tolist(), names)
    if cfg.train.log_trajectories:
        with timer("log_tokens"):  # what the step did to each token of the logged groups
            layers = token_layers(s, batch, ub, scores)
        metrics["time/log_tokens"] = timer.times["time/log_tokens"]
        shown = groups[: cfg.train.log_trajectories]
        run.log_trajectories(s.step, shown, s.setup.chat.decode, layers)
    return metrics


def rollout_metrics(
    groups: list[TrajectoryGroup], stats: RolloutStats, metric_names: Sequence[str]
) -> dict[str, float]:
    """Episode-level means for the log: reward, the task's metrics, turns, tool calls,
    stop-reason mix."""
    trajs: list[Trajectory] = [t for g in groups for t in g.trajectories]
    n = len(trajs)
    m = {
        "reward": sum(t.total_reward for t in trajs) / n,
        "outcome_reward": sum(t.outcome_reward for t in trajs) / n,
        "process_reward": sum(sum(t.step_rewards) for t in trajs) / n,
    }
    for name in metric_names:
        m[name] = sum(t.metrics.get(name, 0.0) for t in trajs) / n
    m |= {
        "turns": sum(t.num_turns for t in trajs) / n,
        "tool_calls": sum(len(t.tool_log) for t in trajs) / n,
        "tool_errors": sum(sum(not e.ok for e in t.tool_log) for t in trajs) / n,
        "response_len": sum(t.response_len for t in trajs) / n,
        "episode_len": sum(len(t.token_ids) for t in trajs) / n,
        "gen_tokens_per_s": stats.tokens_per_s,
        "time/rollout_env": stats.env_s,
    }
    if stats.prefill_s or stats.decode_s:  # the generator keeps a clock (the hf one does)
        m["time/rollout_prefill"], m["time/rollout_decode"] = stats.prefill_s, stats.decode_s
    # Errors per episode: every kind of `ERROR_KINDS`, and a tool's own kinds when they occur.
    kinds = Counter(e.error or "tool_exception" for t in trajs for e in t.tool_log if not e.ok)
    for kind in (*(k for k in ERROR_KINDS if k != "parse_errors"), *sorted(kinds)):
        m[f"tool_error/{kind}"] = kinds.get(kind, 0) / n
    for key in ("parse_errors", "observations_truncated", "truncated_turns", "env_errors"):
        m[key] = sum(t.metrics.get(key, 0.0) for t in trajs) / n
    stops = Counter(str(t.stop_reason) for t in trajs)
    for reason, count in stops.items():
        m[f"stop/{reason}"] = count / n
    multi = [g for g in groups if len(g.trajectories) > 1]
    if multi:
        # Groups whose samples all got the same reward carry no GRPO / RLOO gradient; groups
        # whose outcomes tie are moved by the process rewards alone.
        def tied(values: list[float]) -> bool:
            return max(values) - min(values) < 1e-9

        m["groups_tied"] = sum(tied(g.rewards) for g in multi) / len(multi)
        outcomes = ([t.outcome_reward for t in g.trajectories] for g in multi)
        m["groups_outcome_tied"] = sum(tied(o) for o in outcomes) / len(multi)
    return m


# ---------------------------------------------------------------------------- the run
def train(
    cfg: Config,
    task: TaskSpec | None = None,
    resume: bool = False,
    stop_after: int | None = None,
) -> dict[str, Any]:
    """Run a whole training job; returns the summary (also written to the run directory).

    Args:
        cfg: a validated config.
        task: the task to train on; None = the one ``cfg.task`` names. The recipe's
            ``task`` choices (tools, rewards, system prompt) apply to either.
        resume: continue from the newest checkpoint in ``cfg.train.run_dir`` if any.
        stop_after: stop (without the final eval) after this many RL steps in this call —
            used to simulate a killed run in tests.
    """
    t_start = time.perf_counter()
    if resume and not has_checkpoint(cfg.train.run_dir):
        log.warning("%s has no checkpoint to resume from: starting afresh", cfg.train.run_dir)
        resume = False  # and what a killed attempt logged goes (fresh), not doubled
    run = RunDir(cfg.train.run_dir, _shown_config(cfg, task), fresh=not resume)
    state: TrainState | None = None
    try:
        setup = build_setup(cfg, task)
        state = make_state(setup)
        meta = restore(state, run) if resume else None
        setup.sync_sampler()  # a restored policy (or none: a no-op for a fresh copy)
        summary: dict[str, Any] = dict(meta.get("summary", {})) if meta else {}
        summary["task"] = setup.task.name
        if setup.task.data_report:
            summary["data"] = dict(setup.task.data_report)
        if meta is None:
            before_rl(state, run, summary, resume)
        else:
            run.prepare_resume(state.step)
            if cfg.train.keep_best:
                best.adopt_best_on_disk(setup, run, summary)
        last_eval = rl_steps(state, run, summary, stop_after)
        if state.step < cfg.train.steps:  # stopped early (stop_after)
            return summary
        if cfg.train.checkpoint_every == 0 or state.step % cfg.train.checkpoint_every:
            checkpoint(state, run, {"summary": summary})  # on disk before the final eval
        drop_sft_checkpoints(run)
        release_training_state(state)  # the eval needs only the policy and its sampler copy
        final_eval(setup, state.step, run, summary, last_eval)
        summary["minutes"] = (time.perf_counter() - t_start) / 60
        finish(setup, state.step, run, summary)
        return summary
    finally:  # a stopped or failed run too: the trackers get what it logged
        close_run(run, state)


def close_run(run: RunDir, state: TrainState | None) -> None:
    """The end of a run, finished or not: its rollout workers and trainer ranks stop, its
    trackers flush."""
    try:
        if state is not None and state.rollouts is not None:
            state.rollouts.close()
            state.rollouts = None
        if state is not None and state.group is not None:
            state.group.close()
            state.group = None
    finally:
        run.close()


def _shown_config(cfg: Config, task: TaskSpec | None) -> Config:
    """The config as config.yaml shows it: a task given in Python is not the one
    ``task.name`` names, so it says ``python:<name>``."""
    if task is None:
        return cfg
    given = dataclasses.replace(cfg.task, name=f"python:{task.name}", config={})
    return dataclasses.replace(cfg, task=given)


def before_rl(state: TrainState, run: RunDir, summary: dict[str, Any], resume: bool) -> None:
    """A run with no RL checkpoint yet: the SFT warm start (continued from its own
    checkpoint with ``resume``), the evaluation before RL, the step-0 checkpoint (none
    with ``train.checkpoint_every: 0``, and none when neither SFT nor an evaluation ran:
    it would hold what a fresh start rebuilds from the config, and a 3B model's full state
    is ~37 GB and half a minute to write)."""
    setup, cfg = state.setup, state.setup.cfg
    if cfg.sft.enabled:
        summary["sft"] = resume_warm_start(setup, run, resume)
    if cfg.eval.before:
        before = run_eval(setup, "before", run, 0)
        summary["eval_before"] = eval_record(before)
        run.log_metrics({"phase": "eval_before", **summary["eval_before"]})
        best.keep_if_best(setup, run, summary, before, 0)
    # Reference = the warm-started policy, so KL pulls toward it, not the random init.
    save_reference(state, run)
    if cfg.train.checkpoint_every and (cfg.sft.enabled or cfg.eval.before):
        checkpoint(state, run, {"summary": summary})
        drop_sft_checkpoints(run)


@settled_heap()  # the setup's objects out of the garbage collector's walk
def rl_steps(
    state: TrainState, run: RunDir, summary: dict[str, Any], stop_after: int | None
) -> Evaluated | None:
    """RL steps up to ``train.steps`` (or ``stop_after`` of them), each logged, evaluated
    and checkpointed on its schedule; the last periodic evaluation."""
    setup, cfg = state.setup, state.setup.cfg
    head = setup.task.primary_metric
    bar = run.progress(cfg.train.steps, f"RL ({cfg.algo.estimator})", initial=state.step)
    last_eval: Evaluated | None = None
    done_here = 0
    while state.step < cfg.train.steps and (stop_after is None or done_here < stop_after):
        metrics = rl_step(state, run)
        state.step += 1
        done_here += 1
        run.log_metrics({"phase": "rl", **metrics})
        bar.update_with(reward=metrics["reward"], turns=metrics["turns"], **{head: metrics[head]})
        if cfg.train.eval_every and state.step % cfg.train.eval_every == 0:
            res = run_eval(setup, f"step {state.step}", run, state.step)
            last_eval = (state.step, res)
            run.log_metrics({"phase": "eval", "step": state.step, **eval_record(res)})
            best.keep_if_best(setup, run, summary, res, state.step)
        if cfg.train.checkpoint_every and state.step % cfg.train.checkpoint_every == 0:
            checkpoint(state, run, {"summary": summary})
    bar.close()
    return last_eval


def final_eval(
    setup: Setup, step: int, run: RunDir, summary: dict[str, Any], last_eval: Evaluated | None
) -> None:
    """The evaluation after RL, on the plain model (adapters folded in); a periodic
    evaluation of these very weights is reused instead of run again."""
    cfg = setup.cfg
    adapted = lora.unload(setup.policy) > 0  # a plain model from here on: eval, then save
    if step == 0 and "eval_before" in summary:  # no RL step: the same weights
        summary["eval_after"] = summary["eval_before"]
    elif last_eval is not None and last_eval[0] == step and not adapted:
        # Merging adapters changes the arithmetic, so an adapted model is evaluated again.
        log_eval(setup, run, "after", last_eval[1], step)
        summary["eval_after"] = eval_record(last_eval[1])
    else:
        after = run_eval(setup, "after", run, step)
        summary["eval_after"] = eval_record(after)
        if not (cfg.train.eval_every and step % cfg.train.eval_every == 0):
            best.keep_if_best(setup, run, summary, after, step)  # not evaluated yet
    run.log_metrics({"phase": "eval_after", **summary["eval_after"]})


def finish(setup: Setup, step: int, run: RunDir, summary: dict[str, Any]) -> None:
    """The summary into the last checkpoint, ``final_model/``, and the run's report."""
    summary["steps"] = step
    last = latest_checkpoint(run.ckpt_dir)
    if last is not None and last.name == f"step_{step:06d}":  # not an older one
        # The logs as they end: extending the run keeps this final evaluation's episodes.
        update_checkpoint_meta(last, {"summary": summary, **run.checkpoint_facts()})
    try:
        best.save_model(setup, run.dir / "final_model")
    except (OSError, RuntimeError) as e:
        why = f"{type(e).__name__}: {e}"
        raise write_failed(run.ckpt_dir, "the final model", run.dir / "final_model", why) from e
    run.finish(summary, setup.task.primary_metric)
