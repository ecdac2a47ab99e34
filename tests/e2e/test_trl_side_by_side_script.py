"""benchmarks/trl_side_by_side.py: both sides get the same settings, tool and prompts.

The TRL run itself needs TRL (`make trl`, then `make bench-trl`); these tests check what
makes the comparison fair without it: the recipe takes every setting, TRL's tool function
lists exactly agentr1's schema (so the prompts are the same tokens), and the table's ratios.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest

from agentr1.config import load_config
from agentr1.retrieval.base import Passage
from agentr1.retrieval.bm25 import BM25Retriever
from agentr1.templates import QWEN25_TOOLS
from agentr1.tools.base import tool_schema
from agentr1.tools.search import SearchTool
from tests.benchmark_scripts import benchmark
from tests.tiny_models import save_tiny_llama

side = benchmark("trl_side_by_side")


@pytest.mark.parametrize("setting", sorted(side.SETTINGS))
def test_every_setting_is_a_valid_recipe_override(setting: str) -> None:
    cfg = load_config(str(side.RECIPE), [*side.COMMON, *side.SETTINGS[setting]])
    assert cfg.algo.kl_coef == 0 and cfg.optim.minibatches == 1
    assert (cfg.train.tasks_per_step, cfg.rollout.n_samples) == (side.QUESTIONS, side.SAMPLES)
    if setting.startswith(("agentr1-fast", "agentr1-lora")):
        dtype = "bfloat16" if setting.startswith("agentr1-fast") else "float32"
        assert cfg.model.lora.rank == 16 and cfg.model.compute_dtype == dtype
        assert cfg.optim.micro_batch_tokens == 2560  # a group's rows in one pass
    else:
        assert cfg.optim.micro_batch_tokens == 1024  # the recipe's: the fp32 update's memory
    assert cfg.optim.activation_checkpointing == setting.endswith("-ckpt")


def _search_tool() -> SearchTool:
    passages = [
        Passage("a", "Deerhunter", "Deerhunter is an American rock band from Atlanta."),
        Passage("b", "Nine Lashes", "Nine Lashes is a Christian rock band from Alabama."),
    ]
    return SearchTool(retriever=BM25Retriever(passages), top_k=1)


def test_trl_tool_function_lists_agentr1s_schema_and_returns_its_text() -> None:
    from transformers.utils import get_json_schema

    tool = _search_tool()
    search = side.trl_search(SimpleNamespace(tools=[tool]))
    assert get_json_schema(search) == tool_schema(tool)
    assert search("Deerhunter") == asyncio.run(tool(query="Deerhunter")).content


def test_the_tool_function_renders_the_prompt_agentr1_renders(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(save_tiny_llama(tmp_path / "tiny"))
    tool = _search_tool()
    msgs = [{"role": "system", "content": "Search."}, {"role": "user", "content": "Who?"}]
    kw = {"chat_template": QWEN25_TOOLS, "add_generation_prompt": True, "tokenize": False}
    theirs = tokenizer.apply_chat_template(
        msgs, tools=[side.trl_search(SimpleNamespace(tools=[tool]))], **kw
    )
    assert theirs == tokenizer.apply_chat_template(msgs, tools=[tool_schema(tool)], **kw)


def test_table_gives_each_setting_against_trl() -> None:
    def run(name: str, step: float, rss: float) -> dict[str, object]:
        row = dict.fromkeys(side.KEYS, 1.0)
        return {
            "setting": name,
            "rss_gib": rss,
            "rows": [{**row, "step_s": 99.0}] + [{**row, "step_s": step}] * 3,
        }

    ours, trl = run("agentr1-fp32", 10.0, 3.0), run("trl-fp32", 40.0, 12.0)
    for r in trl["rows"]:  # type: ignore[attr-defined]
        r["tokens"] = 2.0  # TRL's episodes twice as long: per token, agentr1 is 0.5x
    text = side.table([ours, trl])
    line = next(ln for ln in text.splitlines() if ln.startswith("| agentr1-fp32"))
    assert "| 10.0 |" in line  # the median leaves the warm-up step out
    assert line.endswith("| 10000.0 | 0.25x | 0.50x | 0.25x |")
