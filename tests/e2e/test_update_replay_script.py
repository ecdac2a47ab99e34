"""benchmarks/update_replay.py: a captured update of the real loop, replayed and profiled."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.benchmark_scripts import benchmark
from tests.integration.test_qa_env import tiny_qa_recipe

update_replay = benchmark("update_replay")


def test_spread_groups_a_products_calls_by_shape_slowest_total_first() -> None:
    def ev(name: str, shapes: list[list[int]], us: float) -> SimpleNamespace:
        return SimpleNamespace(name=name, input_shapes=shapes, cpu_time_total=us)

    events = [
        ev("aten::mm", [[4, 8], [8, 2]], 1000.0),
        ev("aten::mm", [[4, 8], [8, 2]], 9000.0),
        ev("aten::mm", [[4, 8], [8, 2]], 2000.0),
        ev("aten::mm", [[2, 2], [2, 2]], 500.0),
        ev("aten::add", [[4, 8], [4, 8]], 99000.0),  # not a product
    ]
    rows = update_replay.spread(events)
    assert [r["calls"] for r in rows] == [3, 1]
    first = rows[0]
    assert first["shapes"] == "[[4, 8], [8, 2]]"
    ms = [first[k] for k in ("total_ms", "min_ms", "median_ms", "max_ms")]
    assert ms == [12, 1, 2, 9]  # a product's calls spread: the slow one shows in max only


def test_the_script_replays_a_real_update_per_cap_and_profiles_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model, recipe = tiny_qa_recipe(tmp_path, 8, tokens_per_turn=6)
    out = update_replay.main(
        [
            "--model", str(model), "--recipe", str(recipe), "--setting", "agentr1-fp32",
            "--capture-step", "1", "--caps", "64,4096", "--rounds", "2", "--profile", "--top", "5",
        ]
    )  # fmt: skip
    assert sorted(out["caps"]) == [64, 4096]
    for rows in out["caps"].values():
        assert len(rows) == 2
        for r in rows:
            assert r["seconds"] > 0 and r["minor_faults"] >= 0
            assert all(v > 0.05 for v in r["threads"].values())  # only threads that worked
    assert out["profile"] and out["profile"][0]["op"] in ("aten::mm", "aten::addmm", "aten::bmm")
    text = capsys.readouterr().out
    assert "captured step 1's update:" in text
    assert "cap 64: median" in text and "cap 4096: median" in text
    assert "| product | shapes | calls |" in text


def test_bad_arguments_are_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model, recipe = tiny_qa_recipe(tmp_path, 8, tokens_per_turn=6)
    base = ["--model", str(model), "--recipe", str(recipe)]
    with pytest.raises(SystemExit):
        update_replay.main([*base, "--caps", "1024,lots"])
    assert "--caps takes integers separated by commas, got '1024,lots'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        update_replay.main([*base, "--rounds", "0"])
    assert "must be >= 1" in capsys.readouterr().err
