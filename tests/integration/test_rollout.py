"""Rollout tests with a byte tokenizer, scripted policies and stub tools."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

import pytest

from agentr1.backends.hf import GenerationStats
from agentr1.backends.scripted import ScriptedGenerator
from agentr1.envs.base import ToolEnv
from agentr1.rewards import ANSWER_METRICS
from agentr1.rollout import RolloutConfig, RolloutStats, read_trajectories, run_rollout
from agentr1.rollout.collate import collate_groups
from agentr1.rollout.io import write_trajectories
from agentr1.templates import QWEN25_TOOLS, render_template
from agentr1.tools import tool
from agentr1.tools.calculator import calculator
from agentr1.types import StopReason, Task, ToolResult
from tests.fakes import ByteTokenizer, byte_chat

EOT = 257


def call(name: str, **args: object) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"


def script(turns: list[str]) -> Callable[[str], str]:
    """A policy that plays ``turns`` in order, picking by the number of turns so far."""

    def respond(context: str) -> str:
        done = context.count("<|im_start|>assistant\n") - 1
        return turns[min(done, len(turns) - 1)]

    return respond


def scripted(turns: list[str]) -> ScriptedGenerator:
    tok = ByteTokenizer()
    return ScriptedGenerator(script(turns), tok.encode, tok.decode, EOT)


TASK = Task(id="t1", question="What is 1+2?", answers=["3"])


def run(turns: list[str], tools: list | None = None, **cfg: object):
    chat = byte_chat()
    use = tools if tools is not None else [calculator]
    env = lambda: ToolEnv(tools=use, metrics=ANSWER_METRICS)  # noqa: E731
    groups = run_rollout([TASK], env, scripted(turns), chat, RolloutConfig(**cfg))
    return groups[0].trajectories[0], chat


def test_literal_tokens_and_mask() -> None:
    t1 = call("calculator", expression="1+2")
    t2 = "<answer>3</answer>"
    traj, _ = run([t1, t2])
    enc = ByteTokenizer().encode
    env = ToolEnv(tools=[calculator])
    prompt_text = render_template(
        QWEN25_TOOLS, [m.to_dict() for m in env.reset(TASK)], env.tool_schemas, True
    )
    assert prompt_text.endswith("What is 1+2?<|im_end|>\n<|im_start|>assistant\n")
    glue = "\n<|im_start|>user\n<tool_response>\n3\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    P, A1, O, A2 = enc(prompt_text), [*enc(t1), EOT], enc(glue), [*enc(t2), EOT]
    assert traj.token_ids == P + A1 + O + A2
    assert traj.loss_mask == [0] * len(P) + [1] * len(A1) + [0] * len(O) + [1] * len(A2)
    assert traj.logprobs == [0.0] * len(traj.token_ids)
    assert traj.prompt_len == len(P)
    assert [(t.start, t.end, t.obs_end) for t in traj.turns] == [
        (len(P), len(P) + len(A1), len(P) + len(A1) + len(O)),
        (len(P) + len(A1) + len(O), len(traj.token_ids), len(traj.token_ids)),
    ]
    assert traj.stop_reason is StopReason.ANSWERED
    assert traj.answer == "3" and traj.outcome_reward == 1.0 and traj.metrics["em"] == 1.0
    assert [e.content for e in traj.tool_log] == ["3"]


def test_stream_equals_full_render_up_to_final_newline() -> None:
    traj, chat = run([call("calculator", expression="2*3"), "<answer>6</answer>"])
    env = ToolEnv(tools=[calculator])
    full = render_template(
        QWEN25_TOOLS, [m.to_dict() for m in traj.messages], env.tool_schemas, False
    )
    # The only difference: the template ends the last assistant turn with "<|im_end|>\n";
    # the policy stops on <|im_end|> and never samples the newline.
    assert chat.decode(traj.token_ids) + "\n" == full
    assert chat.encode(full) == [*traj.token_ids, *chat.encode("\n")]


def test_two_calls_in_one_turn_run_concurrently() -> None:
    @tool(timeout_s=5)
    async def slow(x: int) -> str:
        """Sleep then echo.

        Args:
            x: value to echo.
        """
        await asyncio.sleep(0.3)
        return str(x)

    t0 = time.perf_counter()
    traj, _ = run([call("slow", x=1) + call("slow", x=2), "<answer>3</answer>"], tools=[slow])
    assert time.perf_counter() - t0 < 0.55  # sequential would take 0.6 s
    assert [e.content for e in traj.tool_log] == ["1", "2"]
    text = ByteTokenizer().decode(traj.token_ids)
    assert "<tool_response>\n1\n</tool_response>\n<tool_response>\n2\n</tool_response>" in text


def test_faulty_tools_become_observations_and_metrics() -> None:
    @tool(timeout_s=5)
    def boom(q: str) -> str:
        """Always fails.

        Args:
            q: ignored.
        """
        raise RuntimeError("disk on fire")

    @tool(timeout_s=0.2)
    def hang(q: str) -> str:
        """Never answers in time.

        Args:
            q: ignored.
        """
        time.sleep(2)
        return "late"

    class Garbage:
        name, description, timeout_s = "garbage", "returns junk", 1.0
        parameters = {"type": "object", "properties": {"q": {"type": "string"}}, "required": []}

        async def __call__(self, **kw: object) -> ToolResult:
            return object()  # type: ignore[return-value]

    turn1 = call("boom", q="a") + call("hang", q="b") + call("garbage", q="c") + call("nope")
    turn2 = call("boom", wrong=1) + "<tool_call>{not json</tool_call>"
    traj, _ = run(
        [turn1, turn2, "<answer>3</answer>"],
        tools=[boom, hang, Garbage()],
        max_tokens_per_turn=1024,
    )
    assert traj.stop_reason is StopReason.ANSWERED
    m = traj.metrics
    assert m["tool_exception"] == 1 and m["tool_timeout"] == 1 and m["tool_bad_output"] == 1
    assert m["unknown_tool"] == 1 and m["parse_errors"] == 1 and m["bad_arguments"] == 1
    errors = [e.error for e in traj.tool_log]
    assert errors == [
        "tool_exception",
        "tool_timeout",
        "tool_bad_output",
        "unknown_tool",
        "bad_arguments",
    ]
    text = ByteTokenizer().decode(traj.token_ids)
    assert "RuntimeError: disk on fire" in text
    assert "did not answer within 0.2 s" in text
    assert "unknown tool 'nope'. Available tools: boom, garbage, hang." in text
    assert "not valid JSON" in text
    assert "unknown argument(s): wrong" in text


@pytest.mark.parametrize(
    ("turns", "cfg", "reason"),
    [
        (["<answer>3</answer>"], {}, StopReason.ANSWERED),
        (["I think it is three."], {}, StopReason.NO_TOOL_CALL),
        ([call("calculator", expression="1")], {"max_turns": 3}, StopReason.MAX_TURNS),
        ([call("calculator", expression="1")], {"max_context": 1300}, StopReason.MAX_CONTEXT),
    ],
)
def test_stop_reasons(turns: list[str], cfg: dict, reason: StopReason) -> None:
    traj, _ = run(turns, **cfg)
    assert traj.stop_reason is reason
    assert len(traj.token_ids) <= cfg.get("max_context", 10**9)
    if reason is StopReason.MAX_TURNS:
        assert traj.num_turns == 3
    if reason is not StopReason.ANSWERED:
        assert traj.outcome_reward == 0.0


def test_env_exception_ends_only_that_episode_and_masks_turn() -> None:
    class BrokenEnv(ToolEnv):
        async def step(self, text: str):  # type: ignore[override]
            raise KeyError("bug")

    chat = byte_chat()
    gen = scripted(["<answer>3</answer>"])
    groups = run_rollout([TASK], lambda: BrokenEnv(tools=[]), gen, chat, RolloutConfig(n_samples=2))
    for traj in groups[0].trajectories:
        assert traj.stop_reason is StopReason.ERROR
        assert sum(traj.loss_mask) == 0 and traj.metrics["env_errors"] == 1


def test_groups_stats_jsonl_and_collate(tmp_path) -> None:
    chat = byte_chat()
    tasks = [TASK, Task(id="t2", question="What is 2+2?", answers=["4"])]
    stats = RolloutStats()
    groups = run_rollout(
        tasks,
        lambda: ToolEnv(tools=[calculator]),
        scripted([call("calculator", expression="1+2"), "<answer>3</answer>"]),
        chat,
        RolloutConfig(n_samples=3),
        stats,
    )
    assert [g.task.id for g in groups] == ["t1", "t2"]
    assert [t.sample_index for t in groups[1].trajectories] == [0, 1, 2]
    assert [g.rewards for g in groups] == [[1.0] * 3, [0.0] * 3]
    assert stats.episodes == 6 and stats.turns == 12 and stats.stop_reasons == {"answered": 6}

    path = tmp_path / "traj.jsonl"
    write_trajectories(path, [t for g in groups for t in g.trajectories], chat.decode)
    back = read_trajectories(path)
    assert back == [t for g in groups for t in g.trajectories]
    assert "<tool_response>" in json.loads(path.read_text().splitlines()[0])["text"]

    batch = collate_groups(groups, pad_id=ByteTokenizer.pad_token_id)
    traj = groups[0].trajectories[0]
    n = len(traj.token_ids)
    assert batch.input_ids_BT.shape == (6, n) and batch.group_index_B.tolist() == [0, 0, 0, 1, 1, 1]
    assert batch.loss_mask_BT[0].tolist() == [float(x) for x in traj.loss_mask]
    # outcome reward on the last sampled token, nowhere else
    assert batch.token_rewards_BT[0, n - 1] == 1.0 and batch.token_rewards_BT[0].sum() == 1.0
    assert batch.token_rewards_BT[3].sum() == 0.0


def test_bad_jsonl_line_names_file_and_line(tmp_path) -> None:
    p = tmp_path / "bad.jsonl"
    p.write_text('{"task_id": "x"}\n{"oops": 1}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not a trajectory record"):
        read_trajectories(p)


def test_rollout_holds_one_generator_session_over_all_turns() -> None:
    """A generator with ``session()`` (the hf one keeps KV caches between turns inside
    it) gets exactly one session around every generate call of the rollout."""
    import contextlib

    events: list[str] = []

    class SessionGenerator(ScriptedGenerator):
        @contextlib.contextmanager
        def session(self):  # type: ignore[no-untyped-def]
            events.append("open")
            yield
            events.append("close")

        def generate(self, prompts, params):  # type: ignore[no-untyped-def]
            events.append("generate")
            return super().generate(prompts, params)

    tok = ByteTokenizer()
    gen = SessionGenerator(
        script([call("calculator", expression="1+2"), "<answer>3</answer>"]),
        tok.encode,
        tok.decode,
        EOT,
    )
    env = lambda: ToolEnv(tools=[calculator])  # noqa: E731
    (group,) = run_rollout([TASK], env, gen, byte_chat(), RolloutConfig(n_samples=2))
    assert [t.stop_reason for t in group.trajectories] == [StopReason.ANSWERED] * 2
    assert events == ["open", "generate", "generate", "close"]


def test_a_tool_that_exits_or_returns_no_text_costs_one_call_not_the_run() -> None:
    """sys.exit in a tool was not caught (it ended the whole run); a @tool returning None,
    bytes or an object was turned into its repr and counted a success."""
    import sys

    @tool
    def quits(q: str) -> str:
        """Calls sys.exit.

        Args:
            q: ignored.
        """
        sys.exit(3)

    @tool
    def nothing(q: str) -> str:
        """Returns None.

        Args:
            q: ignored.
        """
        return None  # type: ignore[return-value]

    @tool
    def raw(q: str) -> str:
        """Returns bytes.

        Args:
            q: ignored.
        """
        return b"\xff\x00"  # type: ignore[return-value]

    @tool
    def number(q: str) -> str:
        """Returns an int.

        Args:
            q: ignored.
        """
        return 42  # type: ignore[return-value]

    class Leaves:  # a Tool of its own (not @tool) whose coroutine exits
        name, description, timeout_s = "leaves", "calls sys.exit", 1.0
        parameters = {"type": "object", "properties": {"q": {"type": "string"}}, "required": []}

        async def __call__(self, **kw: object) -> ToolResult:
            sys.exit("bye")

    turn = "".join(call(n, q="x") for n in ("quits", "nothing", "raw", "number"))
    turns = [turn, call("leaves", q="x"), "<answer>3</answer>"]  # at most 4 calls a turn
    tools = [quits, nothing, raw, number, Leaves()]
    traj, _ = run(turns, tools=tools, max_tokens_per_turn=1024)
    assert traj.stop_reason is StopReason.ANSWERED
    assert [(e.ok, e.error) for e in traj.tool_log] == [
        (False, "tool_exception"),
        (False, "tool_bad_output"),
        (False, "tool_bad_output"),
        (True, None),
        (False, "tool_exception"),
    ]
    assert "ToolExit: the tool called sys.exit(3)" in traj.tool_log[0].content
    assert traj.tool_log[1].content == "Error: nothing returned nothing."
    assert traj.tool_log[2].content == "Error: raw returned a bytes, not text."
    assert traj.tool_log[3].content == "42"


def test_error_observations_are_clipped_like_any_other() -> None:
    """A 1 MB unknown tool name gave a 1,000,052-character tool message."""
    import asyncio

    env = ToolEnv(tools=[calculator], max_observation_chars=200)
    env.reset(TASK)
    step = asyncio.run(env.step(call("x" * 1_000_000)))
    (result,) = step.tool_results
    assert result.metadata["error"] == "unknown_tool" and result.metadata["truncated"]
    assert len(result.content) == 200 + len(" ...[truncated]")


def test_episodes_with_different_budgets_share_one_generate_call() -> None:
    """Budgets differ when episodes near ``max_context`` have less room: still one
    batched call a turn (grouping by exact budget split turns 2-3 into 8-14 calls), each
    row capped at its own room, and no episode past ``max_context``."""
    tok = ByteTokenizer()
    calls: list[tuple[int, tuple[int, ...] | None]] = []
    inner = ScriptedGenerator(
        script([call("calculator", expression="1+2") + " " + "x" * 80]), tok.encode, tok.decode, EOT
    )

    class Counting:
        def generate(self, prompts, params):  # type: ignore[no-untyped-def]
            calls.append((len(prompts), params.row_max_new_tokens))
            return inner.generate(prompts, params)

    tasks = [
        Task(id=f"t{i}", question="What is 1+2?" + " pad" * (10 * i), answers=["3"])
        for i in range(4)
    ]
    cfg = RolloutConfig(
        max_turns=3, max_tokens_per_turn=120, max_context=1450
    )  # prompts ~1,150-1,270
    groups = run_rollout(tasks, lambda: ToolEnv(tools=[calculator]), Counting(), byte_chat(), cfg)
    trajs = [g.trajectories[0] for g in groups]
    assert all(len(t.token_ids) <= 1450 for t in trajs)
    turns = max(t.num_turns for t in trajs)
    assert len(calls) == turns  # one call per turn, whatever the budgets
    assert any(caps is not None and len(set(caps)) > 1 for _, caps in calls), calls


def test_the_generators_clock_adds_up_in_the_rollouts_stats() -> None:
    """A generator that times its prefills and decode passes (``last_stats``, as the hf
    one does) has them summed over a rollout's calls; one that keeps no clock adds 0."""
    inner = scripted([call("calculator", expression="1+2"), "<answer>3</answer>"])

    class Clocked:
        def __init__(self) -> None:
            self.last_stats = GenerationStats()

        def generate(self, prompts, params):  # type: ignore[no-untyped-def]
            self.last_stats = GenerationStats(prefill_s=0.25, decode_s=0.5)
            return inner.generate(prompts, params)

    timed, plain = RolloutStats(), RolloutStats()
    run_rollout(
        [TASK], lambda: ToolEnv(tools=[calculator]), Clocked(), byte_chat(), RolloutConfig(), timed
    )
    run_rollout(
        [TASK], lambda: ToolEnv(tools=[calculator]), inner, byte_chat(), RolloutConfig(), plain
    )
    assert timed.turns == plain.turns == 2  # two calls
    assert (timed.prefill_s, timed.decode_s) == (0.5, 1.0)
    assert (plain.prefill_s, plain.decode_s) == (0.0, 0.0)
