"""Policy losses and KL variants are registered parts: a recipe names one (or an import
path), the update and the loop call it, a wrong name is one clear error."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from agentr1.algorithms.objectives import (
    KLVariant,
    get_kl_variant,
    kl_variant_names,
    policy_loss_names,
)
from agentr1.config import AlgoConfig, OptimConfig, load_config
from agentr1.configutil import ConfigError
from agentr1.trainer.logprobs import token_logprobs
from agentr1.trainer.update import Learner, UpdateBatch, rl_update
from tests.tiny_models import tiny_llama


def _batch(model: torch.nn.Module) -> UpdateBatch:
    ids = torch.tensor([[5, 6, 7, 8, 9, 10], [5, 6, 11, 12, 13, 14]])
    attn = torch.ones_like(ids)
    mask = torch.tensor([[0, 0, 0, 1, 1, 1], [0, 0, 1, 1, 1, 1]], dtype=torch.float32)
    with torch.no_grad():
        old, _ = token_logprobs(model, ids, attn, mask)
    adv = torch.tensor([[0.0, 0, 0, 1, 1, 1], [0, 0, -1, -1, -1, -1]])
    return UpdateBatch(ids, attn, mask, adv, old)


def _update(algo: AlgoConfig, ub: UpdateBatch | None = None, lr: float = 0.0) -> dict[str, float]:
    model = tiny_llama()
    ub = ub if ub is not None else _batch(model)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    return rl_update(Learner(model, opt), ub, algo, OptimConfig(), 1.0, torch.Generator())


def test_the_builtin_parts_are_registered_by_name() -> None:
    assert policy_loss_names() == ["ppo_clip"]
    assert kl_variant_names() == ["k1_reward", "k2_loss", "k3_loss"]
    assert get_kl_variant("k1_reward").reward is not None
    assert get_kl_variant("k3_loss").loss is not None
    with pytest.raises(ValueError, match="exactly one"):
        KLVariant()


@pytest.mark.parametrize(
    ("override", "said"),
    [
        ("algo.policy_loss=ppo_clipp", "algo.policy_loss: unknown policy loss 'ppo_clipp'"),
        ("algo.kl_mode=k4_loss", "algo.kl_mode: unknown KL variant 'k4_loss'"),
        ("algo.kl_mode=no_such_module_xyz:fn", "algo.kl_mode"),
    ],
)
def test_an_unknown_part_is_one_clear_error(override: str, said: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert said in str(e.value)
    if "unknown" in said:
        assert "k3_loss" in str(e.value) or "ppo_clip" in str(e.value)  # the valid names


def test_a_policy_loss_of_your_own_is_one_function_named_by_path(tmp_path: Path) -> None:
    """REINFORCE's surrogate -A * log pi, from a file next to the recipe: the update uses
    it (its metric is logged, its gradient moves the weights the way the advantages say)."""
    (tmp_path / "my_losses.py").write_text(
        "from agentr1.algorithms import masked_aggregate\n"
        "calls = []\n"
        "def reinforce(inputs, algo):\n"
        "    calls.append(inputs.mask_BT.shape)\n"
        "    per_token = -inputs.advantages_BT * inputs.logprobs_BT\n"
        "    return masked_aggregate(per_token, inputs.mask_BT, algo.agg_mode), {'mine': 1.0}\n"
    )
    (tmp_path / "recipe.yaml").write_text("algo:\n  policy_loss: my_losses.py:reinforce\n")
    cfg = load_config(tmp_path / "recipe.yaml", ["algo.kl_coef=0"])
    assert cfg.algo.policy_loss == f"{tmp_path / 'my_losses.py'}:reinforce"  # anchored
    out = _update(cfg.algo, lr=0.5)
    assert out["mine"] == 1.0 and "clipfrac" not in out
    # -A * log pi with A = +1 on row 0: its tokens become likelier
    model = tiny_llama()
    ub = _batch(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    rl_update(Learner(model, opt), ub, cfg.algo, OptimConfig(), 1.0, torch.Generator())
    with torch.no_grad():
        new, _ = token_logprobs(model, ub.input_ids_BT, ub.attention_mask_BT, ub.loss_mask_BT)
    up = ((new - ub.old_logprobs_BT) * ub.loss_mask_BT)[0].sum()
    down = ((new - ub.old_logprobs_BT) * ub.loss_mask_BT)[1].sum()
    assert up > 0 > down


def test_k2_loss_is_half_the_squared_log_ratio() -> None:
    model = tiny_llama()
    ub = _batch(model)
    ub.advantages_BT.zero_()
    ub.ref_logprobs_BT = ub.old_logprobs_BT + 2.0 * ub.loss_mask_BT  # d = 2 on every token
    out = _update(AlgoConfig(kl_coef=1.0, kl_mode="k2_loss"), ub)
    assert out["kl"] == pytest.approx(0.5 * 2.0**2, rel=1e-4)
    assert "kl_tail_frac" not in out
    k3 = _update(AlgoConfig(kl_coef=1.0, kl_mode="k3_loss", k3_linear_above=None), ub)
    assert k3["kl"] == pytest.approx(math.exp(2) - 3, rel=1e-4)


def test_a_reward_side_variant_is_folded_into_the_rewards_not_the_loss() -> None:
    """k1_reward: the loop subtracts kl_coef x k1 from each agent token's reward before
    the advantages, and the update adds no KL term."""
    from agentr1.trainer.scoring import Scores, step_advantages
    from agentr1.types import RolloutBatch

    mask_BT = torch.tensor([[0.0, 1, 1], [0, 1, 1]])
    lp_BT = torch.tensor([[0.0, -1.0, -1.0], [0.0, -2.0, -2.0]])
    batch = RolloutBatch(
        input_ids_BT=torch.zeros(2, 3, dtype=torch.long),
        attention_mask_BT=torch.ones(2, 3, dtype=torch.long),
        loss_mask_BT=mask_BT,
        old_logprobs_BT=lp_BT,
        token_rewards_BT=torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]]),
        outcome_B=torch.tensor([1.0, 0.0]),
        group_index_B=torch.tensor([0, 1]),
    )
    ref_BT = lp_BT + 0.5 * mask_BT  # k1 = logp - ref_logp = -0.5 on agent tokens
    cfg = SimpleNamespace(
        algo=AlgoConfig(kl_mode="k1_reward", kl_coef=0.1, estimator="reinforce_plus_plus")
    )
    scores = Scores(ref_BT=ref_BT)
    with_kl = step_advantages(cfg, batch, scores, mask_BT)  # type: ignore[arg-type]
    assert with_kl.metrics["kl_reward"] == pytest.approx(-0.5)
    plain = step_advantages(cfg, batch, Scores(), mask_BT)  # type: ignore[arg-type]
    assert "kl_reward" not in plain.metrics
    # REINFORCE++ return-to-go (gamma 1): each agent token gains +0.05 per later token
    ret_gain = with_kl.returns_BT - plain.returns_BT
    torch.testing.assert_close(ret_gain, torch.tensor([[0.0, 0.1, 0.05], [0.0, 0.1, 0.05]]))
    model = tiny_llama()
    ub = _batch(model)
    ub.ref_logprobs_BT = ub.old_logprobs_BT + 2.0 * ub.loss_mask_BT
    assert "kl" not in _update(AlgoConfig(kl_coef=1.0, kl_mode="k1_reward"), ub)


def test_a_kl_variant_of_your_own_by_import_path(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "my_kl.py").write_text(
        "import torch\n"
        "from agentr1.algorithms.objectives import KLVariant\n"
        "def _abs(lp, ref, mask, algo):\n"
        "    kl = ((ref - lp).abs() * mask).sum() / mask.sum()\n"
        "    return kl, {'kl': kl.item(), 'abs_kl': 1.0}\n"
        "ABS = KLVariant(loss=_abs)\n"
        "NOT_A_VARIANT = 3\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    model = tiny_llama()
    ub = _batch(model)
    ub.ref_logprobs_BT = ub.old_logprobs_BT - 1.5 * ub.loss_mask_BT
    out = _update(AlgoConfig(kl_coef=1.0, kl_mode="my_kl:ABS"), ub)
    assert out["kl"] == pytest.approx(1.5, rel=1e-4) and out["abs_kl"] == 1.0
    with pytest.raises(ConfigError, match=r"algo.kl_mode: .*int, not a KLVariant"):
        load_config(None, ["algo.kl_mode=my_kl:NOT_A_VARIANT"])
