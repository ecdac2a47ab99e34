"""End to end on the embedded world with a very small config: every estimator runs,
kill-and-resume reproduces an uninterrupted run, and (slow) the demo setting learns."""

from __future__ import annotations

import gc
import json
import math
from collections import Counter
from pathlib import Path

import pytest
import torch

from agentr1.config import load_config
from agentr1.configutil import ConfigError
from agentr1.trainer.loop import train
from agentr1.trainer.run import metric_records

SMALL = [
    "task.config.world.n_train=120",
    "task.config.world.n_test=12",
    "task.config.world.n_test_ood=4",
    "model.tiny.hidden_size=32",
    "model.tiny.intermediate_size=64",
    "model.tiny.vocab_size=600",
    "sft.steps=20",
    "sft.demos=60",
    "sft.batch_size=8",
    "train.tasks_per_step=2",
    "rollout.n_samples=2",
    "rollout.max_tokens_per_turn=24",
    "rollout.max_turns=3",
    "eval.max_tasks=4",
    "train.log_trajectories=1",
]


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTR1_CACHE", str(tmp_path_factory.getbasetemp() / "agentr1-cache"))


def rl_records(run_dir: Path) -> list[dict]:
    return [
        {
            k: v
            for k, v in r.items()
            if not k.startswith(("time/", "mem/"))
            and k not in ("gen_tokens_per_s", "wall_time", "elapsed_s")
        }
        for r in metric_records(run_dir, "rl")
    ]


def check_rollouts(path: Path, estimator: str, steps: int, episodes: int) -> None:
    """Every training episode is logged once, with what moved the policy: within a group
    the better-rewarded sample gets the larger advantage; a tied group none (group
    baselines)."""
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(recs) == steps * episodes
    assert {(r["step"], r["group"], r["sample"]) for r in recs} == {
        (s, g, i) for s in range(steps) for g in range(2) for i in range(2)
    }
    for r in recs:
        assert (
            r["gold"]
            and r["question"]
            and r["reward"] == pytest.approx(r["outcome_reward"] + r["process_reward"])
        )
    if estimator not in ("grpo", "dr_grpo", "rloo"):
        return
    for s in range(steps):
        (hi, lo), tied = ([r for r in recs if (r["step"], r["group"]) == (s, g)] for g in (0, 1))
        assert (hi["reward"], lo["reward"]) == (1.0, 0.0)
        assert hi["advantage"] > 0 > lo["advantage"]
        assert tied[0]["advantage"] == tied[1]["advantage"] == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize(
    "estimator",
    ["grpo", "dr_grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "gae"],
)
def test_every_estimator_trains(
    tmp_path: Path, estimator: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentr1.trainer import evaluation, loop

    real, real_eval = loop.sample_rollouts, evaluation.evaluate_tasks
    held: list[bool] = []  # at each rollout: gradients allocated?
    frozen: list[bool] = []  # at each rollout and evaluation: the setup's objects frozen?

    def rewarded(s, timer):  # type: ignore[no-untyped-def]
        """The tiny model earns nothing yet; group 0 gets rewards 1 / 0, group 1 a tie."""
        held.append(any(p.grad is not None for p in s.setup.policy.parameters()))
        frozen.append(gc.get_freeze_count() > 0)
        groups, stats, extra = real(s, timer)
        for g, rewards in zip(groups, ([1.0, 0.0], [0.5, 0.5]), strict=True):
            for t, r in zip(g.trajectories, rewards, strict=True):
                t.outcome_reward = r
        return groups, stats, extra

    def evaluated(*args, **kwargs):  # type: ignore[no-untyped-def]
        frozen.append(gc.get_freeze_count() > 0)
        return real_eval(*args, **kwargs)

    monkeypatch.setattr(loop, "sample_rollouts", rewarded)
    monkeypatch.setattr(evaluation, "evaluate_tasks", evaluated)
    extra = ["algo.kl_coef=0.01"] if estimator == "gae" else []
    cfg = load_config(
        None,
        [
            *SMALL,
            f"algo.estimator={estimator}",
            "train.steps=2",
            f"train.run_dir={tmp_path}",
            *extra,
        ],
    )
    summary = train(cfg)
    assert summary["steps"] == 2
    assert held and not held[0]  # SFT's gradients were let go before RL
    # out of the garbage collector's walk while episodes ran (`settled_heap`), and back
    assert len(frozen) > 2 and all(frozen) and gc.get_freeze_count() == 0
    rows = rl_records(tmp_path)
    assert len(rows) == 2 and all(r["skipped_updates"] == 0 for r in rows)
    for f in (
        "config.yaml",
        "report.md",
        "summary.json",
        "trajectories.jsonl",
        "rollouts.jsonl",
        "plots/training.png",
    ):
        assert (tmp_path / f).exists(), f
    check_rollouts(tmp_path / "rollouts.jsonl", estimator, steps=2, episodes=4)
    raw = metric_records(tmp_path, "rl")  # the process's memory, a CPU run: no GPU figures
    assert all(r["mem/peak_rss_gib"] > 0.05 for r in raw) and "mem/gpu_peak_gib" not in raw[0]
    if estimator == "gae":
        assert "value_loss" in rows[0] and "kl" in rows[0]
        # rewards 1 and 0 in a group: the returns vary, so the critic's fit is logged
        assert all(math.isfinite(r["value_explained_var"]) for r in rows)
        assert all(r["value_explained_var"] <= 1.0 for r in rows)
    else:
        assert "value_explained_var" not in rows[0]


def test_kill_and_resume_matches_uninterrupted_run(tmp_path: Path) -> None:
    common = [
        *SMALL,
        "train.steps=4",
        "train.checkpoint_every=2",
        "sft.steps=5",
        "optim.ppo_epochs=2",
        "optim.minibatches=2",
        "algo.kl_coef=0.05",
    ]
    full = load_config(None, [*common, f"train.run_dir={tmp_path / 'full'}"])
    train(full)
    part = load_config(None, [*common, f"train.run_dir={tmp_path / 'part'}"])
    train(part, stop_after=3)  # "killed" after step 3; the last checkpoint is at step 2
    train(part, resume=True)
    a, b = rl_records(tmp_path / "full"), rl_records(tmp_path / "part")
    # the killed run logged steps 0,1,2 then resumed from step 2: the checkpoint recorded
    # the logs' sizes, so the orphaned step-2 row was cut, not kept beside the new one
    logged = (tmp_path / "part" / "metrics.jsonl").read_text().count('"phase": "rl"')
    assert logged == 4 and [r["step"] for r in b] == [0.0, 1.0, 2.0, 3.0]
    assert a == b
    # rollouts.jsonl: the killed attempt's step-2 lines were dropped on resume, not doubled
    ra = (tmp_path / "full" / "rollouts.jsonl").read_text().splitlines()
    rb = (tmp_path / "part" / "rollouts.jsonl").read_text().splitlines()
    assert len(ra) == 4 * 2 * 2 and ra == rb  # steps x tasks x samples, identical
    ta = (tmp_path / "full" / "trajectories.jsonl").read_text().splitlines()
    tb = (tmp_path / "part" / "trajectories.jsonl").read_text().splitlines()
    # the first task's group a step (log_trajectories=1, 2 samples), and 4 greedy
    # episodes of each split (eval.max_tasks=4) before and after RL, none doubled
    labels = Counter(json.loads(x)["label"] for x in ta)
    assert labels == {"rl": 4 * 2, "before": 2 * 4, "after": 2 * 4} and ta == tb
    s_full = json.loads((tmp_path / "full" / "summary.json").read_text())
    s_part = json.loads((tmp_path / "part" / "summary.json").read_text())
    assert s_full["eval_after"] == s_part["eval_after"]


def test_a_checkpoint_that_fails_mid_run_does_not_end_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The step-2 checkpoint fails (as a full disk would): logged, counted in the summary,
    and training goes on to its final checkpoint and model."""
    from agentr1.trainer import state
    from agentr1.trainer.checkpoint import CheckpointError, latest_checkpoint

    real = state.save_checkpoint

    def flaky(root, step, *args, **kwargs):  # type: ignore[no-untyped-def]
        if step == 2:
            raise CheckpointError(f"checkpoint step {step} could not be written: disk full")
        return real(root, step, *args, **kwargs)

    monkeypatch.setattr(state, "save_checkpoint", flaky)
    cfg = load_config(
        None,
        [
            *SMALL,
            "train.steps=3",
            "train.checkpoint_every=1",
            "sft.steps=3",
            f"train.run_dir={tmp_path}",
        ],
    )
    summary = train(cfg)
    assert summary["checkpoint_errors"] == 1 and summary["steps"] == 3
    assert "checkpoint step 2 could not be written" in caplog.text
    assert latest_checkpoint(tmp_path / "checkpoints").name == "step_000003"
    assert (tmp_path / "final_model" / "config.json").exists()


def test_checkpoints_kept_their_size_and_every_row_stamped(tmp_path: Path) -> None:
    """``train.keep_checkpoints`` bounds the disk a run takes; the summary says what the
    last checkpoint took; every metrics row carries its wall-clock time."""
    from agentr1.trainer.checkpoint import latest_checkpoint

    cfg = load_config(
        None,
        [
            *SMALL,
            "train.steps=3",
            "train.checkpoint_every=1",
            "train.keep_checkpoints=1",
            f"train.run_dir={tmp_path}",
        ],
    )
    summary = train(cfg)
    kept = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    # the warm-started KL reference is written once beside them, not into each
    assert kept == ["reference.safetensors", "step_000003"]
    assert not (tmp_path / "checkpoints" / "step_000003" / "reference.safetensors").exists()
    last = latest_checkpoint(tmp_path / "checkpoints")
    assert last is not None
    size = sum(f.stat().st_size for f in last.iterdir())
    tensors = sum(f.stat().st_size for f in last.iterdir() if f.name != "meta.json")
    # as written; meta.json gains the final summary afterwards
    assert tensors < summary["checkpoint_bytes"] <= size
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").open()]
    stamps = [r["wall_time"] for r in rows]
    assert len(rows) >= 5 and stamps == sorted(stamps) and stamps[0] > 1.7e9
    elapsed = [r["elapsed_s"] for r in rows]
    assert (
        elapsed == sorted(elapsed) and 0 <= elapsed[0] <= elapsed[-1] <= summary["minutes"] * 60 + 1
    )
    with pytest.raises(ConfigError, match=r"train\.keep_checkpoints=0"):
        load_config(None, ["train.keep_checkpoints=0"])


def test_a_final_model_that_cannot_be_written_names_the_checkpoint_to_resume_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import PreTrainedModel

    from agentr1.trainer.checkpoint import CheckpointError

    real = PreTrainedModel.save_pretrained

    def full_disk(self, path, *args, **kwargs):  # type: ignore[no-untyped-def]
        if Path(path).name.startswith("final_model"):  # the tiny model's cache still saves
            raise OSError(28, "No space left on device")
        return real(self, path, *args, **kwargs)

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", full_disk)
    cfg = load_config(None, [*SMALL, "train.steps=1", "sft.steps=2", f"train.run_dir={tmp_path}"])
    with pytest.raises(CheckpointError) as e:
        train(cfg)
    msg = str(e.value)
    assert "final model could not be written" in msg and "No space left" in msg
    assert "step_000001" in msg and "resume" in msg
    assert not list(tmp_path.glob("final_model*"))  # nothing partial left behind


def test_eval_episodes_checkpoint_and_extending_a_finished_run(tmp_path: Path) -> None:
    """Every eval episode is on disk for paired tests; the final checkpoint keeps the
    optimizer state (released only after it was written) and the eval summary, so a
    finished run can be extended with more steps."""
    from agentr1.trainer.checkpoint import latest_checkpoint, load_checkpoint
    from agentr1.trainer.setup import build_setup

    common = [*SMALL, "sft.steps=5", "eval.sampled_n=1", f"train.run_dir={tmp_path}"]
    summary = train(load_config(None, [*common, "train.steps=2"]))
    rows = [json.loads(x) for x in (tmp_path / "eval_episodes.jsonl").read_text().splitlines()]
    splits = ("test", "test_ood")
    for label in ("before", "after"):
        for split in splits:
            for mode in ("greedy", "sampled"):
                got = [
                    r for r in rows if (r["label"], r["split"], r["mode"]) == (label, split, mode)
                ]
                n = int(summary[f"eval_{label}"][mode][split]["all"]["n"])
                assert len(got) == n and n > 0
                em = sum(r["em"] for r in got) / n
                assert em == pytest.approx(summary[f"eval_{label}"][mode][split]["all"]["em"])
                assert {"question", "gold", "answer", "f1", "stop_reason"} <= set(got[0])

    path = latest_checkpoint(tmp_path / "checkpoints")
    assert path is not None and path.name == "step_000002"
    cfg = load_config(None, [*common, "train.steps=3"])
    states, meta = load_checkpoint(path, {"policy": build_setup(cfg).policy})
    assert states["optimizer"]["state"], "the final checkpoint lost the AdamW moments"
    assert meta["summary"]["eval_after"] == summary["eval_after"] and meta["step"] == 2

    longer = train(cfg, resume=True)
    assert longer["steps"] == 3 and [r["step"] for r in rl_records(tmp_path)] == [0.0, 1.0, 2.0]
    labels = [json.loads(x)["label"] for x in (tmp_path / "eval_episodes.jsonl").open()]
    n_after = len([r for r in rows if r["label"] == "after"])
    # the first "after" evaluated step 2's weights and is kept under that name
    assert labels.count("after") == labels.count("after (step 2)") == n_after


def test_release_training_state_frees_what_only_training_needs() -> None:
    from agentr1.trainer.setup import build_setup
    from agentr1.trainer.state import make_state, release_training_state

    cfg = load_config(None, [*SMALL, "algo.estimator=gae", "algo.kl_coef=0.01"])
    s = make_state(build_setup(cfg))
    loss = sum(p.sum() for p in s.setup.policy.parameters())
    loss.backward()
    s.optimizer.step()
    assert s.optimizer.state and s.critic is not None and s.reference is not None
    release_training_state(s)
    assert not s.optimizer.state and s.critic is None and s.critic_optimizer is None
    assert s.reference is None and all(p.grad is None for p in s.setup.policy.parameters())


def test_mask_ablations_train_tool_tokens(tmp_path: Path) -> None:
    """With the loss mask off, tool-response tokens get advantages and are trained."""
    from agentr1.rollout.collate import collate
    from agentr1.trainer.scoring import masks
    from agentr1.types import Trajectory

    t = Trajectory(task_id="x")
    t.append_prompt([1, 2])
    t.append_sampled([3, 4], [0.0, 0.0], "")
    t.append_inserted([5, 6])
    t.append_sampled([7], [0.0], "")
    b = collate([t], [0], pad_id=0)
    on = load_config(None, [])
    train_m, adv_m = masks(b, on)
    assert train_m.tolist() == adv_m.tolist() == [[0, 0, 1, 1, 0, 0, 1]]
    off = load_config(None, ["algo.loss_mask=false"])
    train_m, adv_m = masks(b, off)
    assert train_m.tolist() == adv_m.tolist() == [[0, 1, 1, 1, 1, 1, 1]]
    adv_only = load_config(None, ["algo.advantage_mask=false"])
    train_m, adv_m = masks(b, adv_only)
    assert train_m.tolist() == [[0, 0, 1, 1, 0, 0, 1]] and adv_m.tolist() == [[0, 1, 1, 1, 1, 1, 1]]


def test_keep_best_writes_the_weights_of_the_best_evaluation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tiny model's EM barely moves in 3 steps, so each evaluation's greedy EM is set
    by hand (step 1 best, step 3 ties it) and the weights evaluated are kept to compare."""
    from safetensors.torch import load_file

    from agentr1.trainer import loop

    schedule = {"before": 0.1, "step 1": 0.5, "step 2": 0.2, "step 3": 0.5, "after": 0.5}
    seen: dict[str, dict[str, torch.Tensor]] = {}
    real = loop.run_eval

    def scripted(setup, label, run=None, step=None):  # type: ignore[no-untyped-def]
        res = real(setup, label, run, step)
        for r in res["greedy"].values():
            r.by_group["all"]["em"] = schedule[label]
        seen[label] = {k: v.detach().clone() for k, v in setup.policy.state_dict().items()}
        return res

    monkeypatch.setattr(loop, "run_eval", scripted)

    cfg = load_config(
        None,
        [
            *SMALL,
            "train.steps=3",
            "train.eval_every=1",
            "train.keep_best=true",
            "eval.sampled_n=0",
            "algo.entropy_coef=0.1",  # a gradient even when every reward is 0
            f"train.run_dir={tmp_path}",
        ],
    )
    summary = train(cfg)
    # The last step's periodic evaluation is the final one: scored once, logged as both.
    assert sorted(seen) == ["before", "step 1", "step 2", "step 3"]
    recs = [json.loads(x) for x in (tmp_path / "eval_episodes.jsonl").open()]
    final = [{**r, "label": "-"} for r in recs if r["label"] == "after"]
    assert final and final == [{**r, "label": "-"} for r in recs if r["label"] == "step 3"]
    assert {g["all"]["em"] for g in summary["eval_after"]["greedy"].values()} == {0.5}
    assert summary["best_model"] == {"step": 1, "greedy_em": 0.5}
    best = load_file(str(tmp_path / "best_model" / "model.safetensors"))
    at_1, at_3 = seen["step 1"], seen["step 3"]
    assert all(torch.equal(best[k], at_1[k]) for k in best)
    assert any(not torch.equal(at_1[k], at_3[k]) for k in best)  # the steps did change it
    assert not list(tmp_path.glob("best_model.*"))  # no .tmp / .old left behind


def test_keep_best_picks_strictly_better_and_survives_a_failed_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from types import SimpleNamespace

    from agentr1.trainer import best

    written: list[int] = []
    fail = {"now": False}

    def fake_save(setup: object, path: Path, note: object = None) -> None:
        if fail["now"]:
            raise OSError("disk full")
        written.append(step)

    monkeypatch.setattr(best, "save_model", fake_save)
    head = SimpleNamespace(primary_metric="em")
    setup = SimpleNamespace(
        cfg=load_config(None, ["train.eval_every=1", "train.keep_best=true"]), task=head
    )
    run = SimpleNamespace(dir=tmp_path)
    summary: dict = {}

    def res(*ems: float) -> dict:
        return {"greedy": {f"s{i}": SimpleNamespace(score=e) for i, e in enumerate(ems)}}

    for step, ems, broken in [
        (0, (0.2, 0.4), False),  # mean 0.3: the first is the best
        (1, (0.4, 0.2), False),  # a tie keeps the earlier
        (2, (0.5, 0.3), True),  # better, but the write fails: not recorded
        (3, (0.5, 0.2), False),  # better than 0.3 (the failed one does not count)
        (4, (0.1, 0.1), False),
    ]:
        fail["now"] = broken
        best.keep_if_best(setup, run, summary, res(*ems), step)  # type: ignore[arg-type]
    assert written == [0, 3]
    assert summary["best_model"] == {"step": 3, "greedy_em": pytest.approx(0.35)}
    assert summary["best_model_errors"] == 1
    off = SimpleNamespace(cfg=load_config(None, []), task=head)
    best.keep_if_best(off, run, summary, res(0.9), 5)  # type: ignore[arg-type]
    assert written == [0, 3]


def test_keep_best_needs_eval_every() -> None:
    with pytest.raises(ValueError, match=r"train\.keep_best needs train\.eval_every >= 1"):
        load_config(None, ["train.keep_best=true"])


def test_keep_best_after_a_resume_knows_the_model_a_killed_attempt_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed after step 3 (checkpoint at step 2) with step 3 the best and written; the
    resumed run re-evaluates step 3 lower (as nondeterministic hardware could), so the
    summary must name the step-3 model on disk, not the step-2 choice in the checkpoint."""
    from agentr1.trainer import best, loop

    ems = {"before": [0.1], "step 1": [0.2], "step 2": [0.3], "step 3": [0.6, 0.4], "step 4": [0.5]}
    real = loop.run_eval

    def scripted(setup, label, run=None, step=None):  # type: ignore[no-untyped-def]
        res = real(setup, label, run, step)
        em = ems[label].pop(0)
        for r in res["greedy"].values():
            r.by_group["all"]["em"] = em
        return res

    monkeypatch.setattr(loop, "run_eval", scripted)
    cfg = load_config(
        None,
        [
            *SMALL,
            "sft.steps=5",
            "train.steps=4",
            "train.eval_every=1",
            "train.checkpoint_every=2",
            "train.keep_best=true",
            "eval.sampled_n=0",
            f"train.run_dir={tmp_path}",
        ],
    )
    train(cfg, stop_after=3)
    marker = json.loads((tmp_path / "best_model" / best.BEST_MARKER).read_text())
    assert marker == {"step": 3, "greedy_em": 0.6}
    summary = train(cfg, resume=True)
    assert summary["best_model"] == {"step": 3, "greedy_em": 0.6, "before_resume": True}
    assert ems == {k: [] for k in ems}  # every scripted evaluation ran
    # the killed attempt's step-3 evaluation was dropped: one record per question and label
    recs = [json.loads(x) for x in (tmp_path / "eval_episodes.jsonl").open()]
    per_label = Counter(r["label"] for r in recs)
    assert set(per_label) == {"before", "step 1", "step 2", "step 3", "step 4", "after"}
    assert len(set(per_label.values())) == 1
    for r in recs:  # the RL step of the weights each evaluation saw
        want = {"before": 0, "after": 4}.get(r["label"])
        assert r["step"] == (int(r["label"].removeprefix("step ")) if want is None else want)
    # a fresh run in the same directory starts over: the old best_model/ is removed first
    ems.update({"before": [0.0], "step 1": [0.0], "step 2": [0.0], "step 3": [0.0]})
    ems.update({"step 4": [0.0]})
    fresh = train(cfg)
    assert fresh["best_model"] == {"step": 0, "greedy_em": 0.0}


def test_an_engine_of_its_own_gets_the_policys_weights_after_each_change(tmp_path: Path) -> None:
    """A generator that is not the hf one (the vllm engine) is synced through its
    ``load_weights`` with the policy's merged state dict (HF names)."""
    from agentr1.trainer.setup import build_setup

    setup = build_setup(load_config(None, [*SMALL, f"train.run_dir={tmp_path}"]))

    class Engine:
        def __init__(self) -> None:
            self.loaded: list[dict[str, torch.Tensor]] = []

        def generate(self, prompts, params):  # type: ignore[no-untyped-def]
            raise AssertionError("not sampled here")

        def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
            self.loaded.append(state_dict)

    engine = Engine()
    setup.generator = engine  # type: ignore[assignment]
    assert not setup.sampler_is_policy
    setup.sync_sampler()
    (weights,) = engine.loaded
    assert weights.keys() == setup.policy.state_dict().keys()
    assert all(torch.equal(weights[k], v) for k, v in setup.policy.state_dict().items())
