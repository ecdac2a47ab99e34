"""The RL loop (docs/design.md §6), read top to bottom like the algorithm:

    sample tasks -> rollout groups -> rewards -> (reference log-probs, values)
    -> advantages -> K epochs of minibatch updates -> eval -> log -> checkpoint

every phase timed. `train(cfg, task=None)` runs SFT warm start (if enabled and not
resuming), the evaluation before RL, the RL steps, the evaluation after, and writes the
run directory. The task is a value (`agentr1.tasks.TaskSpec`): the one ``cfg.task``
names, or one given in Python; the loop reads its metrics from it and names none itself.
Resuming (`resume=True`) restores the newest atomic checkpoint: weights, optimizer,
scheduler, every RNG and the data cursor, so the run continues exactly as if never killed.

Notation: B = rows (episodes) in a step, T = tokens.
"""

from __future__ import annotations

import ctypes
import dataclasses
import gc
import json
import logging
import shutil
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from agentr1 import lora
from agentr1.algorithms import (
    AdvantageConfig,
    AdvantageInputs,
    apply_kl_to_rewards,
    compute_advantages,
    explained_variance,
    kl_penalty,
)
from agentr1.config import Config
from agentr1.eval.evaluate import EvalResult, summarize
from agentr1.rollout.collate import collate_groups
from agentr1.rollout.loop import RolloutStats, run_rollout
from agentr1.tasks import TaskSpec
from agentr1.trainer.checkpoint import (
    CheckpointError,
    latest_checkpoint,
    load_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
    update_checkpoint_meta,
    write_failed,
)
from agentr1.trainer.critic import ValueModel
from agentr1.trainer.evaluation import eval_record, log_eval, run_eval
from agentr1.trainer.logprobs import token_logprobs
from agentr1.trainer.run import RunDir
from agentr1.trainer.sampling import TaskSampler, demo_picks
from agentr1.trainer.setup import Setup, build_setup, train_autocast
from agentr1.trainer.sft import sft_train
from agentr1.trainer.update import UpdateBatch, rl_update
from agentr1.types import Task, Trajectory

log = logging.getLogger(__name__)


@dataclass
class Timer:
    """Wall time per phase of the current step."""

    times: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.times[f"time/{phase}"] = self.times.get(f"time/{phase}", 0.0) + (
                time.perf_counter() - t0
            )


@dataclass
class TrainState:
    """What the loop carries between steps (all of it is checkpointed)."""

    setup: Setup
    optimizer: torch.optim.Optimizer
    scheduler: Any
    sampler: TaskSampler
    update_rng: torch.Generator
    critic: ValueModel | None = None
    critic_optimizer: torch.optim.Optimizer | None = None
    reference: Any | None = None
    step: int = 0


# ---------------------------------------------------------------------------- phases
def sample_rollouts(s: TrainState, timer: Timer) -> tuple[list[Any], RolloutStats]:
    """Sample tasks and run n_samples episodes for each (one group per task)."""
    cfg = s.setup.cfg
    tasks = s.sampler.sample(cfg.train.tasks_per_step)
    rcfg = dataclasses.replace(cfg.rollout, seed=cfg.train.seed * 1_000_003 + s.step)
    stats = RolloutStats()
    s.setup.policy.eval()
    with timer("rollout"):
        groups = run_rollout(tasks, s.setup.make_env, s.setup.generator, s.setup.chat, rcfg, stats)
    return groups, stats


def _masks(batch: Any, cfg: Config) -> tuple[torch.Tensor, torch.Tensor]:
    """(train mask, advantage mask) [B, T]; the ablations swap in "every real token".

    With the loss mask off, every real token is trained, so it needs an advantage too:
    the advantage mask then covers every real token as well (otherwise the ablation
    would train prompt and tool tokens with advantage 0, i.e. not at all).
    """
    real_BT = batch.attention_mask_BT.float().clone()
    real_BT[:, 0] = 0.0  # the first token has no log-prob
    train_BT = batch.loss_mask_BT if cfg.algo.loss_mask else real_BT
    both_on = cfg.algo.advantage_mask and cfg.algo.loss_mask
    adv_BT = batch.loss_mask_BT if both_on else real_BT
    return train_BT, adv_BT


@torch.no_grad()
def score_batch(
    s: TrainState, batch: Any, train_mask_BT: torch.Tensor, timer: Timer
) -> dict[str, Any]:
    """Reference log-probs, critic values and (when off-policy) old log-probs. [B, T] each.

    On-policy (one epoch, one minibatch) the update takes the old log-probs from its own
    forward pass (ratio 1), never from the sampler, so a bf16 sampler copy changes nothing
    there."""
    cfg = s.setup.cfg
    with train_autocast(cfg, s.setup.policy):
        return _score_batch(s, batch, train_mask_BT, timer)


def _score_batch(
    s: TrainState, batch: Any, train_mask_BT: torch.Tensor, timer: Timer
) -> dict[str, Any]:
    cfg = s.setup.cfg
    temp = cfg.rollout.temperature
    out: dict[str, Any] = {"ref": None, "values": None, "old": None}
    on_policy = cfg.optim.ppo_epochs == 1 and cfg.optim.minibatches == 1
    if not on_policy or not cfg.algo.loss_mask:
        with timer("old_logprobs"):
            s.setup.policy.eval()
            out["old"], _ = token_logprobs(
                s.setup.policy, batch.input_ids_BT, batch.attention_mask_BT, train_mask_BT, temp
            )
    if s.reference is not None:
        with timer("reference"):
            out["ref"], _ = token_logprobs(
                s.reference, batch.input_ids_BT, batch.attention_mask_BT, train_mask_BT, temp
            )
    elif cfg.algo.kl_coef > 0 and lora.lora_modules(s.setup.policy):
        with timer("reference"), lora.adapters_disabled(s.setup.policy):
            s.setup.policy.eval()
            out["ref"], _ = token_logprobs(
                s.setup.policy, batch.input_ids_BT, batch.attention_mask_BT, train_mask_BT, temp
            )
    if s.critic is not None:
        with timer("values"):
            out["values"] = s.critic(batch.input_ids_BT, batch.attention_mask_BT)
    return out


def compute_step_advantages(
    cfg: Config, batch: Any, scored: dict[str, Any], adv_mask_BT: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """Token rewards (with k1 KL folded in when asked) -> advantages and returns. [B, T]"""
    rewards_BT = batch.token_rewards_BT
    metrics: dict[str, float] = {}
    if scored["ref"] is not None and cfg.algo.kl_mode == "k1_reward" and cfg.algo.kl_coef > 0:
        lp_BT = scored["old"] if scored["old"] is not None else batch.old_logprobs_BT
        kl_BT = kl_penalty(lp_BT, scored["ref"], "k1", batch.loss_mask_BT)
        rewards_BT = apply_kl_to_rewards(rewards_BT, kl_BT, batch.loss_mask_BT, cfg.algo.kl_coef)
        metrics["kl_reward"] = float(
            (kl_BT * batch.loss_mask_BT).sum() / batch.loss_mask_BT.sum().clamp(min=1)
        )
    acfg = AdvantageConfig(
        estimator=cfg.algo.estimator,
        gamma=cfg.algo.gamma,
        lam=cfg.algo.lam,
        norm_by_std=cfg.algo.norm_by_std,
    )
    out = compute_advantages(
        AdvantageInputs(rewards_BT, adv_mask_BT, batch.group_index_B, scored["values"]), acfg
    )
    if scored["values"] is not None:
        # the critic's values at rollout time against the returns it is trained toward
        ev = explained_variance(scored["values"], out.returns_BT, adv_mask_BT)
        if ev is not None:
            metrics["value_explained_var"] = ev
    return out.advantages_BT, out.returns_BT, metrics


def rollout_metrics(
    groups: list[Any], stats: RolloutStats, metric_names: Sequence[str]
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
    }
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


def update_batch(
    s: TrainState, batch: Any, timer: Timer
) -> tuple[UpdateBatch, dict[str, Any], dict[str, float]]:
    """A collated rollout batch -> what the update takes: masks, reference / old
    log-probs and values (`score_batch`), advantages; also the scores and KL metrics."""
    cfg = s.setup.cfg
    train_mask_BT, adv_mask_BT = _masks(batch, cfg)
    scored = score_batch(s, batch, train_mask_BT, timer)
    with timer("advantage"):
        adv_BT, ret_BT, kl_metrics = compute_step_advantages(cfg, batch, scored, adv_mask_BT)
    ub = UpdateBatch(
        input_ids_BT=batch.input_ids_BT,
        attention_mask_BT=batch.attention_mask_BT,
        loss_mask_BT=train_mask_BT,
        advantages_BT=adv_BT * train_mask_BT,
        old_logprobs_BT=scored["old"],
        ref_logprobs_BT=scored["ref"],
        returns_BT=ret_BT if s.critic is not None else None,
        old_values_BT=scored["values"],
    )
    return ub, scored, kl_metrics


def rl_step(s: TrainState, run: RunDir) -> dict[str, float]:
    """One RL step; returns its metrics."""
    cfg = s.setup.cfg
    timer = Timer()
    t0 = time.perf_counter()
    groups, stats = sample_rollouts(s, timer)
    batch = collate_groups(groups, s.setup.pad_id).to(s.setup.policy.device)
    ub, scored, kl_metrics = update_batch(s, batch, timer)
    train_policy = s.step >= cfg.algo.critic_warmup_steps or s.critic is None
    with timer("update"):
        upd = rl_update(
            s.setup.policy,
            s.optimizer,
            s.scheduler,
            ub,
            cfg.algo,
            cfg.optim,
            temperature=cfg.rollout.temperature,
            generator=s.update_rng,
            critic=s.critic,
            critic_optimizer=s.critic_optimizer,
            train_policy=train_policy,
            autocast=lambda: train_autocast(cfg, s.setup.policy),
        )
    with timer("sync_sampler"):
        s.setup.sync_sampler()
    names = s.setup.task.metric_names
    metrics = {"step": float(s.step), **rollout_metrics(groups, stats, names), **kl_metrics, **upd}
    if scored["old"] is not None:
        # Token in, token out: the trainer's log-probs should match the sampler's.
        diff = (scored["old"] - batch.old_logprobs_BT).abs() * batch.loss_mask_BT
        metrics["logprob_mismatch"] = float(diff.sum() / batch.loss_mask_BT.sum().clamp(min=1))
    metrics.update(timer.times)
    metrics["time/step"] = time.perf_counter() - t0
    if cfg.train.log_rollouts:
        # Mean advantage over each episode's trained tokens: the direction it pushed.
        adv_B = ub.advantages_BT.sum(1) / ub.loss_mask_BT.sum(1).clamp(min=1)
        run.log_rollouts(s.step, groups, adv_B.tolist(), names)
    if cfg.train.log_trajectories:
        run.log_trajectories(
            s.step,
            [g.trajectories[0] for g in groups[: cfg.train.log_trajectories]],
            s.setup.chat.decode,
        )
    return metrics


# ---------------------------------------------------------------------------- setup
def make_state(setup: Setup) -> TrainState:
    cfg = setup.cfg
    policy = setup.policy
    opt = torch.optim.AdamW(
        lora.trainable_parameters(policy),
        lr=cfg.optim.lr,
        weight_decay=cfg.optim.weight_decay,
        betas=(0.9, 0.99),
    )
    total, warm = max(1, cfg.train.steps), cfg.optim.warmup_steps

    def lr_at(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        if cfg.optim.schedule == "cosine":
            import math

            return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warm) / max(1, total - warm))))
        return 1.0

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    critic = critic_opt = None
    if cfg.algo.estimator == "gae":
        critic = ValueModel.from_policy(policy)
        critic_opt = torch.optim.AdamW(critic.parameters(), lr=cfg.algo.critic_lr)
    reference = None
    # With LoRA the reference is the policy's base, adapters off (`_score_batch`).
    if cfg.algo.kl_coef > 0 and not lora.lora_modules(policy):
        import copy

        reference = copy.deepcopy(policy).eval()
        for p in reference.parameters():
            p.requires_grad_(False)
    gen = torch.Generator().manual_seed(cfg.train.seed)
    return TrainState(
        setup=setup,
        optimizer=opt,
        scheduler=sched,
        sampler=TaskSampler(list(setup.task.splits["train"]), cfg.train.seed),
        update_rng=gen,
        critic=critic,
        critic_optimizer=critic_opt,
        reference=reference,
    )


def _modules(s: TrainState) -> dict[str, torch.nn.Module]:
    mods: dict[str, torch.nn.Module] = {"policy": s.setup.policy}
    if s.critic is not None:
        mods["critic"] = s.critic
    if s.reference is not None:
        mods["reference"] = s.reference
    return mods


def checkpoint(s: TrainState, run: RunDir, extra: dict[str, Any]) -> None:
    """Write a checkpoint of the whole state; one that cannot be written (a full disk) is
    logged as an error and counted in ``extra["summary"]["checkpoint_errors"]``, and the
    run goes on: the previous checkpoint is intact and a later one may succeed."""
    try:
        _write_checkpoint(s, run, extra)
    except CheckpointError as e:
        log.error("%s", e)
        summary = extra.get("summary")
        if isinstance(summary, dict):
            summary["checkpoint_errors"] = summary.get("checkpoint_errors", 0) + 1


def _write_checkpoint(s: TrainState, run: RunDir, extra: dict[str, Any]) -> None:
    states: dict[str, Any] = {
        "optimizer": s.optimizer.state_dict(),
        "scheduler": s.scheduler.state_dict(),
        "rng": rng_state(),
        "update_rng": s.update_rng.get_state(),
        "sampler": s.sampler.state(),
    }
    if s.critic_optimizer is not None:
        states["critic_optimizer"] = s.critic_optimizer.state_dict()
    save_checkpoint(run.ckpt_dir, s.step, _modules(s), states, extra)


def restore(s: TrainState, run: RunDir) -> dict[str, Any] | None:
    path = latest_checkpoint(run.ckpt_dir)
    if path is None:
        return None
    states, meta = load_checkpoint(path, _modules(s))
    s.optimizer.load_state_dict(states["optimizer"])
    s.scheduler.load_state_dict(states["scheduler"])
    if s.critic_optimizer is not None:
        s.critic_optimizer.load_state_dict(states["critic_optimizer"])
    set_rng_state(states["rng"])
    s.update_rng.set_state(states["update_rng"])
    s.sampler.load(states["sampler"])
    s.step = int(meta["step"])
    log.info("resumed from %s (step %d)", path, s.step)
    return meta


def trim_heap() -> None:
    """Return freed heap pages to the OS (glibc ``malloc_trim``; a no-op elsewhere): CPU
    tensors freed by Python stay in the process's RSS until then."""
    with suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def release_training_state(s: TrainState) -> None:
    """Free what only training needs (optimizer moments, critic, reference) once the last
    checkpoint is written, and hand the freed heap back to the OS, so the final eval's
    generation buffers fit where the training state was. A PPO run on 2 cores grew from
    16 GiB training to 21.7 GiB in its final eval and was OOM-killed before this."""
    s.optimizer.state.clear()
    s.critic = s.critic_optimizer = s.reference = None
    for p in s.setup.policy.parameters():
        p.grad = None
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    trim_heap()


# ---------------------------------------------------------------------------- the run
def warm_start(setup: Setup, run: RunDir) -> dict[str, float]:
    """SFT on the task's scripted demonstrations run through the real rollout (same masks
    as RL). Logs ``sft/demo_<metric>`` for each task metric, and the headline one per
    breakdown group (``sft/demo_em/hops=2``): how good the imitated policy is."""
    cfg = setup.cfg
    sft = cfg.sft
    rcfg = dataclasses.replace(cfg.rollout, n_samples=1, temperature=1.0)
    t0 = time.perf_counter()
    sources = setup.demo_sources(cfg.train.seed)
    demos: list[Trajectory] = []
    demo_tasks: list[Task] = []
    picks = demo_picks([tasks for tasks, _, _ in sources], sft.demos, cfg.train.seed)
    for (_, make_env, gen), picked in zip(sources, picks, strict=True):
        for g in run_rollout(picked, make_env, gen, setup.chat, rcfg):
            demos.extend(g.trajectories)
        demo_tasks.extend(picked)
    names = setup.task.metric_names
    quality = summarize(demos, {t.id: t for t in demo_tasks}, names, setup.task.breakdown)
    t1 = time.perf_counter()
    bar = run.progress(sft.steps, "SFT warm start")
    losses = sft_train(
        setup.policy,
        demos,
        sft.steps,
        sft.batch_size,
        sft.lr,
        setup.pad_id,
        cfg.train.seed,
        on_step=lambda i, loss: bar.update_with(loss=loss),
        context_weight=sft.context_loss_weight,
        autocast=lambda: train_autocast(cfg, setup.policy),
    )
    bar.close()
    # The RL reference is the adapters-off base: make it the warm start.
    lora.merge_adapters(setup.policy)
    setup.sync_sampler()
    head = setup.task.primary_metric
    info = {f"sft/demo_{m}": v for m, v in quality.by_group["all"].items() if m in names}
    for group, row in quality.by_group.items():
        if group != "all":
            info[f"sft/demo_{head}/{group}"] = row[head]
    info |= {
        "sft/demos": float(len(demos)),
        "sft/final_loss": sum(losses[-20:]) / max(1, len(losses[-20:])),
        "time/sft_demos": t1 - t0,
        "time/sft": time.perf_counter() - t1,
    }
    run.log_metrics({"phase": "sft", **info})
    return info


BEST_MARKER = "selection.json"
"""In ``best_model/``: which evaluation chose it (``{"step", "greedy_<metric>"}``, the
task's headline metric), written with the weights, so a resumed run knows what the
directory holds."""


def best_key(setup: Setup) -> str:
    """The summary key of the best model's score: ``greedy_<headline metric>``."""
    return f"greedy_{setup.task.primary_metric}"


def save_model(setup: Setup, path: Path, note: dict[str, Any] | None = None) -> None:
    """The policy as a plain HF model (adapters folded in) and its tokenizer at ``path``,
    written beside it and renamed into place: a kill mid-write leaves the old one.
    ``note`` goes in as `BEST_MARKER`, in the same rename."""
    tmp, old = path.with_name(path.name + ".tmp"), path.with_name(path.name + ".old")
    shutil.rmtree(tmp, ignore_errors=True)
    merged = lora.merged_state_dict(setup.policy) if lora.lora_modules(setup.policy) else None
    try:
        setup.policy.save_pretrained(tmp, safe_serialization=True, state_dict=merged)
        setup.tokenizer.save_pretrained(tmp)
        if note is not None:
            (tmp / BEST_MARKER).write_text(json.dumps(note) + "\n")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # no partial model left beside the old one
        raise
    shutil.rmtree(old, ignore_errors=True)
    if path.exists():
        path.rename(old)
    tmp.rename(path)
    shutil.rmtree(old, ignore_errors=True)


def keep_if_best(
    setup: Setup,
    run: RunDir,
    summary: dict[str, Any],
    res: dict[str, dict[str, EvalResult]],
    step: int,
) -> None:
    """With ``train.keep_best``: when this evaluation's greedy headline metric (mean over
    the splits) beats every earlier one, write ``best_model/`` and record it in
    ``summary``. A model that cannot be written is logged and counted
    (``best_model_errors``), not fatal; the next evaluation tries again."""
    if not setup.cfg.train.keep_best or not res["greedy"]:
        return
    key = best_key(setup)
    score = sum(r.score for r in res["greedy"].values()) / len(res["greedy"])
    best = summary.get("best_model")
    if best is not None and score <= best[key]:
        return
    choice = {"step": step, key: score}
    try:
        save_model(setup, run.dir / "best_model", note=choice)
    except (OSError, RuntimeError) as e:
        summary["best_model_errors"] = summary.get("best_model_errors", 0) + 1
        log.error(
            "best model (step %d, %s %.3f) not written: %s: %s",
            step,
            key,
            score,
            type(e).__name__,
            e,
        )
        return
    summary["best_model"] = choice
    log.info("best model so far: step %d, %s %.3f -> %s", step, key, score, run.dir / "best_model")


def adopt_best_on_disk(setup: Setup, run: RunDir, summary: dict[str, Any]) -> None:
    """On resume: a killed attempt may have written ``best_model/`` after the checkpoint
    being resumed, so the summary restored with it does not know that model. It was
    evaluated like any other, so when its score beats the summary's choice it becomes the
    choice (``"before_resume": true``); the steps run again may still beat it."""
    marker = run.dir / "best_model" / BEST_MARKER
    if not marker.exists():
        return
    key = best_key(setup)
    try:
        on_disk = json.loads(marker.read_text())
        score, step = float(on_disk[key]), int(on_disk["step"])
    except (ValueError, KeyError, TypeError) as e:
        log.warning(
            "%s: unreadable (%s); best_model/ will be rewritten by the next best", marker, e
        )
        return
    best = summary.get("best_model")
    if best is None or score > best[key]:
        summary["best_model"] = {"step": step, key: score, "before_resume": True}
        log.info("best_model/ from before the resume: step %d, %s %.3f", step, key, score)
    elif step != best["step"]:
        log.warning(
            "best_model/ holds step %d (%s %.3f), not the recorded step %d (%.3f); "
            "the next better evaluation rewrites it",
            step,
            key,
            score,
            best["step"],
            best[key],
        )


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
    # A task given in Python is not the one task.name names: config.yaml says so.
    shown = cfg
    if task is not None:
        given = dataclasses.replace(cfg.task, name=f"python:{task.name}", config={})
        shown = dataclasses.replace(cfg, task=given)
    run = RunDir(cfg.train.run_dir, shown, fresh=not resume)
    t_start = time.perf_counter()
    setup = build_setup(cfg, task)
    state = make_state(setup)
    meta = restore(state, run) if resume else None
    setup.sync_sampler()  # a restored policy (or none: a no-op for a fresh copy)
    summary: dict[str, Any] = dict(meta.get("summary", {})) if meta else {}
    summary["task"] = setup.task.name
    if meta is None:
        if cfg.sft.enabled:
            summary["sft"] = warm_start(setup, run)
        if cfg.eval.before:
            before = run_eval(setup, "before", run, 0)
            summary["eval_before"] = eval_record(before)
            run.log_metrics({"phase": "eval_before", **summary["eval_before"]})
            keep_if_best(setup, run, summary, before, 0)
        # Reference = the warm-started policy, so KL pulls toward it, not the random init.
        if state.reference is not None:
            state.reference.load_state_dict(setup.policy.state_dict())
        checkpoint(state, run, {"summary": summary})
    else:
        run.prepare_resume(state.step)
        if cfg.train.keep_best:
            adopt_best_on_disk(setup, run, summary)
    bar = run.progress(cfg.train.steps, f"RL ({cfg.algo.estimator})", initial=state.step)
    done_here = 0
    last_eval: tuple[int, dict[str, dict[str, EvalResult]]] | None = None
    while state.step < cfg.train.steps:
        if stop_after is not None and done_here >= stop_after:
            bar.close()
            return summary
        metrics = rl_step(state, run)
        state.step += 1
        done_here += 1
        run.log_metrics({"phase": "rl", **metrics})
        head = setup.task.primary_metric
        bar.update_with(reward=metrics["reward"], turns=metrics["turns"], **{head: metrics[head]})
        if cfg.train.eval_every and state.step % cfg.train.eval_every == 0:
            res = run_eval(setup, f"step {state.step}", run, state.step)
            last_eval = (state.step, res)
            run.log_metrics({"phase": "eval", "step": state.step, **eval_record(res)})
            keep_if_best(setup, run, summary, res, state.step)
        if cfg.train.checkpoint_every and state.step % cfg.train.checkpoint_every == 0:
            checkpoint(state, run, {"summary": summary})
    bar.close()
    if cfg.train.checkpoint_every == 0 or state.step % cfg.train.checkpoint_every:
        # The trained weights are on disk before the final eval (which can be killed).
        checkpoint(state, run, {"summary": summary})
    release_training_state(state)  # the eval needs only the policy and its sampler copy
    adapted = lora.unload(setup.policy) > 0  # a plain model from here on: eval, then save
    if state.step == 0 and "eval_before" in summary:  # no RL step: the same weights
        summary["eval_after"] = summary["eval_before"]
    elif last_eval is not None and last_eval[0] == state.step and not adapted:
        # The periodic evaluation of this step scored these very weights: its episodes
        # are the final evaluation's too (merging adapters changes the arithmetic, so an
        # adapted model is evaluated again).
        log_eval(setup, run, "after", last_eval[1], state.step)
        summary["eval_after"] = eval_record(last_eval[1])
    else:
        after = run_eval(setup, "after", run, state.step)
        summary["eval_after"] = eval_record(after)
        if not (cfg.train.eval_every and state.step % cfg.train.eval_every == 0):
            keep_if_best(setup, run, summary, after, state.step)  # not evaluated yet
    run.log_metrics({"phase": "eval_after", **summary["eval_after"]})
    summary["minutes"] = (time.perf_counter() - t_start) / 60
    summary["steps"] = state.step
    last = latest_checkpoint(run.ckpt_dir)
    if last is not None and last.name == f"step_{state.step:06d}":  # not an older one
        update_checkpoint_meta(last, {"summary": summary})
    try:
        save_model(setup, run.dir / "final_model")
    except (OSError, RuntimeError) as e:
        why = f"{type(e).__name__}: {e}"
        raise write_failed(run.ckpt_dir, "the final model", run.dir / "final_model", why) from e
    run.finish(summary, setup.task.primary_metric)
    return summary
