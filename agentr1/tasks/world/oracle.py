"""The world's scripted agent: searches each entity and relation, reads each fact from
the retrieved passage text with the world's own sentence templates (never from the ground
truth) and answers with what it read. It writes the SFT demonstrations and serves tests.
Imports no torch.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from agentr1.envs.parsers import search_call
from agentr1.tasks.world.questions import Comparison, Plan
from agentr1.tasks.world.schema import fact_pattern, fact_sentence, search_query
from agentr1.types import Task

if TYPE_CHECKING:
    from agentr1.tasks.world.world import World


def answer_turn(answer: str) -> str:
    """The assistant text of a final answer.

    The space after the tag (the parser strips it) keeps every word of the answer the same
    token as in the search result it was read from: with a byte-level BPE, "Velmora" after
    ">" and " Velmora" after a word are different tokens, and a tiny model would have to
    learn that pairing for every name instead of simply copying.

    >>> answer_turn("Velmora")
    '<answer> Velmora</answer>'
    """
    return f"<answer> {answer}</answer>"


_RESULT_HEADER = re.compile(r"^\[(\d+)\] (.*)$", re.MULTILINE)


def parse_search_results(content: str) -> list[tuple[str, str]]:
    """(title, text) of each passage in a search tool response (``[i] Title\\ntext``).

    >>> parse_search_results("[1] A\\none. two.\\n[2] B\\nthree.")
    [('A', 'one. two.'), ('B', 'three.')]
    >>> parse_search_results("No results found.")
    []
    """
    heads = list(_RESULT_HEADER.finditer(content))
    out = []
    for i, m in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(content)
        out.append((m.group(2).strip(), content[m.end() : end].strip()))
    return out


class OraclePolicy:
    """A scripted agent that solves world questions by searching and reading.

    It follows the world's `Plan` for the task (which entity to search first, which fact
    to read at each step, how to compare) but reads every value from the observations:
    it finds the passage titled with the name it searched and applies that fact's
    template regex (`fact_pattern`). If a read fails it answers "unknown".

    Args:
        world: the world whose tasks it answers.
        early_answer_prob: chance, drawn once per episode at its first turn, that on a
            multi-hop question it answers right after the first search with what it just
            read (a plausible, always wrong guess): imperfect demonstrations for SFT.
        rng: source of those draws (default ``random.Random(0)``). Episodes of one task
            must not interleave, since the draw is kept per task id until its next start.
        notes: start each turn after a search with a note restating the fact just read
            (`fact_sentence`, e.g. "X has father Y."), then the call or answer. The note
            is the reasoning a small model can imitate: its words up to the value occur
            verbatim in the passage, so reading becomes copying what follows them.
    """

    def __init__(
        self,
        world: World,
        early_answer_prob: float = 0.0,
        rng: random.Random | None = None,
        notes: bool = True,
    ) -> None:
        if not 0.0 <= early_answer_prob <= 1.0:
            raise ValueError(f"early_answer_prob must be in [0, 1], got {early_answer_prob}")
        self.world = world
        self.early_answer_prob = early_answer_prob
        self.rng = rng or random.Random(0)
        self.notes = notes
        self._early: dict[str, bool] = {}

    def next_turn(self, task: Task, observations: Sequence[str]) -> str:
        """The next assistant turn given the tool responses seen so far this episode."""
        plan = self.world.plans.get(task.id)
        if plan is None:
            raise KeyError(f"task {task.id!r} is not a question of this world")
        n = len(observations)
        if n == 0:
            draw = self.rng.random() if self.early_answer_prob > 0 else 1.0
            self._early[task.id] = draw < self.early_answer_prob
        values: list[str | None] = []
        for step, obs in zip(plan.steps, observations, strict=False):
            name = self._resolve(step.query, values)
            values.append(None if name is None else self._read(name, step.read, obs))
        note = self._note(plan, values, n) if self.notes else ""
        multi_hop = len(plan.steps) > 1
        if n == 1 and multi_hop and self._early.get(task.id, False):
            return note + answer_turn(self._early_guess(plan, values, task.answers[0]))
        if n < len(plan.steps):
            name = self._resolve(plan.steps[n].query, values)
            if not name:
                return note + answer_turn("unknown")
            unit = self.world.config.passage_unit
            return note + search_call(search_query(name, plan.steps[n].read, unit))
        return note + answer_turn(self._final(plan, values) or "unknown")

    def _note(self, plan: Plan, values: list[str | None], n: int) -> str:
        """The fact read from the latest search, restated, plus a newline ("" if none)."""
        if n == 0 or n > len(plan.steps) or values[n - 1] is None:
            return ""
        step = plan.steps[n - 1]
        name = self._resolve(step.query, values)
        value = values[n - 1]
        if name is None or value is None:
            return ""
        return fact_sentence(step.read, name, value) + "\n"

    def _early_guess(self, plan: Plan, values: list[str | None], gold: str) -> str:
        """A plausible, wrong answer after one search: for a chain, the entity just read
        (the bridge, not the end); for a comparison, a side's name that is not the winner
        (never a bare number: the question asks for a name)."""
        if not isinstance(plan.answer, Comparison):
            return values[0] or "unknown"
        sides = (plan.answer.left_answer, plan.answer.right_answer)
        known = [c for c in sides if isinstance(c, str) or c < len(values)]
        named = [n for n in (self._resolve(c, values) for c in known) if n is not None]
        # If only the winner is known yet, a name from the question is the wrong guess.
        named += [s.query for s in plan.steps if isinstance(s.query, str)]
        wrong = [n for n in named if n != gold]
        return wrong[0] if wrong else "unknown"

    @staticmethod
    def _resolve(query: str | int, values: list[str | None]) -> str | None:
        return query if isinstance(query, str) else values[query]

    @staticmethod
    def _read(name: str, key: str, observation: str) -> str | None:
        for title, text in parse_search_results(observation):
            if title == name:
                m = fact_pattern(key, name).search(text)
                if m:
                    return m.group("v")
        return None

    def _final(self, plan: Plan, values: list[str | None]) -> str | None:
        if isinstance(plan.answer, int):
            return values[plan.answer]
        c = plan.answer
        left, right = values[c.left], values[c.right]
        if left is None or right is None:
            return None
        lv, rv = int(left.replace(",", "")), int(right.replace(",", ""))
        left_wins = lv < rv if c.want == "min" else lv > rv
        return self._resolve(c.left_answer if left_wins else c.right_answer, values)
