"""The ``hf`` Generator: batched sampling with a transformers model, on CPU or GPU.

Notation: B batch rows, T sequence positions (prompt, then prompt + generated), V vocab.

How a batch is generated (``HFGenerator.generate``):

1. Prompts are sorted by length, cut into chunks of ``batch_size`` and each chunk is
   **left-padded** into ``ids_BT`` with ``mask_BT`` (1 = real token). Left padding puts
   every row's next token in the same last column, so one decode step serves all rows.
   ``position_ids`` count real tokens only (``cumsum(mask) - 1``): a padded row sees the
   same rotary positions as it would alone, which is what makes batched output equal
   unbatched output.
2. **Prefill**: one forward over the whole chunk fills a ``DynamicCache`` and returns
   logits for the last column only (``logits_to_keep=1``): the [B, T, V] logits of the
   prompt are never built. When the chunk's prompts share a prefix of at least
   ``MIN_SHARED_PREFIX`` tokens (every multi-turn prompt starts with the same system
   prompt and tool schema), the prefix is prefilled once as one row, its cache repeated
   to the B rows, and the rows' rests are prefilled after it, left-padded: row = shared
   prefix | padding | rest. The padding in the middle is masked and position ids count
   real tokens, so every row computes what it would alone.
3. **Decode**: one forward per new token feeds the sampled token (``[B, 1]``) at the next
   position of each row, extends the mask by a column of ones, and reuses the cache. The
   cache's full-attention layers are `ReservedLayer`s: each reserves the chunk's widest
   row plus its longest cap at the start and writes every token in place, where
   transformers' ``DynamicLayer`` copies the whole cache once per token. A Llama or
   Qwen2 model decodes through `DecodePass` (``agentr1/backends/decode.py``), its
   forward written out, attending over the whole reserved buffer with the unwritten
   columns masked (a slice of it made torch's bf16 ``bmm`` copy every layer's cache per
   token); other models, and models with forward hooks (LoRA), take transformers'.
   Rows that have finished are fed the pad token and their outputs are frozen; once at
   most half of the decode batch is still live (and at least ``MIN_COMPACT_ROWS`` rows
   have finished), the finished rows leave it: the cache, mask, positions and row
   streams keep the live rows only, so the long tail of a batch whose rows stop at
   different lengths runs at the width of its live rows, not of the chunk
   (``compact=False`` keeps every row to the end). The loop ends when every row has
   finished. Everything runs under ``torch.inference_mode()``
   with the model in eval mode (its previous mode is restored afterwards).
4. **Kept caches across calls** (``with generator.session(): ...``; the rollout opens one
   per rollout): every row's KV cache is kept after its call, trimmed to its real tokens
   (prompt + generated tokens except the last, which was sampled but never fed). A later
   call's prompt that extends a kept row's tokens (the next turn: the same episode plus
   its last token and a tool response) takes that cache and prefills only the new
   suffix, laid out as padding | kept | padding | suffix, with position ids continuing
   the kept row's. A multi-turn episode is then prefilled once over all its turns
   instead of once per turn. Kept rows are used at most once, the oldest are dropped
   beyond ``keep_cache_bytes``, and all are dropped when the session ends: the weights
   must not change inside a session. Models whose caches are not plain full-attention
   layers (sliding windows, recurrent states) do not keep rows.
5. **Twins** (``share_twins``): rows of a chunk with the same prompt (and the same kept
   cache) have the same tokens so far -- a GRPO group's samples, and once the policy is
   sure of itself most of them for most of an episode (the demo's trained agent: 1-3
   distinct episodes of 8). They are prefilled as one row of the decode batch (a
   "line"); every row still draws its own token from its line's distribution, with its
   own draws. Rows of a line that draw the same token stay on it; each other token
   drawn makes a copy of the line's cache (appended to the batch) for its rows. A line
   no unfinished row needs any more is fed padding and, once at most half the batch is
   still needed, leaves it (the rows' caches kept first). Tokens and log-probs are those
   of decoding every row apart, up to float rounding: a row's logits come from its
   twin's position in the batch.

Log-prob semantics (what RL needs as "old log-probs"): each returned log-prob is that of
the sampled token under the distribution it was actually sampled from, computed in
float32 from the last position's logits: ``log_softmax(logits / temperature)`` then top-p
truncation and renormalisation (``sampling_logprobs``; the same nucleus rule as
transformers' ``TopPLogitsWarper``). With ``temperature == 0`` the token is the argmax and
its log-prob is ``log_softmax`` of the raw logits (top-p does not apply). A trainer that
recomputes log-probs should use ``sampling_logprobs`` with the same settings.

Stops: a token in ``params.stop_token_ids`` or a string of ``params.stop`` found in the
decoded generated text ends a row with finish "stop", the stopping token kept; reaching
``max_new_tokens`` ends it with "length". The model's EOS token is NOT implied: pass it in
``stop_token_ids`` (the rollout does, from the tokenizer), so stopping is only what the
params say. Stop strings are searched in a decoded tail window of the generated tokens,
never in the prompt.

Sampling with a ``seed`` is reproducible for the same prompts, ``batch_size`` and device;
each row's draw depends on the batch it sits in, so changing ``batch_size`` changes
sampled (not greedy) outputs.

Swapping in a faster engine: the rollout depends only on the ``Generator`` protocol in
``backends/base.py`` (token ids in, ``Completion`` out). A vLLM or SGLang backend wraps
its engine's generate call with ``SamplingParams`` mapped one-to-one (``logprobs=0`` to
get the sampled token's log-prob, ``stop_token_ids``, ``stop``, ``include_stop_str_in_output``,
and no implicit EOS, e.g. vLLM's ``ignore_eos=True``), imports the engine lazily, and is
checked against this module with the log-prob recomputation test in
``tests/integration/test_hf_backend.py``. Engines that report log-probs of the raw (untempered)
distribution need a correction before their numbers can be PPO's old log-probs.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, Protocol

import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer

from agentr1.backends.attention import use_decode_sdpa
from agentr1.backends.base import Completion, SamplingParams
from agentr1.backends.decode import DecodePass, WeightPacks
from agentr1.backends.native import decode_attention, decode_linear, prefill_attention

MIN_COMPACT_ROWS = 2
"""Fewer finished rows are fed padding to the end of the call: dropping them from the
decode batch copies the live rows' cache, not worth it for one row."""

MIN_SHARED_PREFIX = 32
"""Shorter common prompt prefixes are prefilled per row: a second forward call is not
worth fewer tokens."""

STOP_WINDOW_SLACK = 8
"""Extra tokens decoded beyond the longest stop string when checking stop strings.

A stop string of n characters spans at most n tokens when every token decodes to at
least one character; the slack covers tokens that decode to nothing and keeps the
window's first token (whose decoding may lose a leading space) out of any match.
"""


class TokenDecoder(Protocol):
    """The one tokenizer method the generator needs: ids to text, for stop strings.

    HF tokenizers qualify; they annotate ``str | list[str]`` because batched input gives a
    list, but a flat id list always decodes to one ``str``.
    """

    def decode(self, token_ids: list[int], /) -> str | list[str]: ...


@dataclass
class GenerationStats:
    """Totals for one ``generate`` call (``HFGenerator.last_stats``).

    Attributes:
        num_prompts: prompts in the call.
        prompt_tokens: real (unpadded) prompt tokens.
        new_tokens: sampled tokens returned, stop tokens included.
        forward_passes: model forwards (prefills plus decode steps) over all chunks.
        shared_prefix_tokens: prompt tokens not prefilled because their chunk shared them
            (``(rows - 1) x prefix`` per chunk).
        kept_tokens: prompt tokens not prefilled because an earlier call of the session
            kept their cache (module docstring, 4).
        wall_s: wall-clock seconds for the whole call.
        prefill_s: seconds in prefills (the prompts, or what kept caches lack of them).
        decode_s: seconds in decoding: every decode pass with its sampling and
            bookkeeping, from the first token sampled to the last.
        decode_passes: decode passes (one token a row each) over all chunks.
        twin_rows: rows of decode passes not computed because another row of the chunk
            had the same tokens so far (summed over passes; module docstring, 5).
    """

    num_prompts: int = 0
    prompt_tokens: int = 0
    new_tokens: int = 0
    forward_passes: int = 0
    shared_prefix_tokens: int = 0
    kept_tokens: int = 0
    wall_s: float = 0.0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    decode_passes: int = 0
    twin_rows: int = 0

    @property
    def ms_per_decode_pass(self) -> float:
        """Milliseconds a decode pass (0 when there was none)."""
        return 1e3 * self.decode_s / self.decode_passes if self.decode_passes else 0.0

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens per wall-clock second."""
        return self.new_tokens / self.wall_s if self.wall_s > 0 else 0.0

    def as_dict(self) -> dict[str, float]:
        """Flat numbers for a metrics log."""
        return {
            "num_prompts": float(self.num_prompts),
            "prompt_tokens": float(self.prompt_tokens),
            "new_tokens": float(self.new_tokens),
            "forward_passes": float(self.forward_passes),
            "shared_prefix_tokens": float(self.shared_prefix_tokens),
            "kept_tokens": float(self.kept_tokens),
            "wall_s": self.wall_s,
            "tokens_per_s": self.tokens_per_s,
            "prefill_s": self.prefill_s,
            "decode_s": self.decode_s,
            "decode_passes": float(self.decode_passes),
            "twin_rows": float(self.twin_rows),
        }


def sampling_logprobs(logits_BV: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """Log-probs of the distribution tokens are sampled from, in float32.

    ``temperature == 0`` (greedy) gives ``log_softmax(logits)``, untempered and without
    top-p. Otherwise ``log_softmax(logits / temperature)``; then, if ``top_p < 1``, the
    nucleus is the smallest set of most likely tokens whose mass reaches ``top_p`` (a
    token is dropped when the mass of the tokens ranked above it is already >= top_p;
    the top token is always kept), everything else gets ``-inf`` and the rest is
    renormalised. Works on any leading shape ``[..., V]``.
    """
    logits_BV = logits_BV.float()
    if temperature == 0:
        return torch.log_softmax(logits_BV, dim=-1)
    logprobs_BV = torch.log_softmax(logits_BV / temperature, dim=-1)
    if top_p >= 1.0:
        return logprobs_BV
    sorted_BV, order_BV = logprobs_BV.sort(dim=-1, descending=True)
    probs_BV = sorted_BV.exp()
    mass_above_BV = probs_BV.cumsum(dim=-1) - probs_BV
    drop_sorted_BV = mass_above_BV >= top_p
    drop_BV = drop_sorted_BV.scatter(-1, order_BV, drop_sorted_BV)
    logprobs_BV = logprobs_BV.masked_fill(drop_BV, float("-inf"))
    return logprobs_BV - logprobs_BV.logsumexp(dim=-1, keepdim=True)


def _i64(x: int) -> int:
    """``x`` (a 64-bit pattern) as a signed int64."""
    x &= (1 << 64) - 1
    return x - (1 << 64) if x >> 63 else x


_GOLDEN, _MIX1, _MIX2 = _i64(0x9E3779B97F4A7C15), _i64(0xBF58476D1CE4E5B9), _i64(0x94D049BB133111EB)


def _shr(z: torch.Tensor, n: int) -> torch.Tensor:
    """Logical right shift of int64 ``z`` (torch's ``>>`` is arithmetic)."""
    return (z >> n) & ((1 << (64 - n)) - 1)


class RowStreams:
    """One stream of uniform draws per row, keyed by the row's seed: draw ``t`` of a row is
    splitmix64(seed, t), so a row's draws never depend on which rows share its call, and
    all rows draw in one vectorized step (a torch generator per row cost one call per row
    per token)."""

    def __init__(self, seeds: list[int], device: torch.device) -> None:
        self.keys_B = torch.tensor([_i64(s) for s in seeds], dtype=torch.int64, device=device)
        self.t = 0

    def draw(self) -> torch.Tensor:
        """The next uniform in [0, 1) of every row (24 bits: exact in float32). [B, 1]"""
        z = self.keys_B * _MIX2 + torch.full_like(self.keys_B, self.t + 1) * _GOLDEN
        z = (z ^ _shr(z, 30)) * _MIX1
        z = (z ^ _shr(z, 27)) * _MIX2
        z = z ^ _shr(z, 31)
        self.t += 1
        return (_shr(z, 40).to(torch.float32) * 2.0**-24)[:, None]

    def select(self, idx: torch.Tensor) -> RowStreams:
        """The streams of rows ``idx`` only, at the same draw (a batch dropping rows)."""
        kept = RowStreams([], self.keys_B.device)
        kept.keys_B, kept.t = self.keys_B[idx], self.t
        return kept


@dataclass
class SharedRows:
    """The call's one generator (or torch's global one) seen by some rows of a chunk: each
    step still draws one uniform for every row of the whole chunk and hands the rows
    theirs, so dropping finished rows from the batch changes no row's draws."""

    generator: torch.Generator | None
    chunk_rows: int
    at_B: torch.Tensor
    """The chunk's rows still in the batch."""

    def draw(self) -> torch.Tensor:
        u = torch.rand((self.chunk_rows, 1), generator=self.generator, device=self.at_B.device)
        return u[self.at_B]

    def select(self, idx: torch.Tensor) -> SharedRows:
        return SharedRows(self.generator, self.chunk_rows, self.at_B[idx])


RowRng = torch.Generator | RowStreams | SharedRows | None
"""One generator for the whole call, one stream per row (``SamplingParams.row_seeds``),
either of them for the rows left in a batch, or none."""


def _select_rows(rng: RowRng, at_B: torch.Tensor, chunk_rows: int) -> RowRng:
    """The draws of the batch's rows ``at_B`` (positions in the current batch), the same
    as they would have had in the whole batch."""
    if isinstance(rng, (RowStreams, SharedRows)):
        return rng.select(at_B)
    return SharedRows(rng, chunk_rows, at_B)


def _uniform_B1(rng: RowRng, n: int, device: torch.device) -> torch.Tensor:
    """One uniform draw per row. [B, 1]"""
    if isinstance(rng, (RowStreams, SharedRows)):
        return rng.draw().to(device)
    return torch.rand((n, 1), generator=rng, device=device)


def sample_next(
    logits_BV: torch.Tensor, params: SamplingParams, rng: RowRng
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row; return ``(tokens_B, logprobs_B)`` (see ``sampling_logprobs``)."""
    logprobs_BV = sampling_logprobs(logits_BV, params.temperature, params.top_p)
    if params.temperature == 0:
        tokens_B = logprobs_BV.argmax(dim=-1)
    else:
        # Inverse-CDF sampling: one uniform draw per row instead of one per vocabulary
        # entry. On CPU, torch.multinomial (and per-entry noise) took ~40% of decode
        # time for small models. right=True never lands on a zero-probability token:
        # it returns the first i with cdf[i] > u >= cdf[i-1], so p_i > 0.
        cdf_BV = logprobs_BV.exp().cumsum(dim=-1)
        u_B1 = _uniform_B1(rng, cdf_BV.shape[0], cdf_BV.device)
        u_B1 = u_B1.to(cdf_BV.dtype) * cdf_BV[:, -1:]
        tokens_B = torch.searchsorted(cdf_BV, u_B1, right=True).squeeze(-1)
        tokens_B = tokens_B.clamp(max=cdf_BV.shape[-1] - 1)
    return tokens_B, logprobs_BV.gather(-1, tokens_B[:, None]).squeeze(-1)


def cache_kwarg(module: Any) -> str | None:
    """Name of the KV-cache argument of ``module.forward``, None when it takes none.

    transformers 5.x renamed ``past_key_values`` to ``cache`` (the old name is a
    deprecated alias until 5.40); 4.x only knows ``past_key_values``.
    """
    params = inspect.signature(module.forward).parameters
    return next((k for k in ("cache", "past_key_values") if k in params), None)


def common_prefix_len(prompts: list[list[int]]) -> int:
    """Length of the longest prefix every prompt starts with.

    >>> common_prefix_len([[1, 2, 3], [1, 2, 4, 5], [1, 2]])
    2
    """
    first = prompts[0]
    n = min(len(p) for p in prompts)
    for i in range(n):
        if any(p[i] != first[i] for p in prompts):
            return i
    return n


def left_pad(
    prompts: list[list[int]], pad_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-pad prompts; return ``(ids_BT, mask_BT, position_ids_BT)``.

    Positions count real tokens only, so the first real token of every row is position 0
    (pad columns get 0 too; they are masked out and never attended to).
    """
    width = max(len(p) for p in prompts)
    ids_BT = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask_BT = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids_BT[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        mask_BT[row, width - len(prompt) :] = 1
    position_ids_BT = (mask_BT.cumsum(dim=-1) - 1).clamp(min=0)
    return ids_BT.to(device), mask_BT.to(device), position_ids_BT.to(device)


def ends_with_stop_string(
    token_ids: list[int], stops: tuple[str, ...], tokenizer: TokenDecoder
) -> bool:
    """Whether the decoded tail of ``token_ids`` contains one of ``stops``.

    Called after every new token, so a string found in the tail window was completed by
    the newest token: any earlier occurrence lies in the previous, overlapping window and
    would have stopped generation already.
    """
    window = max(len(s) for s in stops) + STOP_WINDOW_SLACK
    text = tokenizer.decode(token_ids[-window:])
    if not isinstance(text, str):
        raise TypeError(f"decode(list[int]) must return str, got {type(text).__name__}")
    return any(s in text for s in stops)


KEY_TAIL = 8
"""Tokens at the end of a kept row that, with its length, key the lookup (then verified)."""


@dataclass
class KeptRow:
    """One row's KV cache after a call, trimmed to its real tokens.

    Attributes:
        tokens: the tokens the cache covers, position 0 first.
        kv: per layer, (keys, values) of shape ``[heads, len(tokens), head_dim]``.
    """

    tokens: list[int]
    kv: list[tuple[torch.Tensor, torch.Tensor]]

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in self.kv)


@dataclass
class KeptCaches:
    """Rows kept by earlier calls of a session, found again by token prefix.

    ``take(prompt)`` returns (and forgets) the longest kept row whose tokens are a proper
    prefix of ``prompt``; ``put`` keeps a row, dropping the oldest beyond ``max_bytes``.
    """

    max_bytes: int
    nbytes: int = 0
    _rows: dict[tuple[int, tuple[int, ...]], list[KeptRow]] = field(default_factory=dict)
    _lengths: dict[int, int] = field(default_factory=dict)  # length -> rows of that length

    @staticmethod
    def _key(tokens: list[int], length: int) -> tuple[int, tuple[int, ...]]:
        return length, tuple(tokens[max(0, length - KEY_TAIL) : length])

    def __len__(self) -> int:
        return sum(len(rows) for rows in self._rows.values())

    def put(self, row: KeptRow) -> None:
        size = row.nbytes
        if not row.tokens or size > self.max_bytes:
            return
        while self.nbytes + size > self.max_bytes:
            self._drop(next(iter(self._rows)), 0)  # dicts keep insertion order: oldest first
        self._rows.setdefault(self._key(row.tokens, len(row.tokens)), []).append(row)
        self._lengths[len(row.tokens)] = self._lengths.get(len(row.tokens), 0) + 1
        self.nbytes += size

    def take(self, prompt: list[int]) -> KeptRow | None:
        for length in sorted(self._lengths, reverse=True):
            if length >= len(prompt):
                continue  # a kept row must leave at least one token to prefill
            key = self._key(prompt, length)
            for i, row in enumerate(self._rows.get(key, [])):
                if row.tokens == prompt[:length]:
                    return self._drop(key, i)
        return None

    def _drop(self, key: tuple[int, tuple[int, ...]], index: int) -> KeptRow:
        rows = self._rows[key]
        row = rows.pop(index)
        if not rows:
            del self._rows[key]
        self._lengths[key[0]] -= 1
        if not self._lengths[key[0]]:
            del self._lengths[key[0]]
        self.nbytes -= row.nbytes
        return row


class ReservedLayer(DynamicLayer):  # type: ignore[no-untyped-call]
    """A full-attention cache layer that writes into a preallocated buffer.

    transformers' ``DynamicLayer`` concatenates the whole cache with each new token's keys
    and values: a copy of every cached byte per decoded token (a third of a decode pass of
    the demo's model at 128 rows, `benchmarks/RESULTS.md`, "Roofline"). This layer reserves
    ``[B, heads, reserve, head_dim]`` at its first update, writes each update in place and
    exposes ``keys`` / ``values`` as views of the filled columns, so attention reads the
    same values it would from the concatenated tensors. A write beyond the buffer grows it
    once (to twice what is needed); batch edits (repeat, select) rebuild it.
    """

    def __init__(self, reserve: int) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.reserve = reserve
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None
        self._n = 0

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n, t = self._n, key_states.shape[-2]
        if self._k is None or n + t > self._k.shape[-2] or self._k.shape[0] != key_states.shape[0]:
            self._grow(key_states, value_states, n + t)
        assert self._k is not None and self._v is not None
        self._k[:, :, n : n + t] = key_states
        self._v[:, :, n : n + t] = value_states
        self._n = n + t
        keys, values = self._k[:, :, : self._n], self._v[:, :, : self._n]
        self.keys, self.values = keys, values
        return keys, values

    def append(
        self, key_states: torch.Tensor, value_states: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`update`, returning the whole buffers ``[B, heads, reserved, head_dim]``; the
        columns past the filled ones hold finite values (zeros, or what a crop left), for
        a decode pass that attends over all of them with those masked
        (`agentr1.backends.decode`)."""
        self.update(key_states, value_states)
        assert self._k is not None and self._v is not None
        return self._k, self._v

    def claim_column(self) -> tuple[torch.Tensor, torch.Tensor, int] | None:
        """Room for one more token, for a caller that writes its key and value itself
        (the native decode kernel, `agentr1.backends.native`): the whole buffers
        ``[B, heads, reserved, head_dim]`` and the column ``n`` now counted as filled,
        which the caller must write before anything reads the cache; None before the
        first `update` (nothing reserved yet)."""
        if self._k is None or self._v is None:
            return None
        n = self._n
        if n + 1 > self._k.shape[-2]:
            self._grow(self._k[:, :, :0], self._v[:, :, :0], n + 1)
        assert self._k is not None and self._v is not None
        self._n = n + 1
        self.keys, self.values = self._k[:, :, : self._n], self._v[:, :, : self._n]
        return self._k, self._v, n

    def _grow(self, key_states: torch.Tensor, value_states: torch.Tensor, needed: int) -> None:
        B, H, _, D = key_states.shape
        cap = max(needed, self.reserve) if self._k is None else 2 * needed
        # The caller writes columns [n, needed) next and the old ones are copied, so only
        # the columns past ``needed`` are zero-filled (not left as empty memory:
        # `append`'s callers read them, masked, and a NaN there would survive the mask).
        k = key_states.new_empty((B, H, cap, D))
        v = value_states.new_empty((B, H, cap, value_states.shape[-1]))
        k[:, :, needed:].zero_()
        v[:, :, needed:].zero_()
        if self._k is not None and self._v is not None and self._n:
            k[:, :, : self._n] = self._k[:, :, : self._n]
            v[:, :, : self._n] = self._v[:, :, : self._n]
        self._k, self._v = k, v

    def _rebuild(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Hold exactly ``keys`` / ``values`` (a batch edit), keeping room to grow."""
        self._k = self._v = None
        self._n = 0
        self.update(keys, values)

    def _filled(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        if self._k is None or self._v is None or not self._n:
            return None
        return self._k[:, :, : self._n], self._v[:, :, : self._n]

    def batch_repeat_interleave(self, repeats: int) -> None:
        filled = self._filled()
        if filled is not None:
            k, v = filled
            self._rebuild(k.repeat_interleave(repeats, 0), v.repeat_interleave(repeats, 0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        filled = self._filled()
        if filled is not None:
            self._rebuild(filled[0][indices], filled[1][indices])

    def crop(self, tokens_to_remove: int) -> None:
        super().crop(tokens_to_remove)
        if self.is_initialized and self.keys is not None:
            self._n = self.keys.shape[-2]

    def reset(self) -> None:
        super().reset()
        self._k = self._v = None
        self._n = 0


def cache_layers_kv(cache: DynamicCache) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
    """Per layer (keys, values) ``[B, heads, T, head_dim]`` of a plain full-attention
    cache; None when some layer is anything else (sliding window, recurrent state)."""
    layers = getattr(cache, "layers", None)
    if layers is None:  # transformers 4.x: per-layer lists on the cache itself
        legacy: Any = cache
        return list(zip(legacy.key_cache, legacy.value_cache, strict=True))
    if not layers or any(type(layer) not in (DynamicLayer, ReservedLayer) for layer in layers):
        return None
    return [(layer.keys, layer.values) for layer in layers]


class HFGenerator:
    """Samples continuations of token-id prompts with a transformers causal LM.

    Implements the ``Generator`` protocol with its own prefill + KV-cache decode loop (no
    ``model.generate``), so the log-prob of every sampled token is exact and cheap; see
    the module docstring for padding, cache and log-prob semantics.

    Args:
        model: a loaded ``PreTrainedModel`` (any device, any dtype; log-probs are float32).
            It is shared, not copied: a trainer updating its weights updates the sampler.
        tokenizer: anything with ``decode(ids) -> str``; needed only for stop strings.
        batch_size: prompts per forward chunk; ``None`` runs all prompts in one chunk.
        share_prefix: prefill a prefix common to a chunk's prompts once (module docstring).
        keep_cache_bytes: most bytes of KV cache a session keeps between calls (module
            docstring, 4); 0 keeps none.
        compact: drop finished rows from the decode batch once half of it has finished
            (module docstring, 3); the same tokens and log-probs either way.
        fast_decode: run decode steps of a Llama or Qwen2 model as `DecodePass` (its own
            written-out forward, `agentr1.backends.decode`) instead of transformers'
            forward; other models always take transformers'.
        pack_weights_bytes: the decode pass multiplies by packed copies of the weights
            (q|k|v and gate|up fused, in oneDNN's blocked layout; `WeightPacks`), re-made
            whenever a weight changes, when the model is on a CPU that packs its dtype
            and its linear weights fit in this many bytes: faster (1.4x on SmolLM2-135M's
            matmuls at 8 rows in bf16) for the memory of those weights once more; 0 = the
            modules' own weights.
        native_attention: the decode pass runs each layer's rotary, cache write and
            attention as one native kernel (`agentr1.backends.native`, built on first use
            with the machine's C++ compiler; torch ops where it cannot be built or the
            dtype / device is not fp32 / bf16 on a CPU).
        native_linear: a bf16 decode pass on a CPU with AMX or AVX512-BF16 multiplies by
            weights packed for the native product kernel
            (`agentr1.backends.native.DecodeLinear`), each layer's norms, residual adds and
            SiLU gate fused into its four products; needs ``pack_weights_bytes`` room as
            the oneDNN packs do. Off, or without the kernel: oneDNN's packs and torch ops.
        share_twins: rows of a chunk with the same tokens so far (twins: a GRPO group's
            samples of one prompt until their draws differ) are prefilled and decoded as
            one row of the decode batch (module docstring, 5); each row still draws its
            own tokens. Needs a cache whose rows can be selected (`cache_layers_kv`).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: TokenDecoder | None = None,
        batch_size: int | None = None,
        share_prefix: bool = True,
        keep_cache_bytes: int = 2 << 30,
        compact: bool = True,
        fast_decode: bool = True,
        pack_weights_bytes: int = 2 << 30,
        native_attention: bool = True,
        native_linear: bool = True,
        share_twins: bool = True,
    ) -> None:
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be >= 1 or None, got {batch_size}")
        if keep_cache_bytes < 0:
            raise ValueError(f"keep_cache_bytes must be >= 0, got {keep_cache_bytes}")
        if pack_weights_bytes < 0:
            raise ValueError(f"pack_weights_bytes must be >= 0, got {pack_weights_bytes}")
        self.keep_cache_bytes = keep_cache_bytes
        self.kept: KeptCaches | None = None  # set inside ``session()``
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.share_prefix = share_prefix
        self.compact = compact
        self.fast_decode = fast_decode
        self.pack_weights_bytes = pack_weights_bytes
        self.native_attention = native_attention
        self.native_linear = native_linear
        self.share_twins = share_twins
        self._copyable: bool | None = None
        self.packs = WeightPacks()
        """The decode pass's packed weights, kept between calls (`WeightPacks`)."""
        self.last_stats = GenerationStats()
        self.weight_version = 0
        """How many updates behind the weights sampling now (set by whoever syncs them)."""
        # Any valid id works as padding (it is masked out everywhere) and 0 always exists;
        # configs' pad ids are often None or, for some checkpoints, outside the embedding.
        self.pad_id = 0
        # Grouped-query decode without torch's slow ``enable_gqa`` CPU kernel (the module).
        use_decode_sdpa(model)
        forward_args = inspect.signature(model.forward).parameters
        self._cache_kwarg = cache_kwarg(model) or "past_key_values"
        self._keep_kwarg = next(
            (k for k in ("logits_to_keep", "num_logits_to_keep") if k in forward_args), None
        )

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        *,
        dtype: torch.dtype | str = "auto",
        device: str | torch.device | None = None,
        batch_size: int | None = None,
        gguf_file: str | None = None,
        **model_kwargs: Any,
    ) -> HFGenerator:
        """Load model and tokenizer from a local directory or a hub id.

        Args:
            path: directory written by ``save_pretrained``, a hub id, or an alias known
                to `agentr1.models.resolve` (e.g. "smollm2-135m-instruct").
            dtype: model dtype; "auto" keeps the checkpoint's.
            device: "cpu", "cuda", ...; default is CUDA when available, else CPU.
            batch_size: see the class docstring.
            gguf_file: name of a GGUF file inside ``path`` (loads dequantized).
            **model_kwargs: passed to ``AutoModelForCausalLM.from_pretrained``
                (e.g. ``attn_implementation``).
        """
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from agentr1.models import resolve

        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        # Aliases such as "smollm2-135m-instruct" resolve to the prepared copy or the GGUF.
        source, gguf = resolve(path)
        if gguf_file:
            gguf = {"gguf_file": gguf_file}
        tokenizer = AutoTokenizer.from_pretrained(source, **gguf)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **gguf, **model_kwargs)
        # transformers' decorated ``to`` confuses type checkers; it is nn.Module.to.
        model = model.to(device)  # type: ignore[arg-type]
        return cls(model, tokenizer, batch_size=batch_size)

    @contextmanager
    def session(self) -> Iterator[None]:
        """Keep each call's row caches for later calls in the block (module docstring, 4).

        The model's weights must not change inside the block. Nested sessions share the
        outermost one's kept rows; leaving the outermost drops them.
        """
        if self.kept is not None:
            yield
            return
        self.kept = KeptCaches(self.keep_cache_bytes)
        try:
            yield
        finally:
            self.kept = None

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        """Sample one completion per prompt; the i-th completion continues ``prompts[i]``.

        Each ``Completion.metrics`` holds ``prompt_tokens`` and ``new_tokens``; totals,
        wall time and tokens/s for the call are in ``self.last_stats``.
        """
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        params.check_rows(len(prompts))
        if params.stop and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer to decode generated tokens")
        start = time.perf_counter()
        self.last_stats = GenerationStats(
            num_prompts=len(prompts), prompt_tokens=sum(len(p) for p in prompts)
        )
        rng = None
        if params.seed is not None:
            rng = torch.Generator(device=self.model.device).manual_seed(params.seed)
        # Longest first: chunks then hold prompts of similar length (less padding).
        order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
        chunk = self.batch_size or max(len(prompts), 1)
        results: dict[int, Completion] = {}
        # Take every prompt's kept row before any chunk keeps new ones (which may evict).
        kept = [self.kept.take(p) for p in prompts] if self.kept is not None else None
        was_training = self.model.training
        self.model.train(False)  # eval mode (``eval`` is untyped in torch's stubs)
        try:
            with torch.inference_mode():
                for lo in range(0, len(order), chunk):
                    rows = order[lo : lo + chunk]
                    rows_kept = [kept[i] for i in rows] if kept is not None else None
                    caps = [params.cap(i) for i in rows]
                    done = self._generate_chunk(
                        [prompts[i] for i in rows],
                        params,
                        self._rng(params, rows, rng),
                        rows_kept,
                        caps,
                    )
                    results.update(zip(rows, done, strict=True))
        finally:
            self.model.train(was_training)
        stats = self.last_stats
        stats.new_tokens = sum(len(c.token_ids) for c in results.values())
        stats.wall_s = time.perf_counter() - start
        return [results[i] for i in range(len(prompts))]

    def _rng(self, params: SamplingParams, rows: list[int], shared: RowRng) -> RowRng:
        """The generators of a chunk's ``rows``: one per row when the call has row seeds,
        else the call's own."""
        if params.row_seeds is None:
            return shared
        return RowStreams([params.row_seeds[i] for i in rows], self.model.device)

    def _forward(
        self,
        ids_BT: torch.Tensor,
        mask_BT: torch.Tensor,
        position_ids_BT: torch.Tensor,
        cache: DynamicCache,
    ) -> torch.Tensor:
        """One cached forward; return float32 logits of the last column, ``logits_BV``."""
        kwargs: dict[str, Any] = {self._cache_kwarg: cache}
        if self._keep_kwarg is not None:
            kwargs[self._keep_kwarg] = 1
        out = self.model(
            input_ids=ids_BT,
            attention_mask=mask_BT,
            position_ids=position_ids_BT,
            use_cache=True,
            **kwargs,
        )
        self.last_stats.forward_passes += 1
        logits_BV: torch.Tensor = out.logits[:, -1, :].float()
        return logits_BV

    def _rows_copy(self) -> bool:
        """Whether this model's cache rows can be copied and dropped (every layer a plain
        full-attention `ReservedLayer`): what twins need to split and leave."""
        if self._copyable is None:
            layers = getattr(_new_cache(self.model, reserve=1), "layers", None) or []
            self._copyable = bool(layers) and all(type(x) is ReservedLayer for x in layers)
        return self._copyable

    def _start(
        self, prompts: list[list[int]], kept: list[KeptRow | None] | None, longest: int
    ) -> tuple[DynamicCache, DecodePass | None, torch.Tensor, torch.Tensor]:
        """A chunk's cache (room for ``longest`` new tokens a row), decode pass, and
        prefill (after the rows' kept caches, if any): ``(cache, decode, logits_BV,
        mask_BT)``; the prefill's seconds go to the stats."""
        use_kept = kept if kept is not None and any(k is not None for k in kept) else None
        # Columns the prefill lays out (`_prefill` / `_prefill_kept`), then one per token.
        if use_kept is not None:
            lens = [0 if k is None else len(k.tokens) for k in use_kept]
            laid_out = max(lens) + max(len(p) - c for p, c in zip(prompts, lens, strict=True))
        else:
            laid_out = max(len(p) for p in prompts)
        t_prefill = time.perf_counter()
        cache = _new_cache(self.model, reserve=laid_out + longest)
        decode = self._decode_pass(cache)
        prefill = self._prefill_pass(decode)
        if use_kept is not None:
            logits_BV, mask_BT = self._prefill_kept(prompts, use_kept, cache, prefill)
        else:
            logits_BV, mask_BT = self._prefill(prompts, cache, prefill)
        self.last_stats.prefill_s += time.perf_counter() - t_prefill
        return cache, decode, logits_BV, mask_BT

    def _generate_chunk(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        rng: RowRng,
        kept: list[KeptRow | None] | None = None,
        caps: list[int] | None = None,
    ) -> list[Completion]:
        """Prefill (after the rows' kept caches, if any) then decode one left-padded chunk
        until every row has finished; row ``i`` stops with "length" at ``caps[i]`` tokens
        (default ``params.max_new_tokens``).

        The decode batch holds a "line" per distinct history: each row its own, but
        twins (module docstring, 5) share one. Each row samples from its line's logits
        with its own draws; a line whose rows draw different tokens splits (a copy of its
        cache for each other token), and lines no unfinished row needs leave the batch
        once they are half of it (module docstring, 3)."""
        device = self.model.device
        n = len(prompts)
        caps = caps or [params.max_new_tokens] * n
        longest = max(caps)
        twins = _twins(prompts, kept) if self.share_twins and self._rows_copy() else None
        home = twins if twins is not None else list(range(n))  # each row's first twin
        firsts = sorted(set(home))
        line_of = {row: i for i, row in enumerate(firsts)}
        twin_kept = None if kept is None else [kept[r] for r in firsts]
        cache, decode, logits_LV, mask_LT = self._start(
            [prompts[r] for r in firsts], twin_kept, longest
        )
        self.last_stats.shared_prefix_tokens += sum(
            len(prompts[r]) for r in range(n) if home[r] != r
        )
        t_decode = time.perf_counter()
        width = mask_LT.shape[1]
        lines = len(firsts)
        full_mask_LT = torch.ones((lines, width + longest), dtype=mask_LT.dtype, device=device)
        full_mask_LT[:, :width] = mask_LT
        prefill_mask_LT = mask_LT
        next_pos_L1 = mask_LT.sum(dim=-1, keepdim=True)
        stop_ids = set(params.stop_token_ids)
        can_compact = self.compact and cache_layers_kv(cache) is not None
        tokens: list[list[int]] = [[] for _ in range(n)]
        logprobs: list[list[float]] = [[] for _ in range(n)]
        finish: list[Finish] = [None] * n
        live = list(range(n))  # the chunk's row at each position of the draws
        line = [line_of[home[row]] for row in live]  # each live row's line
        rests: list[tuple[int, int]] = []  # (line, row) of rows that left `live`
        for step in range(longest):
            if lines == len(live) and line == list(range(lines)):
                logits_BV = logits_LV
            else:
                logits_BV = logits_LV.index_select(0, torch.tensor(line, device=device))
            tokens_B, logprobs_B = sample_next(logits_BV, params, rng)
            drawn = tokens_B.tolist()
            self._record(
                live, drawn, logprobs_B.tolist(), (tokens, logprobs, finish, caps), params, stop_ids
            )
            if all(f is not None for f in finish) or step == longest - 1:
                break
            # The unfinished rows' next lines: (line, token) pairs, the first token of a
            # line keeping it, every other one a copy of it appended to the batch.
            feed = [self.pad_id] * lines
            claimed = [False] * lines
            copies: list[int] = []
            where: dict[tuple[int, int], int] = {}
            for i, row in enumerate(live):
                if finish[row] is not None:
                    continue
                key = (line[i], drawn[i])
                at = where.get(key)
                if at is None:
                    if not claimed[line[i]]:
                        at, claimed[line[i]] = line[i], True
                        feed[at] = drawn[i]
                    else:
                        at = lines + len(copies)
                        copies.append(line[i])
                        feed.append(drawn[i])
                    where[key] = at
                line[i] = at
            if copies:
                at_L = torch.tensor(list(range(lines)) + copies, device=device)
                cache.batch_select_indices(at_L)
                full_mask_LT, prefill_mask_LT = full_mask_LT[at_L], prefill_mask_LT[at_L]
                next_pos_L1 = next_pos_L1[at_L]
                claimed += [True] * len(copies)
                lines += len(copies)
            idle = claimed.count(False)
            if can_compact and idle >= max(MIN_COMPACT_ROWS, lines / 2):  # lines no row needs
                rests += [(line[i], row) for i, row in enumerate(live) if finish[row] is not None]
                gone = [(at, row) for at, row in rests if not claimed[at]]
                if self.kept is not None:  # the leaving lines' rows, before they go
                    self._keep_rows(gone, prompts, tokens, prefill_mask_LT, cache)
                stay = [at for at in range(lines) if claimed[at]]
                moved = {at: j for j, at in enumerate(stay)}
                at_L = torch.tensor(stay, device=device)
                cache.batch_select_indices(at_L)
                full_mask_LT, prefill_mask_LT = full_mask_LT[at_L], prefill_mask_LT[at_L]
                next_pos_L1, feed = next_pos_L1[at_L], [feed[at] for at in stay]
                rests = [(moved[at], row) for at, row in rests if claimed[at]]
                going = [i for i, row in enumerate(live) if finish[row] is None]
                rng = _select_rows(rng, torch.tensor(going, device=device), n)
                live = [live[i] for i in going]
                line = [moved[line[i]] for i in going]
                lines, idle = len(stay), 0
            self.last_stats.twin_rows += sum(finish[row] is None for row in live) - lines + idle
            feed_L1 = torch.tensor(feed, device=device)[:, None]
            mask_BT = full_mask_LT[:, : width + step + 1]
            logits_LV = self._decode_step(feed_L1, mask_BT, next_pos_L1, cache, decode)
            self.last_stats.decode_passes += 1
            next_pos_L1 = next_pos_L1 + 1
        self.last_stats.decode_s += time.perf_counter() - t_decode
        if self.kept is not None:
            rows = rests + [(line[i], row) for i, row in enumerate(live)]
            self._keep_rows(rows, prompts, tokens, prefill_mask_LT, cache)
        return _completions(prompts, tokens, logprobs, finish)

    def _record(
        self,
        live: list[int],
        drawn: list[int],
        drawn_logprobs: list[float],
        rows: tuple[list[list[int]], list[list[float]], list[Finish], list[int]],
        params: SamplingParams,
        stop_ids: set[int],
    ) -> None:
        """Append each live row's drawn token and log-prob (rows finished already were
        fed padding: theirs are dropped); a row ends with "stop" or at its cap."""
        tokens, logprobs, finish, caps = rows
        for row, tok, lp in zip(live, drawn, drawn_logprobs, strict=True):
            if finish[row] is not None:
                continue
            tokens[row].append(tok)
            logprobs[row].append(lp)
            if self._is_stop(tokens[row], params, stop_ids):
                finish[row] = "stop"
            elif len(tokens[row]) == caps[row]:
                finish[row] = "length"

    def _decode_step(
        self,
        feed_B1: torch.Tensor,
        mask_BT: torch.Tensor,
        position_ids_B1: torch.Tensor,
        cache: DynamicCache,
        decode: DecodePass | None,
    ) -> torch.Tensor:
        """One decode pass (one token a row): ``decode`` when there is one, else
        transformers' forward; float32 logits ``[B, V]``."""
        return self._pass(feed_B1, mask_BT, position_ids_B1, cache, decode)

    def _pass(
        self,
        ids_BS: torch.Tensor,
        mask_BT: torch.Tensor,
        position_ids_BS: torch.Tensor,
        cache: DynamicCache,
        decode: DecodePass | None,
    ) -> torch.Tensor:
        """One pass over S tokens a row (a decode step: one; a prefill: the prompts'
        left-padded rest) through ``decode``, or (None) transformers' forward; float32
        logits of the last column ``[B, V]``."""
        if decode is None:
            return self._forward(ids_BS, mask_BT, position_ids_BS, cache)
        self.last_stats.forward_passes += 1
        return decode(ids_BS, mask_BT, position_ids_BS, cache.layers)

    def _decode_pass(self, cache: DynamicCache) -> DecodePass | None:
        """The written-out pass for this call's decode steps (and its prefill, where the
        pass's products are native: `DecodePass.fused`), when it is on, the model
        qualifies and every cache layer is a `ReservedLayer` (None: transformers'
        forward)."""
        layers = getattr(cache, "layers", None)
        if not self.fast_decode or not layers or any(type(x) is not ReservedLayer for x in layers):
            return None
        decode = DecodePass.of(self.model)
        if decode is None:
            return None
        cpu = self.model.device.type == "cpu"
        if self.native_attention and cpu:
            decode = replace(
                decode, attention=decode_attention(), prefill_attention=prefill_attention()
            )
        if decode.linear_bytes() > self.pack_weights_bytes or not decode.packable():
            self.packs.clear()  # the modules' own weights: no copy
            return decode
        self.packs.native = decode_linear() if self.native_linear and cpu else None
        return replace(decode, packs=self.packs)

    def _prefill_pass(self, decode: DecodePass | None) -> DecodePass | None:
        """The call's decode pass where its products are native (`DecodePass.fused`):
        there the written-out prefill beats transformers' forward; elsewhere (None) the
        prefill keeps that forward."""
        model = self.model
        return decode if decode is not None and decode.fused(model.dtype, model.device) else None

    def _prefill(
        self, prompts: list[list[int]], cache: DynamicCache, decode: DecodePass | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Prefill whole prompts (a shared prefix once) through ``decode`` or (None)
        transformers' forward; return ``(logits_BV, mask_BT)``."""
        device = self.model.device
        P = common_prefix_len(prompts) if self.share_prefix and len(prompts) > 1 else 0
        P = min(P, min(len(p) for p in prompts) - 1)  # every row keeps a token to prefill
        if P < MIN_SHARED_PREFIX:
            ids_BT, mask_BT, position_ids_BT = left_pad(prompts, self.pad_id, device)
            return self._pass(ids_BT, mask_BT, position_ids_BT, cache, decode), mask_BT
        ones_1P = torch.ones((1, P), dtype=torch.long, device=device)
        prefix_1P = torch.tensor([prompts[0][:P]], dtype=torch.long, device=device)
        positions_1P = torch.arange(P, device=device)[None]
        self._pass(prefix_1P, ones_1P, positions_1P, cache, decode)
        cache.batch_repeat_interleave(len(prompts))
        ids_BT, rest_mask_BT, rest_pos_BT = left_pad([p[P:] for p in prompts], self.pad_id, device)
        mask_BT = torch.cat([ones_1P.expand(len(prompts), P), rest_mask_BT], dim=-1)
        self.last_stats.shared_prefix_tokens += P * (len(prompts) - 1)
        return self._pass(ids_BT, mask_BT, rest_pos_BT + P, cache, decode), mask_BT

    def _prefill_kept(
        self,
        prompts: list[list[int]],
        kept: list[KeptRow | None],
        cache: DynamicCache,
        decode: DecodePass | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Prefill only what follows each row's kept cache: the cache holds padding | kept
        (C columns), the forward feeds padding | suffix; rows without one feed it all."""
        device = self.model.device
        lens_B = [0 if k is None else len(k.tokens) for k in kept]
        B, C = len(prompts), max(lens_B)
        first = next(k for k in kept if k is not None)
        for layer, (k0, v0) in enumerate(first.kv):
            keys_BHCD = k0.new_zeros((B, k0.shape[0], C, k0.shape[-1]))
            values_BHCD = v0.new_zeros((B, v0.shape[0], C, v0.shape[-1]))
            for row, k in enumerate(kept):
                if k is not None:
                    keys_BHCD[row, :, C - lens_B[row] :] = k.kv[layer][0]
                    values_BHCD[row, :, C - lens_B[row] :] = k.kv[layer][1]
            cache.update(keys_BHCD, values_BHCD, layer)
        kept_mask_BC = torch.zeros((B, C), dtype=torch.long, device=device)
        for row, n in enumerate(lens_B):
            kept_mask_BC[row, C - n :] = 1
        ids_BT, new_mask_BT, new_pos_BT = left_pad(
            [p[n:] for p, n in zip(prompts, lens_B, strict=True)], self.pad_id, device
        )
        mask_BT = torch.cat([kept_mask_BC, new_mask_BT], dim=-1)
        position_ids_BT = new_pos_BT + torch.tensor(lens_B, device=device)[:, None]
        self.last_stats.kept_tokens += sum(lens_B)
        return self._pass(ids_BT, mask_BT, position_ids_BT, cache, decode), mask_BT

    def _keep_rows(
        self,
        rows: list[tuple[int, int]],
        prompts: list[list[int]],
        tokens: list[list[int]],
        prefill_mask_BT: torch.Tensor,
        cache: DynamicCache,
    ) -> None:
        """Keep rows' caches for the session, ``rows`` as (position in the decode batch,
        row of the chunk): a row's real prefill columns, then the decode columns of its
        generated tokens except the last (sampled, never fed)."""
        assert self.kept is not None
        layers_kv = cache_layers_kv(cache)
        if layers_kv is None or self.keep_cache_bytes == 0:
            return
        width = prefill_mask_BT.shape[1]
        made: dict[tuple[int, int], list[tuple[torch.Tensor, torch.Tensor]]] = {}
        for at, row in rows:
            fed = tokens[row][:-1]
            kv = made.get((at, len(fed)))  # twins of one line share their copy
            if kv is None:
                cols_L = torch.cat(
                    [
                        prefill_mask_BT[at].nonzero().squeeze(-1),
                        torch.arange(width, width + len(fed), device=prefill_mask_BT.device),
                    ]
                )
                kv = [(k[at][:, cols_L], v[at][:, cols_L]) for k, v in layers_kv]
                made[(at, len(fed))] = kv
            self.kept.put(KeptRow(prompts[row] + fed, kv))

    def _is_stop(self, row_tokens: list[int], params: SamplingParams, stop_ids: set[int]) -> bool:
        """Whether the newest token of a row ends it (stop token, or completes a stop string)."""
        if row_tokens[-1] in stop_ids:
            return True
        if not params.stop:
            return False
        if self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer to decode generated tokens")
        return ends_with_stop_string(row_tokens, params.stop, self.tokenizer)


Finish = Literal["stop", "length"] | None
"""How a row of a chunk ended (None: not yet)."""


def _completions(
    prompts: list[list[int]],
    tokens: list[list[int]],
    logprobs: list[list[float]],
    finish: list[Finish],
) -> list[Completion]:
    """A chunk's rows as completions (a row still going at the end reached its cap)."""
    return [
        Completion(
            token_ids=tokens[row],
            logprobs=logprobs[row],
            finish_reason=finish[row] or "length",
            metrics={
                "prompt_tokens": float(len(prompts[row])),
                "new_tokens": float(len(tokens[row])),
            },
        )
        for row in range(len(prompts))
    ]


def _twins(prompts: list[list[int]], kept: list[KeptRow | None] | None) -> list[int] | None:
    """Per row of a chunk, the first row with the same prompt and the same kept cache
    length (itself if none); None when every row is its own.

    >>> _twins([[1, 2], [3], [1, 2]], None)
    [0, 1, 0]
    >>> _twins([[1, 2], [3]], None) is None
    True
    """
    first: dict[tuple[int, tuple[int, ...]], int] = {}
    home = []
    for row, prompt in enumerate(prompts):
        k = kept[row] if kept is not None else None
        key = (0 if k is None else len(k.tokens), tuple(prompt))
        home.append(first.setdefault(key, row))
    return home if len(first) < len(prompts) else None


def _new_cache(model: PreTrainedModel, reserve: int = 0) -> DynamicCache:
    """An empty KV cache laid out for ``model`` (sliding-window layers included); with
    ``reserve`` > 0 its plain full-attention layers are `ReservedLayer`s of that many
    columns (no copy of the cache per decoded token)."""
    try:
        cache = DynamicCache(config=model.config)
    except TypeError:  # transformers 4.x: no config argument, layers created lazily
        return DynamicCache()
    layers = getattr(cache, "layers", None)
    if reserve > 0 and layers:
        for i, layer in enumerate(layers):
            if type(layer) is DynamicLayer:
                layers[i] = ReservedLayer(reserve)
    return cache
