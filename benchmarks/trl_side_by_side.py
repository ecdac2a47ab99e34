"""agentr1 and TRL's GRPOTrainer on the same GRPO steps, side by side (issue 28).

The work, identical on both sides: the multi-hop QA recipe (``recipes/multihop_smollm2.yaml``:
BM25 search over the closed corpus, two passages of 80 words a search, up to 3 turns,
F1 reward) from a SmolLM2-135M that already searches (the recipe's SFT warm start), two
training questions x 4 completions a step, T = 1, no KL (TRL's default ``beta = 0``; no
reference pass on either side), one optimizer step a batch. Both render byte-identical
prompt tokens (checked before TRL trains: the script stops if they differ) and run the same
search tool (`agentr1.tools.SearchTool`, whose text TRL puts in its tool messages).

Six runs, one process each, one after the other (RSS is each process's own peak):

- ``agentr1-fp32``: fp32 weights, compute and sampler, full fine-tuning;
- ``agentr1-fast``: bf16 autocast, a bf16 sampler copy, LoRA r16, and passes of up to
  2560 tokens (``optim.micro_batch_tokens``; the recipe's 1024 bounds the fp32 update,
  whose weights' gradients and AdamW moments take 1.6 GiB this one does not have): a
  group's 4 rows run as one pass and compute their shared prompt once, where at 1024
  each row ran alone and computed it itself (the same gradient either way; 4096 was
  faster still but took the peak RSS past half TRL's: benchmarks/RESULTS.md);
- ``agentr1-lora``: the fast setting on a CPU without bf16 arithmetic (AVX2 only, where
  bf16 products are emulated and ``auto`` picks float32): fp32 compute and sampler, LoRA
  r16 and passes of up to 2560 tokens, as ``agentr1-fast``;
- ``agentr1-fp32-ckpt``, ``agentr1-fast-ckpt``: the same with activation checkpointing
  (``optim.activation_checkpointing``), as TRL runs by default;
- ``trl-fp32``: TRL 1.16's GRPOTrainer with its defaults (gradient checkpointing on, loss
  ``dapo``) except ``bf16=False``, ``use_cpu=True``, its tool loop (``tools=[search]``,
  ``max_tool_calling_iterations=2``: 3 turns) and ``max_completion_length`` = the room
  agentr1's ``max_context`` leaves after the prompt (TRL counts tool results in it).

Per step: rollout (generation + searches), update, the whole step; tokens per step (all
real tokens of the 8 episodes, and the sampled ones); searches per episode. The summary is
the median of the steps after the first, and each agentr1 setting's ratio to TRL.

    make trl                                                  # TRL in .venv-trl (once)
    .venv/bin/python benchmarks/trl_side_by_side.py --trl-python .venv-trl/bin/python \\
        --model runs/multihop_real2/warm_start/final_model task.config.data_dir=../shared/data/raw

The warm start: ``experiments/smollm2_multihop/multihop_real.py warm --root
runs/multihop_real2 task.config.data_dir=../shared/data/raw`` (40 SFT steps, ~8 minutes).
``--only agentr1-fp32,trl-fp32`` runs a subset; ``--json FILE`` writes every row.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "multihop_smollm2.yaml"
WARM_START = "runs/multihop_real2/warm_start/final_model"
QUESTIONS, SAMPLES, TURNS = 2, 4, 3
COMMON = (
    f"task.config.n_train={QUESTIONS}",
    f"rollout.n_samples={SAMPLES}",
    f"rollout.max_turns={TURNS}",
    f"train.tasks_per_step={QUESTIONS}",
    "algo.kl_coef=0",
    "optim.minibatches=1",
    "optim.warmup_steps=0",
    "sft.enabled=false",
    "eval.before=false",
    "train.checkpoint_every=0",
)
"""What both sides share: the steps' questions (a seeded pick of two training questions,
each step takes both), the group, no KL, one optimizer step a batch."""
FP32 = ("model.compute_dtype=float32", "model.sampler_dtype=same")
ADAPTERS = ("model.lora.rank=16", "optim.micro_batch_tokens=2560")
"""LoRA r16 and passes of up to 2560 tokens: what the fast settings add to a dtype."""
FAST = ("model.compute_dtype=bfloat16", "model.sampler_dtype=bfloat16", *ADAPTERS)
LORA = (*FP32, *ADAPTERS)
CKPT = "optim.activation_checkpointing=true"
SETTINGS = {
    "agentr1-fp32": FP32,
    "agentr1-fast": FAST,
    "agentr1-lora": LORA,
    "agentr1-fp32-ckpt": (*FP32, CKPT),
    "agentr1-fast-ckpt": (*FAST, CKPT),
    "trl-fp32": (),
}
KEYS = ("rollout_s", "update_s", "step_s", "tokens", "sampled_tokens", "searches")


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


class PhaseRSS:
    """The process's resident memory sampled every 10 ms by a thread, its maximum per
    phase of the trainer's `Timer` (``rollout``, ``old_logprobs``, ``update``, ...;
    ``other`` outside them) from the second step on: which phase holds the peak. A
    phase's peak starts from what the phases before it left allocated."""

    def __init__(self) -> None:
        import threading

        self.phases: list[str] = ["other"]
        self.peak: dict[str, float] = {}
        self.steps = 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        import os

        page = os.sysconf("SC_PAGE_SIZE") / 2**30
        while not self.done.wait(0.01):
            with open("/proc/self/statm") as f:
                rss = int(f.read().split()[1]) * page
            if self.steps >= 2:  # the first step's one-off costs left out
                phase = self.phases[-1]
                self.peak[phase] = max(self.peak.get(phase, 0.0), rss)

    def __enter__(self) -> PhaseRSS:
        from contextlib import contextmanager

        from agentr1.trainer import loop, state

        real, real_step, outer = state.Timer.__call__, loop.rl_step, self

        @contextmanager
        def call(timer: Any, phase: str) -> Any:
            outer.phases.append(phase)
            try:
                with real(timer, phase):
                    yield
            finally:
                outer.phases.pop()

        def step(*a: Any, **k: Any) -> Any:
            outer.steps += 1
            return real_step(*a, **k)

        self.restore = lambda: (
            setattr(state.Timer, "__call__", real),
            setattr(loop, "rl_step", real_step),
        )
        state.Timer.__call__ = call  # type: ignore[method-assign]
        loop.rl_step = step
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.done.set()
        self.thread.join()
        self.restore()


def median_later(rows: list[dict[str, float]]) -> dict[str, float]:
    """Median of each key over the steps after the first (all of them if only one).

    >>> median_later([{"step_s": 9.0}, {"step_s": 2.0}, {"step_s": 4.0}])
    {'step_s': 3.0}
    """
    later = rows[1:] or rows
    return {k: statistics.median(r[k] for r in later) for k in rows[0]}


# --- agentr1 ---------------------------------------------------------------------------


def setting_config(
    setting: str, model: str, steps: int, run_dir: str, overrides: list[str], recipe: str = ""
) -> Any:
    """The recipe (``recipe``, default `RECIPE`) with ``overrides``, `COMMON` and
    ``setting``'s settings, run in ``run_dir`` for ``steps`` RL steps plus the one the run
    stops before (`train`'s ``stop_after``)."""
    from agentr1.config import load_config

    return load_config(
        recipe or str(RECIPE),
        [
            *overrides,
            *COMMON,
            *SETTINGS[setting],
            f"model.path={model}",
            f"train.steps={steps + 1}",
            f"train.run_dir={run_dir}",
        ],
    )


def run_agentr1(setting: str, model: str, steps: int, overrides: list[str]) -> dict[str, Any]:
    """One agentr1 setting through the real training loop; its per-step rows and RSS."""
    import tempfile

    from agentr1.trainer.loop import train
    from agentr1.trainer.run import metric_records

    with tempfile.TemporaryDirectory(prefix="side_by_side_") as tmp:
        cfg = setting_config(setting, model, steps, tmp, overrides)
        with PhaseRSS() as phases:
            train(cfg, stop_after=steps)  # stops before the final eval
        records = metric_records(Path(tmp), "rl")
    n = QUESTIONS * SAMPLES
    rows = [
        {
            "rollout_s": r["time/rollout"],
            "update_s": r["time/update"] + r.get("time/old_logprobs", 0.0),
            "step_s": r["time/step"],
            "tokens": r["episode_len"] * n,
            "sampled_tokens": r["response_len"] * n,
            "searches": r["tool_calls"],
        }
        for r in records
    ]
    by_phase = {k: round(v, 2) for k, v in sorted(phases.peak.items(), key=lambda kv: -kv[1])}
    return {"rows": rows, "rss_gib": peak_rss_gib(), "rss_by_phase_gib": by_phase}


# --- TRL -------------------------------------------------------------------------------


def trl_inputs(model: str, overrides: list[str]) -> tuple[Any, list[Any], Any, Any, int]:
    """(the agentr1 config, the step's tasks, the env factory, the chat format, the
    context budget) for the TRL run: the same recipe, questions and tool as agentr1's."""
    from agentr1.config import load_config
    from agentr1.models import load_tokenizer
    from agentr1.rollout.chat import ChatFormat
    from agentr1.trainer.setup import TEMPLATES, load_task

    cfg = load_config(str(RECIPE), [*overrides, *COMMON, f"model.path={model}"])
    spec = load_task(cfg)
    chat = ChatFormat.from_hf(load_tokenizer(model), TEMPLATES[cfg.model.chat_template])
    make_env = spec.env_factory(listed=not chat.renders_tools)
    return cfg, list(spec.splits["train"]), make_env, chat, cfg.rollout.max_context


def trl_search(env: Any) -> Any:
    """agentr1's search tool as the plain function TRL's tool loop calls; its signature and
    docstring give the JSON schema agentr1's prompt lists (checked by `check_prompts`)."""
    import asyncio

    tool = next(t for t in env.tools if t.name == "search")

    def search(query: str) -> str:
        """Search the encyclopedia and return the most relevant passages for a query.

        Args:
            query: what to look up, e.g. the name of a person or place
        """
        return asyncio.run(tool(query=query)).content

    del search.__annotations__["return"]  # agentr1's schema states no return type
    search.__doc__ = search.__doc__.replace(  # type: ignore[union-attr]
        "Search the encyclopedia and return the most relevant passages for a query.",
        tool.description,
    )
    return search


def check_prompts(tokenizer: Any, search: Any, tasks: list[Any], make_env: Any, chat: Any) -> int:
    """Stop unless TRL's rendering of each prompt is token-for-token agentr1's; the longest
    prompt's length."""
    longest = 0
    for task in tasks:
        env = make_env()
        msgs = env.reset(task)
        ours = chat.prompt_ids(msgs, env.tool_schemas)
        theirs = tokenizer.apply_chat_template(
            [m.to_dict() for m in msgs], tools=[search], add_generation_prompt=True, tokenize=False
        )
        theirs_ids = tokenizer.encode(theirs, add_special_tokens=False)
        if theirs_ids != ours:
            raise SystemExit(
                f"TRL's prompt for task {task.id} differs from agentr1's:\n--- agentr1\n"
                f"{chat.decode(ours)}\n--- TRL\n{theirs}"
            )
        longest = max(longest, len(ours))
    return longest


def run_trl(model: str, steps: int, overrides: list[str]) -> dict[str, Any]:
    """TRL's GRPOTrainer on the same questions, prompts, tool and reward."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen2_5_chat_template

    cfg, tasks, make_env, chat, max_context = trl_inputs(model, overrides)
    torch.manual_seed(cfg.train.seed)
    tokenizer = AutoTokenizer.from_pretrained(model)
    tokenizer.chat_template = qwen2_5_chat_template  # what TRL's tool parsing recognizes
    env = make_env()
    search = trl_search(env)
    longest = check_prompts(tokenizer, search, tasks, make_env, chat)
    by_id = {t.id: t for t in tasks}
    data = Dataset.from_list(
        [{"prompt": [m.to_dict() for m in make_env().reset(t)], "task_id": t.id} for t in tasks]
    )

    def f1_reward(prompts: list[Any], completions: list[Any], task_id: list[str], **_: Any):
        """The recipe's outcome reward (F1 of the final answer), through agentr1's env."""
        scores = []
        for msgs, tid in zip(completions, task_id, strict=True):
            e = make_env()
            e.reset(by_id[tid])
            final = next((m for m in reversed(msgs) if m["role"] == "assistant"), {})
            answer = e.parser.parse(final.get("content") or "", 0).answer
            scores.append(e.finish(answer)[0])
        return scores

    timing: dict[str, float] = {}
    rows: list[dict[str, float]] = []
    args = GRPOConfig(
        output_dir=str(Path(cfg.train.run_dir) / "trl_side_by_side"),
        use_cpu=True,
        bf16=False,
        learning_rate=cfg.optim.lr,
        per_device_train_batch_size=QUESTIONS * SAMPLES,
        num_generations=SAMPLES,
        max_completion_length=max_context - longest,
        max_tool_calling_iterations=TURNS - 1,
        temperature=cfg.rollout.temperature,
        max_steps=steps,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=cfg.train.seed,
        shuffle_dataset=False,
    )
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32),
        reward_funcs=f1_reward,
        args=args,
        train_dataset=data,
        processing_class=tokenizer,
        tools=[search],
    )
    timed(trainer, "_generate", timing, "rollout_s")
    timed(trainer, "_generate_and_score_completions", timing, "prepare_s", count=True)

    class Steps(TrainerCallback):
        def on_step_begin(self, *a: Any, **k: Any) -> None:
            timing["t0"] = time.perf_counter()

        def on_step_end(self, *a: Any, **k: Any) -> None:
            step = time.perf_counter() - timing["t0"]
            rows.append(
                {
                    "rollout_s": timing["rollout_s"],
                    "update_s": step - timing["prepare_s"],
                    "step_s": step,
                    "tokens": timing["tokens"],
                    "sampled_tokens": timing["sampled_tokens"],
                    "searches": timing["searches"],
                }
            )

    trainer.add_callback(Steps())
    trainer.train()
    return {
        "rows": rows,
        "rss_gib": peak_rss_gib(),
        "config": {
            "max_completion_length": args.max_completion_length,
            "gradient_checkpointing": args.gradient_checkpointing,
            "loss_type": args.loss_type,
        },
    }


def timed(trainer: Any, name: str, into: dict[str, float], key: str, count: bool = False) -> None:
    """Wrap ``trainer.<name>`` so each call's seconds land in ``into[key]``; with ``count``,
    also the batch's real and sampled tokens and searches per episode."""
    inner = getattr(trainer, name)

    def wrapper(*a: Any, **k: Any) -> Any:
        t0 = time.perf_counter()
        out = inner(*a, **k)
        into[key] = time.perf_counter() - t0
        if count:
            mask = out["completion_mask"]
            sampled = mask * out["tool_mask"] if "tool_mask" in out else mask
            into["tokens"] = float(out["prompt_mask"].sum() + mask.sum())
            into["sampled_tokens"] = float(sampled.sum())
            calls = trainer._metrics["train"].get("tools/call_frequency") or [0.0]
            into["searches"] = float(calls[-1])
        return out

    setattr(trainer, name, wrapper)


# --- the driver ------------------------------------------------------------------------


def worker(setting: str, model: str, steps: int, overrides: list[str]) -> None:
    """Run one setting in this process and print its result as the last line (JSON)."""
    if setting.startswith("trl"):
        out = run_trl(model, steps, overrides)
    else:
        out = run_agentr1(setting, model, steps, overrides)
    print("RESULT " + json.dumps({"setting": setting, **out}), flush=True)


def spawn(python: str, setting: str, args: argparse.Namespace) -> dict[str, Any]:
    """Run ``setting`` in a fresh process of ``python``; its result."""
    cmd = [python, __file__, "--worker", setting, "--model", args.model, "--steps", str(args.steps)]
    print(f"== {setting}: {' '.join(cmd)}", flush=True)
    proc = subprocess.run([*cmd, *args.overrides], cwd=ROOT, capture_output=True, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-8000:])
        raise SystemExit(f"{setting} failed (exit {proc.returncode})")
    return json.loads(lines[-1][len("RESULT ") :])


def table(results: list[dict[str, Any]]) -> str:
    """The summary table: each setting's step, its step per 1,000 tokens (the episodes'
    lengths differ from run to run: sampling), and both and its RSS as fractions of TRL's."""
    trl = next((r for r in results if r["setting"].startswith("trl")), None)
    trl_m = median_later(trl["rows"]) if trl else None
    out = [
        "| setting | step s | rollout s | update s | peak RSS GiB | tokens / step "
        "| sampled / step | searches / episode | s / 1k tokens | step vs TRL "
        "| per token vs TRL | RSS vs TRL |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        m = median_later(r["rows"])
        per_k = 1000 * m["step_s"] / m["tokens"]
        vs = "- | - | -"
        if trl and trl_m:
            trl_k = 1000 * trl_m["step_s"] / trl_m["tokens"]
            vs = (
                f"{m['step_s'] / trl_m['step_s']:.2f}x | {per_k / trl_k:.2f}x "
                f"| {r['rss_gib'] / trl['rss_gib']:.2f}x"
            )
        out.append(
            f"| {r['setting']} | {m['step_s']:.1f} | {m['rollout_s']:.1f} | {m['update_s']:.1f} "
            f"| {r['rss_gib']:.1f} | {m['tokens']:.0f} | {m['sampled_tokens']:.0f} "
            f"| {m['searches']:.2f} | {per_k:.1f} | {vs} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default=WARM_START, help="a SmolLM2 that calls the search tool")
    ap.add_argument("--steps", type=int, default=5, help="GRPO steps a run (the first is warm-up)")
    ap.add_argument("--trl-python", default=".venv-trl/bin/python", help="python with TRL 1.16")
    ap.add_argument("--only", default=",".join(SETTINGS), help="comma-separated settings")
    ap.add_argument("--json", help="write every setting's rows here")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("overrides", nargs="*", help="section.field=value, for both sides")
    args = ap.parse_args(argv)
    if args.steps < 2:
        ap.error("--steps must be >= 2 (the first step is warm-up)")
    if args.worker:
        worker(args.worker, args.model, args.steps, args.overrides)
        return []
    unknown = set(args.only.split(",")) - set(SETTINGS)
    if unknown:
        ap.error(f"unknown settings {sorted(unknown)}; choose from {', '.join(SETTINGS)}")
    if not Path(args.model).is_dir():
        ap.error(f"no model directory {args.model}: make the warm start first (see --help)")
    if "trl-fp32" in args.only and not Path(args.trl_python).exists():
        ap.error(f"no {args.trl_python}: `make trl` installs TRL in .venv-trl")
    results = []
    for setting in [s for s in SETTINGS if s in args.only.split(",")]:
        python = args.trl_python if setting.startswith("trl") else sys.executable
        results.append(spawn(python, setting, args))
        print(table(results[-1:]), flush=True)
        if "rss_by_phase_gib" in results[-1]:
            print(f"peak RSS by phase (GiB): {results[-1]['rss_by_phase_gib']}", flush=True)
    print(f"\nmedians of steps 2-{args.steps}, {QUESTIONS} questions x {SAMPLES} a step\n")
    print(table(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
