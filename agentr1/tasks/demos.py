"""A `ScriptedPolicy` as a Generator, so demonstrations run through the real rollout.

The generator decodes each context, reads the question (the first user message) and the
tool responses from it, exactly what a model sees (`read_chatml_context`: the ChatML
layout every supported chat template shares), looks the task up by question (as written,
else normalized: lower case, no punctuation, single spaces, which absorbs the spacing a
tokenizer's decode may change) and asks the policy for the next turn. A question it does
not know gets ``<answer>unknown</answer>``. Log-prob 0 for every token (a deterministic
policy). Run it with ``n_samples = 1`` for policies that keep per-episode state by task.
Imports no torch.
"""

from __future__ import annotations

from collections.abc import Sequence

from agentr1.backends.scripted import ScriptedGenerator, read_chatml_context
from agentr1.data.splits import normalize_question
from agentr1.rollout.chat import ChatFormat
from agentr1.tasks.base import ScriptedPolicy
from agentr1.types import Task

UNKNOWN_TURN = "<answer>unknown</answer>"


def policy_generator(
    policy: ScriptedPolicy,
    tasks: Sequence[Task],
    chat: ChatFormat,
    unknown_turn: str = UNKNOWN_TURN,
) -> ScriptedGenerator:
    """``policy`` answering ``tasks`` as a Generator (see the module docstring)."""
    exact: dict[str, Task] = {}
    loose: dict[str, Task] = {}
    for t in tasks:
        exact.setdefault(t.question, t)
        loose.setdefault(normalize_question(t.question), t)

    def respond(context: str) -> str:
        question, responses = read_chatml_context(context)
        if question is None:
            return unknown_turn
        task = exact.get(question) or loose.get(normalize_question(question))
        if task is None:
            return unknown_turn
        return policy.next_turn(task, responses)

    return ScriptedGenerator(respond, chat.encode, chat.decode, chat.end_of_turn_id)
