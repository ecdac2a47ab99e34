"""The embedded world as an RL environment: a ToolEnv with `search` over its corpus, and
the scripted oracle wrapped as a Generator so it runs through the real rollout."""

from __future__ import annotations

import random
from dataclasses import dataclass

from agentr1.backends.scripted import ScriptedGenerator, read_chatml_context
from agentr1.envs.base import OutcomeReward, ProcessReward, ToolEnv, em_reward
from agentr1.envs.parsers import search_call
from agentr1.envs.qa_env import SearchEnvFactory
from agentr1.envs.world import OraclePolicy, World, answer_turn
from agentr1.retrieval.bm25 import BM25Retriever
from agentr1.rollout.chat import ChatFormat
from agentr1.types import Task


@dataclass
class WorldEnvFactory:
    """Makes one ToolEnv per episode; the BM25 index is built once and shared.

    Attributes:
        world: the world whose corpus is searched.
        top_k: passages per search.
        system_prompt: first message (None: the question alone).
        outcome_reward: (answer, task) -> reward.
        process_reward: per-step reward hook, or None.
    """

    world: World
    top_k: int = 2
    system_prompt: str | None = None
    outcome_reward: OutcomeReward = em_reward
    process_reward: ProcessReward | None = None

    def __post_init__(self) -> None:
        self.retriever = BM25Retriever(self.world.passages, index_text=self.world.index_text)
        self._envs = SearchEnvFactory(
            self.retriever, self.top_k, self.system_prompt, self.outcome_reward, self.process_reward
        )

    def __call__(self) -> ToolEnv:
        return self._envs()


def oracle_generator(
    world: World,
    chat: ChatFormat,
    early_answer_prob: float = 0.0,
    seed: int = 0,
    notes: bool = True,
) -> ScriptedGenerator:
    """The oracle policy as a Generator (log-prob 0, deterministic given ``seed``).

    It reads the question and the tool responses from the decoded context, exactly what a
    model would see. Run it with ``n_samples = 1``: the oracle keeps its per-episode draw
    by task id, so two live episodes of one task would share it.
    """
    tasks: dict[str, Task] = {}
    for split in ("train", "test", "test_ood"):
        for t in world.tasks(split):
            tasks.setdefault(t.question, t)
    oracle = OraclePolicy(world, early_answer_prob, random.Random(seed), notes)

    def respond(context: str) -> str:
        question, responses = read_chatml_context(context)
        if question is None or question not in tasks:
            return answer_turn("unknown")
        return oracle.next_turn(tasks[question], responses)

    return ScriptedGenerator(respond, chat.encode, chat.decode, chat.end_of_turn_id)


def tokenizer_corpus(world: World) -> list[str]:
    """Text the demo tokenizer is trained on: passages, questions, calls, answers, glue."""
    out = [f"{p.title}\n{p.text}" for p in world.passages]
    for t in world.tasks("train"):
        out.append(t.question)
        out.extend(answer_turn(a) for a in t.answers)
        out.extend(search_call(s) for s in world.gold_searches[t.id])
    out.append("\n<tool_response>\n[1] x\n</tool_response>\nNo results found.")
    return out
