"""GRPO with vLLM rollouts learns as with hf (issue 25): `tests/e2e/test_learning.py`'s
setting (a small world, a warm start that usually stops after one search, GRPO on the
2-hop questions must teach the second search), sampled by a vLLM engine whose weights are
reloaded after every update. Marked ``vllm`` (``make test-vllm``, a few minutes on 2 cores).

It asks what the hf test asks, so a failure here is vLLM's, not the setting's luck: the
demo's full recipe, which this test ran until 2026-12-06, depends on which SFT basin a
CPU's rounding lands in (reward 0.43 -> 0.64 on one machine, 0.27 -> 0.23 on another).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.test_learning import CFG

vllm_backend = pytest.importorskip("agentr1.backends.vllm")
pytestmark = pytest.mark.vllm
if not vllm_backend.available():
    pytest.skip(f"vLLM is not installed: {vllm_backend.INSTALL}", allow_module_level=True)


def test_grpo_with_vllm_rollouts_teaches_the_second_search(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentr1.config import load_config
    from agentr1.trainer.loop import close_run, rl_step
    from agentr1.trainer.run import RunDir
    from agentr1.trainer.setup import build_setup
    from agentr1.trainer.sft import warm_start
    from agentr1.trainer.state import make_state

    monkeypatch.setenv("AGENTR1_CACHE", str(tmp_path / "cache"))
    cfg = load_config(None, [*CFG, "model.backend=vllm", f"train.run_dir={tmp_path / 'run'}"])
    setup = build_setup(cfg)
    assert type(setup.generator).__name__ == "VLLMGenerator", type(setup.generator)
    run = RunDir(cfg.train.run_dir, cfg, fresh=True)
    warm_start(setup, run)
    setup.tasks["train"] = [t for t in setup.tasks["train"] if t.metadata["hops"] == 2]
    state = make_state(setup)
    rewards, searches = [], []
    try:
        for _ in range(30):
            metrics = rl_step(state, run)
            assert metrics["skipped_updates"] == 0
            rewards.append(metrics["reward"])
            searches.append(metrics["tool_calls"])
            state.step += 1
    finally:
        close_run(run, state)
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last > first + 0.25, f"reward did not rise: {[round(r, 2) for r in rewards]}"
    assert sum(searches[-5:]) / 5 > sum(searches[:5]) / 5 + 0.2, searches
