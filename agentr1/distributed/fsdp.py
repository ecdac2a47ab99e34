"""FSDP2 sharding of the trainer ranks' learners (``distributed.sharding: fsdp``).

Each rank holds a shard of the decoder layers' weights, gradients and AdamW moments
(``torch.distributed.fsdp.fully_shard`` on every decoder layer of the policy and of the
critic) instead of a whole replica: a layer's weights are gathered for its forward and
backward, its gradients reduce-scattered after the backward. The embeddings, final norm
and LM head (a small share of a large model) stay whole on every rank, as in DDP. The loss
semantics are DDP's (`agentr1.distributed.dp`): the global minibatch's denominator, the
gradients summed over ranks (the reduce-scatter's divide factor is 1), the same
optimizer step. Rank 0 keeps its whole policy (and critic) besides its shard, for the
rollouts, the scoring and the checkpoints: after every update the trained weights are
gathered into it; a checkpoint gathers the AdamW moments to rank 0 (`gather_states`) and
a resume scatters them back (`scatter_states`).

FSDP's gathers run inside each forward and backward, so every rank runs the same number
of micro-batches and every one of them, even one whose loss is not finite
(`ShardedParallel`, ``lockstep``).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from agentr1.distributed.dp import DataParallel, collective
from agentr1.trainer.update import Learner


def lockstep_micro_batches(
    by_len: torch.Tensor, micro_batch_size: int, rank: int, world: int
) -> list[torch.Tensor]:
    """Rank ``rank``'s micro-batches when every rank must run as many: ``world x k``
    micro-batches of near-equal size (the fewest with at most ``micro_batch_size`` rows,
    or one more row where the rows do not split into equal counts, at least one row
    each), every ``world``-th to this rank.

    >>> [t.tolist() for t in lockstep_micro_batches(torch.arange(7), 2, 1, 2)]
    [[2, 3], [6]]
    >>> [len(t) for r in range(2) for t in lockstep_micro_batches(torch.arange(5), 1, r, 2)]
    [2, 1, 1, 1]

    Raises:
        ValueError: fewer rows than ranks (a rank would have nothing to run).
    """
    rows = len(by_len)
    if rows < world:
        raise ValueError(
            f"distributed.sharding=fsdp: a minibatch of {rows} rows for {world} trainer ranks; "
            "every rank needs a row (fewer optim.minibatches, or more rows a step)"
        )
    k = max(1, min(math.ceil(rows / (world * micro_batch_size)), rows // world))
    micros = torch.tensor_split(by_len, world * k)
    return list(micros[rank::world])


class ShardedParallel(DataParallel):
    """A rank's `agentr1.trainer.update.Collective` over FSDP2-sharded learners: the
    backward has reduce-scattered (summed) the gradients already; what is left is to agree
    on stepping."""

    lockstep = True

    def micro_batches(
        self,
        input_ids_BT: torch.Tensor,
        attention_mask_BT: torch.Tensor,
        micro_batch_size: int,
        share_prefix: bool,
        max_tokens: int = 0,
    ) -> list[torch.Tensor]:
        # every rank must run as many passes: equal row counts, not `micro_batches`' cut
        lengths = attention_mask_BT.sum(-1)
        by_len = torch.argsort(lengths, stable=True)
        if max_tokens > 0:  # rows as long as the longest fit the cap
            longest = max(1, int(lengths.max()))
            micro_batch_size = max(1, min(micro_batch_size, max_tokens // longest))
        return lockstep_micro_batches(by_len, micro_batch_size, self.rank, self.world)

    def sum_gradients(self, params: list[torch.nn.Parameter], ok: bool) -> bool:
        """The layers' gradients are summed already (reduce-scattered by their backward);
        the rest (whole on every rank) are summed here, with the ranks' count of
        non-finite losses or shards."""
        whole = [p for p in params if not hasattr(p, "to_local")]
        shards = [p.grad for p in params if hasattr(p, "to_local") and p.grad is not None]
        ok = ok and all(bool(torch.isfinite(_local(g)).all()) for g in shards)
        return super().sum_gradients(whole, ok)

    def clip_grad_norm(self, params: list[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
        """`torch.nn.utils.clip_grad_norm_` over whole gradients (the same on every rank)
        and shards (their squares summed over ranks): the one-process norm and scale."""
        import torch.distributed as dist

        grads = [p.grad for p in params if p.grad is not None]
        whole = [g for g in grads if not hasattr(g, "to_local")]
        shards = [_local(g) for g in grads if hasattr(g, "to_local")]
        sq = torch.zeros((), dtype=torch.float32, device=self.device)
        for g in shards:
            sq += g.float().pow(2).sum()
        with collective("the gradients' norm"):
            dist.all_reduce(sq)
        for g in whole:
            sq += g.float().pow(2).sum()
        total = sq.sqrt()
        coef = (max_norm / (total + 1e-6)).clamp(max=1.0)
        for g in [*whole, *shards]:
            g.mul_(coef.to(g.dtype))
        return total


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor (a plain tensor as it is)."""
    return t.to_local() if hasattr(t, "to_local") else t


def _shard_module(module: torch.nn.Module, layer_names: set[str]) -> None:
    """FSDP2 on every decoder layer of ``module``; what lies outside the layers (the
    embeddings, the final norm, the LM head, a value head) stays whole on every rank,
    its gradients summed like DDP's (`ShardedParallel.sum_gradients`). Not on the root:
    the log-probs read the LM head's weight outside any module's forward (chunked,
    `agentr1.trainer.logprobs`), where FSDP would not have gathered it."""
    from torch.distributed.fsdp import fully_shard

    layers = [m for m in module.modules() if type(m).__name__ in layer_names]
    if not layers:
        raise ValueError(
            f"distributed.sharding=fsdp: {type(module).__name__} has no decoder layers named "
            f"by its _no_split_modules ({sorted(layer_names)}) to shard"
        )
    for m in layers:
        unit = fully_shard(m)
        unit.set_gradient_divide_factor(1.0)  # a sum over ranks, as in one process
        unit.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM


def shard_learner(cfg: Any, learner: Learner) -> Learner:
    """``learner``'s policy and critic sharded in place (every decoder layer, by the
    model's ``_no_split_modules``, then the root), with fresh optimizers and LR schedule
    over the shards (`agentr1.trainer.state.make_optimizers`). Every rank calls this
    together, on modules that hold the same weights."""
    from agentr1.trainer.state import make_optimizers

    layers = set(getattr(learner.policy, "_no_split_modules", None) or [])
    _shard_module(learner.policy, layers)
    if learner.critic is not None:
        _shard_module(learner.critic, layers)
    return make_optimizers(cfg, learner.policy, learner.critic)


def _trainable(learner: Learner) -> list[tuple[str, torch.nn.Parameter]]:
    out = []
    for prefix, module in (("", learner.policy), ("critic.", learner.critic)):
        if module is not None:
            out += [(prefix + n, p) for n, p in module.named_parameters() if p.requires_grad]
    return out


def gather_weights(sharded: Learner, into: Learner | None) -> None:
    """Gather the sharded learner's trainable weights (every rank calls this together)
    into ``into``'s policy and critic (rank 0's whole copies; None elsewhere)."""
    dst = dict(_trainable(into)) if into is not None else {}
    with collective("gathering the trained weights"), torch.no_grad():
        for name, p in _trainable(sharded):
            full = p.full_tensor() if hasattr(p, "full_tensor") else p
            if into is not None:
                dst[name].copy_(full)


def _names(module: torch.nn.Module) -> list[str]:
    return [n for n, p in module.named_parameters() if p.requires_grad]


def _by_name(sd: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """An optimizer state dict keyed by parameter index -> keyed by parameter name (the
    full-state form of ``torch.distributed.checkpoint``)."""
    return {
        "state": {names[i]: v for i, v in sd["state"].items()},
        "param_groups": [
            {**g, "params": [names[i] for i in g["params"]]} for g in sd["param_groups"]
        ],
    }


def _by_index(sd: dict[str, Any], names: list[str]) -> dict[str, Any]:
    index = {n: i for i, n in enumerate(names)}
    return {
        "state": {index[n]: v for n, v in sd["state"].items()},
        "param_groups": [
            {**g, "params": [index[n] for n in g["params"]]} for g in sd["param_groups"]
        ],
    }


def _pairs(learner: Learner) -> list[tuple[str, torch.nn.Module, torch.optim.Optimizer]]:
    out: list[tuple[str, torch.nn.Module, torch.optim.Optimizer]] = [
        ("optimizer", learner.policy, learner.optimizer)
    ]
    if learner.critic is not None and learner.critic_optimizer is not None:
        out.append(("critic_optimizer", learner.critic, learner.critic_optimizer))
    return out


def gather_states(sharded: Learner, on_rank0: bool) -> dict[str, Any]:
    """The sharded optimizers' full states (AdamW moments, keyed by parameter index as
    ``Optimizer.state_dict`` keys them) and the LR schedule's, as a checkpoint holds them,
    on rank 0 (an empty dict elsewhere); every rank calls this together."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    out: dict[str, Any] = {}
    with collective("gathering the optimizer states"):
        for key, module, opt in _pairs(sharded):
            full = get_optimizer_state_dict(module, opt, options=opts)
            if on_rank0:
                out[key] = _by_index(full, _names(module))
    if on_rank0 and sharded.scheduler is not None:
        out["scheduler"] = sharded.scheduler.state_dict()
    return out


def scatter_states(sharded: Learner, states: dict[str, Any] | None) -> None:
    """Rank 0's full optimizer states (`agentr1.distributed.ranks.learner_states`; None
    on the other ranks) into the sharded optimizers, each rank keeping its shard; every
    rank calls this together. The LR schedule's state travels with ``states`` to rank 0
    only, so the others get it from their caller."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    with collective("scattering the optimizer states"):
        for key, module, opt in _pairs(sharded):
            full = _by_name(states[key], _names(module)) if states is not None else {}
            set_optimizer_state_dict(module, opt, optim_state_dict=full, options=opts)


def clear_states(learner: Learner) -> None:
    """Fresh optimizers: no moments (AdamW's next step is its first)."""
    for _, _, opt in _pairs(learner):
        opt.state.clear()
