"""LoRA adapters: the adapted model starts as its base, only adapters train, merged weights
load into a plain model and compute the same function, and a LoRA run trains, resumes
exactly and saves a plain merged model."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from agentr1 import lora
from agentr1.config import load_config
from agentr1.configutil import ConfigError
from agentr1.trainer.loop import train
from tests.e2e.test_train_loop import SMALL, rl_records
from tests.tiny_models import tiny_llama

IDS = torch.tensor([[5, 9, 13, 7, 21, 30, 2], [4, 8, 15, 16, 23, 42, 11]])


def logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=IDS).logits


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTR1_CACHE", str(tmp_path_factory.getbasetemp() / "agentr1-cache"))


def randomize_adapters(model: torch.nn.Module) -> None:
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for _, m in lora.lora_modules(model):
            m.lora_B.copy_(torch.randn(m.lora_B.shape, generator=gen) * 0.1)


def test_an_adapted_model_starts_as_its_base_and_trains_only_adapters() -> None:
    model = tiny_llama(vocab_size=64, hidden=32, layers=2)
    base = copy.deepcopy(model)
    names = lora.apply_lora(model, rank=4, alpha=8)
    assert len(names) == 2 * 7  # q k v o gate up down, per layer
    assert torch.equal(logits(model), logits(base))
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {f"{n}.{w}" for n in names for w in ("lora_A", "lora_B")}
    assert lora.trainable_parameters(model) == [p for p in model.parameters() if p.requires_grad]
    m = dict(lora.lora_modules(model))["model.layers.0.mlp.up_proj"]
    assert (
        m.lora_A.shape == (4, 32) and m.lora_B.shape == (64, 4) and m.__dict__["lora_scale"] == 2.0
    )


def test_backward_computes_no_base_weight_gradient() -> None:
    model = tiny_llama(vocab_size=64, hidden=32, layers=2)
    lora.apply_lora(model, rank=4, alpha=8)
    randomize_adapters(model)  # with B = 0, A's gradient is 0 by construction
    model(input_ids=IDS).logits.logsumexp(-1).sum().backward()
    for n, p in model.named_parameters():
        if "lora_" in n:
            assert p.grad is not None and p.grad.abs().sum() > 0, n
        else:
            assert p.grad is None, n


def test_merged_weights_unload_and_disabled_adapters_compute_the_same_functions() -> None:
    model = tiny_llama(vocab_size=64, hidden=32, layers=2)
    base = copy.deepcopy(model)
    lora.apply_lora(model, rank=4, alpha=8)
    randomize_adapters(model)
    adapted = logits(model)
    assert not torch.allclose(adapted, logits(base), atol=1e-3)  # the adapters do something

    plain = copy.deepcopy(base)
    plain.load_state_dict(lora.merged_state_dict(model))  # strict: plain names only
    torch.testing.assert_close(logits(plain), adapted, atol=1e-4, rtol=1e-4)

    with lora.adapters_disabled(model):
        assert torch.equal(logits(model), logits(base))
    assert torch.equal(logits(model), adapted)  # back on after the block

    assert lora.merge_adapters(model) == 14
    torch.testing.assert_close(logits(model), adapted, atol=1e-4, rtol=1e-4)
    assert all(bool((m.lora_B == 0).all()) for _, m in lora.lora_modules(model))
    with lora.adapters_disabled(model):  # the base is now the merged model
        torch.testing.assert_close(logits(model), adapted, atol=1e-4, rtol=1e-4)

    assert lora.unload(model) == 14
    assert lora.lora_modules(model) == []
    assert set(model.state_dict()) == set(base.state_dict())
    assert all(not m._forward_hooks for m in model.modules())
    torch.testing.assert_close(logits(model), adapted, atol=1e-4, rtol=1e-4)


def test_bad_targets_tied_weights_and_bad_config_are_refused() -> None:
    model = tiny_llama(vocab_size=64, hidden=32, layers=1)
    with pytest.raises(ValueError, match=r"model.lora.targets=\['qproj'\].*q_proj"):
        lora.apply_lora(model, rank=4, alpha=8, targets=["qproj"])
    tied = tiny_llama(vocab_size=64, hidden=32, layers=1)
    tied.lm_head.weight = tied.model.embed_tokens.weight
    with pytest.raises(ValueError, match=r"lm_head\.weight is tied to model\.embed_tokens\.weight"):
        lora.apply_lora(tied, rank=4, alpha=8, targets=["lm_head"])
    lora.apply_lora(model, rank=4, alpha=8)
    with pytest.raises(ValueError, match="has LoRA adapters already"):
        lora.apply_lora(model, rank=4, alpha=8)
    with pytest.raises(ConfigError, match=r"model\.lora\.rank=-1"):
        load_config(None, ["model.lora.rank=-1"])
    with pytest.raises(ConfigError, match="alpha=0"):
        load_config(None, ["model.lora.rank=8", "model.lora.alpha=0"])
    with pytest.raises(ConfigError, match=r"model\.lora\.targets is empty"):
        load_config(None, ["model.lora.rank=8", "model.lora.targets=[]"])


@pytest.fixture
def signed_advantages(monkeypatch: pytest.MonkeyPatch) -> None:
    """Seeded +-1 advantages on the agent's tokens. The tiny model of these tests earns no
    reward in a few steps, so every advantage would be 0 and nothing would train: this
    checks the run's plumbing (which weights train, the reference, the checkpoints and
    the saved model), not learning."""
    from agentr1.trainer import scoring

    original = scoring.step_advantages
    gen = torch.Generator().manual_seed(0)

    def patched(cfg, batch, scores, adv_mask_BT):  # type: ignore[no-untyped-def]
        adv = original(cfg, batch, scores, adv_mask_BT)
        signs_BT = torch.randint(0, 2, adv.advantages_BT.shape, generator=gen).float() * 2 - 1
        return scoring.Advantages(signs_BT * adv_mask_BT, adv.returns_BT, adv.metrics)

    monkeypatch.setattr(scoring, "step_advantages", patched)


@pytest.mark.parametrize("estimator", ["grpo", "gae"])
def test_a_lora_run_trains_adapters_against_the_warm_start_and_saves_a_plain_model(
    tmp_path: Path, estimator: str, signed_advantages: None
) -> None:
    cfg = load_config(
        None,
        [
            *SMALL,
            "model.lora.rank=4",
            "model.lora.alpha=8",
            f"algo.estimator={estimator}",
            "algo.kl_coef=0.05",
            "optim.lr=0.01",
            "sft.lr=0.03",
            "train.steps=2",
            "train.checkpoint_every=2",  # keeps step 0 (after SFT) and step 2
            f"train.run_dir={tmp_path}",
        ],
    )
    summary = train(cfg)
    assert summary["steps"] == 2
    rows = rl_records(tmp_path)
    assert all(r["skipped_updates"] == 0 for r in rows)
    # The reference is the warm start itself (SFT adapters merged into the base, adapters
    # restarted at 0): no distance before the first update, some after it.
    assert rows[0]["kl"] == 0.0 and rows[1]["kl"] > 0.0

    ckpts = sorted((tmp_path / "checkpoints").glob("step_*"))
    assert [c.name for c in ckpts] == ["step_000000", "step_000002"]

    def policy_tensors(ckpt: Path) -> dict[str, torch.Tensor]:
        with safe_open(str(ckpt / "policy.safetensors"), "pt") as st:
            return {k: st.get_tensor(k) for k in st.keys()}  # noqa: SIM118

    start = tiny_start()
    first, last = policy_tensors(ckpts[0]), policy_tensors(ckpts[-1])
    b_keys = [k for k in first if k.endswith("lora_B")]
    assert len(b_keys) == 2 * 7 and all(bool((first[k] == 0).all()) for k in b_keys)
    adapted = [k.removesuffix("lora_B") + "weight" for k in b_keys]
    # SFT trained adapters, then merged them: the adapted base weights moved, no other.
    assert all(not torch.equal(first[k], start[k]) for k in adapted)
    assert sum(k in start for k in first) == len(first) - 2 * len(b_keys)
    assert all(torch.equal(first[k], start[k]) for k in first if k in start and k not in adapted)
    # RL trained the adapters and nothing else.
    assert all(bool((last[k] != 0).any()) for k in b_keys)
    assert all(torch.equal(first[k], last[k]) for k in first if "lora_" not in k)

    final = tmp_path / "final_model"
    with safe_open(str(final / "model.safetensors"), "pt") as st:
        assert not [k for k in st.keys() if "lora" in k]  # noqa: SIM118
    from transformers import AutoModelForCausalLM

    got = AutoModelForCausalLM.from_pretrained(final).state_dict()
    for k in first:
        if k.endswith("lora_B"):
            name = k.removesuffix(".lora_B")
            want = last[f"{name}.weight"] + (8 / 4) * (last[k] @ last[f"{name}.lora_A"])
            torch.testing.assert_close(got[f"{name}.weight"], want, atol=1e-6, rtol=1e-6)
        elif "lora_" not in k and k not in adapted:
            assert torch.equal(got[k], last[k]), k


def tiny_start() -> dict[str, torch.Tensor]:
    """The weights the SMALL runs start from (the tiny model, rebuilt from the cache)."""
    from agentr1.trainer.setup import build_setup

    return build_setup(load_config(None, SMALL)).policy.state_dict()


def test_a_killed_lora_run_resumes_exactly(tmp_path: Path) -> None:
    common = [
        *SMALL,
        "model.lora.rank=4",
        "train.steps=3",
        "train.checkpoint_every=1",
        "sft.steps=4",
        "optim.minibatches=2",
        "algo.kl_coef=0.05",
    ]
    full = load_config(None, [*common, f"train.run_dir={tmp_path / 'full'}"])
    train(full)
    part = load_config(None, [*common, f"train.run_dir={tmp_path / 'part'}"])
    train(part, stop_after=2)
    train(part, resume=True)
    assert rl_records(tmp_path / "full") == rl_records(tmp_path / "part")
    s_full = json.loads((tmp_path / "full" / "summary.json").read_text())
    s_part = json.loads((tmp_path / "part" / "summary.json").read_text())
    assert s_full["eval_after"] == s_part["eval_after"]


def grads_after_backward(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    model(input_ids=IDS).logits.logsumexp(-1).sum().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_siblings_that_share_an_input_compute_exactly_what_separate_adapters_do() -> None:
    base = tiny_llama(vocab_size=64, hidden=32, layers=2)
    shared, alone = copy.deepcopy(base), copy.deepcopy(base)
    lora.apply_lora(shared, rank=4, alpha=8)
    lora.apply_lora(alone, rank=4, alpha=8, share_input=False)
    alone.load_state_dict(shared.state_dict())  # the same A's
    randomize_adapters(shared)
    randomize_adapters(alone)
    groups = {id(m.__dict__["lora_group"]) for _, m in lora.lora_modules(shared)}
    assert len(groups - {id(None)}) == 2 * 2  # q/k/v and gate/up of each layer
    assert all(m.__dict__["lora_group"] is None for _, m in lora.lora_modules(alone))
    # the same arithmetic up to float rounding (one GEMM of 3r rows instead of three of r)
    torch.testing.assert_close(logits(shared), logits(alone), atol=1e-4, rtol=1e-4)
    g_shared, g_alone = grads_after_backward(shared), grads_after_backward(alone)
    assert set(g_shared) == set(g_alone) and len(g_shared) == 2 * 14
    for n in g_shared:
        torch.testing.assert_close(g_shared[n], g_alone[n], atol=1e-4, rtol=1e-4, msg=n)
    # no product is kept once every sibling took its slice
    assert all(
        g._z is None
        for g in {m.__dict__["lora_group"] for _, m in lora.lora_modules(shared)} - {None}
    )
    # a copy (PPO's critic) shares nothing with the original
    twin = copy.deepcopy(shared)
    for (_, m), (_, t) in zip(lora.lora_modules(shared), lora.lora_modules(twin), strict=True):
        if m.__dict__["lora_group"] is not None:
            assert t in t.__dict__["lora_group"].mods and m not in t.__dict__["lora_group"].mods
    torch.testing.assert_close(logits(twin), logits(shared))


class Block(torch.nn.Module):
    """Siblings named like q/k/v, called on other inputs and twice: not what Llama does."""

    def __init__(self) -> None:
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = (torch.nn.Linear(6, 5) for _ in range(3))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.q_proj(x) + self.k_proj(y) * self.v_proj(x) - self.q_proj(x) * self.k_proj(y)


def test_siblings_called_on_different_inputs_still_compute_their_own_adapters() -> None:
    torch.manual_seed(0)
    base = Block()
    x, y = torch.randn(3, 6), torch.randn(3, 6)
    models = []
    for share in (True, False):
        m = copy.deepcopy(base)
        lora.apply_lora(m, 2, 2, targets=["q_proj", "k_proj", "v_proj"], share_input=share)
        models.append(m)
    models[1].load_state_dict(models[0].state_dict())
    for m in models:
        randomize_adapters(m)
        with lora.adapters_disabled(m):
            torch.testing.assert_close(m(x, y), base(x, y))
    shared, alone = (m(x, y) for m in models)
    assert not torch.allclose(shared, base(x, y), atol=1e-3)
    torch.testing.assert_close(shared, alone, atol=1e-5, rtol=1e-5)


def test_a_shared_product_is_not_reused_after_the_adapters_change() -> None:
    torch.manual_seed(0)
    block, x = Block(), torch.randn(3, 6)
    lora.apply_lora(block, 2, 2, targets=["q_proj", "k_proj", "v_proj"])
    randomize_adapters(block)
    block.q_proj(x)  # k and v have not taken their slices: the product is still held
    with torch.no_grad():
        block.k_proj.lora_A.add_(1.0)  # what an optimizer step does
    want = (
        torch.nn.functional.linear(x, block.k_proj.weight, block.k_proj.bias)
        + (x @ block.k_proj.lora_A.T @ block.k_proj.lora_B.T) * block.k_proj.__dict__["lora_scale"]
    )
    torch.testing.assert_close(block.k_proj(x), want)


def test_save_model_mid_run_writes_a_plain_model_and_leaves_the_adapters(tmp_path: Path) -> None:
    """`train.keep_best` saves mid-run, while the adapters still train: the file is the
    merged plain model, and the live model keeps its adapters."""
    from types import SimpleNamespace

    from transformers import AutoModelForCausalLM

    from agentr1.trainer.best import save_model

    model = tiny_llama(vocab_size=64, hidden=32, layers=2)
    lora.apply_lora(model, rank=4, alpha=8)
    randomize_adapters(model)
    adapted = logits(model)
    tokenizer = SimpleNamespace(save_pretrained=lambda path: None)
    save_model(SimpleNamespace(policy=model, tokenizer=tokenizer), tmp_path / "best_model")
    assert len(lora.lora_modules(model)) == 14  # still adapted
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "best_model")
    assert not lora.lora_modules(plain)
    torch.testing.assert_close(logits(plain), adapted, atol=1e-4, rtol=1e-4)
    # a second save replaces the first in place
    randomize_adapters(model)
    with torch.no_grad():
        for _, m in lora.lora_modules(model):
            m.lora_B.mul_(2)
    save_model(SimpleNamespace(policy=model, tokenizer=tokenizer), tmp_path / "best_model")
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "best_model")
    torch.testing.assert_close(logits(again), logits(model), atol=1e-4, rtol=1e-4)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best_model"]


def test_a_lora_run_evaluates_the_merged_model_again_after_the_last_periodic_eval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full fine-tune reuses the last step's periodic evaluation as the final one; merging
    adapters changes the arithmetic, so an adapted run scores its merged model itself."""
    from agentr1.trainer import loop

    labels: list[str] = []
    real = loop.run_eval

    def spy(setup, label, run=None, step=None):  # type: ignore[no-untyped-def]
        labels.append(label)
        return real(setup, label, run, step)

    monkeypatch.setattr(loop, "run_eval", spy)
    common = [*SMALL, "sft.steps=4", "train.steps=1", "train.eval_every=1", "eval.sampled_n=0"]
    train(load_config(None, [*common, "model.lora.rank=4", f"train.run_dir={tmp_path / 'a'}"]))
    assert labels == ["before", "step 1", "after"]
    labels.clear()
    train(load_config(None, [*common, f"train.run_dir={tmp_path / 'b'}"]))
    assert labels == ["before", "step 1"]
