"""The ``vllm`` Generator against the ``hf`` one and the trainer, on SmolLM2-135M in fp32.

Marked ``vllm``: these run in vLLM's own virtualenv (``make test-vllm``; vLLM's CPU build
pins an older transformers than the main environment's) and are skipped elsewhere. One
engine serves the module (its first start compiles for about a minute; later starts use
vLLM's compile cache).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from agentr1.backends.base import SamplingParams
from agentr1.backends.hf import HFGenerator, sampling_logprobs
from agentr1.envs.base import ToolEnv
from agentr1.rollout import RolloutConfig, run_rollout
from agentr1.rollout.chat import ChatFormat
from agentr1.templates import QWEN25_TOOLS
from agentr1.tools.calculator import calculator
from agentr1.types import Message, StepResult, Task

vllm_backend = pytest.importorskip("agentr1.backends.vllm")
pytestmark = pytest.mark.vllm
if not vllm_backend.available():
    pytest.skip(f"vLLM is not installed: {vllm_backend.INSTALL}", allow_module_level=True)

MAX_LEN = 1024
QUESTIONS = [
    "What is the capital of France?",
    "Name three primary colours.",
    "Write a haiku about rivers.",
    "How many legs does a spider have?",
]


@pytest.fixture(scope="module")
def model_dir() -> Path:
    from agentr1.models import prepare_smollm2

    return prepare_smollm2()


@pytest.fixture(scope="module")
def tokenizer(model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def policy(model_dir: Path) -> Any:
    from agentr1.models import load_model

    return load_model(model_dir, dtype=torch.float32)


@pytest.fixture(scope="module")
def engine(model_dir: Path) -> Any:
    return vllm_backend.VLLMGenerator(model_dir, max_model_len=MAX_LEN, dtype="float32")


@pytest.fixture(scope="module")
def prompts(tokenizer: Any) -> list[list[int]]:
    texts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False
        )
        for q in QUESTIONS
    ]
    return [tokenizer.encode(t, add_special_tokens=False) for t in texts]


def eot(tokenizer: Any) -> int:
    return int(tokenizer.convert_tokens_to_ids("<|im_end|>"))


def trainer_logprobs(
    policy: Any, prompt: list[int], tokens: list[int], temperature: float, top_p: float
) -> list[float]:
    """The sampling distribution's log-probs of ``tokens`` recomputed by one full forward
    of the trainer's model (`sampling_logprobs`, what the hf backend reports)."""
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = policy(ids, use_cache=False).logits[0, len(prompt) - 1 : -1].float()
    lp = sampling_logprobs(logits, temperature, top_p)
    return lp.gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1).tolist()


def test_greedy_equals_hf_greedy(engine: Any, policy: Any, tokenizer: Any, prompts: list) -> None:
    params = SamplingParams(max_new_tokens=40, temperature=0.0, stop_token_ids=(eot(tokenizer),))
    ours = engine.generate(prompts, params)
    theirs = HFGenerator(policy, tokenizer).generate(prompts, params)
    for a, b in zip(ours, theirs, strict=True):
        assert a.token_ids == b.token_ids, (
            tokenizer.decode(a.token_ids),
            tokenizer.decode(b.token_ids),
        )
        assert a.finish_reason == b.finish_reason
        assert a.logprobs == pytest.approx(b.logprobs, abs=2e-3)


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 0.9), (1.3, 0.8)])
def test_sampled_logprobs_are_the_trainers(
    engine: Any, policy: Any, tokenizer: Any, prompts: list, temperature: float, top_p: float
) -> None:
    """``processed_logprobs``: after temperature and top-p, as `sampling_logprobs`."""
    params = SamplingParams(max_new_tokens=24, temperature=temperature, top_p=top_p, seed=5)
    for prompt, c in zip(prompts, engine.generate(prompts, params), strict=True):
        assert len(c.token_ids) == len(c.logprobs) == 24
        expected = trainer_logprobs(policy, prompt, c.token_ids, temperature, top_p)
        finite = [(a, b) for a, b in zip(c.logprobs, expected, strict=True) if math.isfinite(b)]
        assert len(finite) == 24  # a sampled token is never outside the trainer's nucleus
        assert [a for a, _ in finite] == pytest.approx([b for _, b in finite], abs=2e-3)


def test_stops_lengths_and_seeds(engine: Any, tokenizer: Any, prompts: list) -> None:
    end = eot(tokenizer)
    greedy = SamplingParams(max_new_tokens=60, temperature=0.0, stop_token_ids=(end,))
    c = engine.generate(prompts[:1], greedy)[0]
    assert c.finish_reason == "stop" and c.token_ids[-1] == end  # the stop token is kept
    text = tokenizer.decode(c.token_ids)
    assert "Paris" in text
    cut = engine.generate(
        prompts[:1], SamplingParams(max_new_tokens=60, temperature=0.0, stop=("Paris",))
    )[0]
    assert cut.finish_reason == "stop" and tokenizer.decode(cut.token_ids).endswith("Paris")
    assert cut.token_ids == c.token_ids[: len(cut.token_ids)]  # tokens are never split
    short = engine.generate(prompts[:1], SamplingParams(max_new_tokens=3, temperature=0.0))[0]
    assert short.finish_reason == "length" and len(short.token_ids) == 3
    # No implicit EOS: without stop ids the row runs to max_new_tokens.
    long = engine.generate(prompts[:1], SamplingParams(max_new_tokens=80, temperature=0.0))[0]
    assert len(long.token_ids) == 80 and long.token_ids[: len(c.token_ids)] == c.token_ids
    sampled = SamplingParams(max_new_tokens=16, temperature=1.0, seed=11)
    a = engine.generate([prompts[1]] * 4, sampled)
    b = engine.generate([prompts[1]] * 4, sampled)
    assert [x.token_ids for x in a] == [x.token_ids for x in b]  # seeded: reproducible
    assert len({tuple(x.token_ids) for x in a}) > 1  # rows of one call differ (GRPO groups)


def test_errors_are_named(engine: Any, tmp_path: Path) -> None:
    with pytest.raises(vllm_backend.VLLMBackendError, match="max_model_len is 1024"):
        engine.generate([[1] * 1100], SamplingParams(max_new_tokens=4))
    (tmp_path / "config.json").write_text(
        '{"architectures": ["NoSuchForCausalLM"], "model_type": "nosuch"}'
    )
    with pytest.raises(vllm_backend.VLLMBackendError, match=f"vLLM cannot load {tmp_path}"):
        vllm_backend.VLLMGenerator(tmp_path, max_model_len=128)


class Nudge(ToolEnv):
    """Keeps the episode going with a tool message after a turn without a call, so the
    rollout is multi-turn whatever the model writes."""

    async def step(self, text: str) -> StepResult:
        res = await super().step(text)
        if res.done and res.answer is None and len(self.history) < 3:
            res.done, res.stop_reason = False, None
            res.observation = [Message("tool", "Result: 42. Continue.", name="calculator")]
        return res


def test_a_multi_turn_rollout_equals_hf_token_for_token(
    engine: Any, policy: Any, tokenizer: Any
) -> None:
    """Through `ToolEnv` and the real rollout, greedy: the same token ids, loss mask and
    turns as the hf backend; turns 2 and 3 re-submit the episode and the prefix cache
    serves what earlier turns computed."""
    chat = ChatFormat.from_hf(tokenizer, chat_template=QWEN25_TOOLS)
    cfg = RolloutConfig(max_turns=3, max_tokens_per_turn=48, max_context=MAX_LEN, temperature=0.0)
    tasks = [Task(id=f"q{i}", question=q, answers=["x"]) for i, q in enumerate(QUESTIONS[:2])]
    make = lambda: Nudge(tools=[calculator])  # noqa: E731
    kept: list[int] = []
    real = engine.generate

    def counting(prompts: list[list[int]], params: SamplingParams) -> Any:
        out = real(prompts, params)
        kept.append(engine.last_stats.kept_tokens)
        return out

    engine.generate = counting
    engine.llm.reset_prefix_cache()  # earlier tests cached these system prompts
    try:
        ours = run_rollout(tasks, make, engine, chat, cfg)
    finally:
        del engine.generate
    theirs = run_rollout(tasks, make, HFGenerator(policy, tokenizer), chat, cfg)
    for g1, g2 in zip(ours, theirs, strict=True):
        a, b = g1.trajectories[0], g2.trajectories[0]
        assert a.num_turns == b.num_turns == 3
        assert a.token_ids == b.token_ids and a.loss_mask == b.loss_mask
        assert [(t.start, t.end, t.obs_end) for t in a.turns] == [
            (t.start, t.end, t.obs_end) for t in b.turns
        ]
        assert a.logprobs == pytest.approx(b.logprobs, abs=2e-3)
        for t in a.turns:  # only sampled tokens are trained
            assert set(a.loss_mask[t.start : t.end]) == {1}
            assert set(a.loss_mask[t.end : t.obs_end]) <= {0}
    # Turn 1: the second episode finds the system prompt the first one's blocks hold;
    # turns 2 and 3: each episode's earlier turns as well.
    assert kept[0] < kept[1] < kept[2], kept


def test_weights_follow_the_trainer(
    engine: Any, policy: Any, tokenizer: Any, prompts: list
) -> None:
    """After an update, the engine's log-probs of a fixed continuation are the trainer's
    for the new weights and not the old ones."""
    from agentr1.trainer.logprobs import token_logprobs

    prompt = prompts[0]
    cont = tokenizer.encode("The capital of France is Paris.", add_special_tokens=False)
    before = engine.prompt_logprobs(prompt, cont)
    updated = {k: v.clone() for k, v in policy.state_dict().items()}
    g = torch.Generator().manual_seed(0)
    for name in ("model.layers.3.mlp.down_proj.weight", "model.layers.7.self_attn.o_proj.weight"):
        updated[name] += 0.02 * torch.randn(updated[name].shape, generator=g)
    new_policy = type(policy)(policy.config)
    new_policy.load_state_dict(updated)
    new_policy.eval()
    ids = torch.tensor([prompt + cont])
    lp, _ = token_logprobs(new_policy, ids, torch.ones_like(ids))
    expected = lp[0, len(prompt) :].tolist()
    engine.load_weights(updated)
    try:
        after = engine.prompt_logprobs(prompt, cont)
        assert after == pytest.approx(expected, abs=2e-3)
        assert max(abs(x - y) for x, y in zip(after, before, strict=True)) > 0.05
        assert engine.weight_version >= 1
    finally:
        engine.load_weights(policy.state_dict())
    assert engine.prompt_logprobs(prompt, cont) == pytest.approx(before, abs=1e-5)


def test_lora_adapters_reach_the_engine_merged(
    engine: Any, policy: Any, tokenizer: Any, prompts: list
) -> None:
    """A LoRA policy's adapters are folded into the base before loading
    (`agentr1.lora.merged_state_dict`, what `Setup.sync_sampler` sends): the engine then
    computes what the adapted trainer model computes."""
    import copy

    from agentr1 import lora
    from agentr1.trainer.logprobs import token_logprobs

    adapted = copy.deepcopy(policy)
    lora.apply_lora(adapted, 8, 16.0)  # every attention and MLP projection
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for _, m in lora.lora_modules(adapted):
            _, b = lora._a_b(m)
            b.normal_(0, 0.05, generator=g)
    prompt = prompts[1]
    cont = tokenizer.encode("Red, yellow and blue.", add_special_tokens=False)
    ids = torch.tensor([prompt + cont])
    lp, _ = token_logprobs(adapted, ids, torch.ones_like(ids))
    expected = lp[0, len(prompt) :].tolist()
    before = engine.prompt_logprobs(prompt, cont)
    engine.load_weights(lora.merged_state_dict(adapted))
    try:
        after = engine.prompt_logprobs(prompt, cont)
        assert after == pytest.approx(expected, abs=2e-3)
        assert max(abs(x - y) for x, y in zip(after, before, strict=True)) > 0.05
    finally:
        engine.load_weights(policy.state_dict())
