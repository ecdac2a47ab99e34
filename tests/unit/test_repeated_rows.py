"""Rows that repeat another are computed once (`agentr1.trainer.logprobs.distinct_rows`):
log-probs, entropies, gradients and whole updates are those of computing every row."""

from __future__ import annotations

import pytest
import torch

from agentr1.config import AlgoConfig, OptimConfig
from agentr1.trainer import logprobs
from agentr1.trainer.logprobs import micro_batches, sorted_token_logprobs, token_logprobs
from agentr1.trainer.update import Learner, UpdateBatch, rl_update
from tests.tiny_models import tiny_llama
from tests.unit.test_trainer_units import grouped_batch

COPIES = [0, 0, 3, 5]
"""Rows of `grouped_batch` appended again (row 0 twice): 12 rows, 8 distinct."""

CUT = 10
"""The last copy's loss mask leaves out its last CUT tokens (its original's has them)."""


def repeated_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`grouped_batch` and copies of some of its rows (ids, attention mask, loss mask);
    the last copy selects fewer positions than its original."""
    ids, attn, mask, _ = grouped_batch()
    ids, attn, mask = (torch.cat([t, t[COPIES]]) for t in (ids, attn, mask))
    mask[-1, int(attn[-1].sum()) - CUT :] = 0
    return ids, attn, mask


def backbone_rows(model: torch.nn.Module) -> tuple[list[int], torch.utils.hooks.RemovableHandle]:
    """The rows of every backbone call, as they happen."""
    seen: list[int] = []
    hook = model.model.register_forward_pre_hook(
        lambda _m, _a, kw: seen.append(kw["input_ids"].shape[0]), with_kwargs=True
    )
    return seen, hook


def test_distinct_rows_tell_copies_by_their_unmasked_tokens() -> None:
    ids, attn, _ = repeated_batch()
    first, inverse = logprobs.distinct_rows(ids, attn)
    assert first.tolist() == list(range(8))
    assert inverse.tolist() == list(range(8)) + COPIES
    other = ids.clone()
    other[-1, int(attn[-1].sum())] = 7  # past its end: padding, not the row
    assert torch.equal(logprobs.distinct_rows(other, attn)[1], inverse)
    other[-1, 0] += 1  # a token of the row: now it is its own
    assert logprobs.distinct_rows(other, attn)[1].tolist() == list(range(8)) + COPIES[:-1] + [8]
    assert logprobs.distinct_rows(ids[:8], attn[:8]) is None


def test_copies_run_once_and_get_the_log_probs_and_gradients_of_running_every_row() -> None:
    """A batch with copies runs the backbone over the distinct rows only; each row's
    log-probs and entropies (zero outside its own loss mask) and the gradient of a loss
    that weighs every row differently (as advantages do) equal running the rows one by
    one."""
    model = tiny_llama(vocab_size=64, hidden=32, layers=2)
    ids, attn, mask = repeated_batch()
    weight = torch.randn(ids.shape, generator=torch.Generator().manual_seed(1)) * mask

    def loss(lp: torch.Tensor, ent: torch.Tensor, rows: slice | list[int]) -> torch.Tensor:
        return (lp * weight[rows]).sum() + 0.1 * (ent * weight[rows]).sum()

    seen, hook = backbone_rows(model)
    model.zero_grad()
    lp, ent = token_logprobs(model, ids, attn, mask, 0.7, with_entropy=True)
    loss(lp, ent, slice(None)).backward()
    hook.remove()
    assert sum(seen) <= 8 + 2  # the distinct rows (and their groups' prefixes): no copy
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    for b in range(ids.shape[0]):
        one_lp, one_ent = token_logprobs(
            model, ids[[b]], attn[[b]], mask[[b]], 0.7, with_entropy=True
        )
        torch.testing.assert_close(lp[b], one_lp[0].detach(), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ent[b], one_ent[0].detach(), atol=1e-5, rtol=1e-5)
        loss(one_lp, one_ent, [b]).backward()
    assert (lp[mask == 0] == 0).all() and (ent[mask == 0] == 0).all()
    end = int(attn[-1].sum())
    assert (lp[-1, end - CUT :] == 0).all() and (lp[5, end - CUT : end] != 0).all()
    for a, p in zip(grads, model.parameters(), strict=True):
        torch.testing.assert_close(a, p.grad, atol=1e-5 * float(p.grad.abs().max()), rtol=1e-3)


def test_a_plan_counts_distinct_rows_and_keeps_copies_with_their_row() -> None:
    """`micro_batches` plans the distinct rows (``max_rows`` of them a pass) and puts every
    copy in its row's pass; every row runs once. The no-grad passes run that plan."""
    ids, attn, mask = repeated_batch()
    _, inverse = logprobs.distinct_rows(ids, attn)
    for max_rows in (1, 4, 8):
        plan = micro_batches(ids, attn, max_rows)
        assert sorted(torch.cat(plan).tolist()) == list(range(12))
        for idx in plan:
            distinct = set(inverse[idx].tolist())
            assert len(distinct) <= max_rows
            assert sorted(idx.tolist()) == sorted(
                b for b in range(12) if inverse[b].item() in distinct
            )
    model = tiny_llama(vocab_size=64, hidden=32, layers=2)
    seen, hook = backbone_rows(model)
    got = sorted_token_logprobs(model, ids, attn, mask, 0.7, rows=8)
    hook.remove()
    assert sum(seen) <= 8 + 2
    with torch.no_grad():
        each = torch.cat(
            [token_logprobs(model, ids[[b]], attn[[b]], mask[[b]], 0.7)[0] for b in range(12)]
        )
    torch.testing.assert_close(got, each, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("micro", [12, 3])
def test_an_update_with_copies_is_the_update_of_every_row(
    micro: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`rl_update` on a batch with copies, each copy its own advantage: the weights after
    the step equal those of the same update computing every row (copies not collapsed)."""
    ids, attn, mask = repeated_batch()
    adv = torch.randn(ids.shape, generator=torch.Generator().manual_seed(2)) * mask
    after = []
    for collapse in (True, False):
        if not collapse:
            monkeypatch.setattr(logprobs, "distinct_rows", lambda *_: None)
        model = tiny_llama(vocab_size=64, hidden=32, layers=2)
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        rl_update(
            Learner(model, opt),
            UpdateBatch(ids, attn, mask, adv, None),
            AlgoConfig(),
            OptimConfig(micro_batch_size=micro, grad_clip=1e9),
            1.0,
            torch.Generator().manual_seed(0),
        )
        after.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    start = torch.cat(
        [p.detach().flatten() for p in tiny_llama(vocab_size=64, hidden=32, layers=2).parameters()]
    )
    assert not torch.equal(after[0], start)
    torch.testing.assert_close(after[0], after[1], atol=1e-6, rtol=1e-5)
