"""Config loading: recipes, overrides, and validation messages that name the field."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from agentr1.config import Config, load_config
from agentr1.configutil import ConfigError, to_dict

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


def test_demo_recipe_equals_embedded_defaults() -> None:
    cfg = load_config(RECIPES / "demo.yaml")
    assert to_dict(cfg) == to_dict(load_config(None))
    assert to_dict(dataclasses.replace(cfg, task=Config().task)) == to_dict(Config())


@pytest.mark.parametrize("recipe", sorted(RECIPES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_recipe_loads_and_validates(recipe: Path) -> None:
    load_config(recipe)


def test_overrides_are_typed_and_nested() -> None:
    cfg = load_config(
        None,
        [
            "algo.estimator=rloo",
            "train.steps=7",
            "algo.dual_clip=null",
            "task.process.enabled=true",
            "eval.splits=[test]",
        ],
    )
    assert cfg.algo.estimator == "rloo" and cfg.train.steps == 7 and cfg.algo.dual_clip is None
    assert cfg.task.process.enabled is True and cfg.eval.splits == ("test",)
    assert load_config(None, ["optim.lr=1"]).optim.lr == 1.0  # ints widen to floats


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["algo.estimatr=ppo"], "algo.estimatr: unknown field; valid fields of AlgoConfig:"),
        (["train.steps=ten"], "train.steps: expected an integer, got 'ten'"),
        (["algo.agg_mode=mean"], "algo.agg_mode: 'mean' is not one of"),
        (
            ["algo.estimator=ppo"],
            "algo.estimator: unknown advantage estimator 'ppo'; valid: dr_grpo",
        ),
        (["rollout.n_samples=1"], "group baselines need >= 2 samples per task"),
        (["optim.lr=5"], "optim.lr=5.0: must be in (0, 1]"),
        (["optim.lr=.nan"], "optim.lr=nan: must be in (0, 1]"),
        (["optim.grad_clip=-1"], "optim.grad_clip=-1.0: must be > 0"),
        (["optim.grad_clip=0"], "optim.grad_clip=0.0: must be > 0"),
        (["rollout.max_context=4096"], "would overflow the position table"),
        (["rollout.max_turns=0"], "rollout.max_turns must be >= 1"),
        (
            ["task.name=multihop_qa", "task.config.passage_words=-1"],
            "task.config: passage_words=-1: expected >= 0",
        ),
        (["task.config.world.hops=[1, 4]"], "hops and ood_hops overlap"),
        (["task.process.no_answer=-0.1"], "task.process.no_answer=-0.1: expected >= 0"),
        (["model.keep_kv_gib=-1"], "model.keep_kv_gib=-1.0: expected >= 0"),
        (["model.pack_weights_gib=-1"], "model.pack_weights_gib=-1.0: expected >= 0"),
        (["train.keep_freed_mib=-1"], "train.keep_freed_mib must be >= 0"),
        (["train"], "expected the form section.field=value"),
    ],
)
def test_bad_values_name_the_field_and_the_reason(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(None, overrides)
    assert message in str(e.value)


def test_recipe_errors_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("algo:\n  clip_low: [1]\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: algo.clip_low: expected a number"):
        load_config(bad)
    with pytest.raises(ConfigError, match="no such recipe file"):
        load_config(tmp_path / "missing.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(tmp_path / "list.yaml")


def test_partial_section_keeps_the_fields_own_defaults() -> None:
    cfg = load_config(None, ["rollout.max_turns=3"])
    assert cfg.rollout.max_turns == 3
    assert (
        cfg.rollout.max_context == Config().rollout.max_context == 768
    )  # not RolloutConfig's 4096
    assert cfg.rollout.n_samples == 8


def test_scientific_notation_is_a_number() -> None:
    assert load_config(None, ["sft.lr=1e-3"]).sft.lr == 0.001
    assert load_config(None, ["optim.lr=5E-4"]).optim.lr == 0.0005


def test_scientific_notation_in_a_recipe(tmp_path: Path) -> None:
    (tmp_path / "r.yaml").write_text("optim:\n  lr: 1e-4\n")
    assert load_config(tmp_path / "r.yaml").optim.lr == 0.0001


@dataclasses.dataclass
class _Inner:
    splits: dict[str, int] = dataclasses.field(default_factory=lambda: {"a": 1})
    n: int = 1


@dataclasses.dataclass
class _Outer:
    inner: _Inner = dataclasses.field(default_factory=lambda: _Inner(splits={"b": 2}, n=5))


def test_dict_valued_field_is_replaced_not_merged() -> None:
    """A recipe's map (e.g. eval splits) replaces the default map: it can drop entries."""
    from agentr1.configutil import build

    built = build(_Outer, {"inner": {"splits": {"c": 3}}})
    assert built.inner.splits == {"c": 3}
    assert built.inner.n == 5  # the field's own default, not the class default


def test_the_vllm_backend_without_vllm_names_the_install_command() -> None:
    """``model.backend=vllm`` where vLLM is not installed stops at load, not mid-run."""
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    with pytest.raises(ConfigError, match=r"model\.backend=vllm: vLLM is not installed.*make vllm"):
        load_config(None, ["model.backend=vllm"])
    load_config(None, ["model.backend=auto"])  # auto falls back to hf
