"""The shared-prefix forward (`agentr1.trainer.logprobs.backbone_hidden`) against the
plain per-row forward, on SmolLM2-135M-Instruct under bf16 autocast (the QA recipe's
compute dtype).

    .venv/bin/python benchmarks/shared_prefix.py

Shapes of a multi-hop QA update: rows of 650-1,024 tokens whose first 289 are the same
system prompt with the tool schema (measured on the recipe's episodes), the loss on 70
agent tokens per row; the update's micro-batches of 4 rows and a reference / old-log-prob
pass over 16.
"""

from __future__ import annotations

import time

import torch

from agentr1.models import load_model
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

    def score(share: bool) -> torch.Tensor:
        with torch.no_grad(), ac():
            return token_logprobs(model, ids16, attn16, sel16, 0.7, share_prefix=share)[0]

    diff = float(((score(True) - score(False)).abs() * sel16).max())
    print(f"max |log-prob difference| over 16 rows, bf16 autocast: {diff:.3g}")
    rows = [
        ("forward + backward, 4 rows (one update micro-batch)", train_step, 3),
        ("no-grad forward, 16 rows (reference / old log-probs)", score, 2),
    ]
    for name, fn, reps in rows:
        plain = timed(lambda fn=fn: fn(False), reps)
        shared = timed(lambda fn=fn: fn(True), reps)
        print(f"{name}: plain {plain:.2f} s, shared prefix {shared:.2f} s, {plain / shared:.2f}x")


if __name__ == "__main__":
    main()
