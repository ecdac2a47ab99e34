"""Build a tiny Llama and a byte-level BPE tokenizer from a task's own text.

Both are saved as a normal HF directory (``config.json``, ``model.safetensors``,
``tokenizer.json`` with the chat template), so the same loading code serves the demo, the
tests and real models. The tokenizer is trained on exactly the text the agent reads and
writes (passages, questions, tool calls, answers, template glue), so every name it must
copy is a short token sequence, and it never meets an unknown byte (byte-level BPE).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from agentr1.templates import QWEN25_TOOLS

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def train_tokenizer(
    texts: Iterable[str], vocab_size: int, pretokenizer: str = "words", split_digits: bool = False
) -> Any:
    """Train a byte-level BPE with ChatML special tokens; returns a PreTrainedTokenizerFast.

    ``pretokenizer`` is "words" (whitespace isolated, see below) or "bytelevel" (GPT-2).
    ``split_digits`` makes every digit a token of its own, as SmolLM2's and Llama's
    tokenizers do: a number is then written from the ten digit tokens, each seen thousands
    of times, instead of being one of hundreds of number tokens a tiny model sees a few
    times each (and cannot learn to copy reliably).
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    # Whitespace is its own pre-token, so a word is the same token sequence after a space,
    # a quote or a tag ("Velmora" in a passage, in a search query and in an answer): a
    # tiny model then copies names by copying token ids, not by learning a mapping
    # between "ĠVelmora" and "Velmora".
    if pretokenizer == "bytelevel":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    elif pretokenizer == "words":
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(r"\w+|[^\w\s]+|\s+"), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    else:
        raise ValueError(f"pretokenizer must be 'words' or 'bytelevel', got {pretokenizer!r}")
    if split_digits:
        digits = pre_tokenizers.Digits(individual_digits=True)
        tok.pre_tokenizer = pre_tokenizers.Sequence([tok.pre_tokenizer, digits])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
    )
    fast.chat_template = QWEN25_TOOLS
    return fast


def build_tiny_llama(
    vocab_size: int,
    hidden_size: int,
    layers: int,
    heads: int,
    intermediate_size: int,
    max_positions: int,
    pad_token_id: int,
    eos_token_id: int,
    seed: int,
) -> Any:
    """A freshly initialized LlamaForCausalLM (float32, tied embeddings)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=max_positions,
        pad_token_id=pad_token_id,
        eos_token_id=eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
        rope_theta=10000.0,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    return model.float()


def build_and_save(out_dir: str | Path, texts: Iterable[str], tiny: Any, seed: int) -> Path:
    """Train the tokenizer, build the model (``tiny``: a TinyModelConfig), save both."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer(texts, tiny.vocab_size, tiny.pretokenizer, tiny.split_digits)
    model = build_tiny_llama(
        vocab_size=len(tok),
        hidden_size=tiny.hidden_size,
        layers=tiny.layers,
        heads=tiny.heads,
        intermediate_size=tiny.intermediate_size,
        max_positions=tiny.max_positions,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        seed=seed,
    )
    tok.save_pretrained(out)
    model.save_pretrained(out, safe_serialization=True)
    return out
