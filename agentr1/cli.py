"""Command line: ``agentr1 demo | train | eval | models | serve``.

    agentr1 demo [overrides...]                 the embedded default: world + tiny model
    agentr1 train RECIPE.yaml [overrides...]    e.g. algo.estimator=ppo train.steps=50
    agentr1 train RECIPE.yaml --resume          continue from the newest checkpoint
    agentr1 models prepare smollm2-135m-instruct
    agentr1 serve retriever --corpus passages.jsonl --kind bm25|dense|hybrid [--port 8765]

Overrides are ``section.field=value`` (YAML values); the config is validated before any
work starts, and a bad value stops the run with a message naming the field.
"""

from __future__ import annotations

import argparse
import logging
import sys

from agentr1.configutil import ConfigError


def _train(recipe: str | None, overrides: list[str], resume: bool) -> int:
    from agentr1.config import load_config
    from agentr1.trainer.loop import train

    try:
        cfg = load_config(recipe, overrides)
    except ConfigError as e:
        print(f"agentr1: {e}", file=sys.stderr)
        return 2
    train(cfg, resume=resume)
    return 0


def _serve_retriever(args: argparse.Namespace) -> int:
    """``agentr1 serve retriever``: build the retriever, then serve it until interrupted."""
    from agentr1.retrieval.server import ServerLimits, build_retriever, load_corpus_jsonl, serve

    # Hook: a named default corpus (``--data``, via agentr1.data) plugs in here as a second
    # source of passages; for now the corpus is a JSONL file of {id, title, text}.
    try:
        ServerLimits(args.max_batch, args.max_query_chars, args.max_top_k)
        passages = load_corpus_jsonl(args.corpus)
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
    p_models = sub.add_parser("models", help="prepare offline models")
    p_models.add_argument("action", choices=["prepare"])
    p_models.add_argument("name", choices=["smollm2-135m-instruct"])
    p_models.add_argument("--out", default=None, help="output directory")
    p_serve = sub.add_parser("serve", help="serve a retriever over HTTP (127.0.0.1 by default)")
    p_serve.add_argument("what", choices=["retriever"])
    p_serve.add_argument("--corpus", required=True, help="JSONL, one {id, title, text} a line")
    p_serve.add_argument("--kind", choices=["bm25", "dense", "hybrid"], default="bm25")
    p_serve.add_argument("--model", default=None, help="dense model dir or hub id")
    p_serve.add_argument("--host", default="127.0.0.1", help="interface (no auth: keep loopback)")
    p_serve.add_argument("--port", type=int, default=8765)
    p_serve.add_argument("--max-batch", type=int, default=64, help="queries per request")
    p_serve.add_argument("--max-query-chars", type=int, default=1000)
    p_serve.add_argument("--max-top-k", type=int, default=50)
    args = parser.parse_args(argv)
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
        return _train(args.recipe, args.overrides, args.resume)
    if args.cmd == "models":
        from pathlib import Path

        from agentr1.models import prepare_smollm2

        out = prepare_smollm2(Path(args.out) if args.out else None)
        print(out)
        return 0
    if args.cmd == "serve":
        return _serve_retriever(args)
    return 1


if __name__ == "__main__":
    sys.exit(main())
