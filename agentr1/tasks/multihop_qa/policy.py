"""The multi-hop QA agent's prompt and its scripted demonstrator (supporting facts).

    policy = SupportingFactsPolicy(max_searches=4)
    Demonstrations(train_tasks, policy)          # warm-start episodes through the real rollout

Imports no torch.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from agentr1.backends.scripted import ScriptedGenerator
from agentr1.data.splits import normalize_question
from agentr1.envs.parsers import search_call
from agentr1.rewards.qa import cover_exact_match
from agentr1.rollout.chat import ChatFormat
from agentr1.tasks.demos import policy_generator
from agentr1.types import Task

QA_SYSTEM_PROMPT = (
    "Answer the question using a search engine over Wikipedia. To search, write "
    '<tool_call>{"name": "search", "arguments": {"query": "..."}}</tool_call> and read the '
    "results that come back. Search one fact at a time, as often as you need. Then give the "
    "final answer, a short phrase (a name, a date, a number, yes or no), as "
    "<answer>...</answer>."
)
"""The multi-hop QA task's system prompt: the tool and the answer format."""

UNKNOWN = "unknown"
"""What `SupportingFactsPolicy` answers when it has not read the evidence."""

_TITLE_LINE = re.compile(r"^\[\d+\] (.+)$", re.MULTILINE)


def answer_turn(answer: str) -> str:
    """A final answer turn.

    >>> answer_turn("Chief of Protocol")
    '<answer>Chief of Protocol</answer>'
    """
    return f"<answer>{answer}</answer>"


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
    """`SupportingFactsPolicy` on ``tasks`` as a Generator that runs through the real
    rollout (`agentr1.tasks.policy_generator`): deterministic, log-prob 0 for every token;
    an unknown question gets ``<answer>unknown</answer>``."""
    return policy_generator(SupportingFactsPolicy(max_searches), tasks, chat, answer_turn(UNKNOWN))
