"""The CUDA path (marked gpu: skipped where there is no CUDA device; `benchmarks/gpu_check.sh`
runs them on a lent GPU): the trainer's log-probs and gradients, the sampler's semantics,
a training run with its critic, bf16 autocast, and a checkpoint written on the GPU that a
CPU resumes.

``AGENTR1_GPU_TEST_DEVICE=cpu`` runs the same tests on the CPU (their comparisons are then
of the CPU with itself): a check of the tests' own code on a machine without a GPU."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch

from agentr1.backends.base import SamplingParams
from agentr1.backends.hf import HFGenerator
from agentr1.config import load_config
from agentr1.trainer.logprobs import token_logprobs
from agentr1.trainer.loop import train
from agentr1.trainer.run import metric_records
from tests.e2e.test_train_loop import SMALL, rl_records
from tests.integration.test_hf_backend import (
    test_row_caps_apply_inside_one_batched_call as check_row_caps,  # not collected here
)
from tests.tiny_models import tiny_llama

DEVICE = os.environ.get("AGENTR1_GPU_TEST_DEVICE", "cuda")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        DEVICE.startswith("cuda") and not torch.cuda.is_available(), reason="needs a CUDA device"
    ),
]

PROMPTS = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14], [20, 21, 22, 23, 24, 25, 26]]


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTR1_CACHE", str(tmp_path_factory.getbasetemp() / "agentr1-cache"))


def test_trainer_logprobs_and_gradients_match_the_cpu() -> None:
    """`token_logprobs` on right-padded rows (the shared-prefix path included) and the
    gradient of their sum: the device's float32 agrees with the CPU's."""
    cpu = tiny_llama(vocab_size=64, kv_heads=2)
    dev = tiny_llama(vocab_size=64, kv_heads=2).to(DEVICE)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 64, (4, 24), generator=g)
    ids[:, :10] = ids[0, :10]  # a common prefix: hidden_states runs it once
    mask = torch.ones_like(ids)
    mask[1, 18:] = 0
    mask[3, 12:] = 0
    sel = torch.zeros_like(ids)
    sel[:, 10:] = 1
    sel = sel * mask
    out = {}
    for name, model in (("cpu", cpu), ("dev", dev)):
        model.train()
        d = next(model.parameters()).device
        lp, ent = token_logprobs(model, ids.to(d), mask.to(d), sel.to(d), 0.7, with_entropy=True)
        lp.sum().backward()
        grads = {n: p.grad.detach().cpu() for n, p in model.named_parameters()}
        out[name] = (lp.detach().cpu(), ent.detach().cpu(), grads)
    torch.testing.assert_close(out["dev"][0], out["cpu"][0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(out["dev"][1], out["cpu"][1], atol=1e-4, rtol=1e-4)
    assert (out["cpu"][0][sel == 0] == 0).all() and (out["dev"][0][sel == 0] == 0).all()
    for n, grad in out["cpu"][2].items():
        scale = grad.abs().max().item()
        torch.testing.assert_close(out["dev"][2][n], grad, atol=1e-4 * max(scale, 1.0), rtol=1e-3)


def test_sampling_on_the_device_keeps_its_semantics() -> None:
    """On the device as on the CPU: greedy tokens and log-probs equal the CPU's, each row
    stops at its own cap inside one batched call, a seed reproduces its draws, and the
    sampled log-probs are those of the distribution the trainer recomputes."""
    cpu = HFGenerator(tiny_llama(vocab_size=96, kv_heads=2))
    dev = HFGenerator(tiny_llama(vocab_size=96, kv_heads=2).to(DEVICE))
    greedy = SamplingParams(max_new_tokens=10, temperature=0.0)
    on_cpu, on_dev = cpu.generate(PROMPTS, greedy), dev.generate(PROMPTS, greedy)
    for a, b in zip(on_dev, on_cpu, strict=True):
        assert a.token_ids == b.token_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)

    # The CPU test of per-row caps, on the device's generator (its prompts fit this vocab).
    check_row_caps(dev)

    sampled = SamplingParams(max_new_tokens=12, temperature=0.8, top_p=0.9, seed=7)
    first, again = dev.generate(PROMPTS, sampled), dev.generate(PROMPTS, sampled)
    assert [c.token_ids for c in first] == [c.token_ids for c in again]
    # Without top-p the sampling distribution is the tempered softmax: the trainer's pass
    # at the same temperature recomputes the rollout's log-probs.
    plain = SamplingParams(max_new_tokens=12, temperature=0.8, seed=7)
    rows = dev.generate(PROMPTS, plain)
    for prompt, comp in zip(PROMPTS, rows, strict=True):
        full = torch.tensor([prompt + comp.token_ids], device=DEVICE)
        sel = torch.zeros_like(full)
        sel[0, len(prompt) :] = 1
        with torch.no_grad():
            lp, _ = token_logprobs(dev.model, full, torch.ones_like(full), sel, 0.8)
        want = lp[0, len(prompt) :].cpu().tolist()
        assert comp.logprobs == pytest.approx(want, abs=2e-4)


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(run_dir / "final_model" / "model.safetensors"))


@pytest.fixture
def rewarded(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiny model earns nothing yet: group 0's samples get rewards 1 / 0, so every
    step has advantages, a critic target and gradients to move."""
    from agentr1.trainer import loop

    real = loop.sample_rollouts

    def sample_rollouts(s, timer):  # type: ignore[no-untyped-def]
        groups, stats, extra = real(s, timer)
        for t, r in zip(groups[0].trajectories, [1.0, 0.0], strict=True):
            t.outcome_reward = r
        return groups, stats, extra

    monkeypatch.setattr(loop, "sample_rollouts", sample_rollouts)


@pytest.mark.usefixtures("rewarded")
def test_a_run_on_the_device_with_its_critic_resumes_on_the_cpu(tmp_path: Path) -> None:
    """PPO with a critic (gae) and a KL reference, 2 steps on the device with a checkpoint
    a step; the run then goes on to step 3 on the CPU from the device's checkpoint, and
    its log has every step once, each with a gradient and finite losses."""
    common = [
        *SMALL,
        "algo.estimator=gae",
        "algo.kl_coef=0.05",
        "train.checkpoint_every=1",
        "sft.steps=10",
        f"train.run_dir={tmp_path}",
    ]
    summary = train(load_config(None, [*common, "train.steps=2", f"model.device={DEVICE}"]))
    assert summary["steps"] == 2
    assert (tmp_path / "checkpoints" / "step_000002").is_dir()
    train(load_config(None, [*common, "train.steps=3", "model.device=cpu"]), resume=True)
    rows = rl_records(tmp_path)
    assert [r["step"] for r in rows] == [0, 1, 2]
    for r in rows:
        assert r["grad_norm"] > 0 and r["value_loss"] > 0 and r["skipped_updates"] == 0, r
        assert math.isfinite(r["policy_loss"]) and math.isfinite(r["value_loss"]), r
    assert all(torch.isfinite(w).all() for w in _weights(tmp_path).values())


@pytest.mark.usefixtures("rewarded")
def test_bf16_autocast_with_a_bf16_sampler_trains_on_the_device(tmp_path: Path) -> None:
    """The paper recipe's precision on the device: fp32 weights and AdamW state, bf16
    compute by autocast, rollouts from a bf16 copy that follows each update."""
    cfg = load_config(
        None,
        [
            *SMALL,
            "train.steps=2",
            "sft.steps=10",
            "model.compute_dtype=bfloat16",
            "model.sampler_dtype=bfloat16",
            f"model.device={DEVICE}",
            f"train.run_dir={tmp_path}",
        ],
    )
    summary = train(cfg)
    assert summary["steps"] == 2
    rows = rl_records(tmp_path)
    assert len(rows) == 2
    assert all(r["grad_norm"] > 0 and math.isfinite(r["policy_loss"]) for r in rows), rows
    if DEVICE.startswith("cuda"):  # the step's peak on the GPU is logged
        raw = metric_records(tmp_path, "rl")
        assert all(0 < r["mem/gpu_peak_gib"] <= r["mem/gpu_reserved_gib"] for r in raw)
    weights = _weights(tmp_path)
    assert {w.dtype for w in weights.values()} == {torch.float32}
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["steps"] == 2
