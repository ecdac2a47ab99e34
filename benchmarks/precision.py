"""bf16 on this CPU: SmolLM2-135M-Instruct generation from an fp32 policy vs a bf16 copy
(``model.sampler_dtype``), and a training forward + backward / no-grad forward in fp32 vs
under bf16 autocast (``model.compute_dtype``).

    .venv/bin/python benchmarks/precision.py

Shapes follow the multi-hop QA recipe: 16 prompts of 400-900 tokens + 64 new tokens;
4 sequences of 800 tokens with the loss on the last 200 (the agent's tokens).
"""

from __future__ import annotations

import time

import torch

from agentr1.backends.base import SamplingParams
from agentr1.backends.hf import HFGenerator
from agentr1.models import cast_copy, load_model
from agentr1.trainer.logprobs import token_logprobs


def main() -> None:
    torch.manual_seed(0)
    model = load_model("smollm2-135m-instruct", dtype=torch.float32)
    lengths = torch.randint(400, 900, (16,)).tolist()
    prompts = [torch.randint(100, 40000, (n,)).tolist() for n in lengths]
    params = SamplingParams(max_new_tokens=64, temperature=1.0, seed=0)
    for tag, m in (("fp32", model), ("bf16 copy", cast_copy(model, torch.bfloat16))):
        t = time.perf_counter()
        HFGenerator(m, None).generate(prompts, params)
        print(f"generate 16 x ~650 + 64 new, {tag}: {time.perf_counter() - t:.1f} s", flush=True)
    ids = torch.randint(100, 40000, (4, 800))
    mask = torch.ones_like(ids)
    select = torch.zeros_like(ids)
    select[:, 600:] = 1
    for autocast in (False, True):
        tag = "bf16 autocast" if autocast else "fp32"
        t = time.perf_counter()
        for _ in range(2):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                lp, _ = token_logprobs(model, ids, mask, select)
                lp.sum().backward()
        print(f"forward + backward 4 x 800, {tag}: {(time.perf_counter() - t) / 2:.1f} s")
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            t = time.perf_counter()
            token_logprobs(model, ids, mask, select)
            print(f"no-grad forward 4 x 800, {tag}: {time.perf_counter() - t:.1f} s", flush=True)


if __name__ == "__main__":
    main()
