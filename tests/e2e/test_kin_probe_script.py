"""`benchmarks/kin_probe.py` reads a model's choice of relation at each kin search after the
first, on the oracle's own episodes: at the token where the right call and the other
relation's call first differ, from the distribution one position earlier."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from agentr1.config import load_config
from agentr1.trainer.setup import build_setup
from tests.benchmark_scripts import benchmark
from tests.e2e.test_train_loop import SMALL


@pytest.fixture(scope="module")
def episodes(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    """The SMALL world's kin questions run by the oracle, with their choices."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AGENTR1_CACHE", str(tmp_path_factory.getbasetemp() / "agentr1-cache"))
        script = benchmark("kin_probe")
        setup = build_setup(load_config(script.RECIPE, [*SMALL, "sft.enabled=false"]))
    world = setup.task.extras["world"]
    rows = [(traj, picks, task) for task, traj, picks in script.oracle_episodes(setup, "train")]
    return script, setup, world, rows


def test_each_choice_is_the_token_where_the_two_relations_part(episodes: tuple) -> None:
    script, setup, world, rows = episodes
    groups = {c.group for _, picks, _ in rows for c in picks}
    assert any("grandfather, search 2" in g for g in groups)
    assert any("grandmother, search 2" in g for g in groups)
    for traj, picks, task in rows:
        reads = [s.read for s in world.plans[task.id].steps]
        assert len(picks) == sum(r in ("father", "mother") for r in reads[1:])
        for c in picks:
            k = int(c.group.rsplit(" ", 1)[1]) - 1  # "..., search 3" -> step 2
            other = "mother" if reads[k] == "father" else "father"
            assert traj.token_ids[c.position] == c.right != c.other
            right, wrong = (setup.chat.decode([i]).strip(' "') for i in (c.right, c.other))
            assert right and reads[k].startswith(right) and other.startswith(wrong)
            assert c.group.startswith(script.kin_term(task.question))


def test_the_probe_reads_the_distribution_one_position_before(episodes: tuple) -> None:
    script, setup, _, rows = episodes
    vocab = len(setup.tokenizer)

    def knows_the_episode(traj: object) -> object:
        """A model whose every position predicts the episode's true next token."""

        def model(ids: torch.Tensor) -> SimpleNamespace:
            n = ids.shape[1]
            logits = torch.zeros(1, n, vocab)
            logits[0, torch.arange(n), torch.tensor(traj.token_ids[1 : n + 1])] = 20.0
            return SimpleNamespace(logits=logits)

        return model

    def uniform(ids: torch.Tensor) -> SimpleNamespace:
        return SimpleNamespace(logits=torch.zeros(1, ids.shape[1], vocab))

    probed = [(t, p) for t, p, _ in rows if p]
    for traj, picks in probed:
        knows = script.probe(knows_the_episode(traj), [(traj, picks)])
        assert all(p > 0.999 for ps in knows.values() for p in ps)
    flat = script.probe(uniform, [(t, p) for t, p in probed])
    assert sum(len(ps) for ps in flat.values()) == sum(len(p) for _, p in probed)
    assert all(p == 0.5 for ps in flat.values() for p in ps)


def test_the_script_prints_a_row_per_kin_term_and_search(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AGENTR1_CACHE", str(tmp_path / "cache"))
    script = benchmark("kin_probe")
    assert script.main([*SMALL, "--model", "tiny", "--split", "train"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("| model | split | kin term, search |")
    rows = [r.split(" | ") for r in out[2:]]
    assert rows and all(r[0] == "| tiny" and r[1] == "train" for r in rows)
    assert any(r[2].endswith("grandfather, search 2") for r in rows)
    assert all(0.0 <= float(r[4]) <= 1.0 and int(r[3]) > 0 for r in rows)
