"""``agentr1 qa-eval``: the paper's table (Naive RAG and Tool Call, per model and dataset),
a command the multi-hop QA plug-in adds to the CLI (`agentr1.tasks.registry.COMMANDS`).

    agentr1 qa-eval --model smollm2-135m-instruct --method both --dataset hotpotqa 2wiki musique
    agentr1 qa-eval --model runs/multihop_smollm2/final_model --data my_questions.jsonl
    agentr1 qa-eval --model M --data my_folder/ --on-error skip      # bad records reported
    agentr1 qa-eval --model M --data q.jsonl --fields question=Question,answers=golden_answers

``agentr1 eval --data ...`` (or ``--dataset``, ``--method``, ...) runs this command.
"""

from __future__ import annotations

import argparse
import sys

from agentr1.tasks.registry import Command


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``qa-eval`` subcommand's arguments (see `paper_eval.EvalJob`)."""
    from agentr1.data import QA_FORMATS

    p.add_argument("--model", nargs="+", required=True, help="model dir, hub id or alias")
    p.add_argument("--method", choices=["naive_rag", "tool_call", "both"], default="both")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--data", nargs="+", metavar="PATH", help="question files, or folders of them")
    src.add_argument("--dataset", nargs="+", choices=["hotpotqa", "2wiki", "musique"])
    p.add_argument("--format", choices=QA_FORMATS, default=None, help="format of --data files")
    p.add_argument(
        "--fields",
        default="",
        metavar="NAME=KEY,...",
        help="read --data files as question-only records with these keys "
        "(names: question, answers, id), e.g. question=Question,answers=golden_answers",
    )
    p.add_argument(
        "--on-error",
        choices=["fail", "skip"],
        default="fail",
        help="skip: leave out bad records and unreadable files, each reported "
        "(log and results.json); fail: stop at the first",
    )
    p.add_argument(
        "--unanswerable",
        choices=["skip", "keep"],
        default="skip",
        help="records marked unanswerable (MuSiQue): leave out and count, or keep",
    )
    p.add_argument("--retriever", default="bm25", help="bm25 | dense | hybrid | http://URL")
    p.add_argument("--corpus", choices=["eval", "contexts", "contexts+wiki"], default="contexts")
    p.add_argument("--top-k", type=int, default=5)
    p.add_argument(
        "--passage-words", type=int, default=0, help="words kept of each passage (0 = all)"
    )
    p.add_argument("--max-tasks", type=int, default=0, help="questions per dataset (0 = all)")
    p.add_argument("--max-turns", type=int, default=5)
    p.add_argument("--max-tokens-per-turn", type=int, default=256)
    p.add_argument("--max-context", type=int, default=4096)
    p.add_argument("--chat-template", choices=["qwen2.5", "model"], default="qwen2.5")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-dir", default=None, help="raw data root (default: shared/data/raw)")
    p.add_argument("--out", default="runs/eval", help="writes results.json and results.md here")


def run(args: argparse.Namespace) -> int:
    """``agentr1 qa-eval``: Naive RAG and / or tool calling on QA files; writes the report."""
    import json
    import shlex

    from agentr1.data import DataFormatError
    from agentr1.tasks.multihop_qa.paper_eval import EvalJob, run_job

    methods = ("naive_rag", "tool_call") if args.method == "both" else (args.method,)
    job = EvalJob(
        models=tuple(args.model),
        methods=methods,
        datasets=tuple(args.dataset or ("hotpotqa", "2wiki", "musique")),
        data=tuple(args.data or ()),
        format=args.format,
        fields=args.fields,
        on_error=args.on_error,
        unanswerable=args.unanswerable,
        retriever=args.retriever,
        corpus=args.corpus,
        top_k=args.top_k,
        passage_words=args.passage_words,
        max_tasks=args.max_tasks,
        max_turns=args.max_turns,
        max_tokens_per_turn=args.max_tokens_per_turn,
        max_context=args.max_context,
        chat_template=args.chat_template,
        dtype=args.dtype,
        seed=args.seed,
        data_dir=args.data_dir or "",
        out=args.out,
    )
    try:
        job.validate()
        _, js, md = run_job(job, "agentr1 " + shlex.join(sys.argv[1:]))
    except DataFormatError as e:
        print(f"agentr1 qa-eval: {e}", file=sys.stderr)
        print("(--on-error skip leaves out bad records and unreadable files)", file=sys.stderr)
        return 2
    except (OSError, ValueError) as e:
        print(f"agentr1 qa-eval: {e}", file=sys.stderr)
        return 2
    print(md.read_text(encoding="utf-8"))
    meta = json.loads(js.read_text(encoding="utf-8"))["meta"]
    for rec in meta.get("skipped", []):
        print(f"skipped: {rec['message']}", file=sys.stderr)
    print(f"wrote {js} and {md}")
    return 0


QA_EVAL = Command(
    help="the paper's multi-hop QA table: Naive RAG and tool calling per model and dataset",
    add_arguments=add_arguments,
    run=run,
)
"""Registered as ``qa-eval`` by the command registry's built-in table."""
