"""bf16 autocast for the training passes and a bf16 sampler copy of an fp32 policy: the
copy follows every weight update, training still improves nothing silently (finite
losses, no skipped update), and evaluation switches (``eval.before``, ``sampled_n=0``,
no-RL runs) behave as documented."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agentr1.config import load_config
from agentr1.trainer.loop import train
from agentr1.trainer.setup import build_setup, train_autocast
from tests.test_train_loop import SMALL, rl_records

BF16 = ["model.compute_dtype=bfloat16", "model.sampler_dtype=bfloat16"]


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTR1_CACHE", str(tmp_path_factory.getbasetemp() / "agentr1-cache"))


def test_sampler_copy_is_bf16_and_follows_the_policy(tmp_path: Path) -> None:
    setup = build_setup(load_config(None, [*SMALL, *BF16, f"train.run_dir={tmp_path}"]))
    sampler = setup.generator.model
    assert not setup.sampler_is_policy
    assert next(sampler.parameters()).dtype == torch.bfloat16
    assert next(setup.policy.parameters()).dtype == torch.float32
    with torch.no_grad():
        for p in setup.policy.parameters():
            p.add_(0.5)
    setup.sync_sampler()
    for (name, p), q in zip(setup.policy.named_parameters(), sampler.parameters(), strict=True):
        assert torch.equal(p.to(torch.bfloat16), q), name


def test_default_sampler_shares_the_policy(tmp_path: Path) -> None:
    setup = build_setup(load_config(None, [*SMALL, f"train.run_dir={tmp_path}"]))
    assert setup.sampler_is_policy
    setup.sync_sampler()  # a no-op, not an error


def test_train_autocast_runs_matmuls_in_bf16_only_when_asked() -> None:
    model = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4)
    on = load_config(None, ["model.compute_dtype=bfloat16"])
    off = load_config(None, [])
    with train_autocast(on, model):
        assert model(x).dtype == torch.bfloat16
    with train_autocast(off, model):
        assert model(x).dtype == torch.float32
    bf16_weights = load_config(None, ["model.compute_dtype=bfloat16", "model.dtype=bfloat16"])
    with train_autocast(bf16_weights, model):  # nothing to autocast: weights are bf16
        assert model(x).dtype == torch.float32


@pytest.mark.parametrize("estimator", ["grpo", "gae"])
def test_bf16_training_steps_update_policy_and_sampler(tmp_path: Path, estimator: str) -> None:
    extra = ["algo.kl_coef=0.01"] if estimator == "gae" else []
    cfg = load_config(
        None,
        [
            *SMALL,
            *BF16,
            *extra,
            f"algo.estimator={estimator}",
            "train.steps=2",
            "eval.sampled_n=0",
            f"train.run_dir={tmp_path}",
        ],
    )
    summary = train(cfg)
    rows = rl_records(tmp_path)
    assert len(rows) == 2 and all(r["skipped_updates"] == 0 for r in rows)
    assert all(torch.isfinite(torch.tensor(r["policy_loss"])) for r in rows)
    assert summary["eval_after"]["sampled"] == {}  # sampled_n = 0: greedy only
    assert summary["eval_after"]["greedy"]


def test_eval_switches(tmp_path: Path) -> None:
    common = [*SMALL, "sft.steps=2", "eval.sampled_n=0"]
    no_rl = train(load_config(None, [*common, "train.steps=0", f"train.run_dir={tmp_path / 'a'}"]))
    assert no_rl["eval_after"] == no_rl["eval_before"]  # no RL step: evaluated once
    phases = [
        r.split('"phase": "')[1].split('"')[0]
        for r in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()
    ]
    assert phases.count("eval_before") == 1 and "rl" not in phases
    skip = train(
        load_config(
            None, [*common, "train.steps=1", "eval.before=false", f"train.run_dir={tmp_path / 'b'}"]
        )
    )
    assert "eval_before" not in skip and skip["eval_after"]["greedy"]
