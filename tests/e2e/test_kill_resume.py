"""A real ``kill -9`` (issue 29): a training process killed while it writes a checkpoint,
and once during the SFT warm start, resumes to the same weights, logs and evaluations as
an uninterrupted run, logging each step, SFT and evaluation once and leaving no partial
files behind. Also: ``train.checkpoint_every: 0`` writes one checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from safetensors.torch import load_file

from agentr1.config import load_config
from agentr1.trainer.loop import train
from tests.e2e.test_train_loop import SMALL, rl_records

COMMON = [
    *SMALL,
    "train.steps=3",
    "train.checkpoint_every=1",
    "sft.steps=20",
    "sft.checkpoint_every=5",
    "algo.kl_coef=0.05",
]

CHILD = textwrap.dedent(
    """
    import json, os, signal, sys

    from agentr1.config import load_config
    from agentr1.trainer.loop import train

    mode, overrides, resume = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3] == "1"
    if mode == "checkpoint":  # die inside the step-2 checkpoint, after its first file
        import agentr1.trainer.checkpoint as ck

        real = ck.save_file

        def save_file(tensors, path, *args, **kwargs):
            real(tensors, path, *args, **kwargs)
            if "/.tmp_step_000002_" in str(path):
                os.kill(os.getpid(), signal.SIGKILL)

        ck.save_file = save_file
    elif mode == "sft":  # die at SFT step 13: its newest checkpoint is step 10's
        import agentr1.trainer.sft as sft

        real, calls = sft._backward, [0]

        def backward(*args, **kwargs):
            calls[0] += 1
            if calls[0] == 13:
                os.kill(os.getpid(), signal.SIGKILL)
            return real(*args, **kwargs)

        sft._backward = backward
    train(load_config(None, overrides), resume=resume)
    """
)


def run_child(mode: str, run_dir: Path, resume: bool, env: dict[str, str]) -> int:
    overrides = [*COMMON, f"train.run_dir={run_dir}"]
    cmd = [sys.executable, "-c", CHILD, mode, json.dumps(overrides), "1" if resume else "0"]
    return subprocess.run(cmd, env=env, capture_output=True, timeout=600).returncode


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("kill")
    env = {**os.environ, "AGENTR1_CACHE": str(tmp_path_factory.getbasetemp() / "agentr1-cache")}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parents[2]), env.get("PYTHONPATH", "")])
    out = {"full": root / "full", "checkpoint": root / "checkpoint", "sft": root / "sft"}
    assert run_child("none", out["full"], False, env) == 0
    for mode in ("checkpoint", "sft"):
        assert run_child(mode, out[mode], False, env) == -9  # SIGKILL
        out[f"{mode}_left"] = out[mode] / "left.json"
        left = sorted(str(p.relative_to(out[mode])) for p in out[mode].rglob("*step_*"))
        out[f"{mode}_left"].write_text(json.dumps(left))
        assert run_child("none", out[mode], True, env) == 0
    return out


def _weights(run_dir: Path) -> dict[str, list[float]]:
    w = load_file(str(run_dir / "final_model" / "model.safetensors"))
    return {k: v.flatten().tolist() for k, v in w.items()}


@pytest.mark.parametrize("mode", ["checkpoint", "sft"])
def test_a_killed_run_resumes_to_the_uninterrupted_one(runs: dict[str, Path], mode: str) -> None:
    full, part = runs["full"], runs[mode]
    left = json.loads(runs[f"{mode}_left"].read_text())
    if mode == "checkpoint":  # killed mid-write: the half-written step-2 folder was there
        assert any(".tmp_step_000002_" in p for p in left) and "checkpoints/step_000001" in left
    else:  # killed in SFT: only its own checkpoint, at step 10
        assert left == ["checkpoints/sft/step_000010"]
    assert _weights(full) == _weights(part)
    assert rl_records(full) == rl_records(part)
    for log in ("rollouts.jsonl", "trajectories.jsonl", "eval_episodes.jsonl"):
        assert (full / log).read_text() == (part / log).read_text(), log
    phases = [json.loads(x)["phase"] for x in (part / "metrics.jsonl").open()]
    assert phases.count("sft") == phases.count("eval_before") == phases.count("eval_after") == 1
    assert phases.count("rl") == 3
    s_full, s_part = (json.loads((d / "summary.json").read_text()) for d in (full, part))
    assert s_full["eval_before"] == s_part["eval_before"]
    assert s_full["eval_after"] == s_part["eval_after"]
    assert s_full["sft"]["sft/final_loss"] == s_part["sft"]["sft/final_loss"]
    partial = [p for p in part.rglob("*") if p.name.startswith(".") and "tmp" in p.name]
    assert partial == []
    assert not (part / "checkpoints" / "sft").exists()  # dropped once RL had a checkpoint


def test_checkpoint_every_zero_writes_one_checkpoint_and_resumes_from_it(tmp_path: Path) -> None:
    """A 3-step run with ``checkpoint_every: 0`` writes one checkpoint, at the end, whose
    size is in the summary; continuing it to 5 steps equals a 5-step run."""
    common = [*COMMON, "train.checkpoint_every=0", "sft.steps=6"]
    summary = train(load_config(None, [*common, f"train.run_dir={tmp_path / 'a'}"]))
    ckpts = tmp_path / "a" / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["reference.safetensors", "step_000003"]
    size = sum(f.stat().st_size for f in (ckpts / "step_000003").iterdir())
    assert 0 < summary["checkpoint_bytes"] <= size
    longer = [*common, "train.steps=5"]
    train(load_config(None, [*longer, f"train.run_dir={tmp_path / 'a'}"]), resume=True)
    train(load_config(None, [*longer, f"train.run_dir={tmp_path / 'b'}"]))
    assert rl_records(tmp_path / "a") == rl_records(tmp_path / "b")
    # elapsed_s goes on from the checkpoint's figure: the resumed attempt adds to it
    elapsed = [json.loads(x)["elapsed_s"] for x in (tmp_path / "a" / "metrics.jsonl").open()]
    assert elapsed == sorted(elapsed)
    assert _weights(tmp_path / "a") == _weights(tmp_path / "b")


def test_a_run_killed_before_any_checkpoint_starts_afresh_without_doubled_rows(
    tmp_path: Path,
) -> None:
    """No checkpoint at all (killed during the first SFT steps): resume starts afresh,
    and the killed attempt's rows are gone, not doubled."""
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text('{"phase": "sft", "torn": tr')  # a killed attempt
    cfg = load_config(None, [*COMMON, "sft.steps=4", "train.steps=1", f"train.run_dir={run_dir}"])
    train(cfg, resume=True)
    phases = [json.loads(x)["phase"] for x in (run_dir / "metrics.jsonl").open()]
    assert phases.count("sft") == 1 and phases.count("rl") == 1


def test_no_step_zero_checkpoint_when_nothing_ran_before_rl(tmp_path: Path) -> None:
    """Without SFT or an evaluation before RL the step-0 checkpoint would hold only what
    the config rebuilds (for a 3B model, ~37 GB): it is not written; with an evaluation
    it is (the evaluation is not repeated on resume)."""
    common = [*SMALL, "sft.enabled=false", "train.steps=2", "train.checkpoint_every=2"]
    for before, want in ((False, ["step_000002"]), (True, ["step_000000", "step_000002"])):
        run = tmp_path / str(before)
        train(
            load_config(
                None, [*common, f"eval.before={str(before).lower()}", f"train.run_dir={run}"]
            )
        )
        got = sorted(p.name for p in (run / "checkpoints").glob("step_*"))
        assert got == want, before
