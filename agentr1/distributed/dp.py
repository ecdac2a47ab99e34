"""Data parallelism inside one update: which micro-batches each rank runs, and the
collectives that make N ranks' update the one-process update (`DataParallel`, the
`agentr1.trainer.update.Collective` of a rank).

Every rank holds the whole `UpdateBatch` and draws the same minibatch permutation, so
every rank knows every minibatch and its aggregation denominator (the masked tokens, or
rows, of the WHOLE minibatch). A minibatch's rows are cut into the micro-batches one
process would run (`agentr1.trainer.logprobs.micro_batches`: by length, or rows sharing a
prefix together), each dealt to the rank with the fewest tokens so far (`deal`); each
rank backpropagates its micro-batches' losses times their share of the global
denominator, the gradients are summed over ranks (`DataParallel`), and every rank takes
the same optimizer step. The gradient is then the token-mean (or seq-mean) over
the global minibatch, exactly as in one process, up to the order of the float sums.

Uses only ``torch.distributed`` (gloo or nccl), not Ray: the process group is joined by
`agentr1.distributed.ranks`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from agentr1.trainer.logprobs import micro_batches
from agentr1.trainer.update import MetricMeans

BUCKET_BYTES = 32 * 2**20
"""Gradients are summed in flat buckets of about this size: one collective per bucket
instead of one per tensor (hundreds for a transformer), bounded extra memory."""


class CollectiveError(RuntimeError):
    """A collective of the process group failed on this rank: a peer left it (it raised
    or died), or did not arrive within the group's timeout."""


@contextmanager
def collective(what: str) -> Iterator[None]:
    """Raise what goes wrong inside as a `CollectiveError` saying ``what`` it was."""
    try:
        yield
    except CollectiveError:
        raise
    except RuntimeError as e:  # gloo and nccl raise RuntimeError (or subclasses)
        raise CollectiveError(f"{what}: {type(e).__name__}: {e}") from e


def micro_size(rows: int, micro_batch_size: int, world: int) -> int:
    """The micro-batch size on N ranks: ``micro_batch_size`` when the minibatch has at
    least one micro-batch per rank, else smaller so that every rank gets rows.

    >>> micro_size(128, 32, 2), micro_size(8, 32, 2), micro_size(5, 32, 2), micro_size(1, 4, 2)
    (32, 4, 3, 1)
    """
    return max(1, min(micro_batch_size, math.ceil(rows / world)))


def deal(
    micros: list[torch.Tensor], lengths_B: torch.Tensor, rank: int, world: int
) -> list[torch.Tensor]:
    """Rank ``rank``'s share of ``micros`` (row indices; ``lengths_B``, each row's
    length): each micro-batch in turn to the rank with the fewest tokens to compute so
    far (padded to its longest row; the lowest rank on a tie), so the ranks' token counts
    differ by at most one micro-batch's. The ranks' shares together are ``micros``.

    >>> micros = [torch.tensor([0, 1]), torch.tensor([2, 3]), torch.tensor([4])]
    >>> [t.tolist() for t in deal(micros, torch.full((5,), 9), 1, 2)]
    [[2, 3]]
    """
    load = [0] * world
    mine = []
    for group in micros:
        to = load.index(min(load))
        load[to] += len(group) * int(lengths_B[group].max())
        if to == rank:
            mine.append(group)
    return mine


def buckets(tensors: list[torch.Tensor], limit: int = BUCKET_BYTES) -> list[list[int]]:
    """Indices of ``tensors`` grouped into buckets of one dtype and device, each at most
    ``limit`` bytes (or one tensor, when it alone is larger), in order.

    >>> f, h = torch.zeros(4), torch.zeros(4, dtype=torch.float16)
    >>> buckets([f, f, h, f], limit=32)
    [[0, 1], [2], [3]]
    """
    out: list[list[int]] = []
    key: Any = None
    size = 0
    for i, t in enumerate(tensors):
        n = t.numel() * t.element_size()
        k = (t.dtype, t.device)
        if out and k == key and size + n <= limit:
            out[-1].append(i)
            size += n
        else:
            out.append([i])
            key, size = k, n
    return out


def _flat(group: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in group])


def _unflat(flat: torch.Tensor, group: list[torch.Tensor]) -> None:
    for t, part in zip(group, torch.split(flat, [t.numel() for t in group]), strict=True):
        t.copy_(part.view_as(t))


def all_reduce_flat(tensors: list[torch.Tensor]) -> None:
    """Sum each tensor over ranks in place, a flat bucket at a time; the buckets'
    collectives are issued together, then waited on."""
    import torch.distributed as dist

    pending = []
    with collective("the gradients' sum"):
        for idx in buckets(tensors):
            group = [tensors[i] for i in idx]
            flat = _flat(group)
            pending.append((group, flat, dist.all_reduce(flat, async_op=True)))
        for group, flat, work in pending:
            work.wait()
            _unflat(flat, group)


def broadcast_flat(tensors: list[torch.Tensor], src: int = 0) -> None:
    """Overwrite each tensor with rank ``src``'s, in flat buckets."""
    import torch.distributed as dist

    with collective(f"the broadcast from rank {src}"):
        for idx in buckets(tensors):
            group = [tensors[i] for i in idx]
            flat = _flat(group)
            dist.broadcast(flat, src=src)
            _unflat(flat, group)


class DataParallel:
    """One rank's `agentr1.trainer.update.Collective` over the default process group."""

    lockstep = False

    def __init__(self, rank: int, world: int, device: torch.device) -> None:
        self.rank, self.world, self.device = rank, world, device

    def micro_batches(
        self,
        input_ids_BT: torch.Tensor,
        attention_mask_BT: torch.Tensor,
        micro_batch_size: int,
        share_prefix: bool,
        max_tokens: int = 0,
    ) -> list[torch.Tensor]:
        """The micro-batches one process cuts (`micro_batches`, with at most `micro_size`
        rows), dealt (`deal`): with at least ``world`` micro-batches of rows they are the
        very micro-batches one process runs, so even the per-micro-batch metrics agree."""
        rows = micro_size(input_ids_BT.shape[0], micro_batch_size, self.world)
        plan = micro_batches(
            input_ids_BT, attention_mask_BT, rows, share_prefix, max_tokens=max_tokens
        )
        return deal(plan, attention_mask_BT.sum(-1), self.rank, self.world)

    def sum_gradients(self, params: list[torch.nn.Parameter], ok: bool) -> bool:
        """Sum the gradients (a rank that computed none for a parameter adds zeros) and
        the ranks' count of non-finite losses, in one set of collectives; every rank gets
        the same sums, hence makes the same decision to step or skip."""
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        failed = torch.tensor([0.0 if ok else 1.0], device=self.device)
        grads = [p.grad for p in params if p.grad is not None]
        all_reduce_flat([*grads, failed])
        return failed.item() == 0.0 and all(bool(torch.isfinite(g).all()) for g in grads)

    def clip_grad_norm(self, params: list[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
        """The summed gradients are the same on every rank: clip as one process does."""
        return torch.nn.utils.clip_grad_norm_(params, max_norm)

    def reduce_metrics(self, means: MetricMeans) -> None:
        """Weighted sums and weights of every metric over ranks; a rank that logged no
        value of a metric (it had no rows) adds nothing to it."""
        import torch.distributed as dist

        names: list[list[str]] = [[] for _ in range(self.world)]
        with collective("the metrics' sum"):
            dist.all_gather_object(names, list(means.sums))
            keys = list(dict.fromkeys(k for ks in names for k in ks))  # the same on every rank
            sums = [means.sums.get(k, 0.0) for k in keys]
            counts = [float(means.counts.get(k, 0.0)) for k in keys]
            t = torch.tensor(sums + counts, dtype=torch.float64, device=self.device)
            dist.all_reduce(t)
        n = len(keys)
        means.sums = {k: float(t[i]) for i, k in enumerate(keys)}
        means.counts = {k: float(t[n + i]) for i, k in enumerate(keys)}
