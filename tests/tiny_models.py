"""Tiny random models and tokenizers for fast tests, saved as ordinary HF directories.

Nothing here touches the network: the model is built from a config with a fixed seed,
the tokenizer from an in-memory character vocabulary. ``save_tiny_llama`` writes both
with ``save_pretrained`` so the real loading code (``from_pretrained`` on a local path)
runs in tests exactly as it does on a real checkpoint.
"""

from __future__ import annotations

import string
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>")
"""Ids 0..3 of the tiny tokenizer; the remaining ids are single characters."""

# Most useful characters first, so small vocabularies still hold words and spaces.
_CHARS = (
    string.ascii_lowercase
    + " .,!?"
    + string.ascii_uppercase
    + string.digits
    + "\"#$%&'()*+-/:;<=>@[\\]^_`{|}~"
)


def tiny_llama(
    vocab_size: int = 64,
    hidden: int = 32,
    layers: int = 2,
    heads: int = 4,
    seed: int = 0,
    init_std: float = 0.5,
    kv_heads: int | None = None,
) -> LlamaForCausalLM:
    """A randomly initialised float32 ``LlamaForCausalLM`` in eval mode.

    ``init_std`` is 25 times the HF default (0.02) so next-token distributions are peaked
    (top token ~0.45 on average) rather than nearly uniform: with near-uniform logits,
    greedy near-ties and top-p boundary cases could flip on 1e-7 float noise between
    cached and uncached forward passes, and sampled text would be pure noise.
    """
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads or heads,
        max_position_embeddings=256,
        initializer_range=init_std,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model.to(torch.float32).eval()


def tiny_tokenizer(vocab_size: int = 64) -> PreTrainedTokenizerFast:
    """A character-level fast tokenizer with ``vocab_size`` ids (4 specials + characters).

    Every non-special id decodes to exactly one character, so decoded text lines up with
    token ids, which makes stop-string tests easy to reason about.
    """
    n_chars = vocab_size - len(SPECIAL_TOKENS)
    if not 0 < n_chars <= len(_CHARS):
        raise ValueError(f"vocab_size must be in (4, {len(_CHARS) + 4}], got {vocab_size}")
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    vocab.update({ch: len(SPECIAL_TOKENS) + i for i, ch in enumerate(_CHARS[:n_chars])})
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
    )


def save_tiny_llama(path: str | Path, vocab_size: int = 64, seed: int = 0) -> Path:
    """Save ``tiny_llama`` and ``tiny_tokenizer`` to ``path`` as a normal HF directory."""
    path = Path(path)
    tiny_llama(vocab_size=vocab_size, seed=seed).save_pretrained(path)
    tiny_tokenizer(vocab_size=vocab_size).save_pretrained(path)
    return path
