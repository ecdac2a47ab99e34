"""Trainer building blocks: chunked log-probs, critic alignment, the update step
(micro-batching, NaN skip), SFT, and atomic checkpoints."""

from __future__ import annotations

import gc
import math
import weakref
from types import SimpleNamespace

import pytest
import torch

from agentr1.algorithms import masked_aggregate
from agentr1.config import AlgoConfig, OptimConfig
from agentr1.trainer.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from agentr1.trainer.critic import ValueModel
from agentr1.trainer.logprobs import token_logprobs
from agentr1.trainer.update import Learner, UpdateBatch, rl_update
from agentr1.types import Trajectory
from tests.tiny_models import tiny_llama


def batch(B: int = 4, T: int = 12, V: int = 64, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, V, (B, T), generator=g)
    attn = torch.ones(B, T, dtype=torch.long)
    attn[1, 9:] = 0  # right padding
    attn[3, 5:] = 0
    mask = torch.zeros(B, T)
    mask[:, 3:6] = 1  # an agent turn
    mask[:, 8:10] = 1  # a second turn after a "tool response" at 6..7
    mask = mask * attn
    return ids, attn, mask


def reference_logprobs(model, ids, attn, temperature=1.0):
    logits = model(input_ids=ids, attention_mask=attn).logits.float() / temperature
    lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    out = torch.zeros(ids.shape)
    out[:, 1:] = lp
    return out


@pytest.mark.parametrize("chunk", [1, 5, 1024])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_logprobs_match_full_logits(chunk: int, temperature: float) -> None:
    model = tiny_llama()
    ids, attn, mask = batch()
    ref = reference_logprobs(model, ids, attn, temperature) * mask
    lp, ent = token_logprobs(
        model, ids, attn, mask, temperature=temperature, chunk=chunk, with_entropy=True
    )
    torch.testing.assert_close(lp, ref, atol=1e-5, rtol=1e-5)
    assert (lp[mask == 0] == 0).all() and (ent[mask == 0] == 0).all()
    assert (ent[mask == 1] > 0).all()


def test_chunked_logprob_gradients_match() -> None:
    model = tiny_llama()
    ids, attn, mask = batch()
    lp, _ = token_logprobs(model, ids, attn, mask, chunk=3)
    masked_aggregate(lp, mask).backward()
    g1 = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    masked_aggregate(reference_logprobs(model, ids, attn), mask).backward()
    for a, b in zip(g1, (p.grad for p in model.parameters()), strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_a_right_padded_batch_runs_without_its_mask_and_a_left_padded_one_with_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Right padding (collate's layout): the causal mask alone keeps real positions off
    the padding, so the backbone gets no mask (the tests above check the values against
    the masked forward); left padding keeps its mask and its values."""
    model = tiny_llama()
    seen: list[object] = []
    forward = type(model.model).forward

    def spy(self, *args, attention_mask=None, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(attention_mask)
        return forward(self, *args, attention_mask=attention_mask, **kwargs)

    monkeypatch.setattr(type(model.model), "forward", spy)
    ids, attn, mask = batch()
    token_logprobs(model, ids, attn, mask)
    assert seen == [None]
    left = attn.flip(-1)  # the same rows, padding first
    ids_left, mask_left = ids.flip(-1) * left, mask.flip(-1)
    seen.clear()
    lp, _ = token_logprobs(model, ids_left, left, mask_left)
    assert len(seen) == 1 and seen[0] is left
    ref = reference_logprobs(model, ids_left, left) * mask_left
    torch.testing.assert_close(lp, ref, atol=1e-5, rtol=1e-5)


def shared_prefix_batch(B: int = 4, P: int = 40, T: int = 60, V: int = 64):
    """Rows that share their first P tokens (a system prompt), then differ; right-padded."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(4, V, (B, T), generator=g)
    ids[:, :P] = ids[0, :P]
    attn = torch.ones(B, T, dtype=torch.long)
    attn[1, T - 7 :] = 0
    attn[3, P + 3 :] = 0
    ids = ids * attn  # pad id 0
    mask = torch.zeros(B, T)
    mask[:, P + 1 : P + 12] = 1
    mask[:, T - 10 : T - 4] = 1
    return ids, attn, mask * attn


def test_shared_prefix_runs_once_and_changes_nothing() -> None:
    """The common prefix runs as one row; log-probs, entropies and gradients equal the
    plain per-row forward (values at padding are irrelevant and masked)."""
    from agentr1.trainer import logprobs as lpmod

    model = tiny_llama(vocab_size=64, hidden=32, layers=2)
    ids, attn, mask = shared_prefix_batch()
    rows = [r[: int(n)].tolist() for r, n in zip(ids, attn.sum(-1), strict=True)]
    assert lpmod.prefix_groups(rows) == [([0, 1, 2, 3], 40)]
    seen: list[tuple[int, int]] = []
    hook = model.model.register_forward_pre_hook(
        lambda _m, _a, kw: seen.append(tuple(kw["input_ids"].shape)), with_kwargs=True
    )
    grads = []
    outs = []
    for share in (True, False):
        model.zero_grad()
        lp, ent = token_logprobs(model, ids, attn, mask, 0.7, with_entropy=True, share_prefix=share)
        (masked_aggregate(lp, mask) + 0.1 * masked_aggregate(ent, mask)).backward()
        grads.append([p.grad.clone() for p in model.parameters()])
        outs.append((lp.detach(), ent.detach()))
    hook.remove()
    assert seen == [(1, 40), (4, 20), (4, 60)]  # shared: prefix once, then the rest
    torch.testing.assert_close(outs[0][0], outs[1][0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(outs[0][1], outs[1][1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(
        outs[0][0], reference_logprobs(model, ids, attn, 0.7) * mask, atol=1e-5, rtol=1e-5
    )
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_grouped_query_passes_with_a_mask_copy_no_key_heads_and_change_nothing() -> None:
    """On a grouped-query model switched to agentr1's attention (as `load_policy` does),
    the shared-prefix pass's masked rest call runs torch's kernel on the key heads as
    they are (no `repeat_kv` copy), with the log-probs and gradients of the plain
    ``sdpa`` model: the same bits for the log-probs and the query side, float rounding
    for the key and value projections' gradients."""
    import copy

    from transformers.integrations import sdpa_attention

    from agentr1.backends.attention import NAME, use_decode_sdpa

    plain = tiny_llama(vocab_size=64, hidden=32, layers=2, heads=4, kv_heads=2)
    ours = copy.deepcopy(plain)
    assert use_decode_sdpa(ours) and ours.config._attn_implementation == NAME
    ids, attn, mask = shared_prefix_batch()
    copies: list[int] = []
    real_repeat = sdpa_attention.repeat_kv

    def counting(h: torch.Tensor, n: int) -> torch.Tensor:
        copies.append(n)
        return real_repeat(h, n)

    sdpa_attention.repeat_kv = counting
    try:
        results = []
        for model in (plain, ours):
            copies.clear()
            lp, ent = token_logprobs(model, ids, attn, mask, 0.7, with_entropy=True)
            (masked_aggregate(lp, mask) + 0.1 * masked_aggregate(ent, mask)).backward()
            results.append((lp.detach(), {n: p.grad for n, p in model.named_parameters()}))
            results[-1] += (list(copies),)
    finally:
        sdpa_attention.repeat_kv = real_repeat
    (lp_a, g_a, copies_a), (lp_b, g_b, copies_b) = results
    assert copies_a and 2 in copies_a  # transformers copies each key head for the rest call
    assert copies_b == []
    assert torch.equal(lp_a, lp_b)
    for name, grad in g_a.items():
        torch.testing.assert_close(g_b[name], grad, atol=1e-6, rtol=1e-5)


def test_shared_prefix_is_skipped_when_short_or_single_row() -> None:
    from agentr1.trainer.logprobs import MIN_SHARED_PREFIX, backbone_hidden

    model = tiny_llama()
    seen: list[tuple[int, int]] = []
    model.model.register_forward_pre_hook(
        lambda _m, _a, kw: seen.append(tuple(kw["input_ids"].shape)), with_kwargs=True
    )
    ids, attn, _ = batch()  # random rows: no common prefix
    backbone_hidden(model.model, ids, attn)
    ids, attn, _ = shared_prefix_batch(P=MIN_SHARED_PREFIX - 1)
    backbone_hidden(model.model, ids, attn)
    backbone_hidden(model.model, ids[:1], attn[:1])
    assert seen == [(4, 12), (4, 60), (1, 60)]


def test_critic_shares_the_prefix_too() -> None:
    model = tiny_llama()
    critic = ValueModel.from_policy(model)
    torch.nn.init.normal_(critic.v_head.weight)
    ids, attn, _ = shared_prefix_batch()
    v = critic(ids, attn)
    h = critic.backbone(input_ids=ids, attention_mask=attn).last_hidden_state
    real = attn.bool()
    real[:, 0] = False
    plain = torch.zeros_like(v)
    plain[:, 1:] = critic.v_head(h[:, :-1]).squeeze(-1)
    # equal up to float rounding, relative to the values' scale (the shared prefix sums
    # its attention in another order: a few ulps of the largest value on some CPUs)
    scale = float(plain[real].abs().max())
    torch.testing.assert_close(v[real], plain[real], atol=1e-5 * max(scale, 1.0), rtol=1e-5)


def test_critic_values_align_with_previous_hidden_state() -> None:
    model = tiny_llama()
    critic = ValueModel.from_policy(model)
    torch.nn.init.normal_(critic.v_head.weight)
    ids, attn, _ = batch()
    v = critic(ids, attn)
    h = critic.backbone(input_ids=ids, attention_mask=attn).last_hidden_state
    assert v[0, 0] == 0
    torch.testing.assert_close(v[:, 5], critic.v_head(h[:, 4]).squeeze(-1))
    # the critic is a copy: training it leaves the policy alone
    assert critic.backbone is not model.model


def make_update_batch(model, seed=0):
    ids, attn, mask = batch(seed=seed)
    with torch.no_grad():
        old, _ = token_logprobs(model, ids, attn, mask)
    adv = torch.randn(ids.shape, generator=torch.Generator().manual_seed(seed)) * mask
    return UpdateBatch(ids, attn, mask, adv, old)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_micro_batching_gives_the_same_update(mode: str) -> None:
    results = []
    for micro, tokens in ((4, 0), (1, 0), (3, 0), (4, 20)):
        model = tiny_llama()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        ub = make_update_batch(model)
        rl_update(
            Learner(model, opt),
            ub,
            AlgoConfig(agg_mode=mode),
            OptimConfig(micro_batch_size=micro, grad_clip=1e9, micro_batch_tokens=tokens),
            1.0,
            torch.Generator().manual_seed(0),
        )
        results.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    torch.testing.assert_close(results[0], results[1], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(results[0], results[2], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(results[0], results[3], atol=1e-6, rtol=1e-5)
    assert not torch.equal(
        results[0], torch.cat([p.detach().flatten() for p in tiny_llama().parameters()])
    )


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_logged_metrics_do_not_depend_on_the_micro_batch_cut(mode: str) -> None:
    """Rows of different lengths cut one, three or four a pass: the update logs the same
    policy loss, entropy, KL and clip fraction (each micro-batch's metrics weighted by its
    share of the minibatch's denominator, as its loss is)."""
    logged = []
    for micro in (4, 1, 3):
        model = tiny_llama()
        ub = make_update_batch(model)
        ub.advantages_BT = ub.advantages_BT + 0.5 * ub.loss_mask_BT  # a non-zero mean loss
        logged.append(
            rl_update(
                Learner(model, torch.optim.SGD(model.parameters(), lr=0.1)),
                ub,
                AlgoConfig(agg_mode=mode, entropy_coef=0.01),
                OptimConfig(micro_batch_size=micro, grad_clip=1e9),
                1.0,
                torch.Generator().manual_seed(0),
            )
        )
    names = set(logged[0]) - {"lr", "skipped_updates"}
    assert {"policy_loss", "entropy", "grad_norm"} <= names
    for other in logged[1:]:
        for k in names:
            assert other[k] == pytest.approx(logged[0][k], rel=1e-5, abs=1e-7), k


def test_non_finite_update_is_skipped_and_weights_unchanged() -> None:
    model = tiny_llama()
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    ub = make_update_batch(model)
    ub.advantages_BT[0, 4] = math.nan  # a poisoned advantage on an agent token
    m = rl_update(
        Learner(model, opt), ub, AlgoConfig(), OptimConfig(), 1.0, torch.Generator().manual_seed(0)
    )
    assert m["skipped_updates"] == 1.0
    for a, b in zip(before, model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_one_token_far_below_the_reference_does_not_dominate_the_kl_update() -> None:
    metrics = {}
    for above in (None, 3.0):
        model = tiny_llama()
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        ub = make_update_batch(model)
        ub.advantages_BT.zero_()  # only the KL term pulls
        ub.ref_logprobs_BT = ub.old_logprobs_BT.clone()
        ub.ref_logprobs_BT[0, 4] += 10.0  # the reference finds it e^10 times likelier
        algo = AlgoConfig(kl_coef=1.0, k3_linear_above=above)
        metrics[above] = rl_update(
            Learner(model, opt), ub, algo, OptimConfig(), 1.0, torch.Generator().manual_seed(0)
        )
    n_tokens = float(make_update_batch(tiny_llama()).loss_mask_BT.sum())
    exact, bounded = metrics[None], metrics[3.0]
    close = pytest.approx
    assert exact["kl"] == close((math.exp(10) - 11) / n_tokens, rel=1e-3)
    assert bounded["kl"] == close((math.exp(3) - 4 + (math.exp(3) - 1) * 7) / n_tokens, rel=1e-3)
    assert bounded["kl_tail_frac"] == close(1 / n_tokens)
    assert "kl_tail_frac" not in exact
    # the gradient of that one token shrinks from e^10 - 1 to e^3 - 1
    assert bounded["grad_norm"] == close(
        exact["grad_norm"] * (math.exp(3) - 1) / (math.exp(10) - 1), rel=1e-2
    )


def test_values_at_mask_zero_do_not_change_the_update() -> None:
    outs = []
    for poison in (False, True):
        model = tiny_llama()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        ub = make_update_batch(model)
        if poison:
            ub.advantages_BT[:, 6:8] = 1e6  # tool-response tokens
            ub.old_logprobs_BT[:, 0:3] = -1e6  # prompt tokens
        rl_update(
            Learner(model, opt),
            ub,
            AlgoConfig(),
            OptimConfig(),
            1.0,
            torch.Generator().manual_seed(0),
        )
        outs.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    torch.testing.assert_close(outs[0], outs[1])


def test_checkpoint_roundtrip_is_atomic_and_complete(tmp_path) -> None:
    model = tiny_llama(seed=1)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    model(input_ids=torch.tensor([[5, 6, 7]])).logits.sum().backward()
    opt.step()
    path = save_checkpoint(
        tmp_path,
        3,
        {"policy": model},
        {"optimizer": opt.state_dict(), "cursor": {"pos": 7}},
        {"note": "x"},
    )
    # a half-written checkpoint (no meta.json) is ignored
    (tmp_path / "step_000009").mkdir()
    assert latest_checkpoint(tmp_path) == path
    other = tiny_llama(seed=2)
    states, meta = load_checkpoint(path, {"policy": other})
    assert meta == {"note": "x", "step": 3} and states["cursor"] == {"pos": 7}
    for a, b in zip(model.state_dict().values(), other.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    opt2 = torch.optim.AdamW(other.parameters(), lr=0.01)
    opt2.load_state_dict(states["optimizer"])
    assert torch.equal(
        opt2.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"]
    )


def test_checkpoint_keeps_newest(tmp_path) -> None:
    model = tiny_llama()
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step, {"policy": model}, {}, {}, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_000002", "step_000003"]


def test_a_checkpoint_that_cannot_be_written_names_the_cause_and_leaves_no_debris(
    tmp_path, monkeypatch
) -> None:
    """A full disk mid-write (torch.save's RuntimeError, as seen on a real run) and a disk
    already too full for another checkpoint: a CheckpointError with the step, the cause and
    the newest intact checkpoint; no partial directory is left; the old one still loads."""
    from agentr1.trainer import checkpoint as ckpt

    model = tiny_llama()
    first = save_checkpoint(tmp_path, 1, {"policy": model}, {"x": 1}, {})

    def full_disk(*args: object, **kwargs: object) -> None:
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos")

    monkeypatch.setattr(ckpt.torch, "save", full_disk)
    with pytest.raises(ckpt.CheckpointError) as e:
        save_checkpoint(tmp_path, 2, {"policy": model}, {"x": 2}, {})
    msg = str(e.value)
    assert "checkpoint step 2" in msg and "unexpected pos" in msg and str(first) in msg
    assert sorted(q.name for q in tmp_path.iterdir()) == ["step_000001"]  # no .tmp_ left
    monkeypatch.undo()
    assert load_checkpoint(first, {"policy": tiny_llama(seed=3)})[0] == {"x": 1}

    monkeypatch.setattr(ckpt.shutil, "disk_usage", lambda _: SimpleNamespace(free=1024))
    with pytest.raises(ckpt.CheckpointError, match=r"0 MiB free, the last checkpoint took"):
        save_checkpoint(tmp_path, 3, {"policy": model}, {}, {})
    assert sorted(q.name for q in tmp_path.iterdir()) == ["step_000001"]


def test_sft_lowers_nll_on_masked_tokens() -> None:
    from agentr1.trainer.sft import sft_train

    model = tiny_llama()
    t = Trajectory(task_id="x")
    t.append_prompt([5, 6, 7])
    t.append_sampled([8, 9, 10], [0.0] * 3, "")
    t.append_inserted([11, 12])
    t.append_sampled([13, 14], [0.0] * 2, "")
    losses = sft_train(model, [t], steps=30, batch_size=1, lr=1e-2, pad_id=0, seed=0)
    assert losses[-1] < 0.2 * losses[0]


def test_sft_context_loss_trains_the_context_and_reports_agent_loss_only() -> None:
    """context_weight adds an LM loss on prompt + tool-response tokens; the returned loss
    stays the agent-token NLL, so runs with and without it compare directly."""
    from agentr1.trainer.logprobs import token_logprobs
    from agentr1.trainer.sft import sft_train

    def demo() -> Trajectory:
        t = Trajectory(task_id="x")
        t.append_prompt([5, 6, 7, 5, 6, 7])
        t.append_sampled([8, 9], [0.0] * 2, "")
        t.append_inserted([11, 12, 11, 12])
        t.append_sampled([13], [0.0], "")
        return t

    def context_nll(model: torch.nn.Module) -> float:
        t = demo()
        ids = torch.tensor([t.token_ids])
        with torch.no_grad():
            lp, _ = token_logprobs(model, ids, torch.ones_like(ids))
        ctx = torch.tensor([[0.0] + [1.0 - m for m in t.loss_mask[1:]]])
        return float(-(lp * ctx).sum() / ctx.sum())

    plain, with_ctx = tiny_llama(), tiny_llama()
    before = context_nll(plain)
    a = sft_train(plain, [demo()], steps=1, batch_size=1, lr=1e-2, pad_id=0, seed=0)
    b = sft_train(
        with_ctx, [demo()], steps=1, batch_size=1, lr=1e-2, pad_id=0, seed=0, context_weight=1.0
    )
    assert a == pytest.approx(b)  # same weights before the step: same agent loss reported
    sft_train(plain, [demo()], steps=20, batch_size=1, lr=1e-2, pad_id=0, seed=0)
    sft_train(
        with_ctx, [demo()], steps=20, batch_size=1, lr=1e-2, pad_id=0, seed=0, context_weight=1.0
    )
    assert context_nll(with_ctx) < 0.5 * before
    assert context_nll(with_ctx) < 0.5 * context_nll(plain)


def test_rollout_metrics_count_groups_whose_rewards_tie() -> None:
    from agentr1.rollout.loop import RolloutStats
    from agentr1.trainer.loop import rollout_metrics
    from agentr1.types import Task, TrajectoryGroup, Turn

    def traj(outcome: float, process: float) -> Trajectory:
        return Trajectory("t", outcome_reward=outcome, turns=[Turn(0, 1, 1, reward=process)])

    def group(*rewards: tuple[float, float]) -> TrajectoryGroup:
        return TrajectoryGroup(Task("t", "q", ["a"]), [traj(o, p) for o, p in rewards])

    groups = [
        group((0.0, 0.1), (0.0, 0.1)),  # everything ties: no gradient
        group((0.0, 0.2), (0.0, 0.1)),  # outcomes tie: only the process reward moves it
        group((1.0, 0.1), (0.0, 0.1)),  # an answer difference
        group((0.5, 0.0)),  # a group of one is no group
    ]
    m = rollout_metrics(groups, RolloutStats(), ("em", "f1"))
    assert m["groups_tied"] == pytest.approx(1 / 3)
    assert m["groups_outcome_tied"] == pytest.approx(2 / 3)
    assert "groups_tied" not in rollout_metrics(groups[3:], RolloutStats(), ())
    # The rollout's parts in seconds: env always, prefill / decode where the generator times them.
    timed = rollout_metrics(groups, RolloutStats(env_s=0.1, prefill_s=0.2, decode_s=0.5), ())
    assert (timed["time/rollout_env"], timed["time/rollout_prefill"]) == (0.1, 0.2)
    assert timed["time/rollout_decode"] == 0.5 and "time/rollout_decode" not in m


def test_sorted_token_logprobs_equal_one_pass() -> None:
    """The no-grad passes (reference, old log-probs) run rows sorted by length, a few at
    a time, each pass cut to its longest row: the same log-probs as one padded pass."""
    from agentr1.trainer.logprobs import sorted_token_logprobs

    model = tiny_llama(vocab_size=64, hidden=32, layers=2)
    torch.manual_seed(1)
    lengths = [5, 23, 9, 17, 30, 2]
    ids = torch.randint(1, 64, (len(lengths), 30))
    attn = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        attn[row, :n] = 1
    ids = ids * attn
    select = attn.clone()
    select[:, :3] = 0
    with torch.no_grad():
        one, _ = token_logprobs(model, ids, attn, select, 0.7)
    seen: list[tuple[int, int]] = []
    hook = model.model.register_forward_pre_hook(
        lambda _m, _a, kw: seen.append(tuple(kw["input_ids"].shape)), with_kwargs=True
    )
    sorted_ = sorted_token_logprobs(model, ids, attn, select, 0.7, rows=4)
    hook.remove()
    # lengths 2, 5, 9, then 17, 23, 30 (`length_groups`: 27 + 90 tokens, where a split
    # into 4 + 2 rows would compute 68 + 60)
    assert seen == [(3, 9), (3, 30)]
    torch.testing.assert_close(sorted_, one, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("seed", range(30))
def test_length_groups_is_the_cheapest_cut(seed: int) -> None:
    """Against every way to cut the sorted rows into runs of at most ``max_rows``."""
    import itertools

    from agentr1.trainer.logprobs import length_groups

    g = torch.Generator().manual_seed(seed)
    n = int(torch.randint(1, 9, (1,), generator=g))
    max_rows = int(torch.randint(1, 5, (1,), generator=g))
    lengths = torch.randint(1, 300, (n,), generator=g).sort().values.tolist()
    by_len = torch.randperm(n, generator=g)

    def cost(sizes: list[int]) -> int:
        total, at = 0, 0
        for k in sizes:
            at += k
            total += k * lengths[at - 1] + 64
        return total

    cheapest = min(
        cost(list(sizes))
        for parts in range(1, n + 1)
        for sizes in itertools.product(range(1, max_rows + 1), repeat=parts)
        if sum(sizes) == n
    )
    groups = length_groups(by_len, lengths, max_rows, pass_tokens=64)
    assert torch.equal(torch.cat(groups), by_len)  # every row once, in order
    assert all(1 <= len(gr) <= max_rows for gr in groups)
    assert cost([len(gr) for gr in groups]) == cheapest


def grouped_batch(seed: int = 3, V: int = 64) -> tuple[torch.Tensor, ...]:
    """Two GRPO-like groups of 4 rows, shuffled together: a group's rows share their
    first 80 or 100 tokens (the prompt and a first turn), then differ in content and
    length; right-padded. (ids, attention mask, loss mask, each row's group)"""
    g = torch.Generator().manual_seed(seed)
    lengths = [90, 120, 104, 140, 116, 150, 106, 132]
    group = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    prefix = {0: 80, 1: 100}
    T = max(lengths)
    ids = torch.randint(4, V, (8, T), generator=g)
    for k in (0, 1):
        rows = (group == k).nonzero().flatten()
        ids[rows, : prefix[k]] = ids[rows[0], : prefix[k]]
    attn = torch.zeros(8, T, dtype=torch.long)
    for row, n in enumerate(lengths):
        attn[row, :n] = 1
    mask = torch.zeros(8, T)
    mask[:, 60:] = 1  # the agent's tokens, some inside the shared part
    perm = torch.randperm(8, generator=g)
    return (ids * attn)[perm], attn[perm], (mask * attn)[perm], group[perm]


@pytest.mark.parametrize(
    ("max_rows", "calls"),
    [
        (8, [(2, 100), (8, 60)]),  # one pass: both prefixes in one call, then every rest
        (4, [(1, 80), (1, 100), (4, 50), (4, 60)]),  # a pass a group
    ],
)
def test_micro_batches_run_a_groups_common_prefix_once_and_change_nothing(
    max_rows: int, calls: list[tuple[int, int]]
) -> None:
    """A group's rows share their prefix: `micro_batches` keeps each group in one pass,
    which computes its prefix once (the prefixes in one call, then the rows' rests), 620
    tokens instead of 8 x 150. Log-probs, entropies and gradients summed over the passes
    equal one plain padded pass; without sharing the plan is `length_groups`'s."""
    from agentr1.trainer.logprobs import length_groups, micro_batches

    model = tiny_llama(vocab_size=64, hidden=32, layers=2)
    ids, attn, mask, group = grouped_batch()
    plan = micro_batches(ids, attn, max_rows)
    assert all(len(set(group[idx].tolist())) * 4 == len(idx) for idx in plan)  # whole groups
    lengths = attn.sum(-1)
    by_len = torch.argsort(lengths, stable=True)
    plain = [g.tolist() for g in length_groups(by_len, lengths[by_len].tolist(), max_rows)]
    assert [g.tolist() for g in micro_batches(ids, attn, max_rows, share_prefix=False)] == plain

    seen: list[tuple[int, int]] = []
    hook = model.model.register_forward_pre_hook(
        lambda _m, _a, kw: seen.append(tuple(kw["input_ids"].shape)), with_kwargs=True
    )
    model.zero_grad()
    lp_BT, ent_BT = torch.zeros(ids.shape), torch.zeros(ids.shape)
    for idx in plan:
        t = int(lengths[idx].max())
        lp, ent = token_logprobs(model, ids[idx, :t], attn[idx, :t], mask[idx, :t], 0.7, True)
        loss = (lp * mask[idx, :t]).sum() + 0.1 * (ent * mask[idx, :t]).sum()
        (loss / mask.sum()).backward()  # the batch's token mean, over passes
        lp_BT[idx, :t], ent_BT[idx, :t] = lp.detach(), ent.detach()
    hook.remove()
    assert sorted(seen) == calls
    shared_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    lp, ent = token_logprobs(model, ids, attn, mask, 0.7, True, share_prefix=False)
    (((lp * mask).sum() + 0.1 * (ent * mask).sum()) / mask.sum()).backward()
    torch.testing.assert_close(lp_BT, lp.detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent_BT, ent.detach(), atol=1e-5, rtol=1e-5)
    for a, p in zip(shared_grads, model.parameters(), strict=True):
        torch.testing.assert_close(a, p.grad, atol=1e-5, rtol=1e-4)


def test_groups_lone_rows_and_a_row_that_is_all_prefix_in_one_pass() -> None:
    """`backbone_hidden` with two groups, a row that shares nothing and a row no longer
    than its group's prefix: every real position's state and every gradient equal the
    plain forward's."""
    from agentr1.trainer.logprobs import backbone_hidden, prefix_groups

    model = tiny_llama(vocab_size=64, hidden=32, layers=2)
    ids, attn, _, _ = grouped_batch()
    g = torch.Generator().manual_seed(9)
    lone = torch.randint(4, 64, (1, ids.shape[1]), generator=g)
    lone[0, 70:] = 0
    short = ids[attn.sum(-1).argmax()].clone()[None]
    rows = [r[: int(n)].tolist() for r, n in zip(ids, attn.sum(-1), strict=True)]
    p = dict((len(m), q) for m, q in prefix_groups(rows))[4]
    short[0, p:] = 0  # just a group's prefix: nothing left of it to run in the rest
    ids, attn = (
        torch.cat([ids, lone, short]),
        torch.cat([attn, (lone > 0).long(), (short > 0).long()]),
    )
    w = torch.randn(ids.shape[0], ids.shape[1], 32, generator=g) * attn[..., None]
    states = []
    for share in (True, False):
        model.zero_grad()
        h = backbone_hidden(model.model, ids, attn, share)
        (h * w).sum().backward()
        states.append((h.detach(), [q.grad.clone() for q in model.model.parameters()]))
    real = attn.bool()
    torch.testing.assert_close(states[0][0][real], states[1][0][real], atol=1e-5, rtol=1e-5)
    for a, b in zip(states[0][1], states[1][1], strict=True):  # float sums, in other orders
        torch.testing.assert_close(a, b, atol=1e-5 * float(b.abs().max()), rtol=1e-3)


def test_the_no_grad_passes_share_prefixes_too() -> None:
    """`sorted_token_logprobs` (reference and old log-probs) runs the same plan."""
    from agentr1.trainer.logprobs import sorted_token_logprobs

    model = tiny_llama(vocab_size=64, hidden=32, layers=2)
    ids, attn, mask, _ = grouped_batch()
    with torch.no_grad():
        one, _ = token_logprobs(model, ids, attn, mask, 0.7, share_prefix=False)
    seen: list[tuple[int, int]] = []
    model.model.register_forward_pre_hook(
        lambda _m, _a, kw: seen.append(tuple(kw["input_ids"].shape)), with_kwargs=True
    )
    torch.testing.assert_close(sorted_token_logprobs(model, ids, attn, mask, 0.7, rows=8), one)
    assert seen == [(2, 100), (8, 60)]


@pytest.mark.parametrize("seed", range(30))
def test_a_cut_of_rows_sharing_prefixes_is_the_cheapest(seed: int) -> None:
    """`_cheapest_cuts` against every way to cut rows in order into runs of at most
    ``max_rows``, each run's cost computed from scratch: its groups (neighbours sharing
    at least MIN_SHARED_PREFIX tokens), each group's prefix once, then the rows' rests."""
    import itertools

    from agentr1.trainer.logprobs import MIN_SHARED_PREFIX, _cheapest_cuts

    g = torch.Generator().manual_seed(seed)
    n = int(torch.randint(1, 9, (1,), generator=g))
    max_rows = int(torch.randint(1, 5, (1,), generator=g))
    lengths = torch.randint(20, 120, (n,), generator=g).tolist()
    common = [0] + [
        min(a, b, int(torch.randint(0, 80, (1,), generator=g)))
        for a, b in itertools.pairwise(lengths)
    ]

    def run_cost(a: int, b: int) -> int:  # from scratch: the run's groups, then its passes
        groups, at = [], a
        for k in range(a + 1, b + 1):
            if k == b or common[k] < MIN_SHARED_PREFIX:
                groups.append(range(at, k))
                at = k
        shared = [
            min([*(common[k] for k in g[1:]), max(lengths[k] for k in g) - 1]) if len(g) > 1 else 0
            for g in groups
        ]
        if not any(shared):
            return (b - a) * max(lengths[a:b]) + 64
        rest = max(lengths[k] - p for g, p in zip(groups, shared, strict=True) for k in g)
        n_groups = sum(len(g) > 1 for g in groups)
        return n_groups * max(shared) + (b - a) * rest + 2 * 64

    def cost(sizes: tuple[int, ...]) -> int:
        edges = [0, *itertools.accumulate(sizes)]
        return sum(run_cost(a, b) for a, b in itertools.pairwise(edges))

    cheapest = min(
        cost(sizes)
        for parts in range(1, n + 1)
        for sizes in itertools.product(range(1, max_rows + 1), repeat=parts)
        if sum(sizes) == n
    )
    total, cuts = _cheapest_cuts(lengths, common, max_rows, 64)
    assert [a for a, _ in cuts] == [0, *(b for _, b in cuts[:-1])] and cuts[-1][1] == n
    assert all(1 <= b - a <= max_rows for a, b in cuts)
    assert total == cost(tuple(b - a for a, b in cuts)) == cheapest


def test_head_checkpointing_changes_no_gradient(monkeypatch: pytest.MonkeyPatch) -> None:
    """Small passes keep the LM head's logits for the backward; large ones (beyond
    CHECKPOINT_LOGITS_BYTES of logits) compute them again: the same log-probs and
    gradients."""
    from agentr1.trainer import logprobs as lpmod

    model = tiny_llama(vocab_size=64, hidden=32, layers=2)
    ids, attn, mask = shared_prefix_batch()
    calls: list[int] = []
    real = lpmod._logits
    monkeypatch.setattr(lpmod, "_logits", lambda *a: calls.append(1) or real(*a))
    grads, lps = [], []
    for limit in (0, 1 << 30):  # every pass recomputing, then none
        monkeypatch.setattr(lpmod, "CHECKPOINT_LOGITS_BYTES", limit)
        model.zero_grad()
        lp, _ = token_logprobs(model, ids, attn, mask, 0.7)
        masked_aggregate(lp, mask).backward()
        grads.append([p.grad.clone() for p in model.parameters()])
        lps.append(lp.detach())
        calls.append(-1)
    cut = calls.index(-1)
    assert cut == 2 and calls[cut + 1 :] == [1, -1]  # a forward and a backward, then one
    torch.testing.assert_close(lps[0], lps[1], atol=0, rtol=0)
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_keep_freed_memory_sets_glibc_malloc_and_is_a_no_op_elsewhere(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On glibc ``mallopt`` takes both settings (a fresh process, so this test's own
    stays as it was); with another C library, or one without ``mallopt``, nothing is
    set and nothing raises."""
    import ctypes
    import os
    import platform
    import subprocess
    import sys

    from agentr1.trainer import setup

    if platform.libc_ver()[0] == "glibc":
        code = "from agentr1.trainer.setup import keep_freed_memory as k; print(k(256 << 20))"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert out.stdout.strip() == "True", out.stderr

    def not_glibc(name: str) -> str:
        raise ValueError(f"unrecognized configuration name {name!r}")  # musl, macOS

    with monkeypatch.context() as m:
        m.setattr(os, "confstr", not_glibc)
        assert setup.keep_freed_memory(1 << 20) is False
    monkeypatch.setattr(os, "confstr", lambda name: "glibc 2.36")
    monkeypatch.setattr(ctypes, "CDLL", lambda name: SimpleNamespace())  # no mallopt
    assert setup.keep_freed_memory(1 << 20) is False


def test_a_full_disk_in_safetensors_or_before_the_first_checkpoint_is_a_checkpoint_error(
    tmp_path, monkeypatch
) -> None:
    """safetensors reports a full disk as its own SafetensorError (seen on a GPU machine
    whose 64 GiB disk a 3B run's 37 GB checkpoints filled): a CheckpointError like any
    other, the partial directory removed. A first checkpoint, with no last one to predict
    its size, is checked against its tensors' bytes before anything is written."""
    from safetensors import SafetensorError

    from agentr1.trainer import checkpoint as ckpt

    model = tiny_llama()
    opt = torch.optim.AdamW(model.parameters())
    model(torch.tensor([[1, 2, 3]])).logits.sum().backward()
    opt.step()

    def full_disk(*args: object, **kwargs: object) -> None:
        raise SafetensorError("Error while serializing: I/O error: No space left on device")

    monkeypatch.setattr(ckpt, "save_file", full_disk)
    with pytest.raises(ckpt.CheckpointError, match=r"checkpoint step 1.*No space left"):
        save_checkpoint(tmp_path, 1, {"policy": model}, {"optimizer": opt.state_dict()}, {})
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()

    weights = sum(p.nbytes for p in model.parameters())  # tied weights counted once
    need = ckpt._tensor_bytes([model, {"optimizer": opt.state_dict()}])
    assert 3 * weights <= need <= 3 * weights + sum(b.nbytes for b in model.buffers()) + 1024
    monkeypatch.setattr(ckpt.shutil, "disk_usage", lambda _: SimpleNamespace(free=need - 1))
    with pytest.raises(ckpt.CheckpointError, match=r"MiB free, this checkpoint needs about"):
        save_checkpoint(tmp_path, 1, {"policy": model}, {"optimizer": opt.state_dict()}, {})
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("cap", [0, 400, 250, 1])
def test_a_token_cap_bounds_what_each_micro_batch_computes(cap: int) -> None:
    """`micro_batches(max_tokens=...)`: no pass of two rows or more computes more tokens
    than the cap (counted from the backbone's calls: a group's prefix once, then the
    rows' rests); every row runs once; a cap below every row runs them one by one."""
    from agentr1.trainer.logprobs import micro_batches

    model = tiny_llama(vocab_size=64, hidden=32, layers=2)
    ids, attn, _, _ = grouped_batch()
    plan = micro_batches(ids, attn, 8, max_tokens=cap)
    assert sorted(torch.cat(plan).tolist()) == list(range(8))
    lengths = attn.sum(-1)
    seen: list[int] = []
    hook = model.model.register_forward_pre_hook(
        lambda _m, _a, kw: seen.append(kw["input_ids"].numel()), with_kwargs=True
    )
    computed = []
    with torch.no_grad():
        for idx in plan:
            seen.clear()
            t = int(lengths[idx].max())
            token_logprobs(model, ids[idx, :t], attn[idx, :t])
            computed.append(sum(seen))
    hook.remove()
    if cap == 0:
        assert len(plan) == 1
    else:
        assert all(n <= cap for n, idx in zip(computed, plan, strict=True) if len(idx) > 1)
    if cap == 1:
        assert [len(idx) for idx in plan] == [1] * 8
    if cap == 400:
        assert any(len(idx) > 1 for idx in plan)  # groups still share their prefix


def test_fsdp_micro_batches_take_the_cap_over_the_longest_row() -> None:
    from agentr1.distributed.fsdp import ShardedParallel

    mask = torch.zeros(8, 50, dtype=torch.long)
    for row, n in enumerate([10, 10, 10, 10, 10, 10, 10, 50]):
        mask[row, :n] = 1
    ids = torch.ones_like(mask)
    par = ShardedParallel(0, 2, torch.device("cpu"))
    assert [len(m) for m in par.micro_batches(ids, mask, 4, True)] == [4]
    assert [len(m) for m in par.micro_batches(ids, mask, 4, True, max_tokens=100)] == [2, 2]


class _Node:
    """A tracked object that can sit in a reference cycle and be weakly referenced."""

    me: _Node | None = None


def _cycle() -> tuple[_Node, weakref.ref[_Node]]:
    node = _Node()
    node.me = node
    return node, weakref.ref(node)


def test_settled_heap_freezes_what_exists_and_collects_what_is_made_inside() -> None:
    """The objects of before the block leave the collector's walk (a cycle among them
    waits for the block's end); a cycle made inside is collected as usual; a nested block,
    a process that froze objects itself and a collector turned off are left alone."""
    from agentr1.trainer.state import settled_heap

    assert gc.get_freeze_count() == 0
    kept, kept_ref = _cycle()
    with settled_heap():
        frozen = gc.get_freeze_count()
        assert frozen > 0 and not any(o is kept for o in gc.get_objects())
        made, made_ref = _cycle()
        del kept, made
        gc.collect()
        assert made_ref() is None and kept_ref() is not None
        with settled_heap():
            assert gc.get_freeze_count() == frozen
        assert gc.get_freeze_count() == frozen
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert kept_ref() is None

    gc.freeze()  # the process's own
    try:
        own = gc.get_freeze_count()
        with settled_heap():
            assert gc.get_freeze_count() == own
        assert gc.get_freeze_count() == own
    finally:
        gc.unfreeze()
    gc.disable()
    try:
        with settled_heap():
            assert gc.get_freeze_count() == 0
    finally:
        gc.enable()
