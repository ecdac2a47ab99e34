"""`DecodePass` (agentr1/backends/decode.py) against transformers' forward: the same
tokens and log-probs through the `hf` generator (padding, kept caches, compaction), on
Llama (with and without grouped-query heads) and Qwen2 (q/k/v biases); models it does
not write out keep the module path."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from agentr1 import lora
from agentr1.backends import decode, hf, native
from agentr1.backends.base import Completion, SamplingParams
from agentr1.backends.hf import HFGenerator
from tests.tiny_models import tiny_llama

VOCAB = 64
PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12], [13, 14, 15, 16], [30, 31, 32, 33, 34, 35, 36, 37, 38]]


def tiny_qwen2(sliding: bool = False) -> Qwen2ForCausalLM:
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        initializer_range=0.5,
        use_sliding_window=sliding,
        sliding_window=8 if sliding else None,
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        model = Qwen2ForCausalLM(config)
        for name, p in model.named_parameters():
            if name.endswith("bias"):  # Qwen2 initialises its q/k/v biases at zero
                torch.nn.init.normal_(p, std=0.5)
    return model.eval()


MODELS = {
    "llama": lambda: tiny_llama(vocab_size=VOCAB),
    "llama-gqa": lambda: tiny_llama(vocab_size=VOCAB, kv_heads=2),
    "qwen2": tiny_qwen2,
}


BF16_MODELS = {
    **MODELS,
    # heads of 32: the native products' prefill rotates q and k in their epilogue
    "llama-d32": lambda: tiny_llama(vocab_size=VOCAB, hidden=64, heads=2, kv_heads=1),
}


def count_calls(
    monkeypatch: pytest.MonkeyPatch, cls: Any, key: Any = lambda t: t.shape[0]
) -> list[Any]:
    """``key`` of the first argument (default: its rows) of every call of ``cls`` from
    here on."""
    calls: list[Any] = []
    run = cls.__call__

    def spy(self: Any, first: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        calls.append(key(first))
        return run(self, first, *args, **kwargs)

    monkeypatch.setattr(cls, "__call__", spy)
    return calls


def count_rows(monkeypatch: pytest.MonkeyPatch, cls: Any) -> list[int]:
    """Rows of every call of ``cls`` from here on."""
    return count_calls(monkeypatch, cls)


def count_passes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """``(rows, tokens a row)`` of every `DecodePass` call from here on: one token a row
    for a decode step, the prompts' for a prefill."""
    return count_calls(monkeypatch, decode.DecodePass, key=lambda t: tuple(t.shape))


def count_native(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Rows of every native decode-attention call from here on."""
    return count_rows(monkeypatch, native.DecodeAttention)


def native_kernel() -> native.DecodeAttention:
    """The built kernel, or a skip naming why there is none."""
    kernel = native.decode_attention()
    if kernel is None:
        pytest.skip("no native decode-attention kernel here (no C++ compiler, or AGENTR1_NATIVE=0)")
    return kernel


def two_turns(gen: HFGenerator, params: SamplingParams) -> list[Completion]:
    """A session's two calls, the second extending every first turn (kept caches)."""
    with gen.session():
        first = gen.generate(PROMPTS, params)
        nxt = [p + c.token_ids + [20, 21] for p, c in zip(PROMPTS, first, strict=True)]
        return first + gen.generate(nxt, params)


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_new_tokens=10, temperature=0.0),
        SamplingParams(max_new_tokens=10, temperature=1.0, top_p=0.9, seed=4),
        SamplingParams(max_new_tokens=10, temperature=1.0, row_seeds=(1, 2, 3, 4)),
    ],
    ids=["greedy", "seed", "row_seeds"],
)
@pytest.mark.parametrize("attention", ["native", "torch"])
@pytest.mark.parametrize("prefill", ["pass", "transformers"])
def test_the_written_out_pass_samples_what_transformers_forward_does(
    name: str, params: SamplingParams, attention: str, prefill: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In fp32 every token and log-prob as through transformers' forward, with padding,
    a shared prefix, kept caches and compaction; the prefill through the pass too (what a
    bf16 pass with native products does) or through transformers' forward (fp32's way)."""
    model = MODELS[name]()
    native_calls = count_native(monkeypatch)
    if attention == "native":
        native_kernel()
    if prefill == "pass":
        monkeypatch.setattr(HFGenerator, "_prefill_pass", lambda self, decode: decode)
    # Rows finish apart (a stop token, caps of their own): the batch compacts.
    params = replace(params, stop_token_ids=(9,), row_max_new_tokens=(10, 3, 6, 2))
    calls = count_passes(monkeypatch)
    ours = two_turns(HFGenerator(model, native_attention=attention == "native"), params)
    steps = [rows for rows, tokens in calls if tokens == 1]
    assert steps and min(steps) < len(PROMPTS)  # the pass ran, on compacted batches too
    # the pass prefilled too (or not): the first call's prompts, the second call's after
    # the kept caches
    prefills = [c for c in calls if c[1] > 1]
    assert prefills == ([(4, 9), (4, 3)] if prefill == "pass" else [])
    # the native run called the kernel once a layer of every decode step (the same
    # rows), the torch run never
    layers = model.config.num_hidden_layers
    expected = [rows for rows in steps for _ in range(layers)] if attention == "native" else []
    assert native_calls == expected
    calls.clear()
    theirs = two_turns(HFGenerator(model, fast_decode=False), params)
    assert not calls
    for a, b in zip(ours, theirs, strict=True):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        # fp32 through another GEMM (oneDNN's packed weights) and, natively, another
        # attention: rounding, ~1e-5 of a nat.
        assert a.logprobs == pytest.approx(b.logprobs, rel=2e-5, abs=1e-5)


def native_products() -> native.DecodeLinear:
    """The built product kernel on a fast path, or a skip naming why there is none."""
    kernel = native.decode_linear()
    if kernel is None:
        pytest.skip("no native product kernel here (no C++ compiler, or AGENTR1_NATIVE=0)")
    if not kernel.fast:
        pytest.skip("no AMX or AVX512-BF16 on this CPU: the pass keeps oneDNN's products")
    return kernel


@pytest.mark.parametrize("attention", ["native", "torch"])
@pytest.mark.parametrize("products", ["native", "oneDNN", "modules"])
@pytest.mark.parametrize("name", sorted(BF16_MODELS))
def test_one_bf16_step_agrees_and_reads_the_weights_as_they_are_now(
    name: str, products: str, attention: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In bf16 the logits of a prefill and of one decode step agree with the module
    path's to bf16 rounding, from the native product kernel's packs, oneDNN's or the modules' weights,
    with the native attention kernel or torch ops; after in-place weight changes (a
    trainer's update) all see them."""
    packed = products != "modules"
    if packed and not decode.packable(torch.bfloat16, torch.device("cpu")):
        pytest.skip("oneDNN cannot pack bf16 weights on this CPU (no bf16 instructions)")
    model = BF16_MODELS[name]().to(torch.bfloat16)
    gen = HFGenerator(model)
    pass_ = decode.DecodePass.of(model)
    assert pass_ is not None
    product_calls = count_rows(monkeypatch, native.DecodeLinear)
    if packed:
        kernel = native_products() if products == "native" else None
        pass_ = replace(pass_, packs=decode.WeightPacks(native=kernel))
    prefill_calls = count_rows(monkeypatch, native.PrefillAttention)
    if attention == "native":
        pass_ = replace(
            pass_, attention=native_kernel(), prefill_attention=native.prefill_attention()
        )

    def step(fast: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """The logits of a prefill of PROMPTS and of one decode step after it."""
        cache = hf._new_cache(model, reserve=16)
        ids, mask, pos = hf.left_pad(PROMPTS, 0, torch.device("cpu"))
        run = (lambda *a: pass_(*a[:3], cache.layers)) if fast else gen._forward
        with torch.inference_mode():
            prefill = run(ids, mask, pos, cache)
            feed = torch.tensor([[3], [4], [5], [6]])
            mask = torch.cat([mask, torch.ones(4, 1, dtype=mask.dtype)], dim=1)
            nxt = mask.sum(-1, keepdim=True) - 1
            return prefill, run(feed, mask, nxt, cache)

    # The native kernel rounds a bf16 attention once (float32 inside), the module path its
    # scores and probabilities too: each is 1-3% of the logits' scale from the same model
    # in fp32 here (both about equally far), so the two may be twice that apart.
    tol = 0.04 if attention == "native" else 0.02
    for _ in range(2):
        for ours, theirs in zip(step(True), step(False), strict=True):
            scale = theirs.abs().max()
            assert (ours - theirs).abs().max() <= tol * scale
        with torch.no_grad():  # both must see the changes
            model.get_output_embeddings().weight.mul_(-1.0)
            model.model.layers[0].self_attn.k_proj.weight.mul_(3.0)
            model.model.layers[-1].mlp.up_proj.weight.add_(0.5)
    if packed:
        # 9 packs made by the first prefill; the second re-made the 3 whose weights changed
        assert pass_.packs is not None and pass_.packs.repacked == (4 * 2 + 1) + 3
    # natively: four calls a layer and the head's, in each of the four fast passes
    layers = model.config.num_hidden_layers
    assert product_calls == ([4] * (4 * layers + 1) * 4 if products == "native" else [])
    # the AMX prefill attention, once a layer of each fast prefill, where it runs (bf16,
    # heads of a multiple of 32, AMX granted); SDPA elsewhere
    kernel = native.prefill_attention()
    head = model.config.hidden_size // model.config.num_attention_heads
    runs = attention == "native" and kernel is not None and kernel.ready and head % 32 == 0
    assert prefill_calls == ([4] * layers * 2 if runs else [])


def generate_twice(gen: HFGenerator, change: Any) -> tuple[list[Completion], list[Completion]]:
    """Greedy completions of PROMPTS, then ``change(model)``, then again."""
    params = SamplingParams(max_new_tokens=8, temperature=0.0)
    first = gen.generate(PROMPTS, params)
    with torch.no_grad():
        change(gen.model)
    return first, gen.generate(PROMPTS, params)


def sgd_step(model: Any) -> None:
    """An optimizer's update: every weight moves (in place, as optimizers write)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    with torch.enable_grad():
        ids = torch.tensor([PROMPTS[0]])
        model(input_ids=ids, labels=ids).loss.backward()
    opt.step()


def load_other(model: Any) -> None:
    """A sampler's sync: another model's weights through ``load_state_dict``."""
    model.load_state_dict(tiny_llama(vocab_size=VOCAB, seed=11).state_dict())


@pytest.mark.parametrize("change", [sgd_step, load_other], ids=["optimizer", "load_state_dict"])
def test_packed_weights_are_kept_between_calls_and_remade_when_weights_change(
    change: Any,
) -> None:
    """The packs of a generator are made once and reused by later calls; after the
    weights change (an optimizer step, a sampler's ``load_state_dict``) the next call
    re-makes them and samples what a generator reading the modules' weights does."""
    model = tiny_llama(vocab_size=VOCAB)
    twin = tiny_llama(vocab_size=VOCAB)
    packed, plain = HFGenerator(model), HFGenerator(twin, pack_weights_bytes=0)
    first = packed.generate(PROMPTS, SamplingParams(max_new_tokens=8, temperature=0.0))
    made = packed.packs.repacked
    assert made == len(model.model.layers) * 4 + 1  # q|k|v, o, gate|up, down a layer; the head
    ours = generate_twice(packed, change)
    theirs = generate_twice(plain, change)
    assert not plain.packs.packs  # the cap of 0 bytes: the modules' own weights
    assert [c.token_ids for c in first] == [c.token_ids for c in ours[0]]
    assert packed.packs.repacked == 2 * made  # kept by the second call, re-made by the third
    for a, b in zip([*ours[0], *ours[1]], [*theirs[0], *theirs[1]], strict=True):
        assert a.token_ids == b.token_ids
        assert a.logprobs == pytest.approx(b.logprobs, rel=2e-5, abs=1e-5)
    assert [c.token_ids for c in ours[0]] != [c.token_ids for c in ours[1]]  # it changed


def test_the_byte_cap_turns_packing_off_for_a_model_above_it() -> None:
    model = tiny_llama(vocab_size=VOCAB)
    pass_ = decode.DecodePass.of(model)
    assert pass_ is not None
    size = pass_.linear_bytes()
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert size == sum(m.weight.nbytes for m in linears)  # every linear layer, the head too
    params = SamplingParams(max_new_tokens=6, temperature=0.0)
    below, above = HFGenerator(model, pack_weights_bytes=size - 1), HFGenerator(model)
    assert below.generate(PROMPTS, params) and not below.packs.packs
    assert above.generate(PROMPTS, params) and above.packs.nbytes() == size
    with pytest.raises(ValueError, match="pack_weights_bytes must be >= 0"):
        HFGenerator(model, pack_weights_bytes=-1)


def test_weights_onednn_cannot_pack_stay_the_modules() -> None:
    """float16 weights (and any CUDA model's) have no blocked layout here: the pass reads
    the modules' weights, and packing them directly is a clear error."""
    cpu = torch.device("cpu")
    assert decode.packable(torch.float32, cpu) and not decode.packable(torch.float16, cpu)
    assert not decode.packable(torch.float32, torch.device("cuda"))
    model = tiny_llama(vocab_size=VOCAB).to(torch.float16)
    gen = HFGenerator(model)
    assert gen.generate(PROMPTS, SamplingParams(max_new_tokens=3, temperature=0.0))
    assert not gen.packs.packs and gen.last_stats.decode_passes == 2
    pass_ = decode.DecodePass.of(model)
    assert pass_ is not None and not pass_.packable()
    with pytest.raises(ValueError, match=r"0\.qkv: oneDNN cannot pack weights of torch.float16"):
        decode.WeightPacks().linear(pass_.layers[0].qkv, torch.zeros(1, 1, 32, dtype=torch.float16))


def test_models_it_does_not_write_out_keep_transformers_forward() -> None:
    assert decode.DecodePass.of(tiny_llama(vocab_size=VOCAB)) is not None
    adapted = tiny_llama(vocab_size=VOCAB)
    lora.apply_lora(adapted, rank=2, alpha=4.0)  # adapters are forward hooks
    assert decode.DecodePass.of(adapted) is None
    assert decode.DecodePass.of(tiny_qwen2(sliding=True)) is None
    gelu = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            hidden_act="gelu",
        )
    )
    assert decode.DecodePass.of(gelu) is None
    params = SamplingParams(max_new_tokens=4, temperature=0.0)
    assert HFGenerator(adapted).generate([[5, 6, 7]], params)[0].token_ids  # still samples


def test_a_bf16_generator_multiplies_natively_unless_told_not_to(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`HFGenerator`'s default for a bf16 model on a CPU with the kernel's fast path: the
    native products; ``native_linear=False``: oneDNN's packs. Both sample (tokens may part
    where bf16 rounds a near-tie the other way, so only their shapes are compared)."""
    if not decode.packable(torch.bfloat16, torch.device("cpu")):
        pytest.skip("oneDNN cannot pack bf16 weights on this CPU (no bf16 instructions)")
    native_products()
    model = tiny_llama(vocab_size=VOCAB).to(torch.bfloat16)
    calls = count_rows(monkeypatch, native.DecodeLinear)
    params = SamplingParams(max_new_tokens=5, temperature=0.0)
    ours = HFGenerator(model).generate(PROMPTS, params)
    passes = 5  # 5 tokens: the prefill's, then four decode passes
    assert len(calls) == passes * (4 * model.config.num_hidden_layers + 1)
    calls.clear()
    theirs = HFGenerator(model, native_linear=False).generate(PROMPTS, params)
    assert not calls
    assert [len(c.token_ids) for c in ours] == [len(c.token_ids) for c in theirs]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_shared_prefix_prefilled_through_the_pass_samples_the_same(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Prompts that share a prefix: the pass prefills it once for one row, then each
    row's rest against the repeated cache, and samples what transformers' forward does."""
    model = MODELS[name]()
    prefix = list(range(3, 3 + hf.MIN_SHARED_PREFIX + 2))
    prompts = [[*prefix, 40, 41], [*prefix, 42], [*prefix, 43, 44, 45]]
    params = SamplingParams(max_new_tokens=6, temperature=1.0, row_seeds=(1, 2, 3))
    theirs = HFGenerator(model, fast_decode=False).generate(prompts, params)
    calls = count_passes(monkeypatch)
    monkeypatch.setattr(HFGenerator, "_prefill_pass", lambda self, decode: decode)
    gen = HFGenerator(model)
    ours = gen.generate(prompts, params)
    assert gen.last_stats.shared_prefix_tokens == len(prefix) * 2
    assert [c for c in calls if c[1] > 1] == [(1, len(prefix)), (3, 3)]
    for a, b in zip(ours, theirs, strict=True):
        assert a.token_ids == b.token_ids
        assert a.logprobs == pytest.approx(b.logprobs, rel=2e-5, abs=1e-5)


@pytest.mark.parametrize(("copy", "adapters"), [(False, False), (True, False), (True, True)])
def test_the_packs_are_dropped_after_the_rollout(copy: bool, adapters: bool) -> None:
    """After a step's rollout the packs go: the update is about to change every packed
    weight (a sampler copy that the sync overwrites; the policy itself, fully trained);
    LoRA's policy sampled directly packs nothing."""
    from types import SimpleNamespace

    from agentr1.trainer.rollouts import release_stale_packs

    policy = tiny_llama(vocab_size=VOCAB)
    if adapters:
        lora.apply_lora(policy, rank=2, alpha=4)
        direct = HFGenerator(policy)
        direct.generate(PROMPTS, SamplingParams(max_new_tokens=4, temperature=0.0))
        assert direct.packs.nbytes() == 0
    gen = HFGenerator(tiny_llama(vocab_size=VOCAB) if copy else policy)
    gen.generate(PROMPTS, SamplingParams(max_new_tokens=4, temperature=0.0))
    assert gen.packs.nbytes() > 0
    release_stale_packs(SimpleNamespace(setup=SimpleNamespace(generator=gen)))  # type: ignore[arg-type]
    assert gen.packs.nbytes() == 0
