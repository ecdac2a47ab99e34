"""On-policy, the run report's "log-probs before the update" of the logged rows come from
the update's own first forward (`LogprobTap`), not from a forward of their own."""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch

from agentr1.config import AlgoConfig, OptimConfig
from agentr1.trainer.logprobs import token_logprobs
from agentr1.trainer.tokenlog import before_from_tap
from agentr1.trainer.update import Learner, LogprobTap, UpdateBatch, rl_update
from tests.tiny_models import tiny_llama


def _batch() -> UpdateBatch:
    ids = torch.tensor(
        [[5, 6, 7, 8, 9, 10, 0], [5, 6, 11, 12, 13, 14, 15], [7, 8, 9, 3, 4, 0, 0], [9] * 7]
    )
    attn = (ids != 0).long()
    attn[3] = 1
    mask = torch.zeros(ids.shape)
    mask[:, 3:] = 1
    mask = mask * attn
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])[:, None] * mask
    return UpdateBatch(ids, attn, mask, adv, None)  # on-policy: no old log-probs


def test_the_update_hands_back_the_logged_rows_logprobs_before_its_step() -> None:
    model = tiny_llama()
    ub = _batch()
    with torch.no_grad():
        before, _ = token_logprobs(model, ub.input_ids_BT, ub.attention_mask_BT, ub.loss_mask_BT)
    tap = LogprobTap({0, 2})
    learner = Learner(model, torch.optim.SGD(model.parameters(), lr=1.0))
    optim = OptimConfig(micro_batch_size=1)  # four passes, rows trimmed to their length
    rl_update(learner, ub, AlgoConfig(), optim, 1.0, torch.Generator().manual_seed(0), tap=tap)
    assert sorted(tap.got) == [0, 2]
    for r in (0, 2):
        assert tap.got[r].shape == (7,)
        # the same log-probs up to float rounding (rows batched differently: a couple of
        # ulps of a log-prob near -9 on some CPUs' kernels)
        torch.testing.assert_close(tap.got[r], before[r] * ub.loss_mask_BT[r], atol=1e-6, rtol=1e-6)
    with torch.no_grad():
        after, _ = token_logprobs(model, ub.input_ids_BT, ub.attention_mask_BT, ub.loss_mask_BT)
    assert not torch.allclose(after[0], before[0], atol=1e-4)  # the step did move the policy


def test_only_the_first_minibatch_is_before_any_step() -> None:
    model = tiny_llama()
    ub = _batch()
    tap = LogprobTap({0, 1, 2, 3})
    learner = Learner(model, torch.optim.SGD(model.parameters(), lr=1.0))
    optim = OptimConfig(minibatches=2, micro_batch_size=1)
    gen = torch.Generator().manual_seed(0)
    first = torch.randperm(4, generator=torch.Generator().manual_seed(0)).chunk(2)[0]
    rl_update(learner, ub, AlgoConfig(), optim, 1.0, gen, tap=tap)
    assert sorted(tap.got) == sorted(first.tolist())


def test_rows_the_update_did_not_run_are_computed_or_left_unknown() -> None:
    """A logged row missing from the tap: a forward of its own when the weights are as
    they were, NaN (shown as no value) when they changed."""
    model = tiny_llama()
    ub = _batch()
    cfg = SimpleNamespace(
        train=SimpleNamespace(log_trajectories=1),
        rollout=SimpleNamespace(temperature=1.0),
        model=SimpleNamespace(compute_dtype="float32"),
    )
    s = SimpleNamespace(setup=SimpleNamespace(cfg=cfg, policy=model))
    batch = SimpleNamespace(
        group_index_B=torch.tensor([0, 0, 1, 1]),
        input_ids_BT=ub.input_ids_BT,
        attention_mask_BT=ub.attention_mask_BT,
    )
    tap = LogprobTap({0, 1}, got={0: torch.full((7,), -0.5)})
    changed = before_from_tap(s, batch, tap, ub.loss_mask_BT, weights_changed=True)  # type: ignore[arg-type]
    assert changed.shape == (2, 7) and torch.equal(changed[0], torch.full((7,), -0.5))
    assert all(math.isnan(v) for v in changed[1].tolist())
    same = before_from_tap(s, batch, tap, ub.loss_mask_BT, weights_changed=False)  # type: ignore[arg-type]
    with torch.no_grad():
        ref, _ = token_logprobs(
            model, ub.input_ids_BT[1:2], ub.attention_mask_BT[1:2], ub.loss_mask_BT[1:2]
        )
    torch.testing.assert_close(same[1], ref[0], atol=1e-6, rtol=0)
