"""Real multi-hop QA (HotpotQA, 2WikiMultihopQA, MuSiQue) as a task plug-in
(``task.name: multihop_qa``): the paper's experiment.

Questions from the raw files under ``data_dir`` (`agentr1.data` reads every format there),
eval splits held out of training by id and normalized question (`data.load_qa_data`), a
`search` tool over the corpus of every loaded file's context paragraphs (BM25, dense,
hybrid, or a retrieval server), EM / F1 / cover-EM per episode, and supporting-facts
demonstrations (`policy.SupportingFactsPolicy`) for the format warm start. The paper's
baselines (Naive RAG, Base Tool Call) and its table are `agentr1 qa-eval`
(`paper_eval`). It uses only the public task API (`agentr1.tasks`).

    task:
      name: multihop_qa
      config:
        train: [hotpotqa/rpt_hotpotqa_devsplit_train_300.jsonl]
        eval: {hotpotqa: [hotpotqa/ircot_hotpotqa_dev_subsampled_500.jsonl]}
        retriever: bm25
        top_k: 2
        passage_words: 80
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from agentr1.envs.base import ToolEnv
from agentr1.retrieval import Retriever, retriever_from_spec
from agentr1.rewards import ANSWER_METRICS, OutcomeReward, ProcessReward, em
from agentr1.tasks.base import Demonstrations, TaskContext, TaskSpec
from agentr1.tasks.multihop_qa.config import QA_EVAL_FILES, QA_TRAIN_FILES, QATaskConfig
from agentr1.tasks.multihop_qa.data import (
    QAData,
    assert_disjoint,
    data_root,
    load_qa_data,
)
from agentr1.tasks.multihop_qa.policy import (
    QA_SYSTEM_PROMPT,
    SupportingFactsPolicy,
    answer_turn,
    supporting_facts_generator,
    titles_seen,
)
from agentr1.tasks.registry import register_task
from agentr1.tools.search import SearchTool

log = logging.getLogger(__name__)

__all__ = [
    "QA_EVAL_FILES",
    "QA_SYSTEM_PROMPT",
    "QA_TRAIN_FILES",
    "QAData",
    "QATaskConfig",
    "SupportingFactsPolicy",
    "answer_turn",
    "assert_disjoint",
    "data_report",
    "data_root",
    "load_qa_data",
    "make_task",
    "qa_env",
    "supporting_facts_generator",
    "titles_seen",
]


def qa_env(
    retriever: Retriever,
    top_k: int = 5,
    system_prompt: str | None = QA_SYSTEM_PROMPT,
    passage_words: int = 0,
    outcome_reward: OutcomeReward = em,
    process_reward: ProcessReward | None = None,
) -> Callable[[], ToolEnv]:
    """One `ToolEnv` per episode with a `search` tool over ``retriever`` (shared), the QA
    prompt and EM / F1 / cover-EM: the task's env without loading its data."""
    search = SearchTool(retriever, top_k=top_k, max_words=passage_words)

    def make() -> ToolEnv:
        return ToolEnv(
            tools=[search],
            system_prompt=system_prompt,
            outcome_reward=outcome_reward,
            process_reward=process_reward,
            metrics=ANSWER_METRICS,
        )

    return make


@register_task("multihop_qa")
def make_task(cfg: QATaskConfig, ctx: TaskContext) -> TaskSpec:
    """The QA task: train and eval splits, the corpus and its search tool, EM / F1 /
    cover-EM broken down by hops and type, and supporting-facts demonstrations on the
    training questions with at most ``max_turns - 1`` searches (so the answer fits in the
    turn budget). ``extras`` holds ``passages`` and ``files`` (the split -> files read)."""
    data = load_qa_data(cfg)
    assert_disjoint(data.tasks)
    log.info(
        "qa: %s; corpus %d passages",
        ", ".join(f"{k}={len(v)}" for k, v in data.tasks.items()),
        len(data.passages),
    )
    search = SearchTool(
        retriever_from_spec(cfg.retriever, data.passages),
        top_k=cfg.top_k,
        max_words=cfg.passage_words,
    )
    train = data.tasks["train"]
    searches = max(1, ctx.max_turns - 1)

    def demonstrations(seed: int) -> list[Demonstrations]:
        return [Demonstrations(train, SupportingFactsPolicy(searches))]

    return TaskSpec(
        name="multihop_qa",
        splits=data.tasks,
        tools=[search],
        outcome_reward=em,
        metrics=ANSWER_METRICS,
        breakdown=("hops", "type"),
        system_prompt=QA_SYSTEM_PROMPT,
        demonstrations=demonstrations,
        extras={"passages": data.passages, "files": data.files},
        data_report=data_report(data),
    )


def data_report(data: QAData) -> dict[str, Any]:
    """The run summary's ``data``: every record or file left out (``on_error: skip``)
    with its file, line or record, and reason, and the unanswerable records left out."""
    report: dict[str, Any] = {}
    if data.skipped:
        report["skipped"] = [str(e) for e in data.skipped]
    if data.unanswerable:
        report["unanswerable"] = {str(p): len(ids) for p, ids in data.unanswerable.items()}
    return report
