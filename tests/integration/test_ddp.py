"""Data-parallel training over trainer ranks on a local Ray cluster (2 CPUs): 2 ranks take
one process's update (gradients, weights, metrics), a whole run with 2 ranks is a run
with 1 (resumed from a checkpoint too), and a rank that fails is named.

Marked ``ray`` (``make test-ray``): each group starts a rank process, seconds apiece.
Tolerances: fp32, the only difference being the order of the float sums (the ranks'
gradients are added by the all-reduce, one process adds micro-batch after micro-batch):
gradients ``atol=1e-6, rtol=1e-5``; weights after one or more AdamW steps (1 or 4 in an
update, 8 in a run) ``atol=1e-5, rtol=1e-4`` (`STEPPED`), up to 2 lr a step where float32
leaves the gradient undetermined (`assert_stepped_close`).
"""

from __future__ import annotations

import copy
import os
import time
from pathlib import Path
from typing import Any

import pytest
import torch

ray = pytest.importorskip("ray", reason="Ray is not installed here: make ray")

from safetensors.torch import load_file  # noqa: E402

from agentr1 import lora  # noqa: E402
from agentr1.config import AlgoConfig, Config, DistributedConfig, OptimConfig, load_config  # noqa: E402
from agentr1.distributed.cluster import connect, disconnect  # noqa: E402
from agentr1.distributed.ranks import (  # noqa: E402
    TrainerGroup,
    TrainerRank,
    TrainerRankError,
    replica_of,
)
from agentr1.trainer.logprobs import token_logprobs  # noqa: E402
from agentr1.trainer.loop import train  # noqa: E402
from agentr1.trainer.run import metric_records  # noqa: E402
from agentr1.trainer.state import make_learner  # noqa: E402
from agentr1.trainer.update import Learner, UpdateBatch, rl_update  # noqa: E402
from tests.tiny_models import tiny_llama  # noqa: E402

pytestmark = pytest.mark.ray

RANKS = [
    "distributed.trainer_ranks=2",
    "distributed.num_cpus=2",
    "distributed.worker_threads=1",
    "distributed.timeout_s=60",
]
STEPPED = {"atol": 1e-5, "rtol": 1e-4}
"""Weights after AdamW steps where the gradient is determined (see `assert_stepped_close`)."""


def assert_grads_close(got: torch.Tensor, want: torch.Tensor) -> None:
    """A gradient summed in another order (rows split between ranks, 1 thread a rank
    against 2): float32's tolerance, with an absolute floor of 1e-5 of the tensor's
    scale, since an element that is a cancelling sum of larger terms keeps their rounding
    (with the native RMSNorm and SiLU gate, one LoRA element of ~0.03 came out 1.5e-6
    off)."""
    torch.testing.assert_close(got, want, rtol=1e-5, atol=grad_atol(want))


def grad_atol(grad: torch.Tensor) -> float:
    """`assert_grads_close`'s absolute tolerance for ``grad``: 1e-5 of its scale, >= 1e-6."""
    return max(1e-6, 1e-5 * float(grad.abs().max()))


def assert_stepped_close(
    got: torch.Tensor, want: torch.Tensor, grad: torch.Tensor, lr: float, steps: int
) -> None:
    """Weights after ``steps`` AdamW steps from the same start. A first step moves each
    element by lr x g / (|g| + 1e-8): where float32's summing order leaves a gradient
    undetermined (within `assert_grads_close`'s tolerance of 0) that is anything in
    [-lr, lr], so those elements may differ by up to 2 lr a step (one came out 3.9% of
    lr off on an AVX2 CPU); every other element within `STEPPED`."""
    undetermined = grad.abs() <= grad_atol(grad)
    torch.testing.assert_close(got[~undetermined], want[~undetermined], **STEPPED)
    if undetermined.any():
        assert float((got - want)[undetermined].abs().max()) <= 2 * lr * steps * (1 + 1e-5)


@pytest.fixture(scope="module")
def cluster() -> Any:
    connect(DistributedConfig(num_cpus=2))  # the run's own way (ranks import tests.*)
    yield ray
    disconnect()


def update_batch(model: torch.nn.Module, critic: bool, B: int = 8, T: int = 14) -> UpdateBatch:
    """Rows of unequal lengths and masked-token counts (a mean of per-rank means would
    differ from the global mean), a tool response inside each, returns for a critic."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(4, 64, (B, T), generator=g)
    attn = torch.zeros(B, T, dtype=torch.long)
    mask = torch.zeros(B, T)
    for b in range(B):
        n = 5 + (b * 5) % (T - 4)
        attn[b, :n] = 1
        mask[b, 3:n] = 1
        mask[b, 5:7] = 0  # a tool response
    with torch.no_grad():
        old, _ = token_logprobs(model, ids, attn, mask)
    adv = torch.randn(B, T, generator=g) * mask
    ub = UpdateBatch(ids, attn, mask, adv, old)
    if critic:
        ub.returns_BT = torch.randn(B, T, generator=g) * mask
        ub.old_values_BT = torch.zeros(B, T)
    return ub


GROUPS = {
    "ddp-full-grpo": ["algo.estimator=grpo"],
    "ddp-lora-gae": ["algo.estimator=gae", "model.lora.rank=4"],
    "fsdp-full-grpo": ["algo.estimator=grpo", "distributed.sharding=fsdp"],
    "fsdp-lora-gae": ["algo.estimator=gae", "model.lora.rank=4", "distributed.sharding=fsdp"],
}


@pytest.fixture(scope="class", params=list(GROUPS))
def group(request: pytest.FixtureRequest, cluster: Any) -> Any:
    """One group per config for the class's tests (closed after them: one process group
    per process)."""
    # float32 passes: the one-process reference runs rl_update without autocast, and
    # bf16 rounding changes with the micro-batch split (`assert_grads_close` is float32's tolerance).
    cfg = load_config(None, [*RANKS, *GROUPS[request.param], "model.compute_dtype=float32"])
    base = tiny_llama()
    if cfg.model.lora.rank:
        lc = cfg.model.lora
        lora.apply_lora(base, lc.rank, lc.alpha, lc.targets, lc.share_input)
    g = TrainerGroup(cfg, base)
    yield cfg, base, g
    g.close()


def fresh(cfg: Config, base: torch.nn.Module) -> Learner:
    return make_learner(cfg, copy.deepcopy(base))


class TestOneUpdate:
    """`TrainerGroup.update` against `rl_update` in this process, on one batch."""

    @pytest.mark.parametrize(
        ("mode", "minibatches", "epochs"),
        [("token-mean", 1, 1), ("seq-mean-token-mean", 1, 1), ("token-mean", 2, 2)],
    )
    def test_two_ranks_give_one_process_gradients_weights_and_metrics(
        self, group: Any, mode: str, minibatches: int, epochs: int
    ) -> None:
        cfg, base, g = group
        algo = AlgoConfig(agg_mode=mode, estimator=cfg.algo.estimator)
        # 8 rows, 3 a micro-batch: micro-batches of 3, 3, 2 rows (1 x 4 rows with 2
        # minibatches): rank 0 runs two of them, rank 1 one.
        optim = OptimConfig(micro_batch_size=3, minibatches=minibatches, ppo_epochs=epochs)
        ub = update_batch(base, critic=cfg.algo.estimator == "gae")
        one = fresh(cfg, base)
        m_one = rl_update(one, ub, algo, optim, 1.0, torch.Generator().manual_seed(5))
        ranked = fresh(cfg, base)
        g.sync(ranked)  # the ranks start from this fresh learner (weights, AdamW, schedule)
        m_dp = g.update(ranked, ub, algo, optim, 1.0, torch.Generator().manual_seed(5))
        ref = replica_of(one)
        rank0, rank1 = g.replicas(ranked)  # each rank's training copy (fsdp: gathered)
        sharded = cfg.distributed.sharding == "fsdp"
        # rank 0's own policy (and critic): its training copy (ddp), or the gathered
        # shards' weights (fsdp), which its rollouts sample from
        whole = replica_of(ranked)["params"]
        assert ref["grads"].keys() == rank0["grads"].keys() == rank1["grads"].keys()
        assert any(k.startswith("critic.") for k in ref["grads"]) == (cfg.algo.estimator == "gae")
        for k in ref["params"]:
            # The last minibatch's gradient (summed over ranks, the same on both), then the
            # weights after the optimizer step(s): one process's.
            assert torch.equal(rank0["grads"][k], rank1["grads"][k]), k
            assert_grads_close(rank0["grads"][k], ref["grads"][k])
            assert torch.equal(rank0["params"][k], rank1["params"][k]), k
            lr = cfg.algo.critic_lr if k.startswith("critic.") else optim.lr
            steps = minibatches * epochs
            assert_stepped_close(rank0["params"][k], ref["params"][k], ref["grads"][k], lr, steps)
            assert torch.equal(whole[k], rank0["params"][k]), k
        assert m_dp.keys() == m_one.keys()
        # The loss metrics are means over micro-batches: the same as one process's when the
        # micro-batches are (8 rows: 3, 3, 2). Minibatches of 4 rows are cut 2 + 2 for 2
        # ranks (one process: 3 + 1), so there only the step's own metrics agree.
        # fsdp cuts 8 rows 2 + 2 + 2 + 2 (every rank runs as many micro-batches).
        same_micro = minibatches == 1 and not sharded
        for k, v in m_one.items():
            if same_micro or k in ("grad_norm", "skipped_updates", "lr"):
                assert m_dp[k] == pytest.approx(v, rel=1e-5, abs=1e-6), k
        moved = max(
            (ref["params"][k] - p).abs().max()
            for k, p in replica_of(fresh(cfg, base))["params"].items()
        )
        assert moved > 1e-5  # the update did something


# ---------------------------------------------------------------- a whole run
SMALL = [
    "task.config.world.n_train=40",
    "task.config.world.n_test=4",
    "task.config.world.n_test_ood=4",
    "model.tiny.hidden_size=32",
    "model.tiny.intermediate_size=64",
    "model.tiny.vocab_size=600",
    "sft.enabled=false",
    "train.tasks_per_step=2",
    "rollout.n_samples=2",
    "rollout.max_tokens_per_turn=16",
    "rollout.max_turns=2",
    "optim.minibatches=2",
    "optim.micro_batch_size=1",
    # Without a warm start every reward is 0: the entropy bonus and the KL move the
    # weights (from step 1 on, the policy differs from the reference).
    "algo.entropy_coef=0.01",
    "algo.kl_coef=0.05",
    "eval.max_tasks=2",
    "eval.sampled_n=0",
    "eval.before=false",
    "train.eval_every=0",
    "train.log_trajectories=0",
    "train.steps=4",
    "train.checkpoint_every=2",
]
VOLATILE = ("gen_tokens_per_s", "wall_time", "elapsed_s", "logprob_mismatch")


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTR1_CACHE", str(tmp_path_factory.getbasetemp() / "agentr1-cache"))


def rl_rows(run_dir: Path) -> list[dict[str, float]]:
    return [
        {k: v for k, v in r.items() if not k.startswith(("time/", "mem/")) and k not in VOLATILE}
        for r in metric_records(run_dir, "rl")
    ]


def assert_same_run(a: Path, b: Path) -> None:
    rows_a, rows_b = rl_rows(a), rl_rows(b)
    assert len(rows_a) == len(rows_b) == 4
    for ra, rb in zip(rows_a, rows_b, strict=True):
        assert ra.keys() == rb.keys()
        for k, v in ra.items():
            same = (
                rb[k] == v if isinstance(v, str) else rb[k] == pytest.approx(v, rel=1e-4, abs=1e-5)
            )
            assert same, (ra["step"], k, v, rb[k])
    wa = load_file(a / "final_model" / "model.safetensors")
    wb = load_file(b / "final_model" / "model.safetensors")
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], atol=1e-5, rtol=1e-4)


@pytest.fixture(scope="module")
def one_rank_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("one_rank")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AGENTR1_CACHE", str(tmp_path_factory.getbasetemp() / "agentr1-cache"))
        train(load_config(None, [*SMALL, f"train.run_dir={run_dir}"]))
    rows = rl_rows(run_dir)
    assert all(r["grad_norm"] > 0 for r in rows)
    return run_dir


@pytest.mark.parametrize("sharding", ["ddp", "fsdp"])
def test_a_run_with_two_ranks_is_a_run_with_one(
    one_rank_run: Path, tmp_path: Path, cluster: Any, sharding: str
) -> None:
    over = [*SMALL, *RANKS, f"distributed.sharding={sharding}", f"train.run_dir={tmp_path}"]
    train(load_config(None, over))
    assert_same_run(one_rank_run, tmp_path)


@pytest.mark.parametrize("sharding", ["ddp", "fsdp"])
def test_two_ranks_resume_with_the_restored_optimizer(
    one_rank_run: Path, tmp_path: Path, cluster: Any, sharding: str
) -> None:
    """Killed after step 2 (its checkpoint: with fsdp, the moments gathered from the
    shards), resumed: the ranks take the restored weights and AdamW moments, and the run
    ends as the uninterrupted one-rank run."""
    over = [*SMALL, *RANKS, f"distributed.sharding={sharding}", f"train.run_dir={tmp_path}"]
    cfg = load_config(None, over)
    train(cfg, stop_after=2)
    train(cfg, resume=True)
    assert_same_run(one_rank_run, tmp_path)


# ---------------------------------------------------------------- failures
class RaisingRank(TrainerRank):
    def update(self, *args: Any) -> Any:
        raise ValueError("a fault on purpose")


class DyingRank(TrainerRank):
    def update(self, *args: Any) -> Any:
        os._exit(3)


class FailingBuildRank(TrainerRank):
    def build(self) -> int:
        raise MemoryError("no room for the replica")


@pytest.mark.parametrize(
    ("rank_cls", "said"),
    [
        (RaisingRank, "raised ValueError: a fault on purpose"),
        (DyingRank, "died: ActorDiedError"),
        (FailingBuildRank, "raised MemoryError: no room for the replica"),
    ],
)
def test_a_rank_that_fails_is_named_at_once(rank_cls: type, said: str, cluster: Any) -> None:
    cfg = load_config(None, RANKS)  # collectives time out after 60 s: well past this test
    policy = tiny_llama()
    learner = make_learner(cfg, policy)
    g = TrainerGroup(cfg, policy, rank_cls=rank_cls)
    t0 = time.perf_counter()
    try:
        with pytest.raises(TrainerRankError) as e:
            g.update(learner, update_batch(policy, False), AlgoConfig(), OptimConfig(), 1.0,
                     torch.Generator().manual_seed(0))  # fmt: skip
    finally:
        g.close()
    assert "trainer rank 1 (actor 'trainer-rank-1', pid " in str(e.value)
    assert said in str(e.value)
    assert time.perf_counter() - t0 < 30  # not the collectives' timeout


def test_a_rank_that_hangs_is_named_after_the_timeout(cluster: Any) -> None:
    class Hanging(TrainerRank):
        def update(self, *args: Any) -> Any:
            time.sleep(600)

    cfg = load_config(None, [*RANKS, "distributed.timeout_s=5"])
    policy = tiny_llama()
    learner = make_learner(cfg, policy)
    g = TrainerGroup(cfg, policy, rank_cls=Hanging)
    try:
        ray.get(g._built, timeout=120)  # building the replica may take longer than 5 s here
        g.sync(learner)
        with pytest.raises(
            TrainerRankError, match=r"trainer rank 1 .* did not answer: the gradients' sum"
        ):
            g.update(learner, update_batch(policy, False), AlgoConfig(), OptimConfig(), 1.0,
                     torch.Generator().manual_seed(0))  # fmt: skip
    finally:
        g.close()


def test_the_benchmark_runs_every_setting(cluster: Any) -> None:
    """benchmarks/ddp.py on a tiny batch (no warm start, 2 tasks): each setting's update
    runs and is timed."""
    import argparse

    from tests.benchmark_scripts import benchmark

    args = argparse.Namespace(sft_steps=0, tasks=2, repeats=2, rounds=1, only=None)
    results = benchmark("ddp").run(args)
    assert set(results) == set(benchmark("ddp").SETTINGS)
    assert all(r["tokens_per_s"] > 0 for r in results.values())
