"""Data-parallel math without Ray or a process group (`agentr1.distributed.dp`): which
micro-batches each rank runs, and that N ranks' gradients, each normalized by the global
minibatch's denominator and then summed, are one process's gradient. The ranks are
simulated one after the other in this process by a `Collective` that hands gradients on."""

from __future__ import annotations

import copy
import importlib.util
import subprocess
import sys
import threading

import pytest
import torch

from agentr1.config import AlgoConfig, OptimConfig
from agentr1.distributed.dp import DataParallel, buckets, deal, micro_size
from agentr1.distributed.fsdp import lockstep_micro_batches
from agentr1.trainer.logprobs import length_groups, token_logprobs
from agentr1.trainer.update import Collective, Learner, MetricMeans, UpdateBatch, rl_update
from tests.tiny_models import tiny_llama


@pytest.mark.parametrize("rows", [1, 2, 5, 8, 13, 128])
@pytest.mark.parametrize("micro", [1, 3, 32])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_the_ranks_micro_batches_are_each_row_once(rows: int, micro: int, world: int) -> None:
    g = torch.Generator().manual_seed(rows)
    by_len = torch.randperm(rows, generator=g)
    lengths = torch.randint(5, 400, (rows,), generator=g).sort().values.tolist()
    lengths_B = torch.zeros(rows, dtype=torch.long)
    lengths_B[by_len] = torch.tensor(lengths)
    plan = length_groups(by_len, lengths, micro_size(rows, micro, world))
    shares = [deal(plan, lengths_B, r, world) for r in range(world)]
    got = sorted(i for share in shares for mc in share for i in mc.tolist())
    assert got == list(range(rows))
    assert all(len(mc) <= micro for share in shares for mc in share)
    if rows >= world * micro:
        # Enough micro-batches for every rank: they are one process's, dealt round robin.
        one = [mc.tolist() for mc in length_groups(by_len, lengths, micro)]
        assert sorted(mc.tolist() for share in shares for mc in share) == sorted(one)
    if rows >= world:
        assert all(share for share in shares)  # every rank has rows to work on
    # the ranks' padded tokens differ by at most one micro-batch's
    longest = dict(zip(by_len.tolist(), lengths, strict=True))
    tokens = [sum(len(mc) * max(longest[i] for i in mc.tolist()) for mc in s) for s in shares]
    most = max(len(mc) * max(longest[i] for i in mc.tolist()) for s in shares for mc in s)
    assert max(tokens) - min(tokens) <= most


@pytest.mark.parametrize("rows", [2, 3, 5, 8, 13, 128])
@pytest.mark.parametrize("micro", [1, 3, 32])
@pytest.mark.parametrize("world", [2, 3])
def test_fsdp_ranks_run_as_many_micro_batches_each(rows: int, micro: int, world: int) -> None:
    if rows < world:
        with pytest.raises(ValueError, match="every rank needs a row"):
            lockstep_micro_batches(torch.arange(rows), micro, 0, world)
        return
    by_len = torch.randperm(rows, generator=torch.Generator().manual_seed(rows))
    shares = [lockstep_micro_batches(by_len, micro, r, world) for r in range(world)]
    assert len({len(share) for share in shares}) == 1  # FSDP: a pass is a collective
    got = sorted(i for share in shares for mc in share for i in mc.tolist())
    assert got == list(range(rows))
    sizes = [len(mc) for share in shares for mc in share]
    assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1
    # At most micro rows, one more where the rows do not split evenly into equal counts
    # (5 rows, 2 ranks, 1 a micro-batch: 2 + 1 for one rank, 1 + 1 for the other).
    assert max(sizes) <= max(micro, 1 + (rows % world != 0 and micro == 1))
    if rows % (world * micro) == 0:
        assert max(sizes) <= micro


def test_fsdp_config_needs_ranks_and_rows() -> None:
    from agentr1.config import load_config
    from agentr1.configutil import ConfigError

    good = ["distributed.trainer_ranks=2", "distributed.sharding=fsdp"]
    if importlib.util.find_spec("ray") is None:  # a fresh `make test` venv: no Ray yet
        with pytest.raises(ConfigError, match=r"Ray is not installed here; pip install"):
            load_config(None, good)
    else:
        load_config(None, good)
    for bad in (
        ["distributed.sharding=fsdp"],  # one rank
        ["distributed.trainer_ranks=2", "distributed.sharding=zero3"],
        [
            "distributed.trainer_ranks=3",
            "distributed.sharding=fsdp",
            "train.tasks_per_step=1",
            "rollout.n_samples=2",
        ],
    ):
        with pytest.raises(ConfigError, match=r"distributed\.sharding"):
            load_config(None, bad)


def test_buckets_keep_order_dtype_and_size() -> None:
    f, h = torch.zeros(10), torch.zeros(10, dtype=torch.float16)  # 40 and 20 bytes
    assert buckets([f, f, f, h, h, f], limit=80) == [[0, 1], [2], [3, 4], [5]]
    assert buckets([torch.zeros(100)], limit=8) == [[0]]  # one tensor larger than a bucket
    assert buckets([]) == []


def make_batch(model: torch.nn.Module, B: int = 8, T: int = 14) -> UpdateBatch:
    """Rows of very different lengths and masked-token counts: the mean of per-rank
    token-means is not the global token-mean here."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(4, 64, (B, T), generator=g)
    attn = torch.zeros(B, T, dtype=torch.long)
    mask = torch.zeros(B, T)
    for b in range(B):
        n = 4 + (b * 5) % (T - 3)
        attn[b, :n] = 1
        mask[b, 3:n] = 1
    with torch.no_grad():
        old, _ = token_logprobs(model, ids, attn, mask)
    adv = torch.randn(B, T, generator=g) * mask
    return UpdateBatch(ids, attn, mask, adv, old)


class ThreadRanks:
    """``world`` simulated ranks, one thread each, whose collectives meet at a barrier:
    every rank sums the same slots in the same order, so all get the same totals (what
    an all-reduce gives)."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.barrier = threading.Barrier(world, timeout=60)
        self.slots: list[object] = [None] * world

    def exchange(self, rank: int, value: object) -> list[object]:
        self.slots[rank] = value
        self.barrier.wait()
        out = list(self.slots)
        self.barrier.wait()  # nobody overwrites a slot before everyone has read it
        return out

    def rank(self, r: int) -> Collective:
        ranks = self

        class Rank:
            lockstep = False

            def micro_batches(
                self,
                ids: torch.Tensor,
                mask: torch.Tensor,
                micro: int,
                share: bool,
                max_tokens: int = 0,
            ) -> list[torch.Tensor]:
                return DataParallel(r, ranks.world, ids.device).micro_batches(
                    ids, mask, micro, share, max_tokens
                )

            def sum_gradients(self, params: list[torch.nn.Parameter], ok: bool) -> bool:
                mine = [torch.zeros_like(p) if p.grad is None else p.grad for p in params]
                got = ranks.exchange(r, (ok, mine))
                for i, p in enumerate(params):
                    p.grad = sum(g[i] for _, g in got)  # type: ignore[index]
                finite = all(bool(torch.isfinite(p.grad).all()) for p in params)  # type: ignore[arg-type]
                return finite and all(o for o, _ in got)  # type: ignore[misc]

            def clip_grad_norm(self, params: list, max_norm: float) -> torch.Tensor:
                return torch.nn.utils.clip_grad_norm_(params, max_norm)

            def reduce_metrics(self, means: MetricMeans) -> None:
                got = ranks.exchange(r, (means.sums, means.counts))
                keys = list(dict.fromkeys(k for s, _ in got for k in s))  # type: ignore[union-attr]
                means.sums = {k: sum(s.get(k, 0.0) for s, _ in got) for k in keys}  # type: ignore[union-attr]
                means.counts = {k: sum(c.get(k, 0) for _, c in got) for k in keys}  # type: ignore[union-attr]

        return Rank()


def flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def run_update(base, ub, algo, optim, dp=None):
    model = copy.deepcopy(base)
    learner = Learner(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    m = rl_update(learner, ub, algo, optim, 1.0, torch.Generator().manual_seed(3), dp=dp)
    return model, m


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
@pytest.mark.parametrize("world", [2, 3])
def test_ranks_summing_globally_normalized_gradients_take_one_process_steps(
    mode: str, world: int
) -> None:
    algo = AlgoConfig(agg_mode=mode)
    optim = OptimConfig(micro_batch_size=2, minibatches=2, ppo_epochs=2, grad_clip=1e9)
    base = tiny_llama()
    ub = make_batch(base)
    one, m_one = run_update(base, ub, algo, optim)
    ranks = ThreadRanks(world)
    results: list = [None] * world

    def rank(r: int) -> None:
        results[r] = run_update(base, ub, algo, optim, ranks.rank(r))

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for model, m in results:
        # 4 AdamW steps of the summed gradient: the sums' order is the only difference.
        torch.testing.assert_close(flat(model), flat(one), atol=1e-6, rtol=1e-5)
        # 8 rows, 2 minibatches, 2 a micro-batch: every micro-batch is one process's, so
        # the per-micro-batch means agree too, on every rank.
        for k in ("policy_loss", "entropy", "clipfrac", "grad_norm"):
            assert m[k] == pytest.approx(m_one[k], rel=1e-5, abs=1e-7), k
        assert m["skipped_updates"] == 0.0
    assert (flat(one) - flat(base)).abs().max() > 1e-4  # and the update moved the weights


def test_a_mean_of_per_rank_means_would_be_another_gradient() -> None:
    """What the test above tells apart: each rank's loss normalized by its own tokens,
    the ranks' gradients averaged (a plain DDP of a token-mean loss) is not the gradient
    of the token-mean over the global batch, on rows of unequal lengths."""
    algo = AlgoConfig(agg_mode="token-mean")
    optim = OptimConfig(micro_batch_size=4, grad_clip=1e9)
    base = tiny_llama()
    ub = make_batch(base)

    def grads(rows: UpdateBatch) -> torch.Tensor:
        model = copy.deepcopy(base)
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        rl_update(Learner(model, opt), rows, algo, optim, 1.0, torch.Generator().manual_seed(3))
        return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])

    ids, mask = ub.input_ids_BT, ub.attention_mask_BT
    halves = [
        torch.cat(DataParallel(r, 2, ids.device).micro_batches(ids, mask, 4, True))
        for r in range(2)
    ]
    naive = sum(grads(ub.rows(h)) for h in halves) / 2
    assert (naive - grads(ub)).abs().max() > 1e-3


def test_importing_agentr1_and_its_distributed_parts_imports_no_ray() -> None:
    code = (
        "import sys, agentr1, agentr1.trainer.loop, agentr1.distributed.ranks, "
        "agentr1.distributed.dp, agentr1.distributed.cluster\n"
        "from agentr1 import configutil\n"
        "from agentr1.config import Config\n"
        "cfg = configutil.load(Config, None, ['distributed.trainer_ranks=2'])\n"
        "cfg.distributed_errors()\n"
        "assert 'ray' not in sys.modules, 'Ray was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("world", [1, 2])
def test_the_ranks_deal_out_the_passes_one_process_plans(world: int) -> None:
    """With rows that share prefixes, the ranks run one process's micro-batches
    (`micro_batches`: each group whole), dealt: each row once, each micro-batch once
    (8 rows, 4 a micro-batch: enough for 2 ranks; 3 would cut them smaller)."""
    from agentr1.trainer.logprobs import micro_batches
    from tests.unit.test_trainer_units import grouped_batch

    ids, attn, _, group = grouped_batch()
    one = micro_batches(ids, attn, 4)
    assert sorted(sorted(group[mc].tolist()) for mc in one) == [[0] * 4, [1] * 4]
    shares = [
        DataParallel(r, world, ids.device).micro_batches(ids, attn, 4, True) for r in range(world)
    ]
    assert sorted(mc.tolist() for s in shares for mc in s) == sorted(mc.tolist() for mc in one)
    assert all(shares[:2])  # two micro-batches: the first two ranks get one each
