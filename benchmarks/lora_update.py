"""Full fine-tuning vs LoRA on the same GRPO batch: the update, side by side.

One rollout of ``recipes/multihop_smollm2.yaml`` (one question x ``--samples`` from the SFT
warm start) makes one batch; then full-weight and LoRA updates (`agentr1.trainer.update.
rl_update`, the recipe's optimizer settings, each with its own AdamW) alternate on that
same batch for ``--rounds`` rounds, after one untimed warm-up round each. LoRA runs twice:
as configured (q/k/v and gate/up adapters share one product of their input,
``model.lora.share_input``) and with one product per adapter (``lora_unshared``, the same
adapters). Reports the median update time of each, the ratios, and what each keeps
besides the weights (gradients and AdamW moments, in bytes).

    .venv/bin/python benchmarks/lora_update.py --rounds 3 task.config.data_dir=../shared/data/raw

The whole GRPO step with LoRA: ``benchmarks/grpo_step.py ... model.lora.rank=16``.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from typing import Any

import torch
from grpo_step import RECIPE, WARM_START, check_warm_start

from agentr1 import lora
from agentr1.config import load_config


def state_bytes(model: torch.nn.Module, opt: torch.optim.Optimizer) -> int:
    """Bytes of gradients and optimizer state (what training keeps besides the weights)."""
    grads = sum(
        p.grad.numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None
    )
    moments = sum(
        t.numel() * t.element_size()
        for st in opt.state.values()
        for t in st.values()
        if isinstance(t, torch.Tensor)
    )
    return grads + moments


def one_batch(setup: Any) -> Any:
    """The recipe's rollout of one question -> the `UpdateBatch` a GRPO step would use."""
    from agentr1.rollout.collate import collate_groups
    from agentr1.trainer.loop import sample_rollouts
    from agentr1.trainer.scoring import update_batch
    from agentr1.trainer.state import Timer, make_state

    s = make_state(setup)
    groups, _, _ = sample_rollouts(s, Timer())
    return update_batch(s, collate_groups(groups, setup.pad_id), Timer())[0]


def main(argv: list[str] | None = None) -> dict[str, float]:
    from agentr1.trainer.setup import build_setup, train_autocast
    from agentr1.trainer.update import Learner, rl_update

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default=WARM_START, help="a model that calls the search tool")
    ap.add_argument("--samples", type=int, default=8, help="completions of the question")
    ap.add_argument("--rank", type=int, default=16, help="LoRA rank (alpha = 2 x rank)")
    ap.add_argument("--rounds", type=int, default=3, help="timed updates of each")
    ap.add_argument("--recipe", default=str(RECIPE))
    ap.add_argument("overrides", nargs="*", help="section.field=value")
    args = ap.parse_args(argv)
    check_warm_start(ap, args.model)
    cfg = load_config(
        args.recipe,
        [
            *args.overrides,
            f"model.path={args.model}",
            f"rollout.n_samples={args.samples}",
            "train.tasks_per_step=1",
            "sft.enabled=false",
        ],
    )
    setup = build_setup(cfg)
    ub = one_batch(setup)
    tokens = int(ub.attention_mask_BT.sum())
    agent = int(ub.loss_mask_BT.sum())
    full = setup.policy
    adapted = copy.deepcopy(full)
    lora.apply_lora(adapted, args.rank, 2.0 * args.rank, cfg.model.lora.targets)
    alone = copy.deepcopy(full)
    lora.apply_lora(alone, args.rank, 2.0 * args.rank, cfg.model.lora.targets, False)
    alone.load_state_dict(adapted.state_dict())  # the same adapters, one product each
    contenders = {}
    for name, model in (("full", full), ("lora", adapted), ("lora_unshared", alone)):
        params = lora.trainable_parameters(model)
        opt = torch.optim.AdamW(params, lr=cfg.optim.lr, betas=(0.9, 0.99))
        contenders[name] = (model, opt, sum(p.numel() for p in params))
    times: dict[str, list[float]] = {name: [] for name in contenders}
    gen = torch.Generator().manual_seed(0)
    for r in range(args.rounds + 1):  # round 0: warm-up, untimed
        for name, (model, opt, _) in contenders.items():
            t0 = time.perf_counter()
            rl_update(
                Learner(model, opt),
                ub,
                cfg.algo,
                cfg.optim,
                temperature=cfg.rollout.temperature,
                generator=gen,
                autocast=lambda m=model: train_autocast(cfg, m),
            )
            if r:
                times[name].append(time.perf_counter() - t0)
    out: dict[str, float] = {"tokens": tokens, "agent_tokens": agent}
    print(f"batch: {ub.input_ids_BT.shape[0]} rows, {tokens} tokens, {agent} agent tokens")
    print("| update | trainable parameters | median s | rounds (s) | grads + AdamW state |")
    print("|---|---|---|---|---|")
    for name, (model, opt, n) in contenders.items():
        med = statistics.median(times[name])
        out[name] = med
        gib = state_bytes(model, opt) / 2**30
        out[f"{name}_state_gib"] = gib
        rounds = ", ".join(f"{t:.1f}" for t in times[name])
        print(f"| {name} | {n:,} | {med:.1f} | {rounds} | {gib:.2f} GiB |")
    out["speedup"] = out["full"] / out["lora"]
    out["share_gain"] = out["lora_unshared"] / out["lora"]
    print(
        f"LoRA rank {args.rank}: update {out['speedup']:.2f}x faster on the same batch "
        f"({out['full'] / out['lora_unshared']:.2f}x without shared-input products: "
        f"sharing {out['share_gain']:.2f}x)"
    )
    return out


if __name__ == "__main__":
    main()
