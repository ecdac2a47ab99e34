"""The `hf` Generator against a tiny random Llama: log-probs, batching, sampling, stops.

The central check recomputes every returned log-prob with one uncached forward over
prompt + completion (no padding, no cache) and an independent top-p (transformers'
``TopPLogitsWarper``), for prompts of different lengths in one left-padded batch.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from transformers import LlamaForCausalLM, TopPLogitsWarper

from agentr1.backends.base import Completion, SamplingParams
from agentr1.backends.hf import HFGenerator, ends_with_stop_string, sampling_logprobs
from tests.tiny_models import save_tiny_llama, tiny_llama, tiny_tokenizer

VOCAB = 64
# Different lengths on purpose: left padding and position ids must not change anything.
PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12], [13, 14, 15, 16], [30, 31, 32, 33, 34, 35, 36, 37, 38]]


class WordDecoder:
    """Token i decodes to a letter repeated 1 to 3 times, so stop strings straddle tokens."""

    def decode(self, token_ids: list[int]) -> str:
        return "".join(chr(ord("a") + i % 26) * (1 + i % 3) for i in token_ids)


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    return tiny_llama(vocab_size=VOCAB)


@pytest.fixture(scope="module")
def gen(model: LlamaForCausalLM) -> HFGenerator:
    return HFGenerator(model, WordDecoder())


def reference_logprobs(
    model: LlamaForCausalLM, prompt: list[int], completion: Completion, params: SamplingParams
) -> list[float]:
    """Log-probs of the completion's tokens from one full, uncached, unpadded forward."""
    ids_1T = torch.tensor([prompt + completion.token_ids])
    with torch.no_grad():
        logits_TV = model(ids_1T, use_cache=False).logits[0].float()
    # Row t predicts token t + 1: the generated tokens are predicted by rows P-1 .. P+N-2.
    n = len(completion.token_ids)
    logits_NV = logits_TV[len(prompt) - 1 : len(prompt) - 1 + n]
    if params.temperature == 0:
        logprobs_NV = torch.log_softmax(logits_NV, dim=-1)
    else:
        scores_NV = logits_NV / params.temperature
        if params.top_p < 1:
            scores_NV = TopPLogitsWarper(params.top_p)(ids_1T, scores_NV)
        logprobs_NV = torch.log_softmax(scores_NV, dim=-1)
    targets_N = torch.tensor(completion.token_ids)
    return logprobs_NV.gather(-1, targets_N[:, None]).squeeze(-1).tolist()


@pytest.mark.parametrize(
    ("temperature", "top_p", "batch_size"),
    [(1.0, 1.0, None), (0.7, 0.9, None), (1.3, 0.8, 3), (0.0, 1.0, None), (0.0, 0.5, 2)],
)
def test_logprobs_match_full_recomputation(
    model: LlamaForCausalLM, temperature: float, top_p: float, batch_size: int | None
) -> None:
    gen = HFGenerator(model, batch_size=batch_size)
    params = SamplingParams(max_new_tokens=12, temperature=temperature, top_p=top_p, seed=3)
    completions = gen.generate(PROMPTS, params)
    assert len(completions) == len(PROMPTS)
    for prompt, comp in zip(PROMPTS, completions, strict=True):
        assert len(comp.token_ids) == len(comp.logprobs) == 12
        assert all(math.isfinite(lp) and lp <= 0 for lp in comp.logprobs)
        expected = reference_logprobs(model, prompt, comp, params)
        assert comp.logprobs == pytest.approx(expected, abs=1e-4)


def test_greedy_logprobs_are_raw_log_softmax(model: LlamaForCausalLM, gen: HFGenerator) -> None:
    # temperature 0 ignores temperature and top-p: argmax token, untempered log-prob.
    params = SamplingParams(max_new_tokens=6, temperature=0.0, top_p=0.3)
    for prompt, comp in zip(PROMPTS, gen.generate(PROMPTS, params), strict=True):
        ids_1T = torch.tensor([prompt + comp.token_ids])
        with torch.no_grad():
            logits_TV = model(ids_1T).logits[0, len(prompt) - 1 : -1]
        assert comp.token_ids == logits_TV.argmax(-1).tolist()
        raw = torch.log_softmax(logits_TV, -1).max(-1).values.tolist()
        assert comp.logprobs == pytest.approx(raw, abs=1e-4)
        assert max(comp.logprobs) < 0  # not renormalised onto the top token


def test_greedy_batch_equals_each_prompt_alone(gen: HFGenerator) -> None:
    params = SamplingParams(max_new_tokens=15, temperature=0.0)
    batched = gen.generate(PROMPTS, params)
    chunked = HFGenerator(gen.model, batch_size=3).generate(PROMPTS, params)
    for prompt, b, c in zip(PROMPTS, batched, chunked, strict=True):
        alone = gen.generate([prompt], params)[0]
        assert b.token_ids == alone.token_ids == c.token_ids
        assert b.logprobs == pytest.approx(alone.logprobs, abs=1e-4)


def test_seed_makes_sampling_reproducible(gen: HFGenerator) -> None:
    params = SamplingParams(max_new_tokens=20, temperature=1.0, seed=7)
    first = [c.token_ids for c in gen.generate(PROMPTS, params)]
    again = [c.token_ids for c in gen.generate(PROMPTS, params)]
    other = [c.token_ids for c in gen.generate(PROMPTS, SamplingParams(20, 1.0, seed=8))]
    assert first == again
    assert first != other


def test_row_seeds_make_a_row_independent_of_its_batch(gen: HFGenerator) -> None:
    """With ``row_seeds`` a row samples the same tokens alone, in any batch, in any chunk
    (what lets rollout workers reproduce one process); a row's seed, not its position,
    decides."""
    seeds = (11, 12, 13, 14, 15)[: len(PROMPTS)]
    params = SamplingParams(max_new_tokens=20, temperature=1.0, row_seeds=seeds)
    batched = [c.token_ids for c in gen.generate(PROMPTS, params)]
    chunked = HFGenerator(gen.model, batch_size=2).generate(PROMPTS, params)
    assert [c.token_ids for c in chunked] == batched
    for i, prompt in enumerate(PROMPTS):
        alone = gen.generate([prompt], replace(params, row_seeds=(seeds[i],)))[0]
        assert alone.token_ids == batched[i]
    swapped = gen.generate(PROMPTS[::-1], replace(params, row_seeds=seeds[::-1]))
    assert [c.token_ids for c in swapped][::-1] == batched
    other = gen.generate(PROMPTS, replace(params, row_seeds=tuple(s + 100 for s in seeds)))
    assert [c.token_ids for c in other] != batched


def test_row_streams_are_uniform_and_independent() -> None:
    from agentr1.backends.hf import RowStreams

    streams = RowStreams([0, 1, 2, 2**62 + 7], torch.device("cpu"))
    u_BN = torch.cat([streams.draw() for _ in range(20_000)], dim=1)
    assert float(u_BN.min()) >= 0.0 and float(u_BN.max()) < 1.0
    torch.testing.assert_close(u_BN.mean(1), torch.full((4,), 0.5), atol=0.01, rtol=0)
    corr = torch.corrcoef(u_BN)
    assert float((corr - torch.eye(4)).abs().max()) < 0.03  # ~4 sigma at n = 20k
    alone = RowStreams([2], torch.device("cpu"))
    assert torch.equal(torch.cat([alone.draw() for _ in range(50)], dim=1)[0], u_BN[2, :50])


def test_tiny_top_p_is_greedy(gen: HFGenerator) -> None:
    greedy = gen.generate(PROMPTS, SamplingParams(max_new_tokens=10, temperature=0.0))
    nucleus = gen.generate(PROMPTS, SamplingParams(max_new_tokens=10, top_p=1e-6, seed=0))
    for g, n in zip(greedy, nucleus, strict=True):
        assert n.token_ids == g.token_ids
        assert n.logprobs == [0.0] * 10  # the only token left in the nucleus


def test_max_new_tokens_finishes_with_length(gen: HFGenerator) -> None:
    for comp in gen.generate(PROMPTS, SamplingParams(max_new_tokens=5, seed=0)):
        assert comp.finish_reason == "length"
        assert len(comp.token_ids) == 5
        assert comp.metrics["new_tokens"] == 5


def test_stop_token_ends_row_and_is_kept(gen: HFGenerator) -> None:
    greedy = SamplingParams(max_new_tokens=20, temperature=0.0)
    full = gen.generate(PROMPTS, greedy)
    stop_tok = full[0].token_ids[4]
    cut = full[0].token_ids.index(stop_tok) + 1
    stopped = gen.generate(PROMPTS, SamplingParams(20, 0.0, stop_token_ids=(stop_tok,)))
    assert stopped[0].token_ids == full[0].token_ids[:cut]
    assert stopped[0].logprobs == pytest.approx(full[0].logprobs[:cut], abs=1e-5)
    assert stopped[0].finish_reason == "stop"
    # Other rows stop at their own first stop token, or run to the length limit untouched.
    for f, s in zip(full[1:], stopped[1:], strict=True):
        if stop_tok in f.token_ids:
            assert s.token_ids == f.token_ids[: f.token_ids.index(stop_tok) + 1]
            assert s.finish_reason == "stop"
        else:
            assert s.token_ids == f.token_ids
            assert s.finish_reason == "length"


def test_stop_string_ends_row_at_completing_token(gen: HFGenerator) -> None:
    decoder = WordDecoder()
    full = gen.generate(PROMPTS, SamplingParams(max_new_tokens=20, temperature=0.0))
    # A string straddling tokens 5..7 of row 0, without its first and last character.
    stop = decoder.decode(full[0].token_ids[5:8])[1:-1]
    stopped = gen.generate(PROMPTS, SamplingParams(20, 0.0, stop=(stop, "#never#")))
    for f, s in zip(full, stopped, strict=True):
        # Expected cut: the first prefix whose full decoded text contains the string.
        hits = [k for k in range(1, 21) if stop in decoder.decode(f.token_ids[:k])]
        if hits:
            assert s.token_ids == f.token_ids[: hits[0]]
            assert s.finish_reason == "stop"
        else:
            assert s.token_ids == f.token_ids
            assert s.finish_reason == "length"
    assert stopped[0].finish_reason == "stop"
    assert len(stopped[0].token_ids) <= 8


def test_stop_string_window_sees_long_strings() -> None:
    # One character per token: a 12-character string spans 12 tokens, all in the window.
    tok = tiny_tokenizer(VOCAB)
    ids = tok.encode("a long stop string here", add_special_tokens=False)
    assert ends_with_stop_string(ids, ("stop string here",), tok)
    assert not ends_with_stop_string(ids[:-1], ("stop string here",), tok)


def test_sampling_logprobs_hand_values() -> None:
    logits_1V = torch.tensor([[0.5, 0.3, 0.2]]).log()
    # top_p 0.6: mass above 0.3 is 0.5 < 0.6 (kept); above 0.2 is 0.8 (dropped).
    # Kept {0.5, 0.3} renormalise to {0.625, 0.375}.
    probs = sampling_logprobs(logits_1V, temperature=1.0, top_p=0.6).exp()
    assert probs[0].tolist() == pytest.approx([0.625, 0.375, 0.0])
    # top_p 0.4: the top token alone already holds 0.5 >= 0.4.
    assert sampling_logprobs(logits_1V, 1.0, 0.4).exp()[0].tolist() == pytest.approx([1, 0, 0])
    # temperature 0.5 squares the odds: [0.25, 0.09, 0.04] / 0.38.
    tempered = sampling_logprobs(logits_1V, 0.5, 1.0).exp()[0].tolist()
    assert tempered == pytest.approx([0.25 / 0.38, 0.09 / 0.38, 0.04 / 0.38])
    # Greedy: untempered, no top-p.
    assert sampling_logprobs(logits_1V, 0.0, 0.4).exp()[0].tolist() == pytest.approx(
        [0.5, 0.3, 0.2]
    )


def test_stats_and_training_mode_restored(model: LlamaForCausalLM) -> None:
    gen = HFGenerator(model, batch_size=2)
    model.train()
    try:
        comps = gen.generate(PROMPTS, SamplingParams(max_new_tokens=4, seed=0))
        assert model.training
    finally:
        model.eval()
    stats = gen.last_stats
    assert stats.num_prompts == 4
    assert stats.prompt_tokens == sum(len(p) for p in PROMPTS)
    assert stats.new_tokens == sum(len(c.token_ids) for c in comps) == 16
    assert stats.forward_passes == 2 * 4  # 2 chunks x (prefill + 3 decode steps)
    assert stats.decode_passes == 2 * 3
    assert stats.wall_s > 0 and stats.tokens_per_s > 0
    assert stats.prefill_s > 0 and stats.decode_s > 0
    assert stats.prefill_s + stats.decode_s <= stats.wall_s
    assert stats.ms_per_decode_pass == pytest.approx(1e3 * stats.decode_s / 6)
    assert stats.as_dict()["decode_passes"] == 6.0
    assert comps[1].metrics == {"prompt_tokens": 1.0, "new_tokens": 4.0}


def test_bad_inputs(gen: HFGenerator, model: LlamaForCausalLM) -> None:
    assert gen.generate([], SamplingParams()) == []
    with pytest.raises(ValueError, match="at least one token"):
        gen.generate([[1, 2], []], SamplingParams())
    with pytest.raises(ValueError, match="tokenizer"):
        HFGenerator(model).generate([[1]], SamplingParams(stop=("x",)))


def test_from_pretrained_local_dir(tmp_path: Path, gen: HFGenerator) -> None:
    path = save_tiny_llama(tmp_path / "tiny", vocab_size=VOCAB)
    loaded = HFGenerator.from_pretrained(path, dtype=torch.float32, device="cpu")
    tok = loaded.tokenizer
    assert tok is not None
    params = SamplingParams(max_new_tokens=12, temperature=0.0)
    ours = gen.generate(PROMPTS, params)
    theirs = loaded.generate(PROMPTS, params)
    assert [c.token_ids for c in theirs] == [c.token_ids for c in ours]
    # The real tokenizer drives stop strings: stop at the text of row 0's tokens 3..4.
    stop = tok.decode(ours[0].token_ids[3:5])
    cut = loaded.generate(PROMPTS[:1], SamplingParams(12, 0.0, stop=(stop,)))[0]
    assert stop in tok.decode(cut.token_ids)
    assert stop not in tok.decode(cut.token_ids[:-1])
    assert cut.finish_reason == "stop"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_logprobs_match_full_recomputation_cuda(model: LlamaForCausalLM) -> None:
    cuda_model = tiny_llama(vocab_size=VOCAB).cuda()
    params = SamplingParams(max_new_tokens=12, temperature=0.7, top_p=0.9, seed=3)
    completions = HFGenerator(cuda_model).generate(PROMPTS, params)
    for prompt, comp in zip(PROMPTS, completions, strict=True):
        expected = reference_logprobs(model, prompt, comp, params)  # CPU reference
        assert comp.logprobs == pytest.approx(expected, abs=1e-3)


def test_sampler_draws_match_the_distribution() -> None:
    """Inverse-CDF sampling: frequencies match p, zero-probability tokens never drawn."""
    from agentr1.backends.hf import sample_next

    probs = torch.tensor([0.5, 0.0, 0.3, 0.2, 0.0])
    logits_BV = probs.clamp_min(1e-30).log().expand(20_000, -1).clone()
    logits_BV[:, [1, 4]] = float("-inf")
    rng = torch.Generator().manual_seed(0)
    tokens_B, lp_B = sample_next(logits_BV, SamplingParams(temperature=1.0), rng)
    freq = torch.bincount(tokens_B, minlength=5).float() / 20_000
    assert freq[1] == 0 and freq[4] == 0
    torch.testing.assert_close(freq, probs, atol=0.015, rtol=0)  # ~4 sigma at n = 20k
    torch.testing.assert_close(lp_B, probs[tokens_B].log())


def test_shared_prompt_prefix_is_prefilled_once_and_changes_nothing(
    model: LlamaForCausalLM,
) -> None:
    """Prompts that start alike (the system prompt of every turn) are prefilled as
    shared prefix | padding | rest: same tokens and log-probs as without sharing, and
    every log-prob still matches a full uncached recomputation."""
    g = torch.Generator().manual_seed(5)
    system = torch.randint(4, VOCAB, (40,), generator=g).tolist()
    rests = [torch.randint(4, VOCAB, (n,), generator=g).tolist() for n in (1, 9, 4, 17)]
    prompts = [system + r for r in rests] + [system + rests[2]]  # a group: same prompt twice
    for params in (
        SamplingParams(max_new_tokens=10, temperature=0.0),
        SamplingParams(max_new_tokens=10, temperature=1.0, top_p=0.9, seed=7),
    ):
        shared_gen = HFGenerator(model)
        shared = shared_gen.generate(prompts, params)
        # the distinct prompts' prefix once; the repeated prompt (a twin) not at all
        assert shared_gen.last_stats.shared_prefix_tokens == 40 * 3 + len(prompts[4])
        plain_gen = HFGenerator(model, share_prefix=False, share_twins=False)
        plain = plain_gen.generate(prompts, params)
        assert plain_gen.last_stats.shared_prefix_tokens == 0
        for prompt, a, b in zip(prompts, shared, plain, strict=True):
            assert a.token_ids == b.token_ids
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
            assert a.logprobs == pytest.approx(
                reference_logprobs(model, prompt, a, params), abs=1e-4
            )
        if params.temperature == 0:
            assert shared[2].token_ids == shared[4].token_ids


def test_identical_prompts_keep_one_token_each_to_prefill(model: LlamaForCausalLM) -> None:
    prompt = list(range(4, 4 + 50))
    gen = HFGenerator(model, share_twins=False)
    out = gen.generate([prompt] * 3, SamplingParams(max_new_tokens=5, temperature=0.0))
    assert gen.last_stats.shared_prefix_tokens == 49 * 2
    twins = HFGenerator(model)  # the same rows as twins: one row prefilled and decoded
    greedy = SamplingParams(max_new_tokens=5, temperature=0.0)
    assert [o.token_ids for o in twins.generate([prompt] * 3, greedy)] == [o.token_ids for o in out]
    assert twins.last_stats.shared_prefix_tokens == 50 * 2
    assert twins.last_stats.twin_rows == 2 * 4  # two rows of each of the 4 decode passes
    alone = HFGenerator(model, share_prefix=False).generate(
        [prompt], SamplingParams(max_new_tokens=5, temperature=0.0)
    )
    assert all(o.token_ids == alone[0].token_ids for o in out)


@pytest.mark.parametrize("seeds", [None, [5, 6, 7, 8, 9, 10, 11, 12]])
def test_twins_decode_as_one_row_until_their_draws_differ_and_change_nothing(
    model: LlamaForCausalLM, seeds: list[int] | None
) -> None:
    """A GRPO-like chunk: two prompts x 4 samples (twins until their draws differ), one
    twin capped early, a stop token, three turns in a session (kept caches, twins again
    where a turn's prompts are equal): the same tokens and log-probs as decoding every
    row, each log-prob that of a full uncached forward, with fewer rows decoded."""
    import copy

    peaked = copy.deepcopy(model)  # sure of itself, as a trained policy: twins stay twins
    with torch.no_grad():
        peaked.lm_head.weight.mul_(6.0)
    g = torch.Generator().manual_seed(21)
    a, b = (torch.randint(4, VOCAB, (n,), generator=g).tolist() for n in (40, 45))
    params = SamplingParams(
        max_new_tokens=10,
        temperature=1.0,
        top_p=0.95,
        stop_token_ids=[7],
        seed=4 if seeds is None else None,
        row_seeds=seeds,
        row_max_new_tokens=[10, 10, 4, 10, 10, 10, 10, 10],
    )
    runs = []
    for share in (True, False):
        gen = HFGenerator(peaked, share_twins=share)
        twin_rows = 0
        with gen.session():
            prompts, outs = [a] * 4 + [b] * 4, []
            for turn in range(3):
                outs.append(gen.generate(prompts, params))
                twin_rows += gen.last_stats.twin_rows
                response = [9, 10 + turn]  # the same "tool response" to equal episodes
                prompts = [
                    p + o.token_ids + response for p, o in zip(prompts, outs[-1], strict=True)
                ]
        runs.append((outs, twin_rows))
    (got, twin_rows), (want, none) = runs
    assert none == 0 and twin_rows > 0
    for call_got, call_want in zip(got, want, strict=True):
        for x, y in zip(call_got, call_want, strict=True):
            assert x.token_ids == y.token_ids and x.finish_reason == y.finish_reason
            assert x.logprobs == pytest.approx(y.logprobs, abs=1e-4)
    first = got[0]
    assert len(first[2].token_ids) <= 4  # its own cap
    assert len({tuple(o.token_ids) for o in first[:4]}) > 1  # some twins split
    prompt = [a] * 4 + [b] * 4
    for row, o in enumerate(first):
        assert o.logprobs == pytest.approx(
            reference_logprobs(peaked, prompt[row], o, params), abs=1e-4
        )


def three_turns(
    gen: HFGenerator, first: list[list[int]], params: SamplingParams, seed: int
) -> tuple[list[list[list[int]]], list[list[Completion]], list[int]]:
    """Three calls, each prompt extended by its completion and a random "tool response"
    (the rollout's pattern); return each call's prompts, its completions and its
    ``kept_tokens``."""
    g = torch.Generator().manual_seed(seed)
    prompts, calls, outs_per_call, kept = first, [], [], []
    for _ in range(3):
        outs = gen.generate(prompts, params)
        calls.append(prompts)
        outs_per_call.append(outs)
        kept.append(gen.last_stats.kept_tokens)
        sizes = torch.randint(1, 12, (len(prompts),), generator=g).tolist()
        prompts = [
            p + o.token_ids + torch.randint(4, VOCAB, (n,), generator=g).tolist()
            for p, o, n in zip(prompts, outs, sizes, strict=True)
        ]
    return calls, outs_per_call, kept


@pytest.mark.parametrize("batch_size", [None, 2])
def test_session_prefills_each_turn_only_after_the_kept_cache(
    model: LlamaForCausalLM, batch_size: int | None
) -> None:
    """Inside ``session()`` every later turn reuses its episode's cache: same tokens and
    log-probs as recomputing each prompt from scratch, every log-prob equal to a full
    uncached forward, and only the new suffix is prefilled."""
    g = torch.Generator().manual_seed(11)
    system = torch.randint(4, VOCAB, (40,), generator=g).tolist()
    first = [system + torch.randint(4, VOCAB, (n,), generator=g).tolist() for n in (1, 9, 4)]
    first += [first[1]]  # a group: the same prompt twice
    for params in (
        SamplingParams(max_new_tokens=6, temperature=0.0),
        SamplingParams(max_new_tokens=6, temperature=1.0, top_p=0.9, seed=3),
    ):
        plain = HFGenerator(model, batch_size=batch_size)
        kept = HFGenerator(model, batch_size=batch_size)
        _, want, none_kept = three_turns(plain, first, params, seed=1)
        assert none_kept == [0, 0, 0] and kept.kept is None
        with kept.session():
            calls, got, kept_tokens = three_turns(kept, first, params, seed=1)
            assert kept.kept is not None and len(kept.kept) == len(first)
        assert kept.kept is None  # dropped with the session
        # Call 2 reuses each prompt + its turn minus the last token (sampled, never fed).
        assert kept_tokens[0] == 0
        fed = [len(p) + len(o.token_ids) - 1 for p, o in zip(first, got[0], strict=True)]
        assert kept_tokens[1] == sum(fed)
        assert kept_tokens[2] > kept_tokens[1]
        for prompts, call_want, call_got in zip(calls, want, got, strict=True):
            for prompt, a, b in zip(prompts, call_want, call_got, strict=True):
                assert a.token_ids == b.token_ids
                assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
                assert b.logprobs == pytest.approx(
                    reference_logprobs(model, prompt, b, params), abs=1e-4
                )


def test_session_mixes_kept_and_new_prompts_and_respects_its_byte_budget(
    model: LlamaForCausalLM,
) -> None:
    """A call with some prompts that extend a kept row and some that do not prefills
    each from the right place; a budget smaller than one row keeps nothing and a budget
    of one row keeps the newest; the outputs never change."""
    params = SamplingParams(max_new_tokens=5, temperature=0.0)
    a, b = list(range(4, 30)), list(range(30, 56))  # equal lengths: rows of equal bytes
    alone = HFGenerator(model)
    first = alone.generate([a, b], params)
    ext = [a + first[0].token_ids + [7, 8], b + first[1].token_ids + [9]]
    fresh = [list(range(10, 22))]
    want = alone.generate([*ext, *fresh], params)

    gen = HFGenerator(model)
    with gen.session():
        gen.generate([a, b], params)
        assert gen.kept is not None
        row_bytes = gen.kept.nbytes // 2
        got = gen.generate([*ext, *fresh], params)
        assert gen.last_stats.kept_tokens == sum(len(p) + 4 for p in (a, b))
    for prompt, w, g_ in zip([*ext, *fresh], want, got, strict=True):
        assert w.token_ids == g_.token_ids
        assert w.logprobs == pytest.approx(g_.logprobs, abs=1e-4)
        assert g_.logprobs == pytest.approx(reference_logprobs(model, prompt, g_, params), abs=1e-4)

    for budget, expect_kept in ((row_bytes - 1, 0), (row_bytes + row_bytes // 2, 1)):
        small = HFGenerator(model, keep_cache_bytes=budget)
        with small.session():
            small.generate([a, b], params)
            assert small.kept is not None and len(small.kept) == expect_kept
            assert small.kept.nbytes <= budget
            out = small.generate(ext, params)
            assert [o.token_ids for o in out] == [o.token_ids for o in want[:2]]
    # In chunks of one, the first chunk's new (longer) row must not evict the row the
    # second chunk needs: every prompt takes its kept row before any chunk runs.
    chunked = HFGenerator(model, batch_size=1, keep_cache_bytes=2 * row_bytes)
    with chunked.session():
        chunked.generate([a, b], params)
        out = chunked.generate(ext, params)
        assert chunked.last_stats.kept_tokens == sum(len(p) + 4 for p in (a, b))
    assert [o.token_ids for o in out] == [o.token_ids for o in want[:2]]
    with pytest.raises(ValueError, match="keep_cache_bytes"):
        HFGenerator(model, keep_cache_bytes=-1)


def test_kept_caches_take_the_longest_proper_prefix_once() -> None:
    from agentr1.backends.hf import KeptCaches, KeptRow

    def row(tokens: list[int]) -> KeptRow:
        t = torch.zeros((1, len(tokens), 2))
        return KeptRow(tokens, [(t, t.clone())])

    kept = KeptCaches(max_bytes=10_000)
    for tokens in ([1, 2], [1, 2, 3, 4], [1, 2, 3, 4], [5, 6, 7]):
        kept.put(row(tokens))
    assert len(kept) == 4
    assert kept.take([1, 2, 3, 4]) is not None  # [1, 2]: the equal rows are not proper
    assert kept.take([1, 2, 3]) is None  # [1, 2] was used once
    hit = kept.take([1, 2, 3, 4, 9])
    assert hit is not None and hit.tokens == [1, 2, 3, 4]
    assert kept.take([1, 2, 3, 4, 9]) is not None and kept.take([1, 2, 3, 4, 9]) is None
    assert kept.take([5, 6, 8, 9]) is None
    assert len(kept) == 1 and kept.nbytes == row([5, 6, 7]).nbytes
    long = list(range(4, 24))
    kept.put(row(long))
    assert kept.take([99, *long[1:], 5]) is None  # same length and tail: verified in full
    assert kept.take([*long, 5]) is not None


def test_row_caps_apply_inside_one_batched_call(gen: HFGenerator) -> None:
    """Each row stops with "length" at its own cap, in one call (the rollout used to split
    a batch by cap, doubling the decode passes), and greedy rows agree with an uncapped
    call up to their cap."""
    full = gen.generate(PROMPTS, SamplingParams(max_new_tokens=10, temperature=0.0))
    caps = (10, 3, 7, 1)
    capped = gen.generate(
        PROMPTS, SamplingParams(max_new_tokens=10, temperature=0.0, row_max_new_tokens=caps)
    )
    assert gen.last_stats.forward_passes == 10  # one prefill + 9 decode steps for all rows
    for cap, a, b in zip(caps, capped, full, strict=True):
        assert a.token_ids == b.token_ids[:cap] and a.finish_reason == "length"
        assert a.logprobs == pytest.approx(b.logprobs[:cap], abs=1e-5)
    with pytest.raises(ValueError, match=r"row_max_new_tokens must each be in \[1, max_new"):
        SamplingParams(max_new_tokens=4, row_max_new_tokens=(5, 1))
    with pytest.raises(ValueError, match="2 caps for 4 prompts"):
        gen.generate(PROMPTS, SamplingParams(max_new_tokens=4, row_max_new_tokens=(4, 1)))


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_new_tokens=12, temperature=0.0),
        SamplingParams(max_new_tokens=12, temperature=1.0, top_p=0.9, seed=5),
        SamplingParams(max_new_tokens=12, temperature=1.0, row_seeds=tuple(range(40, 48))),
    ],
    ids=["greedy", "seed", "row_seeds"],
)
def test_finished_rows_leave_the_decode_batch_and_change_nothing(
    model: LlamaForCausalLM, params: SamplingParams, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows that stop early leave the batch once half of it has finished: later decode
    passes run on the live rows only, and every row's tokens, log-probs, finish reasons
    and kept cache (the next turn's prefill) are those of a batch that keeps every row."""
    import agentr1.backends.hf as hf

    widths: list[int] = []  # rows of every decode pass
    step = hf.HFGenerator._decode_step

    def spy(self: HFGenerator, feed_B1: torch.Tensor, *args: object) -> torch.Tensor:
        assert feed_B1.shape[1] == 1  # decode steps only: prefills go another way
        widths.append(feed_B1.shape[0])
        return step(self, feed_B1, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(hf.HFGenerator, "_decode_step", spy)
    prompts = [*PROMPTS, *([7, *p] for p in PROMPTS)]
    params = replace(params, row_max_new_tokens=(12, 2, 3, 4, 2, 12, 5, 3), stop_token_ids=(9,))

    def two_turns(gen: HFGenerator) -> tuple[list[Completion], list[Completion], list[int]]:
        with gen.session():
            first = gen.generate(prompts, params)
            kept = [gen.last_stats.kept_tokens]
            nxt = [p + c.token_ids + [20, 21] for p, c in zip(prompts, first, strict=True)]
            second = gen.generate(nxt, params)
            return first, second, [*kept, gen.last_stats.kept_tokens]

    widths.clear()
    ours = two_turns(HFGenerator(model))
    compacted = widths[:]
    widths.clear()
    theirs = two_turns(HFGenerator(model, compact=False))
    assert set(widths) == {8}  # every decode pass at the chunk's width
    assert compacted[0] == 8 and min(compacted) < 4 and len(compacted) == len(widths)
    assert ours[2] == theirs[2] and ours[2][1] > 0  # the second call reused every kept row
    for turn_ours, turn_theirs in zip(ours[:2], theirs[:2], strict=True):
        for a, b in zip(turn_ours, turn_theirs, strict=True):
            assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


def test_reserved_layer_writes_in_place_and_equals_the_dynamic_layer() -> None:
    """The decode cache's layer keeps one buffer while it fits (no copy of the cache per
    token), shows exactly the concatenated keys and values, grows once when it does not
    fit, and rebuilds on batch edits."""
    from transformers.cache_utils import DynamicLayer

    from agentr1.backends.hf import ReservedLayer

    torch.manual_seed(0)
    ours, theirs = ReservedLayer(reserve=6), DynamicLayer()
    steps = [torch.randn(2, 3, t, 4) for t in (3, 1, 1, 1)]
    for i, k in enumerate(steps):
        a, b = ours.update(k, -k), theirs.update(k, -k)
        if i == 0:
            buffer = ours._k.data_ptr()  # type: ignore[union-attr]
        for x, y in zip(a, b, strict=True):
            torch.testing.assert_close(x, y, atol=0, rtol=0)
    assert ours._k.data_ptr() == buffer and ours.get_seq_length() == 6  # type: ignore[union-attr]
    grow = torch.randn(2, 3, 2, 4)
    for x, y in zip(ours.update(grow, grow), theirs.update(grow, grow), strict=True):
        torch.testing.assert_close(x, y, atol=0, rtol=0)
    assert ours._k.shape[-2] == 16 and ours.get_seq_length() == 8  # type: ignore[union-attr]
    ours.batch_repeat_interleave(2)
    theirs.batch_repeat_interleave(2)
    torch.testing.assert_close(ours.keys, theirs.keys, atol=0, rtol=0)
    ours.batch_select_indices(torch.tensor([3, 0]))
    theirs.batch_select_indices(torch.tensor([3, 0]))
    last = torch.randn(2, 3, 1, 4)
    for x, y in zip(ours.update(last, last), theirs.update(last, last), strict=True):
        torch.testing.assert_close(x, y, atol=0, rtol=0)


def test_generation_with_reserved_layers_equals_dynamic_caches(
    gen: HFGenerator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seeded sampling through a session (kept caches, shared prefixes) gives the same
    tokens and log-probs whether the cache writes in place or concatenates (the in-place
    one decodes through `DecodePass`: float rounding apart)."""
    import agentr1.backends.hf as hf

    reserved: list[int] = []
    made = hf._new_cache

    def spy(model: object, reserve: int = 0) -> object:
        reserved.append(reserve)
        return made(model, reserve)  # type: ignore[arg-type]

    prefix = [40 + i % 20 for i in range(36)]  # long enough to be prefilled once
    prompts = [prefix + p for p in PROMPTS]
    params = SamplingParams(max_new_tokens=8, temperature=1.0, seed=3)

    def two_turns() -> list[Completion]:
        with gen.session():
            first = gen.generate(prompts, params)
            return gen.generate(
                [p + c.token_ids + [20] for p, c in zip(prompts, first, strict=True)], params
            )

    monkeypatch.setattr(hf, "_new_cache", spy)
    ours = two_turns()
    assert reserved and all(r > 0 for r in reserved)
    monkeypatch.setattr(hf, "_new_cache", lambda model, reserve=0: made(model, 0))
    theirs = two_turns()
    for a, b in zip(ours, theirs, strict=True):
        assert a.token_ids == b.token_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


@pytest.mark.parametrize("kv_heads", [2, 4])
@pytest.mark.parametrize("padded", [False, True])
def test_grouped_query_decode_equals_sdpa(padded: bool, kv_heads: int) -> None:
    """A grouped-query model (2 query heads per key head) and a plain multi-head one sample
    through `decode_sdpa` (one-token queries packed per key head, two matmuls) with the
    log-probs of the full uncached forward, with and without padding (no padding = no
    mask: the path transformers sends to torch's slow ``enable_gqa`` kernel); training
    passes are untouched."""
    from agentr1.backends.attention import NAME

    model = tiny_llama(vocab_size=VOCAB, heads=4, kv_heads=kv_heads)
    ids = torch.tensor([PROMPTS[0], PROMPTS[0][::-1]])
    with torch.no_grad():
        before = model(ids).logits
    gen = HFGenerator(model)
    assert model.config._attn_implementation == NAME
    prompts = [PROMPTS[0], PROMPTS[2] if padded else PROMPTS[0][::-1]]
    params = SamplingParams(max_new_tokens=6, temperature=1.0, seed=5)
    for prompt, completion in zip(prompts, gen.generate(prompts, params), strict=True):
        assert completion.logprobs == pytest.approx(
            reference_logprobs(model, prompt, completion, params), abs=1e-5
        )
    model.train()
    torch.testing.assert_close(model(ids).logits, before, atol=1e-6, rtol=1e-6)
