"""Advantage estimators and the name registry, against values computed by hand.

Notation: B = batch rows, T = tokens. Arithmetic for every expected number is in the
comments next to it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

from agentr1.algorithms import (
    AdvantageConfig,
    AdvantageInputs,
    AdvantageOutput,
    Registry,
    UnknownNameError,
    advantage_names,
    compute_advantages,
    dr_grpo,
    gae,
    get_advantage,
    grpo,
    register_advantage,
    reinforce_plus_plus,
    reinforce_plus_plus_baseline,
    rloo,
)

ALL = [
    "dr_grpo",
    "gae",
    "grpo",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "rloo",
]


def f32(rows: list[list[float]] | list[float]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


def idx(ids: list[int]) -> torch.Tensor:
    return torch.tensor(ids, dtype=torch.long)


def close(actual: torch.Tensor, expected: list[list[float]] | list[float]) -> None:
    torch.testing.assert_close(actual, f32(expected), rtol=0, atol=1e-5)


def run(
    name: str,
    rewards_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    group_B: torch.Tensor,
    values_BT: torch.Tensor | None = None,
    **cfg: float | bool,
) -> AdvantageOutput:
    inputs = AdvantageInputs(rewards_BT, mask_BT, group_B, values_BT)
    return get_advantage(name)(inputs, AdvantageConfig(estimator=name, **cfg))  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- registry


def test_registry_lists_the_six_estimators_sorted() -> None:
    assert advantage_names() == ALL
    assert get_advantage("grpo") is grpo
    assert get_advantage("gae") is gae
    assert get_advantage("rloo") is rloo


def test_registry_rejects_duplicates_and_keeps_the_first() -> None:
    reg: Registry[Callable[[], int]] = Registry("thing")

    @reg.register("a")
    def first() -> int:
        return 1

    with pytest.raises(ValueError, match="'a' is already registered"):

        @reg.register("a")
        def second() -> int:
            return 2

    assert reg.get("a") is first
    with pytest.raises(ValueError, match="already registered"):
        register_advantage("grpo")(dr_grpo)
    assert get_advantage("grpo") is grpo
    with pytest.raises(ValueError, match="non-empty"):
        reg.register("")


def test_registry_unknown_name_lists_valid_names_sorted() -> None:
    with pytest.raises(UnknownNameError) as info:
        get_advantage("ppo")
    assert str(info.value) == (
        "unknown advantage estimator 'ppo'; valid: dr_grpo, gae, grpo, "
        "reinforce_plus_plus, reinforce_plus_plus_baseline, rloo, or an import path such as "
        "'my_pkg.module:name' or a file 'my_file.py:name'"
    )
    # Catchable as either kind of error.
    assert isinstance(info.value, KeyError)
    assert isinstance(info.value, ValueError)
    empty: Registry[Callable[[], int]] = Registry("thing")
    with pytest.raises(KeyError, match=r"valid: \(none registered\)"):
        empty.get("x")


def test_config_validates_with_reasons() -> None:
    with pytest.raises(ValueError, match="valid: dr_grpo, gae"):
        AdvantageConfig(estimator="ppo")
    with pytest.raises(ValueError, match="gamma"):
        AdvantageConfig(gamma=1.5)
    with pytest.raises(ValueError, match="lam"):
        AdvantageConfig(lam=-0.1)
    with pytest.raises(ValueError, match="eps"):
        AdvantageConfig(eps=0.0)


def test_inputs_validate_shapes() -> None:
    with pytest.raises(ValueError, match="loss_mask_BT shape"):
        AdvantageInputs(torch.zeros(2, 3), torch.zeros(2, 4), idx([0, 0]))
    with pytest.raises(ValueError, match="group_index_B"):
        AdvantageInputs(torch.zeros(2, 3), torch.zeros(2, 3), idx([0, 0, 1]))
    with pytest.raises(ValueError, match="values_BT"):
        AdvantageInputs(torch.zeros(2, 3), torch.zeros(2, 3), idx([0, 0]), torch.zeros(2, 2))
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        AdvantageInputs(torch.zeros(3), torch.zeros(3), idx([0, 0, 0]))


def test_one_line_dispatch_equals_direct_call() -> None:
    rewards_BT = f32([[0, 1], [0, 3]])
    mask_BT = f32([[1, 1], [1, 1]])
    inputs = AdvantageInputs(rewards_BT, mask_BT, idx([0, 0]))
    cfg = AdvantageConfig(estimator="rloo")
    torch.testing.assert_close(
        compute_advantages(inputs, cfg).advantages_BT, rloo(inputs, cfg).advantages_BT
    )


# ------------------------------------------------------------ group-based estimators

# Six rows, T = 4, groups by id (not contiguous): 7 -> rows 0, 1, 3; 3 -> row 2 alone;
# 9 -> rows 4, 5 with equal rewards. Row 5 has no agent token at all.
GROUP_MASK = f32(
    [
        [0, 1, 1, 1],
        [0, 1, 1, 0],
        [0, 1, 1, 1],
        [0, 0, 1, 1],
        [0, 1, 1, 1],
        [0, 0, 0, 0],
    ]
)
GROUP_REWARDS = f32(
    [
        [0, 0.5, 0, 0.5],  # process 0.5 + outcome 0.5: score 1
        [0, 0, 2, 0],  # score 2
        [0, 0, 0, 5],  # score 5, alone in its group
        [0, 0, 1, 5],  # score 6
        [0, 0, 0, 0.3],  # score 0.3
        [0, 0, 0, 0.3],  # score 0.3 (no agent tokens: counts in the group, trains nothing)
    ]
)
GROUP_IDS = idx([7, 7, 3, 7, 9, 9])
SQRT7 = math.sqrt(7.0)


def test_grpo_hand_values() -> None:
    out = run("grpo", GROUP_REWARDS, GROUP_MASK, GROUP_IDS)
    # Group 7: scores 1, 2, 6; mean 3; deviations -2, -1, 3;
    # unbiased var (4 + 1 + 9) / 2 = 7, std sqrt(7) = 2.6457513.
    # A = -2/sqrt7 = -0.7559289, -1/sqrt7 = -0.3779645, 3/sqrt7 = 1.1338934 (eps 1e-6 < atol)
    a0, a1, a3 = -2 / SQRT7, -1 / SQRT7, 3 / SQRT7
    close(
        out.advantages_BT,
        [
            [0, a0, a0, a0],
            [0, a1, a1, 0],
            [0, 0, 0, 0],  # group of one: 5 - 5 = 0
            [0, 0, a3, a3],
            [0, 0, 0, 0],  # equal rewards: 0.3 - 0.3 = 0, exactly, no NaN
            [0, 0, 0, 0],  # no agent tokens
        ],
    )
    # Returns: the row's total reward on its agent tokens.
    close(
        out.returns_BT,
        [[0, 1, 1, 1], [0, 2, 2, 0], [0, 5, 5, 5], [0, 0, 6, 6], [0, 0.3, 0.3, 0.3], [0] * 4],
    )


def test_grpo_without_std_and_dr_grpo_are_centred_rewards() -> None:
    # Group 7: 1 - 3 = -2, 2 - 3 = -1, 6 - 3 = 3; others 0.
    expected = [
        [0, -2, -2, -2],
        [0, -1, -1, 0],
        [0, 0, 0, 0],
        [0, 0, 3, 3],
        [0, 0, 0, 0],
        [0, 0, 0, 0],
    ]
    close(
        run("grpo", GROUP_REWARDS, GROUP_MASK, GROUP_IDS, norm_by_std=False).advantages_BT, expected
    )
    # Dr. GRPO never divides by the std, whatever norm_by_std says.
    close(
        run("dr_grpo", GROUP_REWARDS, GROUP_MASK, GROUP_IDS, norm_by_std=True).advantages_BT,
        expected,
    )


def test_rloo_hand_values() -> None:
    out = run("rloo", GROUP_REWARDS, GROUP_MASK, GROUP_IDS)
    # Leave-one-out in group 7 (scores 1, 2, 6):
    #   1 - (2 + 6) / 2 = -3;  2 - (1 + 6) / 2 = -1.5;  6 - (1 + 2) / 2 = 4.5
    # (= 3/2 * (-2, -1, 3)). Group of one -> 0; equal rewards -> 0.
    close(
        out.advantages_BT,
        [
            [0, -3, -3, -3],
            [0, -1.5, -1.5, 0],
            [0, 0, 0, 0],
            [0, 0, 4.5, 4.5],
            [0, 0, 0, 0],
            [0, 0, 0, 0],
        ],
    )


def test_reinforce_plus_plus_baseline_hand_values() -> None:
    rewards_BT = f32([[0, 0, 3], [0, 1, 0], [0, 4, 0]])
    mask_BT = f32([[0, 1, 1], [0, 1, 0], [0, 1, 0]])
    out = run("reinforce_plus_plus_baseline", rewards_BT, mask_BT, idx([0, 0, 1]))
    # Group 0: scores 3, 1 -> centred +1, -1; group 1 (alone): 4 - 4 = 0.
    # Masked tokens: [1, 1, -1, 0]; mean 0.25; deviations 0.75, 0.75, -1.25, -0.25;
    # squares sum 0.5625 + 0.5625 + 1.5625 + 0.0625 = 2.75; var 2.75 / 3; std 0.9574271.
    # A = 0.75 / 0.9574271 = 0.7833495, -1.25 / 0.9574271 = -1.3055824,
    #     -0.25 / 0.9574271 = -0.2611165 (the group of one is re-centred by the whitening).
    close(
        out.advantages_BT,
        [[0, 0.7833495, 0.7833495], [0, -1.3055824, 0], [0, -0.2611165, 0]],
    )
    close(out.returns_BT, [[0, 3, 3], [0, 1, 0], [0, 4, 0]])


def test_outcome_estimators_use_the_whole_row_sum() -> None:
    # A reward at a mask-0 position is not lost: the row sum counts it.
    mask_BT = f32([[1, 1, 0], [1, 1, 0]])
    on_agent = run("grpo", f32([[0, 1, 0], [0, 0, 0]]), mask_BT, idx([0, 0]))
    on_glue = run("grpo", f32([[0, 0, 1], [0, 0, 0]]), mask_BT, idx([0, 0]))
    torch.testing.assert_close(on_agent.advantages_BT, on_glue.advantages_BT)
    # scores 1, 0: mean 0.5, std sqrt(0.5) = 0.7071068 -> A = +-0.5 / 0.7071068 = +-0.7071068
    close(on_glue.advantages_BT, [[0.7071068, 0.7071068, 0], [-0.7071068, -0.7071068, 0]])


# ------------------------------------------------------------------- REINFORCE++


def test_reinforce_plus_plus_hand_values_skip_the_tool_gap() -> None:
    # Row 0: agent tokens at 1, 2 | tool token 3 | agent token 4.  gamma = 0.5.
    # Row 1: agent tokens at 1, 2, 3; pad at 4.
    rewards_BT = f32([[0, 0, 0.5, 0, 1.0], [0, 0, 0, 2.0, 0]])
    mask_BT = f32([[0, 1, 1, 0, 1], [0, 1, 1, 1, 0]])
    out = run("reinforce_plus_plus", rewards_BT, mask_BT, idx([0, 1]), gamma=0.5)
    # Row 0 return-to-go (the tool token neither discounts nor resets):
    #   G4 = 1.0;  G2 = 0.5 + 0.5 * 1.0 = 1.0;  G1 = 0 + 0.5 * 1.0 = 0.5
    # Row 1: G3 = 2.0;  G2 = 0.5 * 2 = 1.0;  G1 = 0.5 * 1 = 0.5
    close(out.returns_BT, [[0, 0.5, 1.0, 0, 1.0], [0, 0.5, 1.0, 2.0, 0]])
    # Whitening over the six masked tokens [0.5, 1, 1, 0.5, 1, 2]: mean 1.0;
    # deviations -0.5, 0, 0, -0.5, 0, 1; squares 1.5; var 1.5 / 5 = 0.3; std 0.5477226.
    # A = -0.5 / 0.5477226 = -0.9128709, 0, 1 / 0.5477226 = 1.8257419
    close(
        out.advantages_BT,
        [[0, -0.9128709, 0, 0, 0], [0, -0.9128709, 0, 1.8257419, 0]],
    )


# --------------------------------------------------------------------------- GAE

# One row: prompt | turn 1 (tokens 1, 2) | tool response (3, 4) | turn 2 (token 5) | pad.
GAE_MASK = f32([[0, 1, 1, 0, 0, 1, 0]])
GAE_REWARDS = f32([[0, 0, 0.5, 0, 0, 1.0, 0]])
GAE_VALUES = f32([[9, 1.0, 2.0, 99, 99, 3.0, 99]])  # 9 / 99 sit at mask 0: never read


def test_gae_hand_values_bootstrap_across_the_tool_response() -> None:
    out = run(
        "gae", GAE_REWARDS, GAE_MASK, idx([0]), GAE_VALUES, gamma=0.9, lam=0.8, gae_whiten=False
    )
    # Agent tokens in order: t1 (V=1), t2 (V=2, r=0.5), t5 (V=3, r=1); gamma*lam = 0.72.
    # t5: delta = 1.0 + 0.9 * 0 - 3.0 = -2.0                  A5 = -2.0
    # t2: delta = 0.5 + 0.9 * 3.0 - 2.0 = 1.2  (next value: t5, not the tool token)
    #     A2 = 1.2 + 0.72 * (-2.0) = -0.24
    # t1: delta = 0 + 0.9 * 2.0 - 1.0 = 0.8      A1 = 0.8 + 0.72 * (-0.24) = 0.6272
    close(out.advantages_BT, [[0, 0.6272, -0.24, 0, 0, -2.0, 0]])
    # Returns = A + V: 1.6272, 1.76, 1.0
    close(out.returns_BT, [[0, 1.6272, 1.76, 0, 0, 1.0, 0]])


def test_gae_whitening_hand_values() -> None:
    out = run("gae", GAE_REWARDS, GAE_MASK, idx([0]), GAE_VALUES, gamma=0.9, lam=0.8)
    # Raw [0.6272, -0.24, -2.0]: mean -0.5376; deviations 1.1648, 0.2976, -1.4624;
    # var (1.35675904 + 0.08856576 + 2.13861376) / 2 = 1.79196928; std 1.3386446.
    # A = 1.1648 / 1.3386446 = 0.8701332, 0.2223143, -1.0924475
    close(out.advantages_BT, [[0, 0.8701332, 0.2223143, 0, 0, -1.0924475, 0]])
    close(out.returns_BT, [[0, 1.6272, 1.76, 0, 0, 1.0, 0]])  # returns are not whitened


def test_gae_gamma_lam_one_is_return_minus_value() -> None:
    out = run("gae", GAE_REWARDS, GAE_MASK, idx([0]), GAE_VALUES, gae_whiten=False)
    # gamma = lam = 1: A_t = (sum of rewards from t on) - V_t:
    # t1: 1.5 - 1 = 0.5;  t2: 1.5 - 2 = -0.5;  t5: 1.0 - 3 = -2.0
    close(out.advantages_BT, [[0, 0.5, -0.5, 0, 0, -2.0, 0]])


def test_gae_needs_values() -> None:
    with pytest.raises(ValueError, match="values_BT"):
        run("gae", GAE_REWARDS, GAE_MASK, idx([0]))


def _reference_gae(
    rewards: list[float], values: list[float], gamma: float, lam: float
) -> list[float]:
    """Textbook GAE on a gap-free list of agent tokens."""
    out = [0.0] * len(rewards)
    next_value, next_adv = 0.0, 0.0
    for t in reversed(range(len(rewards))):
        delta = rewards[t] + gamma * next_value - values[t]
        next_adv = delta + gamma * lam * next_adv
        next_value = values[t]
        out[t] = next_adv
    return out


def _random_gapped_batch(
    seed: int, B: int = 4, T: int = 24
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows of prompt | turn | tool response | turn | ... | pad, rewards on agent tokens."""
    g = torch.Generator().manual_seed(seed)
    mask_BT = torch.zeros(B, T)
    for b in range(B):
        t = int(torch.randint(1, 4, (1,), generator=g))  # prompt
        while t < T:
            turn = int(torch.randint(1, 5, (1,), generator=g))
            mask_BT[b, t : t + turn] = 1
            t += turn + int(torch.randint(1, 5, (1,), generator=g))  # tool response
    mask_BT[-1] = 0  # one row with no agent token
    rewards_BT = torch.randn(B, T, generator=g) * mask_BT
    values_BT = torch.randn(B, T, generator=g)
    return rewards_BT, mask_BT, values_BT


def test_gae_matches_textbook_gae_with_the_gaps_removed() -> None:
    """The advantage-mask property: gaps behave as if their tokens were not there."""
    rewards_BT, mask_BT, values_BT = _random_gapped_batch(seed=0)
    out = run(
        "gae", rewards_BT, mask_BT, idx([0, 0, 1, 1]), values_BT, gamma=0.95, lam=0.9,
        gae_whiten=False,
    )  # fmt: skip
    for b in range(rewards_BT.shape[0]):
        keep = mask_BT[b] > 0
        expected = _reference_gae(
            rewards_BT[b][keep].tolist(), values_BT[b][keep].tolist(), 0.95, 0.9
        )
        close(out.advantages_BT[b][keep], expected)
        assert torch.all(out.advantages_BT[b][~keep] == 0)
        close(
            out.returns_BT[b][keep],
            [a + v for a, v in zip(expected, values_BT[b][keep].tolist(), strict=True)],
        )


@pytest.mark.parametrize("name", ["gae", "reinforce_plus_plus"])
def test_gap_tokens_removed_gives_the_same_advantages(name: str) -> None:
    """Same batch, once with tool-response gaps and once compacted: equal at agent tokens
    (whitening on: it runs over the same set of tokens)."""
    rewards_BT, mask_BT, values_BT = _random_gapped_batch(seed=1)
    B, T = mask_BT.shape
    compact = [torch.zeros(B, T) for _ in range(3)]
    for b in range(B):
        keep = mask_BT[b] > 0
        n = int(keep.sum())
        for dst, src in zip(compact, (rewards_BT, mask_BT, values_BT), strict=True):
            dst[b, 1 : 1 + n] = src[b][keep]  # one prompt token, then the agent tokens
    groups = idx([0, 0, 1, 1])
    gapped = run(name, rewards_BT, mask_BT, groups, values_BT, gamma=0.9, lam=0.7)
    packed = run(name, compact[0], compact[1], groups, compact[2], gamma=0.9, lam=0.7)
    for b in range(B):
        keep = mask_BT[b] > 0
        n = int(keep.sum())
        torch.testing.assert_close(
            gapped.advantages_BT[b][keep], packed.advantages_BT[b, 1 : 1 + n]
        )
        torch.testing.assert_close(gapped.returns_BT[b][keep], packed.returns_BT[b, 1 : 1 + n])


@pytest.mark.parametrize("name", ["gae", "reinforce_plus_plus"])
def test_rewards_at_mask_zero_are_credited_to_the_preceding_agent_token(name: str) -> None:
    values_BT = GAE_VALUES
    kwargs: dict[str, float | bool] = {"gamma": 0.9, "lam": 0.8}

    def adv(rewards: list[float]) -> torch.Tensor:
        return run(name, f32([rewards]), GAE_MASK, idx([0]), values_BT, **kwargs).advantages_BT

    # In the tool response (token 3) == on the last token of turn 1 (token 2).
    torch.testing.assert_close(adv([0, 0, 0, 0.7, 0, 1, 0]), adv([0, 0, 0.7, 0, 0, 1, 0]))
    # After the last agent token (pad at 6) == on the last agent token (5).
    torch.testing.assert_close(adv([0, 0, 0, 0, 0, 1, 0.7]), adv([0, 0, 0, 0, 0, 1.7, 0]))
    # In the prompt (token 0): nothing precedes, so the first agent token (1).
    torch.testing.assert_close(adv([0.7, 0, 0, 0, 0, 1, 0]), adv([0, 0.7, 0, 0, 0, 1, 0]))
    # And it matters (the test can fail): moving a reward across a turn changes things.
    assert not torch.allclose(adv([0, 0, 0, 0.7, 0, 1, 0]), adv([0, 0, 0, 0, 0, 1.7, 0]))


# ------------------------------------------------------------- properties, all estimators


@pytest.mark.parametrize("name", ALL)
def test_values_at_mask_zero_change_nothing(name: str) -> None:
    rewards_BT, mask_BT, values_BT = _random_gapped_batch(seed=2)
    groups = idx([0, 0, 1, 1])
    base = run(name, rewards_BT, mask_BT, groups, values_BT, gamma=0.9, lam=0.8)
    garbage_BT = torch.where(mask_BT > 0, values_BT, torch.full_like(values_BT, float("nan")))
    moved_BT = torch.where(mask_BT > 0, values_BT, torch.randn_like(values_BT) * 100)
    for v_BT in (garbage_BT, moved_BT):
        out = run(name, rewards_BT, mask_BT, groups, v_BT, gamma=0.9, lam=0.8)
        torch.testing.assert_close(out.advantages_BT, base.advantages_BT)
        torch.testing.assert_close(out.returns_BT, base.returns_BT)


@pytest.mark.parametrize("name", ALL)
def test_outputs_are_zero_at_mask_zero_and_finite(name: str) -> None:
    rewards_BT, mask_BT, values_BT = _random_gapped_batch(seed=3)
    out = run(name, rewards_BT, mask_BT, idx([0, 1, 1, 1]), values_BT)
    for x_BT in (out.advantages_BT, out.returns_BT):
        assert x_BT.dtype == torch.float32
        assert torch.isfinite(x_BT).all()
        assert torch.all(x_BT[mask_BT == 0] == 0)
    assert torch.all(out.advantages_BT[-1] == 0)  # the row with no agent token
    assert (out.advantages_BT[mask_BT > 0] != 0).any()  # and not trivially zero


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    "name", ["grpo", "dr_grpo", "rloo", "reinforce_plus_plus_baseline", "reinforce_plus_plus"]
)
def test_equal_rewards_give_exactly_zero(name: str, dtype: torch.dtype) -> None:
    # In float64, 3 x 0.1, 10 x 0.3 and 3 x 0.7 have a naive mean one ulp off the value;
    # the eps-division would turn that noise into a non-zero advantage.
    sizes, values = [3, 10, 3], [0.1, 0.3, 0.7]
    if name == "reinforce_plus_plus":  # batch-level statistics: one value for the batch
        values = [0.1, 0.1, 0.1]
    B, T = sum(sizes), 4
    rewards_BT = torch.zeros(B, T, dtype=dtype)
    rewards_BT[:, -1] = torch.tensor(
        [v for n, v in zip(sizes, values, strict=True) for _ in range(n)], dtype=dtype
    )
    groups = idx([g for g, n in enumerate(sizes) for _ in range(n)])
    out = run(name, rewards_BT, torch.ones(B, T), groups)
    assert torch.equal(out.advantages_BT, torch.zeros(B, T))


@pytest.mark.parametrize("name", ALL)
def test_empty_mask_gives_zeros_not_nan(name: str) -> None:
    out = run(name, f32([[0, 1], [0, 2]]), torch.zeros(2, 2), idx([0, 0]), torch.ones(2, 2))
    assert torch.equal(out.advantages_BT, torch.zeros(2, 2))
    assert torch.equal(out.returns_BT, torch.zeros(2, 2))


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_group_of_one_gives_zero(name: str) -> None:
    out = run(name, f32([[0, 4], [0, -3]]), torch.ones(2, 2), idx([0, 1]))
    assert torch.equal(out.advantages_BT, torch.zeros(2, 2))


@pytest.mark.parametrize("name", ALL)
def test_outputs_carry_no_graph(name: str) -> None:
    values_BT = torch.randn(2, 3, requires_grad=True)
    rewards_BT = torch.randn(2, 3, requires_grad=True)
    out = run(name, rewards_BT, torch.ones(2, 3), idx([0, 0]), values_BT)
    assert not out.advantages_BT.requires_grad
    assert not out.returns_BT.requires_grad


def test_estimators_direct_calls_share_one_signature() -> None:
    inputs = AdvantageInputs(
        f32([[0, 1], [0, 0]]), torch.ones(2, 2), idx([0, 0]), torch.zeros(2, 2)
    )
    for fn in (gae, grpo, dr_grpo, reinforce_plus_plus, reinforce_plus_plus_baseline, rloo):
        out = fn(inputs, AdvantageConfig())
        assert isinstance(out, AdvantageOutput)
        assert out.advantages_BT.shape == (2, 2)
