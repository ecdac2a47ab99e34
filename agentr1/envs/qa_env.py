"""Real multi-hop QA as an RL environment: a ToolEnv with `search` over a passage corpus,
and a scripted supporting-facts policy that makes format demonstrations for SFT.

    make_env = SearchEnvFactory(retriever_from_spec("bm25", passages), top_k=5)
    demo_gen = supporting_facts_generator(train_tasks, chat, max_searches=4)
    groups = run_rollout(train_tasks, make_env, demo_gen, chat, RolloutConfig(max_turns=5))

Imports no torch.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from agentr1.backends.scripted import ScriptedGenerator, read_chatml_context
from agentr1.data.splits import normalize_question
from agentr1.envs.base import OutcomeReward, ProcessReward, ToolEnv, em_reward
from agentr1.envs.parsers import search_call
from agentr1.retrieval.base import Passage, Retriever
from agentr1.rewards.qa import cover_exact_match
from agentr1.rollout.chat import ChatFormat
from agentr1.tools.search import SearchTool
from agentr1.types import Task

QA_SYSTEM_PROMPT = (
    "Answer the question using a search engine over Wikipedia. To search, write "
    '<tool_call>{"name": "search", "arguments": {"query": "..."}}</tool_call> and read the '
    "results that come back. Search one fact at a time, as often as you need. Then give the "
    "final answer, a short phrase (a name, a date, a number, yes or no), as "
    "<answer>...</answer>."
)
"""The default system prompt of `task.kind: qa`: the tool and the answer format."""

UNKNOWN = "unknown"
"""What `SupportingFactsPolicy` answers when it has not read the evidence."""

_TITLE_LINE = re.compile(r"^\[\d+\] (.+)$", re.MULTILINE)


def answer_turn(answer: str) -> str:
    """A final answer turn.

    >>> answer_turn("Chief of Protocol")
    '<answer>Chief of Protocol</answer>'
    """
    return f"<answer>{answer}</answer>"


def retriever_from_spec(spec: str, passages: Sequence[Passage]) -> Retriever:
    """A retriever from its config string.

    Args:
        spec: "bm25", "dense" (all-MiniLM-L6-v2, embeddings cached on disk), "hybrid"
            (RRF of both), or an ``http(s)://`` URL of ``agentr1 serve retriever`` (then
            ``passages`` is not used: the server holds its own corpus).
        passages: the corpus for the local kinds.

    Raises:
        ValueError: an unknown spec, naming the valid ones.
    """
    if spec.startswith(("http://", "https://")):
        from agentr1.retrieval.client import RemoteRetriever

        return RemoteRetriever(spec)
    from agentr1.retrieval.server import RETRIEVER_KINDS, build_retriever

    if spec not in RETRIEVER_KINDS:
        raise ValueError(
            f"retriever {spec!r} is unknown: use one of {', '.join(RETRIEVER_KINDS)} or an "
            "http:// URL of `agentr1 serve retriever`"
        )
    return build_retriever(spec, list(passages))


@dataclass
class SearchEnvFactory:
    """Makes one ToolEnv with a `search` tool per episode; the retriever is shared.

    Attributes:
        retriever: any `Retriever` (built once, shared by every episode).
        top_k: passages per search.
        system_prompt: first message (None: the question alone).
        outcome_reward: (answer, task) -> reward; EM by default (the eval metric).
        process_reward: per-step reward hook, or None.
        passage_words: words kept of each passage in a search result (0 = all).
    """

    retriever: Retriever
    top_k: int = 5
    system_prompt: str | None = QA_SYSTEM_PROMPT
    outcome_reward: OutcomeReward = em_reward
    process_reward: ProcessReward | None = None
    passage_words: int = 0

    def __call__(self) -> ToolEnv:
        return ToolEnv(
            tools=[SearchTool(self.retriever, top_k=self.top_k, max_words=self.passage_words)],
            system_prompt=self.system_prompt,
            outcome_reward=self.outcome_reward,
            process_reward=self.process_reward,
        )


def _key(text: str) -> str:
    """Matching key of questions and titles: lower case, no punctuation, single spaces.

    It also absorbs the small changes a tokenizer's decode may make (spaces before
    punctuation), since the policy reads text decoded from tokens.
    """
    return normalize_question(text)


def titles_seen(observations: Sequence[str]) -> set[str]:
    """Matching keys of the passage titles in search results (``[i] Title`` lines).

    >>> sorted(titles_seen(["[1] Shirley Temple\\nShirley Temple was ...", "No results found."]))
    ['shirley temple']
    """
    return {_key(t) for obs in observations for t in _TITLE_LINE.findall(obs)}


@dataclass
class SupportingFactsPolicy:
    """A scripted demonstrator for real multi-hop questions (format demonstrations for SFT).

    Rule, at every turn, given the tool responses seen so far in the episode:

    1. Pending titles are the task's supporting titles (``metadata["supporting_titles"]``,
       in the dataset's order) that no search result so far was titled with and that it
       has not searched yet. While some are pending and fewer than ``max_searches``
       searches were made, it searches the first pending title, the query being the title
       itself. (Privileged: the gold title is the query. For a bridge question the second
       title usually appears in the first passage, so the query is one a reader could
       write, but the policy does not derive it from the text.) A title that an earlier
       search already returned is not searched again.
    2. Otherwise it answers. It answers the gold answer (``answers[0]``) only if it has
       *seen* the evidence: a result titled with every supporting title, or a result
       whose text contains a gold answer (whole words, SQuAD normalization). Else it
       answers "unknown": it never states what it did not read.

    A task without supporting titles (question-only data) gets one search with the question
    as the query, then rule 2 with "every supporting title" vacuously false.
    """

    max_searches: int = 4

    def __post_init__(self) -> None:
        if self.max_searches < 1:
            raise ValueError(f"max_searches must be >= 1, got {self.max_searches}")

    def queries(self, task: Task) -> list[str]:
        """The titles to look up (the question itself when there are none)."""
        titles = [str(t) for t in task.metadata.get("supporting_titles", [])]
        return titles or [task.question]

    def next_turn(self, task: Task, observations: Sequence[str]) -> str:
        """The next assistant turn's text given this episode's tool responses, in order."""
        wanted = self.queries(task)
        searched: list[str] = []
        for i in range(len(observations) + 1):
            seen = titles_seen(observations[:i])
            pending = [q for q in wanted if _key(q) not in seen and q not in searched]
            if i == len(observations):
                if pending and len(searched) < self.max_searches:
                    return search_call(pending[0])
                return answer_turn(self.answer(task, observations))
            if not pending or len(searched) >= self.max_searches:
                break  # an answer turn was due here; later responses are not its own
            searched.append(pending[0])
        return answer_turn(self.answer(task, observations))

    def answer(self, task: Task, observations: Sequence[str]) -> str:
        """The gold answer if the evidence was seen (see the class docstring), else UNKNOWN."""
        titles = task.metadata.get("supporting_titles", [])
        seen = titles_seen(observations)
        complete = bool(titles) and all(_key(str(t)) in seen for t in titles)
        read = cover_exact_match(" ".join(observations), task.answers) > 0
        return task.answers[0] if complete or read else UNKNOWN


def supporting_facts_generator(
    tasks: Sequence[Task], chat: ChatFormat, max_searches: int = 4
) -> ScriptedGenerator:
    """`SupportingFactsPolicy` as a Generator that runs through the real rollout.

    It reads the question (the first user message) and the tool responses from the
    decoded context, exactly what a model sees, and looks the task up by normalized
    question. An unknown question gets ``<answer>unknown</answer>``. Deterministic; log-prob
    0 for every token.
    """
    by_question = {_key(t.question): t for t in tasks}
    policy = SupportingFactsPolicy(max_searches)

    def respond(context: str) -> str:
        question, responses = read_chatml_context(context)
        task = by_question.get(_key(question)) if question is not None else None
        if task is None:
            return answer_turn(UNKNOWN)
        return policy.next_turn(task, responses)

    return ScriptedGenerator(respond, chat.encode, chat.decode, chat.end_of_turn_id)
