"""Device placement (``model.device``): names resolve or fail clearly, and batches move.
The CUDA path itself needs a GPU and is not exercised on the CPU CI machine."""

from __future__ import annotations

import pytest
import torch

from agentr1.rollout.collate import collate
from agentr1.trainer.critic import ValueModel
from agentr1.trainer.setup import resolve_device
from agentr1.types import Trajectory
from tests.tiny_models import tiny_llama


def test_auto_is_cuda_only_when_there_is_one() -> None:
    want = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == want
    assert resolve_device("cpu") == torch.device("cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_a_gpu_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"model.device='cuda:0': this machine has no CUDA"):
        resolve_device("cuda:0")


def test_bad_device_name_names_the_field() -> None:
    with pytest.raises(ValueError, match=r"model.device='banana': expected auto, cpu"):
        resolve_device("banana")


def test_batch_to_moves_every_tensor_and_is_free_when_already_there() -> None:
    t = Trajectory(task_id="t", token_ids=[1, 2, 3], loss_mask=[0, 1, 1], logprobs=[0, -1, -1])
    batch = collate([t], [0], pad_id=0)
    assert batch.to("cpu") is batch
    meta = batch.to("meta")  # a second device every build has
    assert {getattr(meta, f).device.type for f in vars(meta)} == {"meta"}


def test_critic_follows_the_policy_device() -> None:
    policy = tiny_llama()
    critic = ValueModel.from_policy(policy)
    devices = {p.device for p in critic.parameters()}
    assert devices == {next(policy.parameters()).device}
