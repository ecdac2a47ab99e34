"""Sharing the prompt prefix every row starts with, against the plain per-row passes, on
SmolLM2-135M-Instruct: the training forward (`agentr1.trainer.logprobs.backbone_hidden`)
under bf16 autocast (the QA recipe's compute dtype) and the rollout's prefill
(`agentr1.backends.hf.HFGenerator`, bf16 sampler copy).

    .venv/bin/python benchmarks/shared_prefix.py

Shapes of a multi-hop QA update: rows of 650-1,024 tokens whose first 289 are the same
system prompt with the tool schema (measured on the recipe's episodes), the loss on 70
agent tokens per row; the update's micro-batches of 4 rows and a reference / old-log-prob
pass over 16; generation of 32 tokens after 16 such contexts. Numerics: the shared pass
against the plain one, next to bf16's own error (plain bf16 against plain fp32).
"""

from __future__ import annotations

import time

import torch

from agentr1.backends.base import SamplingParams
from agentr1.backends.hf import HFGenerator
from agentr1.models import cast_copy, load_model
from agentr1.trainer.logprobs import token_logprobs

PREFIX = 289


def episode_batch(B: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(650, 1025, (B,), generator=g).tolist()
    T = max(lengths)
    ids = torch.randint(100, 40000, (B, T), generator=g)
    ids[:, :PREFIX] = ids[0, :PREFIX]
    attn = torch.zeros(B, T, dtype=torch.long)
    select = torch.zeros(B, T)
    for b, n in enumerate(lengths):
        attn[b, :n] = 1
        select[b, n - 70 : n] = 1
    return ids * attn, attn, select


def timed(fn, repeats: int) -> float:
    fn()  # warm-up
    t = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t) / repeats


def main() -> None:
    torch.manual_seed(0)
    model = load_model("smollm2-135m-instruct", dtype=torch.float32)
    ac = lambda: torch.autocast("cpu", dtype=torch.bfloat16)  # noqa: E731
    ids4, attn4, sel4 = episode_batch(4, 0)
    ids16, attn16, sel16 = episode_batch(16, 1)

    def train_step(share: bool) -> None:
        with ac():
            lp, _ = token_logprobs(model, ids4, attn4, sel4, 0.7, share_prefix=share)
            lp.sum().backward()
        model.zero_grad(set_to_none=True)

    def score(share: bool, bf16: bool = True) -> torch.Tensor:
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            return token_logprobs(model, ids16, attn16, sel16, 0.7, share_prefix=share)[0]

    def gap(a: torch.Tensor, b: torch.Tensor) -> str:
        d = (a - b).abs()[sel16.bool()]
        return f"mean {float(d.mean()):.3g}, max {float(d.max()):.3g}"

    fp32 = score(False, bf16=False)
    print(f"|log-prob difference| over {int(sel16.sum())} agent tokens:", flush=True)
    print(f"  shared vs plain, fp32: {gap(score(True, bf16=False), fp32)}")
    print(f"  shared vs plain, bf16 autocast: {gap(score(True), score(False))}")
    print(f"  plain bf16 vs plain fp32 (bf16's own error): {gap(score(False), fp32)}", flush=True)

    sampler = cast_copy(model, torch.bfloat16)
    prompts = [row[m.bool()].tolist()[:-70] for row, m in zip(ids16, attn16, strict=True)]
    params = SamplingParams(max_new_tokens=32, temperature=0.0)

    def generate(share: bool) -> None:
        HFGenerator(sampler, share_prefix=share).generate(prompts, params)

    rows = [
        ("forward + backward, 4 rows (one update micro-batch)", train_step, 3),
        ("no-grad forward, 16 rows (reference / old log-probs)", score, 2),
        ("generate 32 tokens after 16 contexts (bf16 copy)", generate, 2),
    ]
    for name, fn, reps in rows:
        plain = timed(lambda fn=fn: fn(False), reps)
        shared = timed(lambda fn=fn: fn(True), reps)
        print(
            f"{name}: plain {plain:.2f} s, shared prefix {shared:.2f} s, {plain / shared:.2f}x",
            flush=True,
        )


if __name__ == "__main__":
    main()
