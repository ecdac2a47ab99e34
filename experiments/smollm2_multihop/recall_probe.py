"""Can the demo's tiny Llama learn associative recall with our SFT code? A sanity probe.

Sequences ``k1 v1 k2 v2 ... k8 v8 SEP kq -> vq`` with random keys and values; the loss
is on the last token only, through the trainer's own `token_logprobs`. Lookup of this
kind is what reading a search result needs; this isolates it from the world and the
chat format.

    .venv/bin/python experiments/smollm2_multihop/recall_probe.py --steps 1500
    .venv/bin/python experiments/smollm2_multihop/recall_probe.py --arch gpt2 --loss plain  # controls
"""

from __future__ import annotations

import argparse
import time

import torch

from agentr1 import token_logprobs
from agentr1.algorithms import masked_aggregate
from agentr1.tiny import build_tiny_llama


def batch(
    b: int, pairs: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    keys = torch.stack([torch.randperm(90, generator=gen)[:pairs] + 10 for _ in range(b)])
    vals = torch.randint(100, 200, (b, pairs), generator=gen)
    q = torch.randint(0, pairs, (b,), generator=gen)
    rows = torch.arange(b)
    seq = torch.stack([keys, vals], -1).reshape(b, 2 * pairs)
    ids = torch.cat([seq, torch.full((b, 1), 5), keys[rows, q][:, None], vals[rows, q][:, None]], 1)
    mask = torch.zeros(ids.shape)
    mask[:, -1] = 1
    return ids, torch.ones_like(ids), mask


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument(
        "--arch",
        choices=["llama", "gpt2"],
        default="llama",
        help="gpt2 = learned absolute positions instead of RoPE",
    )
    ap.add_argument(
        "--loss",
        choices=["trainer", "plain"],
        default="trainer",
        help="plain = cross-entropy on full logits, bypassing token_logprobs",
    )
    args = ap.parse_args()
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    if args.arch == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        model = GPT2LMHeadModel(
            GPT2Config(
                vocab_size=200,
                n_embd=args.hidden,
                n_layer=args.layers,
                n_head=4,
                n_positions=64,
                resid_pdrop=0.0,
                embd_pdrop=0.0,
                attn_pdrop=0.0,
                bos_token_id=1,
                eos_token_id=1,
            )
        )
    else:
        model = build_tiny_llama(200, args.hidden, args.layers, 4, 3 * args.hidden, 512, 0, 1, 0)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    t0 = time.perf_counter()
    for step in range(args.steps):
        model.train()
        ids, att, mask = batch(32, args.pairs, gen)
        if args.loss == "plain":
            logits = model(input_ids=ids, attention_mask=att).logits[:, -2]
            loss = torch.nn.functional.cross_entropy(logits, ids[:, -1])
        else:
            lp, _ = token_logprobs(model, ids, att, mask)
            loss = -masked_aggregate(lp, mask)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 250 == 0 or step == args.steps - 1:
            model.eval()
            with torch.no_grad():
                ids, att, _ = batch(256, args.pairs, gen)
                pred = model(input_ids=ids, attention_mask=att).logits[:, -2].argmax(-1)
                acc = (pred == ids[:, -1]).float().mean().item()
            print(
                f"step {step:5d}  loss {loss.item():.3f}  recall accuracy {acc:.3f}  "
                f"({time.perf_counter() - t0:.0f} s)",
                flush=True,
            )


if __name__ == "__main__":
    main()
