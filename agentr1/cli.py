"""Command line: ``agentr1 demo | train | eval | compare | report | models | serve`` and the
subcommands plug-ins add (``qa-eval``, `agentr1.tasks.registry.COMMANDS`).

    agentr1 demo [overrides...]                 the embedded default: world + tiny model
    agentr1 train RECIPE.yaml [overrides...]    e.g. algo.estimator=ppo train.steps=50
    agentr1 train RECIPE.yaml --resume          continue from the newest checkpoint
    agentr1 eval RECIPE.yaml --model runs/demo/final_model   any task's eval splits
    agentr1 qa-eval --model smollm2-135m-instruct --dataset hotpotqa --max-tasks 8
    agentr1 eval --model M --data FOLDER --on-error skip   = qa-eval (question files given)
    agentr1 compare A/eval_episodes.jsonl B/eval_episodes.jsonl --where label=after
    agentr1 report runs/demo [runs/other ...] [-o report.html]   curves, evals, token viewer
    agentr1 report --serve runs/demo [--port 8760]   the same, live on 127.0.0.1
    agentr1 models prepare smollm2-135m-instruct
    agentr1 serve retriever --corpus passages.jsonl --kind bm25|dense|hybrid [--port 8765]
    agentr1 serve retriever --data hotpotqa musique --on-error skip

Overrides are ``section.field=value`` (YAML values); the config is validated before any
work starts, and a bad value stops the run with a message naming the field.

``agentr1 eval`` with question files (``--data``, ``--dataset`` or another option of the
QA evaluation: `_QA_EVAL_FLAGS`) and no recipe runs ``agentr1 qa-eval`` with the same
options, saying so on stderr: evaluating a file of questions needs no recipe.

Bad input files: ``--on-error fail|skip`` on ``eval``, ``qa-eval``, ``train`` and ``serve
retriever``. "fail" (the default) stops at the first malformed record or unreadable file,
naming file, line and field; "skip" leaves it out and reports each one with file, line and
reason (log; ``results.json`` of an eval). On ``train`` and a recipe's ``eval`` it is the
override ``task.config.on_error=...`` of a task that reads data files (``multihop_qa``).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from agentr1.configutil import ConfigError


def _train(recipe: str | None, overrides: list[str], resume: bool) -> int:
    """``agentr1 train`` / ``demo``: load the config (overrides applied), then train."""
    from agentr1.config import load_config
    from agentr1.data import DataFormatError
    from agentr1.trainer.loop import train

    try:
        cfg = load_config(recipe, overrides)
        train(cfg, resume=resume)
    except ConfigError as e:
        print(f"agentr1: {e}", file=sys.stderr)
        return 2
    except DataFormatError as e:
        print(f"agentr1: {e}", file=sys.stderr)
        print(_SKIP_HINT, file=sys.stderr)
        return 2
    except (OSError, ValueError) as e:
        # A model, file or server that is not there: one line; the traceback at debug level.
        logging.getLogger("agentr1").debug("train failed", exc_info=True)
        print(f"agentr1: {e}", file=sys.stderr)
        return 2
    return 0


_SKIP_HINT = "(--on-error skip leaves out bad records and unreadable files, reporting each)"


def _eval(args: argparse.Namespace) -> int:
    """``agentr1 eval RECIPE --model M``: any task's evaluation splits, no training."""
    from agentr1.config import load_config
    from agentr1.trainer.evaluation import evaluate

    overrides = [*args.overrides, *_on_error_override(args)]
    if args.model:
        overrides.append(f"model.path={args.model}")
    from agentr1.data import DataFormatError

    try:
        cfg = load_config(args.recipe, overrides)
        evaluate(cfg, splits=args.split or None, out=args.out)
    except (ConfigError, OSError, ValueError) as e:
        print(f"agentr1 eval: {e}", file=sys.stderr)
        if isinstance(e, DataFormatError):
            print(_SKIP_HINT, file=sys.stderr)
        return 2
    md = Path(args.out) / "results.md"
    print(md.read_text(encoding="utf-8"))
    print(f"wrote {md}, results.json and episodes.jsonl in {args.out}")
    return 0


def _compare(args: argparse.Namespace) -> int:
    """``agentr1 compare``: paired EM / F1 differences with a bootstrap CI and sign test."""
    from agentr1.eval.compare import compare_files

    def pairs(items: list[str]) -> dict[str, str]:
        bad = [x for x in items if "=" not in x]
        if bad:
            raise ValueError(f"--where expects KEY=VALUE, got {bad[0]!r}")
        return dict(x.split("=", 1) for x in items)

    try:
        where_a = {**pairs(args.where), **pairs(args.where_a)}
        where_b = {**pairs(args.where), **pairs(args.where_b)}
        for res in compare_files(args.a, args.b, args.metric, where_a, where_b, args.common):
            print(res.line())
    except (OSError, ValueError) as e:
        print(f"agentr1 compare: {e}", file=sys.stderr)
        return 2
    return 0


def _report(args: argparse.Namespace) -> int:
    """``agentr1 report``: the runs' self-contained report.html, or ``--serve`` it."""
    from agentr1.report import ReportError, write_report
    from agentr1.report.data import MAX_STEPS

    steps = MAX_STEPS if args.max_steps is None else args.max_steps
    try:
        if args.serve:
            from agentr1.report.serve import serve

            serve(args.run_dirs, args.host, args.port, steps)
            return 0
        path = write_report(args.run_dirs, args.out, steps)
    except (ReportError, OSError) as e:
        print(f"agentr1 report: {e}", file=sys.stderr)
        return 2
    print(path.resolve())
    return 0


def _add_report_parser(sub: Any) -> None:
    """``agentr1 report RUN_DIR [RUN_DIR ...]``: curves, evaluations, the trajectory viewer."""
    p = sub.add_parser(
        "report",
        help="a run's report.html: curves, evaluation tables, token-level trajectory viewer",
        description="Write one self-contained report.html (no server, no network) for one "
        "or more run directories, their curves overlaid; or serve it (--serve) on "
        "127.0.0.1, refreshed as a run writes. See docs/report.md.",
    )
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories")
    p.add_argument("-o", "--out", default=None, help="default: the first RUN_DIR/report.html")
    p.add_argument(
        "--max-steps",
        type=int,
        default=None,
        help="RL steps (and evaluations) whose logged episodes the page holds, evenly "
        "spread (default 30)",
    )
    p.add_argument("--serve", action="store_true", help="serve the page instead of writing it")
    p.add_argument("--host", default="127.0.0.1", help="with --serve (no auth: keep loopback)")
    p.add_argument("--port", type=int, default=8760, help="with --serve; 0 = any free port")


def _add_eval_parser(sub: Any) -> None:
    """``agentr1 eval``: a recipe's task, a model, its evaluation splits."""
    p = sub.add_parser("eval", help="evaluate a model on a recipe's task (any task), no training")
    p.add_argument("recipe", nargs="?", default=None, help="YAML recipe (default: the demo's)")
    p.add_argument("overrides", nargs="*", help="section.field=value, e.g. task.name=world")
    p.add_argument("--model", default=None, help="model dir, hub id or alias (model.path)")
    p.add_argument("--split", nargs="+", default=None, help="splits (default: the task's)")
    p.add_argument("--out", default="runs/eval", help="writes results.md / .json, episodes.jsonl")
    _add_on_error(p, "task.config.on_error of a task that reads data files (multihop_qa)")


def _add_on_error(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument(
        "--on-error",
        choices=["fail", "skip"],
        default=None,
        help=f"skip: leave out bad records and unreadable files, each logged; fail: stop "
        f"at the first ({what})",
    )


def _on_error_override(args: argparse.Namespace) -> list[str]:
    """``--on-error X`` of ``train`` / ``eval`` as the override it stands for."""
    return [f"task.config.on_error={args.on_error}"] if args.on_error else []


def data_corpus(
    entries: list[str], data_dir: str | None, wiki: bool, on_error: str = "fail"
) -> list[Any]:
    """The corpus a QA run builds from question files: every context paragraph of the
    files (or dataset folders) ``entries`` under ``data_dir`` (default: the raw data
    root), plus the Wikipedia distractors with ``wiki``; ids as in training
    (`agentr1.data.paragraph_id`), so a served corpus matches an in-process one. With
    ``on_error="skip"`` bad records and unreadable files are left out, each logged.

    Raises:
        ValueError: the corpus is empty (naming the files and the options that give one).
    """
    from agentr1.data import Loader, default_data_dir, files_corpus, resolve_entry

    root = Path(data_dir).expanduser() if data_dir else default_data_dir()
    load = Loader(on_error)  # type: ignore[arg-type]  # "fail" | "skip": argparse choices
    files = [p for e in entries for p in resolve_entry(e, root, "--data", load)]
    passages = files_corpus(files, root, wiki, load)
    if load.skipped:
        logging.getLogger(__name__).warning(
            "--data: left out %d malformed record(s) or file(s), each logged above",
            len(load.skipped),
        )
    if not passages:
        raise ValueError(
            f"--data: the corpus is empty: it is the context paragraphs of "
            f"{', '.join(str(p) for p in dict.fromkeys(files))}, and none has any "
            f"(question-only files); name files with context, add --wiki (the Wikipedia "
            f"files under {root / 'wikipedia'}), or give --corpus passages.jsonl"
        )
    return passages


def _serve_retriever(args: argparse.Namespace) -> int:
    """``agentr1 serve retriever``: build the retriever, then serve it until interrupted."""
    from agentr1.retrieval.server import ServerLimits, build_retriever, load_corpus_jsonl, serve

    try:
        ServerLimits(args.max_batch, args.max_query_chars, args.max_top_k)
        if args.corpus:
            passages = load_corpus_jsonl(args.corpus)
        else:
            passages = data_corpus(args.data, args.data_dir, args.wiki, args.on_error)
    except (OSError, ValueError) as e:
        print(f"agentr1: {e}", file=sys.stderr)
        return 2
    retriever = build_retriever(args.kind, passages, model=args.model)
    print(f"serving {args.kind} over {len(passages)} passages on http://{args.host}:{args.port}")
    serve(
        retriever,
        host=args.host,
        port=args.port,
        max_batch=args.max_batch,
        max_query_chars=args.max_query_chars,
        max_top_k=args.max_top_k,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="agentr1", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_demo = sub.add_parser("demo", help="train an agent on the embedded multi-hop world")
    p_demo.add_argument("overrides", nargs="*", help="section.field=value")
    p_demo.add_argument("--resume", action="store_true")
    p_train = sub.add_parser("train", help="train from a YAML recipe")
    p_train.add_argument("recipe")
    p_train.add_argument("overrides", nargs="*", help="section.field=value")
    p_train.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    _add_on_error(p_train, "task.config.on_error of a task that reads data files (multihop_qa)")
    p_models = sub.add_parser("models", help="prepare offline models")
    p_models.add_argument("action", choices=["prepare"])
    p_models.add_argument("name", choices=["smollm2-135m-instruct"])
    p_models.add_argument("--out", default=None, help="output directory")
    _add_eval_parser(sub)
    _add_report_parser(sub)
    p_cmp = sub.add_parser(
        "compare", help="paired test of two evaluations on the same questions (B minus A)"
    )
    p_cmp.add_argument("a", help="episodes JSONL of A (eval_episodes.jsonl or episodes.jsonl)")
    p_cmp.add_argument("b", help="episodes JSONL of B")
    p_cmp.add_argument("--metric", nargs="+", default=["em", "f1"])
    p_cmp.add_argument(
        "--where", nargs="*", default=[], metavar="KEY=VALUE", help="filter lines of both files"
    )
    p_cmp.add_argument("--where-a", nargs="*", default=[], metavar="KEY=VALUE")
    p_cmp.add_argument("--where-b", nargs="*", default=[], metavar="KEY=VALUE")
    p_cmp.add_argument(
        "--common", action="store_true", help="pair only the questions both files have"
    )
    p_serve = sub.add_parser("serve", help="serve a retriever over HTTP (127.0.0.1 by default)")
    p_serve.add_argument("what", choices=["retriever"])
    corpus = p_serve.add_mutually_exclusive_group(required=True)
    corpus.add_argument("--corpus", help="JSONL, one {id, title, text} a line")
    corpus.add_argument(
        "--data",
        nargs="+",
        metavar="ENTRY",
        help="question files or dataset folders (e.g. hotpotqa 2wikimultihopqa musique): "
        "serve their context paragraphs, as a multihop_qa run builds its corpus",
    )
    p_serve.add_argument("--data-dir", default=None, help="raw data root for --data entries")
    p_serve.add_argument(
        "--wiki", action="store_true", help="with --data: add the Wikipedia extras"
    )
    p_serve.add_argument(
        "--on-error",
        choices=["fail", "skip"],
        default="fail",
        help="with --data: skip leaves out bad records and unreadable files, each logged",
    )
    p_serve.add_argument("--kind", choices=["bm25", "dense", "hybrid"], default="bm25")
    p_serve.add_argument("--model", default=None, help="dense model dir or hub id")
    p_serve.add_argument("--host", default="127.0.0.1", help="interface (no auth: keep loopback)")
    p_serve.add_argument("--port", type=int, default=8765)
    p_serve.add_argument("--max-batch", type=int, default=64, help="queries per request")
    p_serve.add_argument("--max-query-chars", type=int, default=1000)
    p_serve.add_argument("--max-top-k", type=int, default=50)
    plugins = _add_plugin_commands(sub)
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["eval"] and any(a.split("=")[0] in _QA_EVAL_FLAGS for a in argv):
        if any(a.endswith((".yaml", ".yml")) for a in argv):
            print(
                "agentr1 eval: a recipe's eval takes its questions from the recipe "
                "(task.config); question files (--data, --dataset) are evaluated without "
                "one: `agentr1 eval --model M --data FILES` (the same as `agentr1 qa-eval`)",
                file=sys.stderr,
            )
            return 2
        if "qa-eval" in plugins:
            print("agentr1 eval: question files given: running `agentr1 qa-eval`", file=sys.stderr)
            argv = ["qa-eval", *argv[1:]]
    # Overrides may follow options too (`eval r.yaml --model m task.config.x=1`).
    args, extra = parser.parse_known_args(argv)
    if extra:
        if not hasattr(args, "overrides") or any("=" not in x or x.startswith("-") for x in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides = [*args.overrides, *extra]
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    for noisy in ("bm25s", "matplotlib", "httpx", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
    except ImportError:
        pass

    if args.cmd == "demo":
        return _train(None, args.overrides, args.resume)
    if args.cmd == "train":
        return _train(args.recipe, [*args.overrides, *_on_error_override(args)], args.resume)
    if args.cmd == "models":
        from pathlib import Path

        from agentr1.models import prepare_smollm2

        out = prepare_smollm2(Path(args.out) if args.out else None)
        print(out)
        return 0
    if args.cmd == "eval":
        return _eval(args)
    if args.cmd == "serve":
        return _serve_retriever(args)
    if args.cmd == "compare":
        return _compare(args)
    if args.cmd == "report":
        return _report(args)
    if args.cmd in plugins:
        return plugins[args.cmd].run(args)
    return 1


_QA_EVAL_FLAGS = (
    "--dataset",
    "--data",
    "--method",
    "--retriever",
    "--corpus",
    "--format",
    "--fields",
    "--unanswerable",
)
"""Options only the QA evaluation has: ``agentr1 eval`` with one runs ``agentr1 qa-eval``."""


def _add_plugin_commands(sub: Any) -> dict[str, Any]:
    """The subcommands plug-ins registered (`agentr1.tasks.registry.COMMANDS`)."""
    from agentr1.tasks.registry import COMMANDS

    out = {}
    for name in COMMANDS.names():
        cmd = COMMANDS.get(name)
        p = sub.add_parser(name, help=cmd.help, description=cmd.description or cmd.help)
        cmd.add_arguments(p)
        out[name] = cmd
    return out


if __name__ == "__main__":
    sys.exit(main())
