"""The rollout engines side by side: the same multi-turn QA rollout with ``hf`` and ``vllm``.

SmolLM2-135M-Instruct in bf16 (both engines), the multi-hop QA task's questions with its
search tool over the real corpus (BM25), the Qwen2.5 tools template, ``--tasks`` questions
x ``--samples`` samples, ``--max-turns`` turns of at most ``--max-tokens`` sampled tokens,
temperature 1, seeded. Each backend runs in a process of its own (peak RSS is the
process's), once to warm up (vLLM compiles on its first start) and then ``--repeats``
times; the best run is reported. Figures: episodes/s, sampled tokens/s, prompt tokens
submitted and prompt tokens computed (submitted minus those a cache served: the hf
kept caches and shared prefixes, vLLM's prefix cache), peak RSS.

vLLM's CPU build lives in its own virtualenv (``make vllm``); run this there, so both
engines see the same transformers and torch:

    .venv-vllm/bin/python benchmarks/backends.py                    # both, side by side
    .venv-vllm/bin/python benchmarks/backends.py --backend hf --json # one, as JSON
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from typing import Any


def run_one(args: argparse.Namespace) -> dict[str, Any]:
    """One backend in this process: its best run's figures."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import torch

    from agentr1.backends.hf import HFGenerator
    from agentr1.models import load_model, load_tokenizer, prepare_smollm2
    from agentr1.retrieval import retriever_from_spec
    from agentr1.rollout import ChatFormat, RolloutConfig, run_rollout
    from agentr1.tasks.multihop_qa import QATaskConfig, load_qa_data, qa_env
    from agentr1.templates import QWEN25_TOOLS

    torch.set_num_threads(args.threads)
    data = load_qa_data(QATaskConfig(n_eval=args.tasks, eval={"hotpotqa": ["hotpotqa"]}))
    tasks = data.tasks["hotpotqa"][: args.tasks]
    retriever = retriever_from_spec("bm25", data.passages)
    tok = load_tokenizer("smollm2-135m-instruct")
    chat = ChatFormat.from_hf(tok, chat_template=QWEN25_TOOLS)
    max_context = 2048
    if args.backend == "hf":
        model = load_model("smollm2-135m-instruct", dtype=torch.bfloat16)
        gen: Any = HFGenerator(model, tok)
    else:
        from agentr1.backends.vllm import VLLMGenerator

        gen = VLLMGenerator(prepare_smollm2(), max_model_len=max_context, dtype="bfloat16")
    submitted = computed = 0
    real = gen.generate

    def counting(prompts: list[list[int]], params: Any) -> Any:
        nonlocal submitted, computed
        out = real(prompts, params)
        s = gen.last_stats
        submitted += s.prompt_tokens
        computed += s.prompt_tokens - s.kept_tokens - s.shared_prefix_tokens
        return out

    gen.generate = counting
    cfg = RolloutConfig(
        n_samples=args.samples,
        max_turns=args.max_turns,
        max_tokens_per_turn=args.max_tokens,
        max_context=max_context,
        temperature=1.0,
        seed=0,
    )
    make_env = qa_env(retriever, top_k=3, passage_words=80)
    best: dict[str, Any] | None = None
    for i in range(args.repeats + 1):
        submitted = computed = 0
        t0 = time.perf_counter()
        groups = run_rollout(tasks, make_env, gen, chat, cfg)
        wall = time.perf_counter() - t0
        trajs = [t for g in groups for t in g.trajectories]
        sampled = sum(sum(t.loss_mask) for t in trajs)
        row = {
            "backend": args.backend,
            "episodes": len(trajs),
            "wall_s": round(wall, 2),
            "episodes_per_s": round(len(trajs) / wall, 3),
            "sampled_tokens_per_s": round(sampled / wall, 1),
            "sampled_tokens": sampled,
            "turns": sum(t.num_turns for t in trajs),
            "prompt_tokens_submitted": submitted,
            "prompt_tokens_computed": computed,
        }
        if i > 0 and (best is None or wall < best["wall_s"]):
            best = row
    assert best is not None
    best["peak_rss_gib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)
    return best


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--backend", choices=["hf", "vllm", "both"], default="both")
    p.add_argument("--tasks", type=int, default=8)
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--max-turns", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--json", action="store_true", help="print one JSON line (one backend)")
    args = p.parse_args()
    if args.backend != "both":
        row = run_one(args)
        print(json.dumps(row) if args.json else row)
        return
    rows = []
    for backend in ("hf", "vllm"):
        cmd = [sys.executable, __file__, "--backend", backend, "--json"]
        cmd += [
            f"--{k.replace('_', '-')}={v}"
            for k, v in vars(args).items()
            if k not in ("backend", "json")
        ]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for r in rows:
        print("| " + " | ".join(str(r[k]) for k in keys) + " |")
    hf, vl = rows
    print(
        f"\nvllm / hf: {vl['sampled_tokens_per_s'] / hf['sampled_tokens_per_s']:.2f}x sampled tokens/s, "
        f"{vl['episodes_per_s'] / hf['episodes_per_s']:.2f}x episodes/s"
    )


if __name__ == "__main__":
    main()
