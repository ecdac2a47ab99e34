"""Atomic, complete checkpoints: a resumed run continues exactly as an uninterrupted one.

A checkpoint is a directory ``step_000040/`` holding the policy (and critic) weights as
safetensors, optimizer and scheduler states, every RNG state, the data cursor and the
step. It is written to a temporary sibling directory and renamed into place, so a run
killed mid-write leaves the previous checkpoint intact. Optimizer/RNG states are loaded
with ``torch.load(weights_only=True)`` — no arbitrary unpickling.

A checkpoint that cannot be written (a full disk, a vanished directory) raises
`CheckpointError` naming the step, the directory, the cause and the newest complete
checkpoint, after removing its partial files; when the disk's free space is already
smaller than the newest checkpoint, it is refused before anything is written.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from agentr1.fileio import remove_partial, write_atomic

log = logging.getLogger(__name__)

STATE_FILE = "state.pt"
META_FILE = "meta.json"


def _weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    # Tied weights share storage; safetensors refuses duplicates, so keep each once.
    seen: dict[int, str] = {}
    out = {}
    for k, v in module.state_dict().items():
        ptr = v.data_ptr()
        if ptr in seen and v.numel() > 0:
            continue
        seen[ptr] = k
        out[k] = v.detach().contiguous().cpu()
    return out


def rng_state() -> dict[str, Any]:
    """Every RNG the run draws from."""
    py = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()  # type: ignore[misc]
    return {  # builtins and tensors only, so `torch.load(weights_only=True)` accepts it
        "python": [py[0], list(py[1]), py[2]],
        "numpy": [
            str(name),
            torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            int(pos),
            int(has_gauss),
            float(cached),
        ],
        "torch": torch.get_rng_state(),
    }


def set_rng_state(state: dict[str, Any]) -> None:
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])


class CheckpointError(OSError):
    """A checkpoint could not be written; the previous ones are intact."""


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file())


def write_failed(root: str | Path, what: str, to: Path, why: str) -> CheckpointError:
    """The error for ``what`` (a checkpoint, the final model) that could not be written to
    ``to``: the cause and the newest complete checkpoint under ``root`` to resume from."""
    last = latest_checkpoint(root)
    intact = f"the newest complete checkpoint, {last}, is intact" if last else "no earlier one"
    return CheckpointError(
        f"{what} could not be written to {to}: {why}; {intact} "
        "(free space and run again with resume to continue from it)"
    )


def save_checkpoint(
    root: str | Path,
    step: int,
    modules: dict[str, torch.nn.Module],
    states: dict[str, Any],
    meta: dict[str, Any],
    keep: int = 2,
) -> Path:
    """Write ``root/step_{step:06d}`` atomically; keep the newest ``keep`` checkpoints.

    Args:
        modules: named modules whose weights go to ``<name>.safetensors``.
        states: tensors-and-builtins state (optimizers, schedulers, RNG, cursor) for
            ``state.pt``.
        meta: JSON-able facts (step, metrics so far) for ``meta.json``.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp_step_{step:06d}_{os.getpid()}"
    remove_partial(root)  # what a killed writer (any process) left
    last = latest_checkpoint(root)
    free = shutil.disk_usage(root).free
    if last is not None:  # the last one's size predicts this one's
        need, what = _dir_bytes(last), "the last checkpoint took"
    else:  # the first: its tensors' bytes (a 3B model's full state is ~37 GB)
        need, what = _tensor_bytes([*modules.values(), states]), "this checkpoint needs about"
    if free < need:
        raise write_failed(
            root,
            f"checkpoint step {step}",
            root,
            f"{free / 2**20:.0f} MiB free, {what} {need / 2**20:.0f} MiB",
        )
    try:
        tmp.mkdir()
        for name, module in modules.items():
            save_file(_weights(module), str(tmp / f"{name}.safetensors"))
        torch.save(states, tmp / STATE_FILE)
        (tmp / META_FILE).write_text(json.dumps({**meta, "step": step}, indent=1))
        for f in tmp.iterdir():  # make the bytes durable before the rename publishes them
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
    # torch.save reports a full disk as RuntimeError, safetensors as its own SafetensorError
    # ("I/O error: No space left on device", seen on a GPU machine's 64 GiB disk).
    except (OSError, RuntimeError, SafetensorError) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise write_failed(root, f"checkpoint step {step}", root, f"{type(e).__name__}: {e}") from e
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    for old in sorted(root.glob("step_*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _tensor_bytes(objs: list[Any]) -> int:
    """Bytes of the distinct tensors in modules' state dicts and nested state (dicts,
    lists, tuples): what a checkpoint of them writes, give or take its metadata."""
    seen: set[tuple[int, int, int]] = set()
    total = 0

    def visit(o: Any) -> None:
        nonlocal total
        if isinstance(o, torch.nn.Module):
            visit(o.state_dict())
        elif isinstance(o, torch.Tensor):
            try:  # tied weights share a storage: counted once
                key = (o.untyped_storage().data_ptr(), o.storage_offset(), o.nbytes)
            except (RuntimeError, NotImplementedError):  # a tensor subclass without one
                key = (id(o), 0, 0)
            if key[0] == 0:  # meta tensors, empty storages: no address to share
                key = (id(o), 0, 0)
            if key not in seen:
                seen.add(key)
                total += o.nbytes
        elif isinstance(o, dict):
            for v in o.values():
                visit(v)
        elif isinstance(o, (list, tuple)):
            for v in o:
                visit(v)

    for o in objs:
        visit(o)
    return total


def save_weights_once(path: str | Path, module: torch.nn.Module) -> None:
    """``module``'s weights to ``path`` (safetensors) through a temporary file and a
    rename: for what a run writes once and every checkpoint points to (the reference)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        save_file(_weights(module), str(tmp))
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except (OSError, RuntimeError, SafetensorError) as e:
        tmp.unlink(missing_ok=True)
        raise write_failed(
            path.parent, "the reference model", path, f"{type(e).__name__}: {e}"
        ) from e


def load_weights(path: str | Path, module: torch.nn.Module) -> None:
    """Load a `save_weights_once` file (or a checkpoint's ``<name>.safetensors``) into
    ``module``, checking the names match (tied weights saved once)."""
    f = Path(path)
    missing, unexpected = module.load_state_dict(load_file(str(f)), strict=False)
    # Tied weights were saved once; anything else missing is a real mismatch.
    tied = {k for k in missing if "lm_head" in k or "embed" in k}
    if set(missing) - tied or unexpected:
        raise ValueError(
            f"{f}: weights do not match the model (missing {sorted(set(missing) - tied)[:5]}, "
            f"unexpected {sorted(unexpected)[:5]})"
        )
    tie = getattr(module, "tie_weights", None)
    if callable(tie):
        tie()


def update_checkpoint_meta(path: str | Path | None, meta: dict[str, Any]) -> None:
    """Merge ``meta`` into a written checkpoint's ``meta.json`` (atomically; the step is
    kept). For facts learnt after the weights were saved, e.g. the final eval."""
    if path is None:
        raise FileNotFoundError("no checkpoint to update")
    f = Path(path) / META_FILE
    old = json.loads(f.read_text())
    write_atomic(f, json.dumps({**old, **meta, "step": old["step"]}, indent=1), durable=True)


def latest_checkpoint(root: str | Path) -> Path | None:
    """Newest complete checkpoint directory under ``root`` (temporary ones are ignored)."""
    root = Path(root)
    if not root.exists():
        return None
    done = [p for p in sorted(root.glob("step_*")) if (p / META_FILE).exists()]
    return done[-1] if done else None


def load_checkpoint(
    path: str | Path, modules: dict[str, torch.nn.Module]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Load weights into ``modules`` in place; returns (states, meta)."""
    path = Path(path)
    for name, module in modules.items():
        f = path / f"{name}.safetensors"
        if not f.exists():
            raise FileNotFoundError(f"{f}: checkpoint has no weights for {name!r}")
        load_weights(f, module)
    states = torch.load(path / STATE_FILE, weights_only=True)
    meta = json.loads((path / META_FILE).read_text())
    return states, meta
