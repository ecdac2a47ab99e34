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
from tests.e2e.test_train_loop import SMALL, rl_records

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


def test_sampler_copy_is_what_a_rollout_worker_loads(tmp_path: Path) -> None:
    """The driver's bf16 copy of the fp32 policy holds what ``load_model(path, bf16)``
    (a rollout worker's sampler) holds, parameter for parameter and buffer for buffer:
    the rotary frequencies the model computes for itself stay float32 in both."""
    from agentr1.models import load_model

    setup = build_setup(load_config(None, [*SMALL, *BF16, f"train.run_dir={tmp_path}"]))
    copy_ = setup.generator.model
    loaded = load_model(setup.model_dir, dtype=torch.bfloat16)
    for kind in ("named_parameters", "named_buffers"):
        mine = dict(getattr(copy_, kind)())
        theirs = dict(getattr(loaded, kind)())
        assert mine.keys() == theirs.keys(), kind
        for name, t in theirs.items():
            assert mine[name].dtype == t.dtype and torch.equal(mine[name], t), name
    buffers = dict(copy_.named_buffers())
    assert any(n.endswith("inv_freq") and b.dtype == torch.float32 for n, b in buffers.items())


def test_same_sampler_dtype_shares_the_policy(tmp_path: Path) -> None:
    cfg = load_config(None, [*SMALL, "model.sampler_dtype=same", f"train.run_dir={tmp_path}"])
    setup = build_setup(cfg)
    assert setup.sampler_is_policy
    setup.sync_sampler()  # a no-op, not an error


def test_train_autocast_runs_matmuls_in_bf16_only_when_asked() -> None:
    model = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4)
    on = load_config(None, ["model.compute_dtype=bfloat16"])
    off = load_config(None, ["model.compute_dtype=float32"])
    with train_autocast(on, model):
        assert model(x).dtype == torch.bfloat16
    with train_autocast(off, model):
        assert model(x).dtype == torch.float32
    bf16_weights = load_config(None, ["model.compute_dtype=bfloat16", "model.dtype=bfloat16"])
    with train_autocast(bf16_weights, model):  # nothing to autocast: weights are bf16
        assert model(x).dtype == torch.float32


def test_the_lm_head_runs_in_the_weights_dtype_under_autocast() -> None:
    """Autocast runs the backbone in bf16; the LM head and its log-softmax stay in the
    weights' float32 (bf16 logits flattened a GRPO run's learning: see
    ``ModelConfig.compute_dtype``)."""
    from agentr1.trainer.logprobs import _head_chunk

    g = torch.Generator().manual_seed(0)
    hidden = (3 * torch.randn(6, 16, generator=g)).to(torch.bfloat16)  # a bf16 backbone's
    weight = torch.randn(50, 16, generator=g)
    targets = torch.randint(0, 50, (6,), generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lp, ent = _head_chunk(hidden, targets, weight, None, 1.0, True)
    want_lp, want_ent = _head_chunk(hidden.float(), targets, weight, None, 1.0, True)
    assert lp.dtype == torch.float32
    assert torch.equal(lp, want_lp) and torch.equal(ent, want_ent)
    bf16_logits = torch.nn.functional.linear(hidden, weight.to(torch.bfloat16)).float()
    bf16_lp = bf16_logits.log_softmax(-1).gather(-1, targets[:, None]).squeeze(-1)
    assert not torch.allclose(lp, bf16_lp, atol=1e-4)  # what the bf16 head would give


@pytest.mark.parametrize("native", [True, False])
def test_auto_compute_dtype_is_bf16_only_where_the_cpu_has_it(
    native: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``compute_dtype: auto`` autocasts on a CPU with native bf16 (avx512_bf16 or AMX)
    and stays float32 elsewhere, where emulated bf16 would be slower."""
    from agentr1.trainer import setup

    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: native, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    assert setup.native_bf16(torch.device("cpu")) is native
    model = torch.nn.Linear(4, 4)
    with train_autocast(load_config(None, ["model.compute_dtype=auto"]), model):
        out = model(torch.randn(2, 4))
    assert out.dtype == (torch.bfloat16 if native else torch.float32)
    with pytest.raises(Exception, match="compute_dtype"):
        load_config(None, ["model.compute_dtype=fp8"])


@pytest.mark.parametrize("native", [True, False])
def test_auto_sampler_dtype_is_a_bf16_copy_only_where_the_cpu_has_it(
    native: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``sampler_dtype: auto`` (the demo's) samples from a bf16 copy on a CPU with native
    bf16 and from the float32 policy itself elsewhere; the policy stays float32."""
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: native, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    cfg = load_config(None, [*SMALL, "model.sampler_dtype=auto", f"train.run_dir={tmp_path}"])
    setup = build_setup(cfg)
    assert setup.sampler_is_policy is not native
    want = torch.bfloat16 if native else torch.float32
    assert next(setup.generator.model.parameters()).dtype == want
    assert next(setup.policy.parameters()).dtype == torch.float32
    with pytest.raises(Exception, match="sampler_dtype"):
        load_config(None, ["model.sampler_dtype=fp16"])


@pytest.mark.parametrize("native", [True, False])
def test_bf16_by_name_where_the_cpu_only_emulates_it_is_warned(
    native: bool, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``bfloat16`` named on a CPU without bf16 arithmetic runs emulated, ~50x slower than
    float32 on an AVX2 CPU: the run says so and names the settings; ``auto`` is silent."""
    from agentr1.trainer import setup

    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: native, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    cpu = torch.device("cpu")
    cfg = load_config(None, [*BF16, "model.dtype=float32"])
    with caplog.at_level("WARNING", logger=setup.__name__):
        named = setup.warn_emulated_bf16(cfg, cpu)
    if native:
        assert named == [] and not caplog.records
    else:
        assert named == ["model.compute_dtype=bfloat16", "model.sampler_dtype=bfloat16"]
        assert "emulated" in caplog.text and "use auto" in caplog.text
    auto = load_config(None, ["model.compute_dtype=auto", "model.sampler_dtype=auto"])
    assert setup.warn_emulated_bf16(auto, cpu) == []


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


def test_sft_under_bf16_autocast_learns_like_fp32() -> None:
    """Autocast caches bf16 copies of the weights until its context exits: one context
    around many optimizer steps would compute every step with the first weights and the
    loss would not fall. sft_train enters it per step."""
    from agentr1.trainer.sft import sft_train
    from agentr1.types import Trajectory
    from tests.tiny_models import tiny_llama

    def demo() -> Trajectory:
        t = Trajectory(task_id="x")
        t.append_prompt([5, 6, 7])
        t.append_sampled([8, 9, 10], [0.0] * 3, "")
        t.append_inserted([11, 12])
        t.append_sampled([13, 14], [0.0] * 2, "")
        return t

    def autocast() -> torch.autocast:
        return torch.autocast("cpu", dtype=torch.bfloat16)

    fp32 = sft_train(tiny_llama(), [demo()], steps=30, batch_size=1, lr=1e-2, pad_id=0, seed=0)
    bf16 = sft_train(
        tiny_llama(), [demo()], steps=30, batch_size=1, lr=1e-2, pad_id=0, seed=0, autocast=autocast
    )
    assert bf16[-1] < 0.2 * bf16[0]
    assert bf16[-1] == pytest.approx(fp32[-1], abs=0.1)


def test_rl_update_under_autocast_uses_fresh_weights_every_optimizer_step() -> None:
    """20 epochs = 20 optimizer steps in one update: each must see the weights after the
    one before. With a stale autocast cache every epoch would score the first weights,
    and the mean policy loss would stay at its first value (-1: ratio 1, advantage 1).
    Only the linear layers train: embeddings and norms are not cast, so their updates
    would show through a stale cache."""
    from agentr1.config import AlgoConfig, OptimConfig
    from agentr1.trainer.logprobs import token_logprobs
    from agentr1.trainer.update import Learner, UpdateBatch, rl_update
    from tests.tiny_models import tiny_llama

    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    mask = torch.tensor([[0, 0, 0, 1, 1, 1]], dtype=torch.float32)
    losses = {}
    for tag, ctx in (("fp32", None), ("bf16", lambda: torch.autocast("cpu", torch.bfloat16))):
        model = tiny_llama()
        for name, p in model.named_parameters():  # train only what autocast casts
            p.requires_grad_("proj" in name)
        with torch.no_grad():
            old, _ = token_logprobs(model, ids, torch.ones_like(ids), mask)
        batch = UpdateBatch(ids, torch.ones_like(ids), mask, mask, old)
        kwargs = {} if ctx is None else {"autocast": ctx}
        out = rl_update(
            Learner(model, torch.optim.SGD(model.parameters(), lr=1.0)),
            batch,
            AlgoConfig(),
            OptimConfig(ppo_epochs=20),
            temperature=1.0,
            generator=torch.Generator().manual_seed(0),
            **kwargs,
        )
        losses[tag] = out["policy_loss"]
    assert losses["fp32"] < -1.05  # the ratio rose over the epochs
    assert losses["bf16"] == pytest.approx(losses["fp32"], abs=0.03)


def test_last_rl_step_is_checkpointed_before_the_final_eval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process killed in the final evaluation (e.g. out of memory) keeps its RL steps:
    the newest checkpoint is the last step even when checkpoint_every does not divide it."""
    from agentr1.trainer import loop
    from agentr1.trainer.checkpoint import latest_checkpoint

    real_eval = loop.run_eval

    def killed_after_rl(setup, label, run=None, step=None):  # type: ignore[no-untyped-def]
        if label == "after":
            raise MemoryError("killed in the final eval")
        return real_eval(setup, label, run, step)

    monkeypatch.setattr(loop, "run_eval", killed_after_rl)
    cfg = load_config(
        None,
        [
            *SMALL,
            "sft.steps=2",
            "train.steps=3",
            "train.checkpoint_every=10",
            f"train.run_dir={tmp_path}",
        ],
    )
    with pytest.raises(MemoryError):
        train(cfg)
    newest = latest_checkpoint(tmp_path / "checkpoints")
    assert newest is not None and newest.name == "step_000003"
