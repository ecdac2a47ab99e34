"""Every recipe loads and validates; the paper recipe holds exactly the paper's values; the
QA recipes name data files that exist (when the data is on this machine)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentr1.config import Config, load_config
from agentr1.configutil import ConfigError
from agentr1.data import resolve_entry
from agentr1.tasks import task_config
from agentr1.tasks.multihop_qa import data_root

RECIPES = sorted((Path(__file__).resolve().parents[2] / "recipes").glob("*.yaml"))


def recipe(name: str) -> Config:
    return load_config(next(p for p in RECIPES if p.name == name))


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_recipe_loads_and_validates(path: Path) -> None:
    cfg = load_config(path)
    if cfg.task.name == "multihop_qa":
        qa = task_config(cfg.task)
        assert set(cfg.eval.splits) <= set(qa.eval_files)
        root = data_root(qa)
        if not root.is_dir():
            pytest.skip(f"no raw data at {root}")
        for name, entries in {"train": qa.train, **qa.eval_files}.items():
            for e in entries:
                assert resolve_entry(e, root, f"{path.name}: {name}")


def test_paper_recipe_is_the_papers_setting() -> None:
    cfg = recipe("qwen2.5-3b-paper.yaml")
    m = cfg.model
    assert m.path == "Qwen/Qwen2.5-3B-Instruct" and m.device == "auto"
    assert (m.dtype, m.compute_dtype, m.sampler_dtype) == ("float32", "bfloat16", "bfloat16")
    qa = task_config(cfg.task)
    assert cfg.task.name == "multihop_qa" and qa.top_k == 5 and qa.retriever == "dense"
    assert cfg.train.tasks_per_step == 128 and cfg.train.steps == 400
    assert cfg.algo.estimator == "grpo" and cfg.rollout.n_samples == 5
    assert cfg.optim.lr == 1e-6 and cfg.algo.critic_lr == 1e-5 and cfg.algo.kl_coef == 0.001
    r = cfg.rollout
    assert (r.max_turns, r.max_tokens_per_turn, r.max_context) == (5, 1024, 8192)
    assert not cfg.sft.enabled
    assert cfg.eval.splits == ("hotpotqa", "2wiki", "musique")


def test_smollm2_recipe_is_sized_for_cpu() -> None:
    cfg = recipe("multihop_smollm2.yaml")
    assert cfg.model.path == "smollm2-135m-instruct" and cfg.model.chat_template == "qwen2.5"
    qa = task_config(cfg.task)
    assert cfg.task.name == "multihop_qa" and cfg.sft.enabled and cfg.algo.estimator == "grpo"
    assert (cfg.train.tasks_per_step, cfg.rollout.n_samples) == (6, 4)
    assert cfg.rollout.temperature == 1.0 and cfg.train.steps == 28
    # the setting the SmolLM2 study tested (experiments/smollm2_multihop/): no std division, 4
    # minibatches at lr 2e-5 after an 8-step warmup, a penalty for no answer
    assert not cfg.algo.norm_by_std and cfg.task.process.no_answer == 0.2
    o = cfg.optim
    assert (o.minibatches, o.lr, o.warmup_steps, cfg.algo.kl_coef) == (4, 2e-5, 8, 0.001)
    # searching must pay (evidence shaping) and two searches must fit the context
    assert cfg.task.process.enabled and cfg.task.process.evidence > 0
    assert qa.passage_words == 80 and qa.top_k == 2
    r = cfg.rollout
    assert (r.max_turns, r.max_tokens_per_turn, r.max_context) == (3, 128, 1024)
    assert qa.n_eval == 100 and cfg.eval.splits == ("hotpotqa", "2wiki", "musique")
    # bf16 where the CPU has it (the study's machines), float32 where it would be emulated
    assert (cfg.model.compute_dtype, cfg.model.sampler_dtype) == ("auto", "auto")


def test_qa_validation_names_the_problem() -> None:
    with pytest.raises(ConfigError, match=r"task\.config: retriever='bm42'"):
        load_config(None, ["task.name=multihop_qa", "model.path=m", "task.config.retriever=bm42"])
    with pytest.raises(ConfigError, match=r"task\.config\.n_evl: unknown field; valid fields"):
        load_config(None, ["task.name=multihop_qa", "task.config.n_evl=3"])
