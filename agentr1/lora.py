"""LoRA: train a low-rank update of the policy's linear layers instead of every weight.

A chosen linear layer ``y = W x`` becomes ``y = W x + (alpha / r) · B A x`` with ``A`` [r, in]
and ``B`` [out, r] trainable and ``W`` frozen; ``B`` starts at zero, so the adapted model
starts equal to its base. The backward pass then computes no gradient for any base weight
(on SmolLM2-135M that is most of the update's work: benchmarks/RESULTS.md), and AdamW keeps
moments for the adapters only.

The base weights stay plain parameters under their usual names; the adapters are two more
parameters on the same modules (``<module>.lora_A``, ``<module>.lora_B``), added to the
output by a forward hook. Hence:

- `merged_state_dict` is a plain state dict (base + scaled B A under the base's names): the
  bf16 sampler copy and a saved final model load it like any other;
- `adapters_disabled` runs the base model: the KL reference without a second copy;
- `merge_adapters` folds the adapters into the base and restarts them at zero (after the SFT
  warm start, so the RL reference — the base — is the warm start);
- `unload` folds them in and removes them: a plain model again.

Sibling projections that read the same input (q/k/v of an attention block, gate/up of an
MLP: `SHARED_INPUT`) share one ``x [A_q; A_k; A_v]^T`` product: the input is read (and cast
by autocast) once instead of once per adapter, in the forward and in the backward. The
adapters stay separate parameters and compute exactly what they would alone; only the
memory traffic changes (benchmarks/RESULTS.md, LoRA section).

Notation: r = rank, I = in features, O = out features, N = tokens.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn

from agentr1.config import DEFAULT_LORA_TARGETS as DEFAULT_TARGETS


def _a_b(m: nn.Module) -> tuple[nn.Parameter, nn.Parameter]:
    """An adapted module's (A [r, I], B [O, r])."""
    return m.get_parameter("lora_A"), m.get_parameter("lora_B")


def _flags(m: nn.Module) -> dict[str, Any]:
    """An adapted module's plain attributes (``lora_scale``, ``lora_enabled``)."""
    return m.__dict__


SHARED_INPUT: tuple[tuple[str, ...], ...] = (
    ("q_proj", "k_proj", "v_proj"),
    ("gate_proj", "up_proj"),
)
"""Last name parts of sibling linear layers (same parent module) that Llama / Qwen blocks
call on the same input tensor."""


class _SharedInput:
    """Adapters of sibling layers that read one input: the first of them to run computes
    ``x A^T`` for all (their A's stacked), the others take their slice of it.

    The product is reused only for the very tensor it was computed from (identity, not
    equality), with the same A's (their in-place version counters: an optimizer step in
    between starts a new product) in the same grad / autocast mode. So a model that does
    not feed the siblings one input gets the right answer, only without the saving. The
    product is dropped as soon as every member has taken its slice."""

    def __init__(self, mods: list[nn.Linear]) -> None:
        self.mods = mods
        self._x: torch.Tensor | None = None
        self._key: tuple[Any, ...] = ()
        self._z: torch.Tensor | None = None
        self._taken: set[int] = set()

    def project(self, m: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """``x A_m^T`` for member ``m``. [..., r]"""
        a: list[torch.Tensor] = [_a_b(k)[0] for k in self.mods]
        key = (
            tuple(t._version for t in a),
            torch.is_grad_enabled(),
            torch.is_autocast_enabled(x.device.type),
        )
        if self._z is None or self._x is not x or self._key != key:
            self._x, self._key, self._taken = x, key, set()
            self._z = nn.functional.linear(x, torch.cat(a))
        self._taken.add(id(m))
        i = next(j for j, k in enumerate(self.mods) if k is m)
        r = a[i].shape[0]
        z = self._z[..., i * r : (i + 1) * r]
        if len(self._taken) == len(self.mods):
            self._x = self._z = None
        return z

    def __deepcopy__(self, memo: dict[int, Any]) -> _SharedInput:
        # A copied model (PPO's critic) gets its own group over its own modules, no cache.
        return _SharedInput([copy.deepcopy(m, memo) for m in self.mods])


def _lora_forward(module: nn.Module, args: tuple[Any, ...], out: torch.Tensor) -> torch.Tensor:
    flags = _flags(module)
    if not flags["lora_enabled"]:
        return out
    a_RI, b_OR = _a_b(module)
    group: _SharedInput | None = flags["lora_group"]
    z = nn.functional.linear(args[0], a_RI) if group is None else group.project(module, args[0])
    scale: float = flags["lora_scale"]
    # The scale on the rank-r product, not on the [..., O] output: one elementwise pass
    # over r columns instead of O, forward and backward.
    return out + nn.functional.linear(z * scale, b_OR)


def _share_inputs(chosen: list[str], linear: dict[str, nn.Linear]) -> None:
    """Give the adapted siblings of `SHARED_INPUT` (same parent module) one `_SharedInput`."""
    by_parent: dict[tuple[str, tuple[str, ...]], list[nn.Linear]] = {}
    for n in chosen:
        parent, _, last = n.rpartition(".")
        for names in SHARED_INPUT:
            if last in names:
                by_parent.setdefault((parent, names), []).append(linear[n])
    for mods in by_parent.values():
        if len(mods) > 1:
            group = _SharedInput(mods)
            for m in mods:
                _flags(m)["lora_group"] = group


def lora_modules(model: nn.Module) -> list[tuple[str, nn.Linear]]:
    """(name, module) of every adapted linear layer, in module order."""
    return [
        (n, m)
        for n, m in model.named_modules()
        if isinstance(m, nn.Linear) and "lora_A" in m._parameters
    ]


def apply_lora(
    model: nn.Module,
    rank: int,
    alpha: float,
    targets: Sequence[str] = DEFAULT_TARGETS,
    share_input: bool = True,
) -> list[str]:
    """Add rank-``rank`` adapters to every linear layer whose last name part is in
    ``targets``, freeze every other parameter of ``model``; returns the adapted names.
    ``share_input``: siblings of `SHARED_INPUT` compute their ``x A^T`` as one product.

    Raises:
        ValueError: a bad rank or alpha, a model that has adapters already, targets that
            match no linear layer (the message lists the model's linear layer names), or a
            target whose weight is tied to another module (merging would change both).
    """
    if rank < 1 or alpha <= 0:
        raise ValueError(f"LoRA needs rank >= 1 and alpha > 0, got rank={rank}, alpha={alpha}")
    if lora_modules(model):
        raise ValueError("the model has LoRA adapters already")
    linear = {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    chosen = [n for n in linear if n.rsplit(".", 1)[-1] in targets]
    if not chosen:
        names = sorted({n.rsplit(".", 1)[-1] for n in linear})
        raise ValueError(
            f"model.lora.targets={list(targets)} match no linear layer of this model; "
            f"its linear layers are named: {', '.join(names)}"
        )
    owners: dict[int, list[str]] = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        owners.setdefault(id(p), []).append(n)
    for n in chosen:
        others = [t for t in owners[id(linear[n].weight)] if t != f"{n}.weight"]
        if others:
            raise ValueError(
                f"model.lora.targets: {n}.weight is tied to {', '.join(others)}; an adapter "
                "on it would change both when merged: leave it out of the targets"
            )
    model.requires_grad_(False)
    for n in chosen:
        m = linear[n]
        w = m.weight
        a_RI = torch.empty(rank, m.in_features, dtype=w.dtype, device=w.device)
        nn.init.kaiming_uniform_(a_RI, a=math.sqrt(5))  # nn.Linear's own init
        b_OR = torch.zeros(m.out_features, rank, dtype=w.dtype, device=w.device)
        m.register_parameter("lora_A", nn.Parameter(a_RI))
        m.register_parameter("lora_B", nn.Parameter(b_OR))
        _flags(m).update(lora_scale=alpha / rank, lora_enabled=True, lora_group=None)
        m.register_forward_hook(_lora_forward)
    if share_input:
        _share_inputs(chosen, linear)
    return chosen


def trainable_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The parameters an optimizer should hold (all of them without adapters)."""
    return [p for p in model.parameters() if p.requires_grad]


def _delta(m: nn.Linear) -> torch.Tensor:
    """The adapter's weight update, in the base weight's dtype. [O, I]"""
    a_RI, b_OR = (p.detach().float() for p in _a_b(m))
    scale: float = _flags(m)["lora_scale"]
    return (scale * (b_OR @ a_RI)).to(m.weight.dtype)


def merged_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """``model.state_dict()`` with every adapter folded into its base weight and the
    adapter entries left out: what a plain model of the same architecture loads."""
    sd = model.state_dict()
    for name, m in lora_modules(model):
        prefix = f"{name}." if name else ""
        del sd[f"{prefix}lora_A"], sd[f"{prefix}lora_B"]
        sd[f"{prefix}weight"] = m.weight.detach() + _delta(m)
    return sd


Adapters = dict[str, tuple[torch.Tensor, torch.Tensor, float]]
"""Base weight name -> (A [r, I], B [O, r], scale) of each adapted linear layer."""


def base_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """``model.state_dict()`` without the adapters: the frozen base weights (what a plain
    model of the same architecture loads before `merge_into`)."""
    sd = model.state_dict()
    for name, _ in lora_modules(model):
        prefix = f"{name}." if name else ""
        del sd[f"{prefix}lora_A"], sd[f"{prefix}lora_B"]
    return sd


def adapter_state(model: nn.Module) -> Adapters:
    """Every adapter's (A, B, scale) by its base weight's name, detached on the CPU: all a
    sampler holding the base weights needs after an update (kilobytes to megabytes,
    against the whole model for merged weights)."""
    out: Adapters = {}
    for name, m in lora_modules(model):
        a_RI, b_OR = (p.detach().cpu().clone() for p in _a_b(m))
        out[f"{name}.weight" if name else "weight"] = (a_RI, b_OR, float(_flags(m)["lora_scale"]))
    return out


def merge_into(base: dict[str, torch.Tensor], adapters: Adapters) -> dict[str, torch.Tensor]:
    """``base`` with each adapter folded into its weight (`merged_state_dict`'s result,
    computed where the base weights already are)."""
    out = dict(base)
    for key, (a_RI, b_OR, scale) in adapters.items():
        w = base[key]
        out[key] = w + (scale * (b_OR.float() @ a_RI.float())).to(w.dtype)
    return out


@torch.no_grad()
def merge_adapters(model: nn.Module) -> int:
    """Fold every adapter into its base weight and restart it at zero (B = 0; A kept);
    the model computes the same function. Returns the number of adapters merged."""
    mods = lora_modules(model)
    for _, m in mods:
        m.weight.add_(_delta(m))
        _a_b(m)[1].zero_()
    return len(mods)


@torch.no_grad()
def unload(model: nn.Module) -> int:
    """Merge every adapter and remove it (parameters, hook, flags): a plain model that
    computes the same function. Returns the number of adapters removed."""
    mods = lora_modules(model)
    merge_adapters(model)
    for _, m in mods:
        for key, hook in list(m._forward_hooks.items()):
            if hook is _lora_forward:
                del m._forward_hooks[key]
        del m._parameters["lora_A"], m._parameters["lora_B"]
        del _flags(m)["lora_scale"], _flags(m)["lora_enabled"], _flags(m)["lora_group"]
    return len(mods)


@contextlib.contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[None]:
    """Run ``model`` as its base (every adapter off) inside the block."""
    mods = [m for _, m in lora_modules(model)]
    before = [_flags(m)["lora_enabled"] for m in mods]
    for m in mods:
        _flags(m)["lora_enabled"] = False
    try:
        yield
    finally:
        for m, on in zip(mods, before, strict=True):
            _flags(m)["lora_enabled"] = on
