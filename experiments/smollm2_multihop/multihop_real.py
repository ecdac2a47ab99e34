"""The paper's table on real data, on this CPU: Base Tool Call, Naive RAG, the SFT warm
start, GRPO and PPO, all greedy on the same HotpotQA / 2Wiki / MuSiQue eval questions.

    .venv/bin/python experiments/smollm2_multihop/multihop_real.py all                 # everything
    .venv/bin/python experiments/smollm2_multihop/multihop_real.py all train.steps=10  # overrides, all phases
    .venv/bin/python experiments/smollm2_multihop/multihop_real.py rl --variant ppo    # one phase

Phases (``all`` runs them in this order; each is also a subcommand):

1. ``baselines``: the untrained model; Naive RAG with ``--rag-top-k`` passages, and Base
   Tool Call = the same multi-turn eval the trained models get;
2. ``warm``: the recipe's SFT warm start, then its eval;
3. ``rl --variant grpo`` and ``rl --variant ppo`` from that same warm start (same steps,
   same questions);
4. ``report``: ``ROOT/results.md`` (+ ``results.json``): the table, then each RL run
   paired against the warm start on the same questions (EM / F1 difference, bootstrap
   95% CI, sign test -- `agentr1.eval.compare`); and the curves
   ``experiments/smollm2_multihop/plots/multihop_smollm2_training.png`` (``--docs DIR``).

``reeval --run NAME`` re-evaluates ``ROOT/NAME/final_model`` greedily with per-question
records, for a run made before training runs wrote ``eval_episodes.jsonl``.

A phase whose output exists is skipped, so an interrupted ``all`` continues where it
stopped (an RL phase resumes from its last checkpoint). ``rl`` with more ``train.steps``
than a finished run has extends that run, keeping its results so far as
``ROOT/<variant>_<steps>steps`` (a row and paired lines of their own).
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from agentr1.config import Config, load_config
from agentr1.fileio import write_atomic
from agentr1.tasks import task_config

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "multihop_smollm2.yaml"
VARIANTS = {"grpo": ["algo.estimator=grpo"], "ppo": ["algo.estimator=gae"]}
LABELS = {"hotpotqa": "HotpotQA", "2wiki": "2Wiki", "musique": "MuSiQue (OOD)"}


def config(args: argparse.Namespace, extra: list[str], defaults: tuple[str, ...] = ()) -> Config:
    """The recipe with ``defaults``, then the command line's overrides, then ``extra``."""
    return load_config(args.recipe, [*defaults, *args.overrides, *extra])


def baselines(args: argparse.Namespace) -> None:
    """Naive RAG and Base Tool Call with the untrained model -> ROOT/baselines.json."""
    from agentr1 import build_setup
    from agentr1.eval.evaluate import evaluate
    from agentr1.tasks.multihop_qa.baselines import naive_rag

    out = args.root / "baselines.json"
    if out.exists():
        return
    cfg = config(args, [])
    setup = build_setup(cfg)
    setup.policy.eval()
    res: dict[str, Any] = {"naive_rag": {}, "tool_call": {}, "rag_top_k": args.rag_top_k}
    for split in cfg.eval.splits:
        tasks = setup.tasks[split]
        t0 = time.perf_counter()
        rag = naive_rag(
            tasks,
            setup.task.tools[0].retriever,
            setup.generator,
            setup.chat,
            top_k=args.rag_top_k,
            rollout=cfg.rollout,
            passage_words=task_config(cfg.task).passage_words,
        )
        names = setup.task.metric_names
        tool = evaluate(
            tasks,
            setup.make_env,
            setup.generator,
            setup.chat,
            cfg.rollout,
            0.0,
            1,
            1,
            metrics=names,
        )
        res["naive_rag"][split] = {"by_group": rag.by_group, "stop_reasons": rag.stop_reasons}
        res["tool_call"][split] = {"by_group": tool.by_group, "stop_reasons": tool.stop_reasons}
        print(
            f"{split}: naive RAG EM {rag.score:.3f}, tool call EM {tool.score:.3f} "
            f"({time.perf_counter() - t0:.0f} s)",
            flush=True,
        )
    write_atomic(out, json.dumps(res, indent=1))


def warm(args: argparse.Namespace) -> None:
    """The recipe's SFT warm start and its eval -> ROOT/warm_start/."""
    from agentr1 import train

    run_dir = args.root / "warm_start"
    if (run_dir / "summary.json").exists():
        return
    train(config(args, ["train.steps=0", f"train.run_dir={run_dir}"]))


KEPT = ("summary.json", "eval_episodes.jsonl", "report.md", "metrics.jsonl", "config.yaml")
"""What `keep_finished` copies of a finished run (its results, not its checkpoints)."""


def keep_finished(run_dir: Path) -> Path:
    """Set a finished RL run up to be extended: copy its results (`KEPT`, the
    ``final_model``) to ``<run_dir>_<steps>steps`` -- its own table row and paired lines --
    then remove the finished markers from ``run_dir`` so a resume trains on from its last
    checkpoint. Returns the copy."""
    import shutil

    steps = int(json.loads((run_dir / "summary.json").read_text())["steps"])
    keep = run_dir.with_name(f"{run_dir.name}_{steps}steps")
    if keep.exists():
        raise SystemExit(f"{keep} exists already: move it away to extend {run_dir} again")
    keep.mkdir()
    for name in KEPT:
        if (run_dir / name).exists():
            shutil.copy2(run_dir / name, keep / name)
    if (run_dir / "final_model").is_dir():
        shutil.copytree(run_dir / "final_model", keep / "final_model")
        shutil.rmtree(run_dir / "final_model")
    for name in ("summary.json", "eval_episodes.jsonl", "report.md"):
        (run_dir / name).unlink(missing_ok=True)
    return keep


def rl(args: argparse.Namespace) -> None:
    """RL (``args.variant``) from the shared warm start -> ROOT/<variant>/. A finished run
    with fewer steps than ``train.steps`` is extended from its last checkpoint; its
    results so far are kept as ROOT/<variant>_<steps>steps/ (`keep_finished`)."""
    from agentr1 import train

    run_dir = args.root / args.variant
    summary = run_dir / "summary.json"
    if summary.exists():
        done = int(json.loads(summary.read_text())["steps"])
        if done >= config(args, []).train.steps:
            return
        print(f"extending {run_dir} from step {done}; kept {keep_finished(run_dir)}", flush=True)
    extra = [
        *VARIANTS[args.variant],
        f"model.path={args.root / 'warm_start' / 'final_model'}",
        "sft.enabled=false",
        f"train.run_dir={run_dir}",
    ]
    # The warm start has its own eval; `eval.before=true` on the command line adds it back
    # (`train.keep_best` then counts the warm start as a candidate).
    cfg = config(args, extra, defaults=("eval.before=false",))
    train(cfg, resume=(run_dir / "checkpoints").is_dir())


def reeval(args: argparse.Namespace) -> None:
    """Greedy eval of ``ROOT/<run>/final_model`` with per-question records ->
    ``ROOT/<run>/reeval/`` (for runs made before the loop wrote ``eval_episodes.jsonl``)."""
    from agentr1 import train

    run_dir = args.root / args.run / "reeval"
    if (run_dir / "summary.json").exists():
        return
    extra = [
        f"model.path={args.root / args.run / 'final_model'}",
        "sft.enabled=false",
        "train.steps=0",
        "eval.before=true",
        f"train.run_dir={run_dir}",
    ]
    train(config(args, extra))


def _run_phase(args: argparse.Namespace, phase: list[str]) -> None:
    """This script with ``phase`` in a child process (its own memory, every core); output
    goes to ``ROOT/<phase>.log``. Exits naming the log when the phase fails."""
    cmd = [sys.executable, __file__, *phase, "--root", str(args.root), "--recipe", args.recipe]
    log_path = args.root / f"{phase[0]}{'_' + phase[-1] if len(phase) > 1 else ''}.log"
    print(f"started {' '.join(phase)} (log: {log_path})", flush=True)
    with open(log_path, "a", encoding="utf-8") as log:
        rc = subprocess.call([*cmd, *args.overrides], stdout=log, stderr=subprocess.STDOUT)
    if rc != 0:
        raise SystemExit(f"failed: {' '.join(phase)} (exit {rc}); see {log_path}")


def run_all(args: argparse.Namespace) -> None:
    """Every phase, one after another: two RL runs side by side would need twice the
    memory and share the same cores anyway."""
    t0 = time.perf_counter()
    for phase in (["baselines"], ["warm"], *[["rl", "--variant", v] for v in VARIANTS]):
        _run_phase(args, phase)
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20
        print(
            f"{' '.join(phase)} done at {(time.perf_counter() - t0) / 60:.1f} min "
            f"(largest phase so far: {peak:.1f} GiB RSS)",
            flush=True,
        )
    report(args)


# ---------------------------------------------------------------------------- report
def rl_runs(root: Path) -> list[tuple[str, str]]:
    """(directory name, row label) of every finished RL run under ``root``: ``grpo``,
    ``ppo`` and copies such as ``grpo_20steps`` kept before a run was extended; GRPO
    first, then by steps."""
    runs = []
    for d in root.iterdir() if root.is_dir() else ():
        variant = d.name.split("_", 1)[0]
        summary = d / "summary.json"
        if variant in VARIANTS and summary.exists():
            steps = int(json.loads(summary.read_text())["steps"])
            runs.append((list(VARIANTS).index(variant), steps, d.name, variant))
    return [(name, f"{v.upper()}, {n} steps") for _, n, name, v in sorted(runs)]


def _rows(args: argparse.Namespace) -> list[tuple[str, dict[str, Any]]]:
    """(row label, split -> by_group) in the paper's order; missing phases are left out."""
    rows: list[tuple[str, dict[str, Any]]] = []
    base = args.root / "baselines.json"
    if base.exists():
        b = json.loads(base.read_text())
        rows.append(("Base Tool Call", {s: r["by_group"] for s, r in b["tool_call"].items()}))
        rows.append(
            (
                f"Naive RAG (top-{b['rag_top_k']})",
                {s: r["by_group"] for s, r in b["naive_rag"].items()},
            )
        )
    for name, label in [("warm_start", "SFT warm start"), *rl_runs(args.root)]:
        path = args.root / name / "summary.json"
        if path.exists():
            rows.append((label, json.loads(path.read_text())["eval_after"]["greedy"]))
    return rows


def table(rows: list[tuple[str, dict[str, Any]]]) -> str:
    """Markdown: EM / F1 / cover-EM per dataset, the mean EM, and tool calls per question."""
    splits = [s for s in LABELS if any(s in r for _, r in rows)]
    head = " | ".join(f"{LABELS[s]} EM / F1 / cover" for s in splits)
    lines = [
        f"| method | {head} | mean EM | tool calls / question |",
        "|---|" + "---|" * (len(splits) + 2),
    ]
    for label, res in rows:
        cells, ems, calls = [], [], []
        for s in splits:
            g = res.get(s, {}).get("all")
            if g is None:
                cells.append("")
                continue
            cells.append(f"{g['em']:.3f} / {g['f1']:.3f} / {g['cover_em']:.3f}")
            ems.append(g["em"])
            calls.append(g["tool_calls"])
        mean = sum(ems) / len(ems) if ems else float("nan")
        tc = sum(calls) / len(calls) if calls else float("nan")
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {mean:.3f} | {tc:.2f} |")
    return "\n".join(lines)


def moving_average(ys: list[float], width: int = 5) -> list[float]:
    """Mean of each value and the ``width - 1`` before it, over the ones that exist: a
    step that did not log the metric (NaN: PPO's explained variance when the returns do not
    vary) leaves a gap at its own point, not in its neighbours'."""
    out = []
    for i, y in enumerate(ys):
        have = [v for v in ys[max(0, i - width + 1) : i + 1] if not math.isnan(v)]
        out.append(sum(have) / len(have) if have and not math.isnan(y) else float("nan"))
    return out


def plot(args: argparse.Namespace, out: Path) -> Path | None:
    """GRPO and PPO training curves (5-step moving averages) as one PNG."""
    from agentr1 import metric_records

    series = {}
    for name in VARIANTS:
        series[name] = metric_records(args.root / name, "rl")
    if not any(series.values()):
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        ("f1", "F1 of training answers"),
        ("em", "EM of training answers"),
        ("process_reward", "process reward / episode"),
        ("tool_calls", "tool calls / episode"),
        ("response_len", "sampled tokens / episode"),
        ("kl", "KL to the warm start"),
        ("time/step", "seconds / step (2 cores)"),
        ("value_explained_var", "critic's explained variance (PPO)"),
    ]
    cols = (len(panels) + 1) // 2
    fig, grid = plt.subplots(2, cols, figsize=(4 * cols, 6.4))
    axes = list(grid.flat)
    for ax in axes[len(panels) :]:
        ax.axis("off")
    for ax, (key, title) in zip(axes, panels, strict=False):
        for color, (name, rows) in enumerate(series.items()):
            if not any(key in r for r in rows):
                continue  # e.g. GRPO has no critic
            smooth = moving_average([float(r.get(key, float("nan"))) for r in rows])
            ax.plot([r["step"] + 1 for r in rows], smooth, label=name.upper(), color=f"C{color}")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("RL step")
    axes[0].legend()
    fig.suptitle("SmolLM2-135M-Instruct on HotpotQA + 2Wiki (BM25 search), 5-step moving average")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return out


def episode_scores(args: argparse.Namespace, name: str, metric: str) -> dict[str, float] | None:
    """``split/task_id -> metric`` of a run's greedy eval (the warm start's is its "before"
    eval: it ran 0 RL steps), from its own records or its ``reeval``; None without any."""
    from agentr1.eval.compare import load_scores

    label = "before" if name == "warm_start" else "after"
    for path, lab in (
        (args.root / name / "eval_episodes.jsonl", label),
        (args.root / name / "reeval" / "eval_episodes.jsonl", "before"),
    ):
        if path.exists():
            return load_scores(path, metric, {"label": lab, "mode": "greedy"})
    return None


def paired_section(args: argparse.Namespace) -> str:
    """Each RL run against the warm start on the same questions: per dataset, in domain
    (HotpotQA + 2Wiki) and overall -- EM and F1 differences with bootstrap 95% CIs,
    questions better / worse, exact sign test (`agentr1.eval.compare`)."""
    from agentr1.eval.compare import paired

    subsets = {LABELS[s]: (s,) for s in LABELS}
    subsets["in domain (HotpotQA + 2Wiki)"] = ("hotpotqa", "2wiki")
    subsets["all three"] = tuple(LABELS)
    lines = []
    for name, label in rl_runs(args.root):
        scores = {
            (who, m): episode_scores(args, who, m)
            for who in ("warm_start", name)
            for m in ("em", "f1")
        }
        if any(v is None for v in scores.values()):
            continue
        for title, splits in subsets.items():
            cells = []
            for m in ("em", "f1"):
                a, b = scores[("warm_start", m)], scores[(name, m)]
                assert a is not None and b is not None
                keys = [k for k in a if k.split("/", 1)[0] in splits]
                if not keys:
                    break
                r = paired({k: a[k] for k in keys}, {k: b[k] for k in keys}, m)
                cells.append(
                    f"{r.mean_a:.3f} → {r.mean_b:.3f} ({r.diff:+.3f} [{r.ci_low:+.3f}, "
                    f"{r.ci_high:+.3f}]) | {r.wins} / {r.losses} | {r.p_sign:.2g}"
                )
            if len(cells) == 2:
                lines.append(f"| {label} | {title} | {r.n} | " + " | ".join(cells) + " |")
    if not lines:
        return ""
    head = (
        "Paired against the warm start, on the same questions (difference with its "
        "bootstrap 95% CI; questions better / worse; exact sign-test p):\n\n"
        "| RL run | questions | n | EM: warm → RL (Δ [CI]) | better / worse | p "
        "| F1: warm → RL (Δ [CI]) | better / worse | p |\n|---|---|---|---|---|---|---|---|---|"
    )
    return head + "\n" + "\n".join(lines)


def report(args: argparse.Namespace) -> None:
    rows = _rows(args)
    md = table(rows)
    pairs = paired_section(args)
    if pairs:
        md += "\n\n" + pairs
    (args.root / "results.md").write_text(md + "\n")
    (args.root / "results.json").write_text(json.dumps(dict(rows), indent=1))
    png = plot(args, Path(args.docs) / "multihop_smollm2_training.png")
    print(md)
    if png:
        print(f"curves: {png}")


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("phase", choices=["all", "baselines", "warm", "rl", "reeval", "report"])
    ap.add_argument("--variant", choices=list(VARIANTS), help="which RL run (phase rl)")
    ap.add_argument("--run", help="phase reeval: the run directory under ROOT (warm_start, ...)")
    ap.add_argument("--recipe", default=str(RECIPE))
    ap.add_argument("--root", type=Path, default=Path("runs/multihop_real"))
    ap.add_argument("--rag-top-k", type=int, default=5, help="passages in the Naive RAG prompt")
    ap.add_argument("--docs", default=str(Path(__file__).resolve().parent / "plots"))
    ap.add_argument("overrides", nargs="*", help="section.field=value for every phase")
    args = ap.parse_intermixed_args()
    if args.phase == "rl" and args.variant is None:
        ap.error("rl needs a variant: " + " | ".join(VARIANTS))
    if args.phase == "reeval" and not (args.root / str(args.run) / "final_model").is_dir():
        ap.error(f"reeval needs --run NAME with a final_model under {args.root}")
    args.root.mkdir(parents=True, exist_ok=True)
    phases = {"all": run_all, "baselines": baselines, "warm": warm, "rl": rl, "report": report}
    phases["reeval"] = reeval
    phases[args.phase](args)


if __name__ == "__main__":
    main()
