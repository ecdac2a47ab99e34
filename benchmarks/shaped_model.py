"""Randomly initialised models of known configurations: the same shapes as the real
model, and so the same time and memory, on a machine that holds no weights and reaches
no hub (the lent GPU machine, whose tree travels under 64 MiB).

    python3 benchmarks/shaped_model.py qwen2.5-3b OUT_DIR --tokenizer TOKENIZER_DIR

saves a model directory that ``model.path`` can name (config.json, model.safetensors and
the tokenizer files copied from ``--tokenizer``; Qwen3's tokenizer, which `make venv`
fetches into .cache/tokenizers/qwen3, has Qwen2.5's vocabulary plus a few added tokens).
What it generates is noise: use it for speed and memory, never for a learning result.
`roofline.py --shape NAME` builds one in memory.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import Any

import torch

SHAPES: dict[str, dict[str, Any]] = {
    # SmolLM2-135M-Instruct's config.json (a Llama).
    "smollm2-135m": {
        "arch": "llama",
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "vocab_size": 49152,
        "max_position_embeddings": 8192,
        "rope_theta": 100000.0,
        "tie_word_embeddings": True,
    },
    # Qwen2.5-3B-Instruct's config.json (the paper's model: q/k/v biases, GQA 16:2).
    "qwen2.5-3b": {
        "arch": "qwen2",
        "hidden_size": 2048,
        "intermediate_size": 11008,
        "num_hidden_layers": 36,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
        "max_position_embeddings": 32768,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
    },
    # Qwen2.5's architecture and vocabulary at a test's size: dry runs of a recipe that
    # names the 3B model, on a CPU, before a GPU is spent on it.
    "qwen2.5-tiny": {
        "arch": "qwen2",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
        "max_position_embeddings": 32768,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": True,
    },
}

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def shaped_model(name: str, dtype: torch.dtype, device: str | torch.device = "cpu") -> Any:
    """A causal LM of `SHAPES` [name] with random weights (seed 0), built in ``dtype``
    directly on ``device`` (a 3B model's fp32 init on two CPU cores takes minutes)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    if name not in SHAPES:
        raise ValueError(f"shape {name!r}: expected one of {', '.join(sorted(SHAPES))}")
    spec = dict(SHAPES[name])
    config_cls, model_cls = {
        "llama": (LlamaConfig, LlamaForCausalLM),
        "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    }[spec.pop("arch")]
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device), torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = model_cls(config_cls(**spec))
    finally:
        torch.set_default_dtype(previous)
    return model.eval()


def save(name: str, out: Path, tokenizer: Path, dtype: torch.dtype, device: str) -> Path:
    """`shaped_model` saved as a model directory, with the tokenizer files beside it."""
    missing = [f for f in TOKENIZER_FILES if not (tokenizer / f).is_file()]
    if missing:
        raise FileNotFoundError(f"--tokenizer {tokenizer}: no {', '.join(missing)}")
    out.mkdir(parents=True, exist_ok=True)
    shaped_model(name, dtype, device).save_pretrained(out)
    for f in TOKENIZER_FILES:
        shutil.copyfile(tokenizer / f, out / f)
    return out


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("shape", choices=sorted(SHAPES))
    ap.add_argument("out", type=Path)
    ap.add_argument("--tokenizer", type=Path, required=True, help="a folder with tokenizer.json")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args(argv)
    out = save(args.shape, args.out, args.tokenizer, getattr(torch, args.dtype), args.device)
    print(f"saved a random {args.shape} ({args.dtype}) in {out}")
    return out


if __name__ == "__main__":
    main()
