"""``oracle_search.py``: the oracle env's search returns each task's own gold
passages, whatever the query, through the normal rollout."""

from __future__ import annotations

import oracle_search

from agentr1 import Task
from agentr1.backends.scripted import ScriptedGenerator
from agentr1.retrieval.base import Passage
from agentr1.rollout import RolloutConfig, run_rollout
from agentr1.tools.search import SearchTool
from tests.fakes import byte_chat

GoldPassages, OracleSearchEnv = oracle_search.GoldPassages, oracle_search.OracleSearchEnv

CALL = '<tool_call>{"name": "search", "arguments": {"query": "anything at all"}}</tool_call>'


def test_each_episode_searches_its_own_gold_passages() -> None:
    tasks = [Task(f"t{i}", f"Where was person {i} born?", [f"town {i}"]) for i in range(2)]
    gold = {
        f"t{i}": [Passage(f"p{i}", f"Person {i}", f"Person {i} was born in town {i} long ago.")]
        for i in range(2)
    }

    def make_env() -> OracleSearchEnv:
        tool = SearchTool(GoldPassages(), top_k=2, max_words=6)
        return OracleSearchEnv(tools=[tool], system_prompt=None, gold=gold)

    chat = byte_chat()
    gen = ScriptedGenerator(
        lambda ctx: CALL if "tool_response" not in ctx else "<answer>x</answer>",
        chat.encode,
        chat.decode,
        chat.end_of_turn_id,
    )
    groups = run_rollout(tasks, make_env, gen, chat, RolloutConfig(max_turns=3, max_context=4096))
    logs = {g.trajectories[0].task_id: g.trajectories[0].tool_log for g in groups}
    assert logs["t0"][0].content == "[1] Person 0\nPerson 0 was born in town ..."
    assert logs["t1"][0].content == "[1] Person 1\nPerson 1 was born in town ..."
