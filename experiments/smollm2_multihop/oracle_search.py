"""Is the policy limited by its searching or by its reading? Evaluate a model greedily
twice on the same questions: with the recipe's real search, and with an oracle search
that returns the question's gold supporting passages whatever the query (clipped like
the real ones). Same prompt, tool format and budgets; only what the search returns
differs.

    .venv/bin/python experiments/smollm2_multihop/oracle_search.py \\
        --model runs/multihop_real2/warm_start/final_model \\
        --split hotpotqa task.config.data_dir=../shared/data/raw

Prints EM / F1 / tool calls for both and the paired difference (`agentr1.eval.compare`).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentr1 import Message, Task, ToolEnv
from agentr1.config import load_config
from agentr1.retrieval.base import Passage
from agentr1.tasks import task_config
from agentr1.tools.search import SearchTool

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "multihop_smollm2.yaml"


@dataclass
class GoldPassages:
    """A Retriever that returns the current task's gold passages for any query."""

    passages: list[Passage] = field(default_factory=list)

    def search(self, query: str, k: int) -> list[Passage]:
        return self.passages[:k]

    def search_batch(self, queries: list[str], k: int) -> list[list[Passage]]:
        return [self.search(q, k) for q in queries]


@dataclass
class OracleSearchEnv(ToolEnv):
    """The QA search env whose `search` tool returns the task's gold passages."""

    gold: dict[str, list[Passage]] = field(default_factory=dict)

    def reset(self, task: Task) -> list[Message]:
        tool = self.tools[0]
        assert isinstance(tool, SearchTool) and isinstance(tool.retriever, GoldPassages)
        tool.retriever.passages = self.gold.get(task.id, [])
        return super().reset(task)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", required=True, help="the policy to evaluate (HF directory)")
    ap.add_argument("--split", default="hotpotqa", help="an eval split of the recipe")
    ap.add_argument("--recipe", default=str(RECIPE))
    ap.add_argument("overrides", nargs="*", help="section.field=value")
    args = ap.parse_args()

    from agentr1 import build_setup
    from agentr1.data import normalize_question
    from agentr1.eval.compare import paired
    from agentr1.eval.evaluate import evaluate

    cfg = load_config(args.recipe, [*args.overrides, f"model.path={args.model}"])
    setup = build_setup(cfg)
    setup.policy.eval()
    tasks = setup.tasks[args.split]
    by_title: dict[str, list[Passage]] = {}
    for p in setup.task.extras["passages"]:
        by_title.setdefault(normalize_question(p.title), []).append(p)
    gold = {
        t.id: [
            p
            for s in t.metadata.get("supporting_titles", [])
            for p in by_title.get(normalize_question(s), [])
        ]
        for t in tasks
    }
    factory = setup.make_env
    qa = task_config(cfg.task)

    def oracle_env() -> ToolEnv:
        tool = SearchTool(GoldPassages(), top_k=qa.top_k, max_words=qa.passage_words)
        return OracleSearchEnv(
            tools=[tool],
            system_prompt=setup.task.system_prompt,
            outcome_reward=setup.task.outcome_reward,
            metrics=setup.task.episode_metrics,
            gold=gold,
        )

    scores: dict[str, dict[str, Any]] = {}
    for name, make_env in (("real search", factory), ("oracle search", oracle_env)):
        t0 = time.perf_counter()
        res = evaluate(
            tasks, make_env, setup.generator, setup.chat, cfg.rollout, 0.0, metrics=("em", "f1")
        )
        g = res.by_group["all"]
        scores[name] = {
            m: {t.task_id: t.metrics[m] for t in res.trajectories} for m in ("em", "f1")
        }
        print(
            f"{name}: EM {g['em']:.3f} F1 {g['f1']:.3f} tool calls {g['tool_calls']:.2f} "
            f"({len(tasks)} questions, {time.perf_counter() - t0:.0f} s)",
            flush=True,
        )
    for m in ("em", "f1"):
        print(paired(scores["real search"][m], scores["oracle search"][m], m).line())
    n_gold = sum(bool(v) for v in gold.values())
    print(f"{n_gold} of {len(tasks)} questions have gold passages in the corpus")


if __name__ == "__main__":
    main()
