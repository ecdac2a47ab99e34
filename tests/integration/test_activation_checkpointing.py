"""optim.activation_checkpointing: the same gradients, a second forward in the backward,
the sampler untouched, and a clear error for a model that cannot do it."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from agentr1 import configutil
from agentr1.backends import native
from agentr1.backends.base import SamplingParams
from agentr1.config import load_config
from agentr1.trainer.logprobs import checkpointing, token_logprobs
from agentr1.trainer.setup import enable_activation_checkpointing, load_policy
from tests.tiny_models import tiny_llama


def _grads(model: torch.nn.Module, ids: torch.Tensor) -> tuple[list[torch.Tensor], int]:
    """Gradients of the mean log-prob of ``ids``, and how often the first layer's
    attention ran."""
    calls = []
    hook = model.model.layers[0].self_attn.register_forward_hook(lambda *_: calls.append(1))
    model.train()
    model.zero_grad(set_to_none=True)
    lp, _ = token_logprobs(model, ids, torch.ones_like(ids))
    lp[:, 1:].mean().backward()
    hook.remove()
    return [p.grad.clone() for p in model.parameters() if p.grad is not None], len(calls)


def test_checkpointing_recomputes_the_forward_and_keeps_the_gradients(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Both passes on the modules' own ops (checkpointing keeps them; the plain pass would
    # run the native norms and gates, equal only to float rounding: tests/unit/test_fused.py).
    monkeypatch.setattr(native, "rms_norm", lambda: None)
    monkeypatch.setattr(native, "silu_gate", lambda: None)
    ids = torch.randint(0, 64, (3, 48), generator=torch.Generator().manual_seed(0))
    ids[:, :40] = ids[0, :40]  # a shared prompt: the prefix-sharing path must step aside
    plain, plain_calls = _grads(tiny_llama(), ids)
    model = tiny_llama()
    enable_activation_checkpointing(model)
    recomputed, calls = _grads(model, ids)
    assert len(recomputed) == len(plain)
    for a, b in zip(recomputed, plain, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert (plain_calls, calls) == (2, 2)  # prefix + rest without; forward + recompute with
    assert checkpointing(model.model)


def test_the_config_turns_it_on_for_the_policy_and_sampling_still_decodes(tmp_path: Path) -> None:
    from agentr1.tiny import build_and_save

    shape = load_config(None, []).model.tiny
    path = build_and_save(tmp_path / "tiny", ["Who founded Port Azel?"] * 8, shape, seed=0)
    cfg = load_config(None, [f"model.path={path}", "optim.activation_checkpointing=true"])
    _, _, policy, generator, _ = load_policy(cfg, str(path))
    assert checkpointing(policy)
    policy.eval()
    out = generator.generate([[1, 2, 3]], SamplingParams(max_new_tokens=4, temperature=0.0))
    assert len(out[0].token_ids) == 4


def test_a_model_without_gradient_checkpointing_is_a_config_error() -> None:
    model = SimpleNamespace(supports_gradient_checkpointing=False)
    with pytest.raises(configutil.ConfigError, match=r"optim\.activation_checkpointing"):
        enable_activation_checkpointing(model)


def test_a_trainer_ranks_replica_checkpoints_as_rank_0_does() -> None:
    from agentr1.distributed.ranks import build_replica

    cfg = load_config(None, ["optim.activation_checkpointing=true"])
    learner = build_replica(cfg, tiny_llama().config, torch.device("cpu"))
    assert checkpointing(learner.policy)
    plain = build_replica(load_config(None, []), tiny_llama().config, torch.device("cpu"))
    assert not checkpointing(plain.policy)
