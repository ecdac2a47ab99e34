"""Command line: ``agentr1 demo | train | eval | models``.

    agentr1 demo [overrides...]                 the embedded default: world + tiny model
    agentr1 train RECIPE.yaml [overrides...]    e.g. algo.estimator=ppo train.steps=50
    agentr1 train RECIPE.yaml --resume          continue from the newest checkpoint
    agentr1 models prepare smollm2-135m-instruct

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
    return 1


if __name__ == "__main__":
    sys.exit(main())
