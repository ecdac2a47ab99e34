"""The paper's two baselines, as evaluations with one signature (`METHODS`):

- `naive_rag`: retrieve the top-k passages for the question once, put them in the prompt,
  generate one turn. The answer is the ``<answer>...</answer>`` span, or, when the model
  wrote none, the first non-empty line of its turn (small instruct models often answer
  in plain text; scoring them 0 would measure the tag, not the reading). Such episodes
  keep the stop reason ``no_tool_call`` ("no answer tag") and count ``untagged_answer``.
- `base_tool_call`: the model with the `search` tool and the tool prompt, through the
  normal multi-turn rollout (`agentr1.eval.evaluate`), i.e. exactly what RL
  trains and evaluates; "base" when the model is untrained.

Both run through `run_rollout` + `summarize`, so both return an `EvalResult` with EM, F1,
cover-EM, mean turns, tool calls and the stop-reason mix, greedy (temperature 0).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from agentr1.backends.base import Generator
from agentr1.envs.base import ToolEnv
from agentr1.eval.evaluate import EvalResult, evaluate
from agentr1.retrieval.base import Passage, Retriever
from agentr1.rewards import ANSWER_METRICS
from agentr1.rollout.chat import ChatFormat
from agentr1.rollout.loop import RolloutConfig
from agentr1.tasks.multihop_qa import qa_env
from agentr1.tasks.multihop_qa.policy import QA_SYSTEM_PROMPT
from agentr1.tools.search import format_passages
from agentr1.types import Message, StepResult, StopReason, Task

BREAKDOWN = ("hops", "type")
"""Task metadata the tables break down by."""

METRIC_NAMES = tuple(ANSWER_METRICS)
"""EM, F1, cover-EM: what the tables report."""

NAIVE_RAG_SYSTEM_PROMPT = (
    "Answer the question using the passages. Give only the final answer, a short phrase "
    "(a name, a date, a number, yes or no), as <answer>...</answer>."
)
"""System prompt of the Naive RAG baseline."""


def rag_prompt(question: str, passages: Sequence[Passage], max_words: int = 0) -> str:
    """The user message of Naive RAG: the passages as the search tool formats them, then
    the question.

    >>> print(rag_prompt("Who?", [Passage("p", "Ann", "Ann wrote it.")]))
    Passages:
    [1] Ann
    Ann wrote it.
    <BLANKLINE>
    Question: Who?
    """
    return f"Passages:\n{format_passages(list(passages), max_words)}\n\nQuestion: {question}"


def first_line(text: str) -> str | None:
    """The first non-empty line, stripped (None if there is none).

    >>> first_line("\\n  Paris.\\nBecause ...")
    'Paris.'
    >>> first_line("  ") is None
    True
    """
    return next((line.strip() for line in text.splitlines() if line.strip()), None)


@dataclass
class NaiveRAGEnv(ToolEnv):
    """One-turn env: the prompt carries the retrieved passages; the first turn is final.

    Attributes:
        passages: task id -> the passages put in its prompt (retrieved beforehand, in a
            batch).
    """

    passages: dict[str, list[Passage]] = field(default_factory=dict)
    passage_words: int = 0

    def reset(self, task: Task) -> list[Message]:
        self.task = task
        self.history = []
        user = Message(
            "user", rag_prompt(task.question, self.passages.get(task.id, []), self.passage_words)
        )
        return [Message("system", self.system_prompt), user] if self.system_prompt else [user]

    async def step(self, text: str) -> StepResult:
        """Parse the answer (tag, else first line); the episode always ends here."""
        parsed = self.parser.parse(text, 0)
        if parsed.answer is not None:
            return StepResult([], 0.0, True, StopReason.ANSWERED, answer=parsed.answer)
        metrics = {"untagged_answer": 1.0}
        return StepResult(
            [], 0.0, True, StopReason.NO_TOOL_CALL, answer=first_line(text), metrics=metrics
        )


Method = Callable[..., EvalResult]
"""(tasks, retriever, generator, chat, *, top_k, rollout, seed, passage_words) -> EvalResult."""


def naive_rag(
    tasks: Sequence[Task],
    retriever: Retriever,
    generator: Generator,
    chat: ChatFormat,
    *,
    top_k: int = 5,
    rollout: RolloutConfig | None = None,
    seed: int = 0,
    system_prompt: str | None = NAIVE_RAG_SYSTEM_PROMPT,
    passage_words: int = 0,
) -> EvalResult:
    """Naive RAG: top-k passages for the question in the prompt, one greedy turn.

    Args:
        tasks: the questions.
        retriever: searched once per question (one batch call), query = the question.
        generator, chat: the model and its chat format.
        top_k: passages in the prompt.
        rollout: budgets (``max_tokens_per_turn``, ``max_context``); ``max_turns`` is
            forced to 1.
        seed: sampling seed (greedy decoding does not use it).
        system_prompt: None for no system message.
        passage_words: words kept of each passage (0 = all), as the search tool clips them.
    """
    hits = retriever.search_batch([t.question for t in tasks], top_k)
    by_id = {t.id: h for t, h in zip(tasks, hits, strict=True)}
    cfg = dataclasses.replace(rollout or RolloutConfig(), max_turns=1)

    def make_env() -> ToolEnv:
        return NaiveRAGEnv(
            tools=[],
            system_prompt=system_prompt,
            metrics=ANSWER_METRICS,
            passages=by_id,
            passage_words=passage_words,
        )

    return evaluate(
        tasks,
        make_env,
        generator,
        chat,
        cfg,
        temperature=0.0,
        seed=seed,
        metrics=METRIC_NAMES,
        breakdown=BREAKDOWN,
    )


def base_tool_call(
    tasks: Sequence[Task],
    retriever: Retriever,
    generator: Generator,
    chat: ChatFormat,
    *,
    top_k: int = 5,
    rollout: RolloutConfig | None = None,
    seed: int = 0,
    system_prompt: str | None = QA_SYSTEM_PROMPT,
    passage_words: int = 0,
) -> EvalResult:
    """Tool calling: the `search` env and tool prompt through the normal rollout, greedy.

    Arguments as `naive_rag`; ``rollout.max_turns`` bounds the turns.
    """
    make_env = qa_env(retriever, top_k, system_prompt, passage_words)
    cfg = rollout or RolloutConfig()
    return evaluate(
        tasks,
        make_env,
        generator,
        chat,
        cfg,
        0.0,
        seed=seed,
        metrics=METRIC_NAMES,
        breakdown=BREAKDOWN,
    )


METHODS: dict[str, Method] = {"naive_rag": naive_rag, "tool_call": base_tool_call}
"""Evaluation methods by the name ``agentr1 eval --method`` takes."""

METHOD_LABELS = {"naive_rag": "Naive RAG", "tool_call": "Tool Call"}
"""Row labels in the report (the paper's "Base Tool Call" is Tool Call on the base model)."""
