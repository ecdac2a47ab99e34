"""The embedded multi-hop world as a task plug-in (``task.name: world``, the demo's task).

A seeded fictional encyclopedia (`world.World`: people, cities, countries, companies,
films, universities, one passage per fact), questions of 1-4 hops in the HotpotQA / 2Wiki
/ MuSiQue styles (`questions`), a `search` tool over its passages (BM25 over subject and
relation), exact-match reward, and an oracle (`oracle.OraclePolicy`) whose imperfect
demonstrations warm-start a tiny model built from scratch. It uses only the public task
API (`agentr1.tasks`), the same a user task has.

    task:
      name: world
      config:
        world: {ood_types: [comparison], n_train: 1800}
        top_k: 1
        early_answer_prob: 0.6
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from agentr1.backends.scripted import ScriptedGenerator
from agentr1.envs.base import ToolEnv
from agentr1.envs.parsers import search_call
from agentr1.retrieval.bm25 import BM25Retriever
from agentr1.rewards import ANSWER_METRICS, em
from agentr1.rollout.chat import ChatFormat
from agentr1.tasks.base import Demonstrations, TaskContext, TaskSpec
from agentr1.tasks.demos import policy_generator
from agentr1.tasks.registry import register_task
from agentr1.tasks.world.oracle import OraclePolicy, answer_turn, parse_search_results
from agentr1.tasks.world.questions import Comparison, Plan, Step, vocabulary_coverage
from agentr1.tasks.world.schema import (
    NO_RESULTS,
    QUESTION_TYPES,
    SPLITS,
    fact_pattern,
    fact_sentence,
    search_query,
)
from agentr1.tasks.world.world import World, WorldConfig
from agentr1.tools.search import SearchTool

__all__ = [
    "NO_RESULTS",
    "QUESTION_TYPES",
    "SPLITS",
    "Comparison",
    "OraclePolicy",
    "Plan",
    "Step",
    "World",
    "WorldConfig",
    "WorldTaskConfig",
    "answer_turn",
    "fact_pattern",
    "fact_sentence",
    "make_task",
    "oracle_generator",
    "parse_search_results",
    "search_query",
    "tokenizer_corpus",
    "vocabulary_coverage",
    "world_env",
    "world_search",
]


@dataclass(frozen=True)
class WorldTaskConfig:
    """``task.config`` of the world task."""

    world: WorldConfig = field(default_factory=lambda: WorldConfig(ood_types=("comparison",)))
    """World generator settings. The demo holds comparison questions out of training ("Who
    was born first, A or B?" needs comparing numbers, a skill the other types never use)
    and tests them, with the 4-hop questions, as test_ood."""
    top_k: int = 1
    """Passages the search tool returns per call."""
    demo_worlds: int = 4
    """Warm-start demonstrations also come from this many other worlds (same word pools,
    other seeds, so other facts); 0 = only the task's own training questions. Facts a tiny
    model cannot memorize force it to learn to read its search results, which is what
    transfers."""
    own_world_demos: bool = True
    """Also demonstrate on the task world's own training questions (one more source,
    sharing ``sft.demos`` evenly). Its names then occur in SFT text: a name the model has
    never seen is a rare token that it copies poorly ("country of Silanor" for any city)."""
    early_answer_prob: float = 0.6
    """Fraction of multi-hop demonstrations that answer after the first search (so the
    warm-started policy is imperfect and RL has something to fix)."""
    notes: bool = False
    """Demonstrations restate each fact they read ("X has father Y.") before their next
    call or answer: a scratchpad the agent can copy from. With one-fact passages (the
    world's default) they are not needed and cost tokens."""

    def validate(self) -> None:
        """Raise ValueError naming each bad field."""
        self.world.validate()
        if self.top_k < 1:
            raise ValueError("top_k must be >= 1: a search that returns nothing teaches nothing")
        if self.demo_worlds < 0:
            raise ValueError("demo_worlds must be >= 0 (0 = the task's own questions)")
        if not 0 <= self.early_answer_prob <= 1:
            raise ValueError("early_answer_prob is a probability: it must be in [0, 1]")


def world_search(world: World, top_k: int) -> SearchTool:
    """The `search` tool over a world's passages (BM25 over each fact's subject and
    relation, `World.index_text`)."""
    return SearchTool(BM25Retriever(world.passages, index_text=world.index_text), top_k=top_k)


def world_env(world: World, top_k: int = 2) -> Callable[[], ToolEnv]:
    """One `ToolEnv` per episode with the world's search tool (shared), EM / F1 / cover-EM
    metrics and no system prompt: the task's env without building a `TaskSpec`."""
    search = world_search(world, top_k)

    def make() -> ToolEnv:
        return ToolEnv(tools=[search], system_prompt=None, metrics=ANSWER_METRICS)

    return make


def tokenizer_corpus(world: World) -> list[str]:
    """Text the demo tokenizer is trained on: passages, questions, calls, answers, glue."""
    out = [f"{p.title}\n{p.text}" for p in world.passages]
    for t in world.tasks("train"):
        out.append(t.question)
        out.extend(answer_turn(a) for a in t.answers)
        out.extend(search_call(s) for s in world.gold_searches[t.id])
    out.append("\n<tool_response>\n[1] x\n</tool_response>\nNo results found.")
    return out


def oracle_generator(
    world: World,
    chat: ChatFormat,
    early_answer_prob: float = 0.0,
    seed: int = 0,
    notes: bool = True,
) -> ScriptedGenerator:
    """The oracle policy on every question of ``world`` as a Generator (log-prob 0,
    deterministic given ``seed``; run it with ``n_samples = 1``)."""
    oracle = OraclePolicy(world, early_answer_prob, random.Random(seed), notes)
    tasks = [t for s in SPLITS for t in world.tasks(s)]
    return policy_generator(oracle, tasks, chat, unknown_turn=answer_turn("unknown"))


@register_task("world")
def make_task(cfg: WorldTaskConfig, ctx: TaskContext) -> TaskSpec:
    """The world task: its splits (train, test, test_ood), the search tool, EM / F1 /
    cover-EM per episode broken down by hops and question type, and oracle
    demonstrations from this world and ``cfg.demo_worlds`` others (built only when the run
    warm-starts)."""
    world = World.build(cfg.world)
    n_demo = cfg.demo_worlds if ctx.warm_start else 0
    demo_worlds = [
        World.build(dataclasses.replace(cfg.world, seed=cfg.world.seed + 7919 * (k + 1)))
        for k in range(n_demo)
    ]

    def demonstrations(seed: int) -> list[Demonstrations]:
        own = [world] if cfg.own_world_demos or not demo_worlds else []
        return [
            Demonstrations(
                w.tasks("train"),
                OraclePolicy(w, cfg.early_answer_prob, random.Random(seed), cfg.notes),
                tools=None if w is world else [world_search(w, cfg.top_k)],
            )
            for w in [*own, *demo_worlds]
        ]

    def texts() -> list[str]:
        return [t for w in [world, *demo_worlds] for t in tokenizer_corpus(w)]

    return TaskSpec(
        name="world",
        splits={s: world.tasks(s) for s in SPLITS},
        tools=[world_search(world, cfg.top_k)],
        outcome_reward=em,
        metrics=ANSWER_METRICS,
        breakdown=("hops", "type"),
        eval_splits=("test", "test_ood"),
        system_prompt=None,  # a tiny model learns the format from the demonstrations
        demonstrations=demonstrations,
        tokenizer_texts=texts,
        extras={"world": world},
    )
