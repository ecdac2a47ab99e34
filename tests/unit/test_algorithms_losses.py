"""Losses, KL, entropy and the one masked aggregation, against values computed by hand.

Notation: B = batch rows, T = tokens, V = vocabulary. Arithmetic for every expected number
is in the comments next to it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

from agentr1.algorithms import (
    AGG_MODES,
    AggMode,
    aggregation_weight,
    apply_kl_to_rewards,
    entropy_bonus,
    entropy_from_logits,
    explained_variance,
    kl_loss,
    kl_penalty,
    masked_aggregate,
    policy_loss_ppo,
    value_loss,
)

LN = math.log


def f32(rows: list[list[float]] | list[float]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


def close(actual: torch.Tensor, expected: float | list[float] | list[list[float]]) -> None:
    torch.testing.assert_close(
        actual, torch.tensor(expected, dtype=torch.float32), rtol=0, atol=1e-5
    )


# ------------------------------------------------------------------ masked_aggregate

LOSS = f32([[1, 2, 3, 4], [5, 6, 7, 8], [9, 9, 9, 9]])
MASK = f32([[1, 1, 0, 0], [1, 1, 1, 0], [0, 0, 0, 0]])  # row 2: no masked token


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", 4.2),  # (1 + 2 + 5 + 6 + 7) / 5 = 21 / 5
        ("seq-mean-token-sum", 10.5),  # (3 + 18) / 2; the empty row is not a sample
        ("seq-mean-token-mean", 3.75),  # (3/2 + 18/3) / 2 = (1.5 + 6) / 2
    ],
)
def test_masked_aggregate_hand_values(mode: AggMode, expected: float) -> None:
    close(masked_aggregate(LOSS, MASK, mode), expected)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [("token-mean", 5.0), ("seq-mean-token-sum", 2.0), ("seq-mean-token-mean", 2.0)],
)
def test_aggregation_weight_is_the_denominator(mode: AggMode, expected: float) -> None:
    close(aggregation_weight(MASK, mode), expected)  # 5 masked tokens, 2 non-empty rows


@pytest.mark.parametrize("mode", AGG_MODES)
def test_masked_aggregate_empty_mask_is_zero_with_finite_grad(mode: AggMode) -> None:
    loss_BT = torch.full((2, 3), float("nan"), requires_grad=True)
    out = masked_aggregate(loss_BT, torch.zeros(2, 3), mode)  # type: ignore[arg-type]
    assert out.item() == 0.0
    out.backward()
    assert loss_BT.grad is not None
    assert torch.equal(loss_BT.grad, torch.zeros(2, 3))


def test_masked_aggregate_rejects_unknown_mode() -> None:
    with pytest.raises(
        ValueError, match="valid: token-mean, seq-mean-token-sum, seq-mean-token-mean"
    ):
        masked_aggregate(LOSS, MASK, "sum")  # type: ignore[arg-type]


# --------------------------------------------------------------------- PPO policy loss

# Six tokens in one row, clip 0.2 / 0.2, dual clip c = 3:
#   token  A   ratio   -A*r    -A*clip(r)   max      dual min(., -A*c)   active
#   1     +1   1.1     -1.1    -1.1         -1.1     -                   none
#   2     +1   1.5     -1.5    -1.2         -1.2     -                   clip (high)
#   3     -1   0.5      0.5     0.8          0.8     min(0.8, 3) = 0.8   clip (low)
#   4     -1   5.0      5.0     1.2          5.0     min(5.0, 3) = 3.0   dual clip
#   5     +2   0.5     -1.0    -1.6         -1.0     -                   none
#   6     -1   1.5      1.5     1.2          1.5     min(1.5, 3) = 1.5   none
# plus a seventh, masked token with garbage.
ADV = f32([[1, 1, -1, -1, 2, -1, 123.0]])
RATIO = [1.1, 1.5, 0.5, 5.0, 0.5, 1.5]
OLD = f32([[-1.0, -2.0, -0.5, -3.0, -1.5, -0.7, 0.0]])
PPO_MASK = f32([[1, 1, 1, 1, 1, 1, 0]])


def _logprobs(ratios: list[float] = RATIO, garbage: float = 55.0) -> torch.Tensor:
    logp = [o + LN(r) for o, r in zip(OLD[0, :6].tolist(), ratios, strict=True)] + [garbage]
    return torch.tensor([logp], dtype=torch.float32, requires_grad=True)


def test_ppo_clip_both_sides_and_dual_clip_hand_values() -> None:
    logp_BT = _logprobs()
    loss, metrics = policy_loss_ppo(logp_BT, OLD, ADV, PPO_MASK)
    # (-1.1 - 1.2 + 0.8 + 3.0 - 1.0 + 1.5) / 6 = 2.0 / 6
    close(loss, 2.0 / 6)
    close(metrics["clipfrac"], 2 / 6)  # tokens 2, 3
    close(metrics["dual_clip_frac"], 1 / 6)  # token 4
    # k3 = (r - 1) - ln r: 0.0046898 + 0.0945349 + 0.1931472 + 2.3905621 + 0.1931472
    #      + 0.0945349 = 2.9706161; / 6 = 0.4951027
    close(metrics["approx_kl"], 0.4951027)
    loss.backward()
    # d/dlogp of -A*r is -A*r where the unclipped term is chosen; 0 where clipped:
    # -A*r = [-1.1, 0, 0, 0, -2 * 0.5, +1 * 1.5] / 6, and 0 at the masked token.
    assert logp_BT.grad is not None
    close(logp_BT.grad, [[-1.1 / 6, 0, 0, 0, -1.0 / 6, 1.5 / 6, 0]])


def test_ppo_without_dual_clip() -> None:
    loss, metrics = policy_loss_ppo(_logprobs(), OLD, ADV, PPO_MASK, dual_clip_c=None)
    # token 4 keeps 5.0: 2.0 - 3.0 + 5.0 = 4.0; / 6
    close(loss, 4.0 / 6)
    close(metrics["dual_clip_frac"], 0.0)


def test_ppo_no_clip_is_the_plain_ratio_objective() -> None:
    # clip range wide enough that no ratio in [0.5, 5] is clipped, no dual clip:
    # (-1.1 - 1.5 + 0.5 + 5.0 - 1.0 + 1.5) / 6 = 3.4 / 6
    loss, metrics = policy_loss_ppo(
        _logprobs(), OLD, ADV, PPO_MASK, clip_low=0.99, clip_high=10.0, dual_clip_c=None
    )
    close(loss, 3.4 / 6)
    close(metrics["clipfrac"], 0.0)


def test_ppo_on_policy_ratio_one_gives_minus_mean_advantage() -> None:
    logp_BT = OLD.clone().requires_grad_(True)
    loss, metrics = policy_loss_ppo(logp_BT, OLD, ADV, PPO_MASK)
    # ratio 1 everywhere: -(1 + 1 - 1 - 1 + 2 - 1) / 6 = -1 / 6
    close(loss, -1.0 / 6)
    close(metrics["approx_kl"], 0.0)
    close(metrics["clipfrac"], 0.0)


def test_ppo_clip_higher_is_asymmetric() -> None:
    # A = +1, ratio 1.25: symmetric 0.2 clips to -1.2; clip_high 0.28 leaves -1.25.
    # A = -1, ratio 0.75: clip_low 0.2 clips to 0.8 in both.
    adv_BT, old_BT, mask_BT = f32([[1, -1]]), f32([[0, 0]]), f32([[1, 1]])
    logp_BT = f32([[LN(1.25), LN(0.75)]])
    sym, _ = policy_loss_ppo(logp_BT, old_BT, adv_BT, mask_BT)
    higher, _ = policy_loss_ppo(logp_BT, old_BT, adv_BT, mask_BT, clip_high=0.28)
    close(sym, (-1.2 + 0.8) / 2)
    close(higher, (-1.25 + 0.8) / 2)


def test_ppo_seq_mean_modes() -> None:
    # Tokens 1-2 in row 0, tokens 3-6 in row 1 (same per-token losses as above).
    adv_BT = f32([[1, 1, 0, 0], [-1, -1, 2, -1]])
    old_BT = torch.zeros(2, 4)
    logp_BT = f32([[LN(1.1), LN(1.5), 0, 0], [LN(0.5), LN(5.0), LN(0.5), LN(1.5)]])
    mask_BT = f32([[1, 1, 0, 0], [1, 1, 1, 1]])
    # row sums: -1.1 - 1.2 = -2.3;  0.8 + 3.0 - 1.0 + 1.5 = 4.3
    loss, _ = policy_loss_ppo(logp_BT, old_BT, adv_BT, mask_BT, agg_mode="seq-mean-token-sum")
    close(loss, (-2.3 + 4.3) / 2)
    loss, _ = policy_loss_ppo(logp_BT, old_BT, adv_BT, mask_BT, agg_mode="seq-mean-token-mean")
    close(loss, (-2.3 / 2 + 4.3 / 4) / 2)  # (-1.15 + 1.075) / 2 = -0.0375


def test_ppo_rejects_bad_settings() -> None:
    args = (_logprobs(), OLD, ADV, PPO_MASK)
    with pytest.raises(ValueError, match="clip_low"):
        policy_loss_ppo(*args, clip_low=1.0)
    with pytest.raises(ValueError, match="clip_high"):
        policy_loss_ppo(*args, clip_high=-0.1)
    with pytest.raises(ValueError, match="dual_clip_c"):
        policy_loss_ppo(*args, dual_clip_c=1.0)


# ------------------------------------------------------------------------- value loss

#   token  old   v     R     (v-R)^2   v_clip = old + clamp(v-old, +-0.2)   (v_clip-R)^2   max
#   1      1.0   1.1   2.0   0.81      1.1                                  0.81           0.81
#   2      1.0   1.5   2.0   0.25      1.2                                  0.64           0.64 (clip)
#   3      1.0   1.5   1.0   0.25      1.2                                  0.04           0.25
#   4      0.0  -1.0   2.0   9.0      -0.2                                  4.84           9.0
# plus a masked token with garbage.
V_OLD = f32([[1.0, 1.0, 1.0, 0.0, 7.0]])
V_RET = f32([[2.0, 2.0, 1.0, 2.0, -7.0]])
V_MASK = f32([[1, 1, 1, 1, 0]])


def test_value_loss_clipped_hand_values() -> None:
    v_BT = f32([[1.1, 1.5, 1.5, -1.0, 99.0]]).requires_grad_(True)
    loss, metrics = value_loss(v_BT, V_OLD, V_RET, V_MASK)
    # 0.5 * (0.81 + 0.64 + 0.25 + 9.0) / 4 = 0.5 * 10.7 / 4 = 1.3375
    close(loss, 1.3375)
    close(metrics["vf_clipfrac"], 0.25)
    loss.backward()
    # grad 0.5 * 2 (v - R) / 4 where the unclipped term wins, 0 where the clip wins:
    # [(1.1 - 2) / 4, 0, (1.5 - 1) / 4, (-1 - 2) / 4, 0]
    assert v_BT.grad is not None
    close(v_BT.grad, [[-0.225, 0, 0.125, -0.75, 0]])


def test_value_loss_unclipped() -> None:
    v_BT = f32([[1.1, 1.5, 1.5, -1.0, 99.0]])
    loss, metrics = value_loss(v_BT, V_OLD, V_RET, V_MASK, clip_range=None)
    # 0.5 * (0.81 + 0.25 + 0.25 + 9.0) / 4 = 0.5 * 10.31 / 4 = 1.28875
    close(loss, 1.28875)
    close(metrics["vf_clipfrac"], 0.0)


# ------------------------------------------------------------------------------- KL


def test_kl_estimators_hand_values() -> None:
    logp_BT = f32([[-1.0, -2.0, -0.3]])
    ref_BT = f32([[-1.5, -1.0, -0.3]])
    # d = ref - logp = [-0.5, 1.0, 0]
    close(kl_penalty(logp_BT, ref_BT, "k1"), [[0.5, -1.0, 0.0]])  # -d
    close(kl_penalty(logp_BT, ref_BT, "k2"), [[0.125, 0.5, 0.0]])  # d^2 / 2
    # exp(d) - d - 1: e^-0.5 + 0.5 - 1 = 0.1065307;  e - 2 = 0.7182818
    close(kl_penalty(logp_BT, ref_BT, "k3"), [[0.1065307, 0.7182818, 0.0]])
    with pytest.raises(ValueError, match="valid: k1, k2, k3"):
        kl_penalty(logp_BT, ref_BT, "k4")  # type: ignore[arg-type]


def test_kl_loss_k3_hand_value_and_gradient() -> None:
    logp_BT = f32([[-1.0, -2.0, float("nan")]]).requires_grad_(True)
    ref_BT = f32([[-1.5, -1.0, 0.0]])
    mask_BT = f32([[1, 1, 0]])
    loss = kl_loss(logp_BT, ref_BT, mask_BT)
    close(loss, (0.1065307 + 0.7182818) / 2)
    loss.backward()
    # d/dlogp (e^d - d - 1) with d = ref - logp: 1 - e^d
    # token 1: 1 - e^-0.5 = 0.3934693;  token 2: 1 - e = -1.7182818; both / 2
    assert logp_BT.grad is not None
    close(logp_BT.grad, [[0.3934693 / 2, -1.7182818 / 2, 0.0]])


def test_k3_past_the_threshold_is_its_tangent_so_one_token_cannot_dominate() -> None:
    c = 3.0
    # d = ref - logp: below c, at c, just past it, far past it, negative, masked garbage
    logp_BT = f32([[-1.0, -4.0, -4.5, -12.0, -0.5, float("nan")]]).requires_grad_(True)
    ref_BT = f32([[-0.5, -1.0, -1.0, -1.0, -2.0, 0.0]])
    mask_BT = f32([[1, 1, 1, 1, 1, 0]])
    exact = kl_penalty(logp_BT, ref_BT, "k3", mask_BT)
    kl = kl_penalty(logp_BT, ref_BT, "k3", mask_BT, k3_linear_above=c)
    k3_c, slope = math.exp(c) - c - 1, math.exp(c) - 1  # 16.0855, 19.0855
    # d <= c: exactly k3; d > c: k3(c) + slope * (d - c), far below exp(d) at d = 11
    close(kl[:, [0, 1, 4, 5]], exact[:, [0, 1, 4, 5]].tolist())
    close(kl[0, 2], k3_c + slope * 0.5)
    close(kl[0, 3], k3_c + slope * 8.0)
    assert exact[0, 3].item() > 5e4 and kl[0, 3].item() < 200
    kl.sum().backward()
    assert logp_BT.grad is not None
    # d/dlogp = -(dk3/dd): 1 - e^d up to c, then the constant -(e^c - 1)
    grads = [1 - math.exp(0.5), 1 - math.exp(3.0), -slope, -slope, 1 - math.exp(-1.5), 0]
    close(logp_BT.grad, [grads])
    # the loss path takes it too; a threshold past the +-20 clamp is the exact estimator
    close(kl_loss(logp_BT, ref_BT, mask_BT, k3_linear_above=c), kl.sum().item() / 5)
    close(kl_penalty(logp_BT, ref_BT, "k3", mask_BT, k3_linear_above=25.0), exact.tolist())
    for bad in (0.0, -1.0, math.nan):
        with pytest.raises(ValueError, match="k3_linear_above"):
            kl_penalty(logp_BT, ref_BT, "k3", mask_BT, k3_linear_above=bad)


def test_apply_kl_to_rewards_only_on_masked_tokens() -> None:
    rewards_BT = f32([[0, 0, 1.0]])
    kl_BT = f32([[0.5, -1.0, 0.2]]).requires_grad_(True)
    out = apply_kl_to_rewards(rewards_BT, kl_BT, f32([[0, 1, 1]]), beta=0.1)
    # [0 (masked: untouched), 0 - 0.1 * (-1.0), 1 - 0.1 * 0.2] = [0, 0.1, 0.98]
    close(out, [[0.0, 0.1, 0.98]])
    assert not out.requires_grad
    with pytest.raises(ValueError, match="beta"):
        apply_kl_to_rewards(rewards_BT, kl_BT, f32([[0, 1, 1]]), beta=-1.0)


# --------------------------------------------------------------------------- entropy


def test_entropy_from_logits_hand_values() -> None:
    logits_BTV = f32(
        [
            [[0, 0, -1e9, -1e9], [0, 0, 0, 0]],
            [
                [0, LN(3), -float("inf"), -float("inf")],
                [5, -float("inf"), -float("inf"), -float("inf")],
            ],
        ]
    )
    # [1/2, 1/2]: ln 2 = 0.6931472;  uniform over 4: ln 4 = 1.3862944;
    # [1/4, 3/4]: 1/4 ln 4 + 3/4 ln(4/3) = 0.3465736 + 0.2157616 = 0.5623351;  one-hot: 0
    expected = [[0.6931472, 1.3862944], [0.5623351, 0.0]]
    for chunk in (None, 1, 3):
        close(entropy_from_logits(logits_BTV, chunk_size=chunk), expected)
    # With a mask, only masked positions are computed; the rest are 0.
    mask_BT = f32([[0, 1], [1, 0]])
    close(entropy_from_logits(logits_BTV, 1, mask_BT), [[0.0, 1.3862944], [0.5623351, 0.0]])
    close(entropy_from_logits(logits_BTV, None, mask_BT * 0), [[0.0, 0.0], [0.0, 0.0]])


def test_entropy_gradient_is_finite_with_minus_inf_logits() -> None:
    logits_BTV = f32([[[0, LN(3), -float("inf")]]]).requires_grad_(True)
    entropy_from_logits(logits_BTV, chunk_size=1).sum().backward()
    assert logits_BTV.grad is not None
    assert torch.isfinite(logits_BTV.grad).all()
    # dH/dl_i = -p_i (ln p_i + H): p = [1/4, 3/4], H = 0.5623351
    # -0.25 * (ln 0.25 + 0.5623351) = 0.2059868;  -0.75 * (ln 0.75 + 0.5623351) = -0.2059868
    close(logits_BTV.grad, [[[0.2059868, -0.2059868, 0.0]]])


def test_entropy_bonus_is_the_masked_aggregate() -> None:
    entropy_BT = f32([[1.0, 2.0, 100.0], [3.0, float("nan"), 5.0]])
    mask_BT = f32([[1, 1, 0], [1, 0, 1]])
    close(entropy_bonus(entropy_BT, mask_BT), (1 + 2 + 3 + 5) / 4)
    close(entropy_bonus(entropy_BT, mask_BT, "seq-mean-token-mean"), (1.5 + 4.0) / 2)


# ------------------------------------------------------------------------- properties

B, T, V = 6, 7, 5


def _random_batch(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    mask_BT = (torch.rand(B, T, generator=g) < 0.6).float()
    mask_BT[0, 2] = 1.0  # at least one token in the first micro-batch
    mask_BT[3] = 0.0  # an empty row
    return {
        "mask": mask_BT,
        "logp": torch.randn(B, T, generator=g) * 0.3 - 1.0,
        "old": torch.randn(B, T, generator=g) * 0.3 - 1.0,
        "ref": torch.randn(B, T, generator=g) * 0.3 - 1.0,
        "adv": torch.randn(B, T, generator=g),
        "values": torch.randn(B, T, generator=g),
        "old_values": torch.randn(B, T, generator=g),
        "returns": torch.randn(B, T, generator=g),
        "logits": torch.randn(B, T, V, generator=g),
    }


# Each: (batch, param tensor with grad, mode) -> scalar loss; the param is the tensor
# that carries the gradient (log-probs, values or logits).
LossFn = Callable[[dict[str, torch.Tensor], torch.Tensor, AggMode], torch.Tensor]
LOSSES: dict[str, tuple[str, LossFn]] = {
    "ppo": (
        "logp",
        lambda d, p, m: policy_loss_ppo(p, d["old"], d["adv"], d["mask"], agg_mode=m)[0],
    ),
    "ppo_clip_higher_no_dual": (
        "logp",
        lambda d, p, m: policy_loss_ppo(
            p, d["old"], d["adv"], d["mask"], clip_high=0.28, dual_clip_c=None, agg_mode=m
        )[0],
    ),
    "value": (
        "values",
        lambda d, p, m: value_loss(p, d["old_values"], d["returns"], d["mask"], agg_mode=m)[0],
    ),
    "kl_k3": ("logp", lambda d, p, m: kl_loss(p, d["ref"], d["mask"], "k3", m)),
    "entropy": (
        "logits",
        lambda d, p, m: entropy_bonus(entropy_from_logits(p, 2, d["mask"]), d["mask"], m),
    ),
}
MASKED_INPUTS = ["logp", "old", "ref", "adv", "values", "old_values", "returns", "logits"]


@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("name", sorted(LOSSES))
def test_anything_at_mask_zero_changes_nothing(name: str, mode: AggMode) -> None:
    """Garbage (random, huge, NaN) at mask 0 in ANY input: same loss, same gradient."""
    param_key, fn = LOSSES[name]
    d = _random_batch(seed=0)
    base_p = d[param_key].clone().requires_grad_(True)
    base = fn(d, base_p, mode)
    base.backward()
    off_BT = d["mask"] == 0
    for fill in (float("nan"), 1e4, -1e4):
        dirty = dict(d)
        for key in MASKED_INPUTS:
            x = d[key]
            off = off_BT[..., None].expand_as(x) if x.dim() == 3 else off_BT
            dirty[key] = torch.where(off, torch.full_like(x, fill), x)
        p = dirty[param_key].clone().requires_grad_(True)
        loss = fn(dirty, p, mode)
        loss.backward()
        torch.testing.assert_close(loss, base)
        assert p.grad is not None and base_p.grad is not None
        torch.testing.assert_close(p.grad, base_p.grad)
    assert base_p.grad is not None
    grad_off = base_p.grad[off_BT]
    assert torch.equal(grad_off, torch.zeros_like(grad_off))  # no gradient leaks to mask 0
    assert base_p.grad.abs().sum() > 0  # and the test is not vacuous


@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("name", sorted(LOSSES))
def test_micro_batches_give_the_full_batch_gradient(name: str, mode: AggMode) -> None:
    """Split rows 0-1 | 2-5, scale each micro-batch loss by its share of the denominator
    (token count for token-mean, non-empty row count for seq-mean), sum the gradients."""
    param_key, fn = LOSSES[name]
    d = _random_batch(seed=1)
    full_p = d[param_key].clone().requires_grad_(True)
    fn(d, full_p, mode).backward()

    total = aggregation_weight(d["mask"], mode)
    acc_p = d[param_key].clone().requires_grad_(True)
    naive_p = d[param_key].clone().requires_grad_(True)
    for rows in (slice(0, 2), slice(2, B)):
        mb = {k: v[rows] for k, v in d.items()}
        share = aggregation_weight(mb["mask"], mode) / total
        (fn(mb, acc_p[rows], mode) * share).backward()
        (fn(mb, naive_p[rows], mode) / 2).backward()  # plain average: wrong weights

    assert full_p.grad is not None and acc_p.grad is not None and naive_p.grad is not None
    torch.testing.assert_close(acc_p.grad, full_p.grad)
    # The test has teeth: averaging micro-batch losses equally gives another gradient.
    assert not torch.allclose(naive_p.grad, full_p.grad, atol=1e-4)


def test_explained_variance_over_masked_tokens() -> None:
    ret = torch.tensor([[1.0, 2.0, 3.0, 99.0], [4.0, 5.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    # perfect values explain all of it; the masked-out 99 is never read
    assert explained_variance(ret.clone(), ret, mask) == pytest.approx(1.0)
    # the returns' mean everywhere explains nothing
    assert explained_variance(torch.full_like(ret, 3.0), ret, mask) == pytest.approx(0.0)
    # a constant offset still explains all of the variance (variance ignores the mean)
    assert explained_variance(ret + 7.0, ret, mask) == pytest.approx(1.0)
    # values moving against the returns do worse than the mean: Var(2R - 6) = 4 Var(R) -> -3
    assert explained_variance(6.0 - ret, ret, mask) == pytest.approx(-3.0)
    assert explained_variance(ret, torch.ones_like(ret), mask) is None  # nothing to explain
    assert explained_variance(ret, ret, torch.zeros_like(mask)) is None
