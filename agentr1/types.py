"""The contracts every layer shares: messages, tool calls, steps, trajectories.

This module imports no torch, so envs, tools and rewards can use it without pulling in a
tensor library. The tensor batch the algorithms take (`RolloutBatch`) is built by exactly
one function, `agentr1.rollout.collate.collate`, from `Trajectory.loss_mask`.

Notation: B = trajectories in a batch, T = padded token length, G = samples per task.

The mask contract (docs/design.md §1), stated once and enforced where tokens are appended
(`Trajectory.append_sampled` / `Trajectory.append_inserted`):

    loss_mask[t] = 1  only for tokens the rollout policy sampled;
    loss_mask[t] = 0  for the prompt, tool responses, template glue, padding, and
                      turns dropped for errors.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # torch stays out of the import graph of envs/tools/rewards
    import torch

Role = Literal["system", "user", "assistant", "tool"]


def valid_text(text: str) -> str:
    """``text`` as valid Unicode: each lone surrogate replaced by U+FFFD.

    A Python ``str`` may hold what no encoder accepts: the bytes a ``surrogateescape``
    decode could not read (a tool's output from a binary file), or a ``\\ud800`` escape
    a model wrote inside JSON. Tokenizers and UTF-8 files reject them; every text the
    rollout tokenizes or logs passes through here. Escaped bytes come back as the valid
    UTF-8 around them, each undecodable byte one U+FFFD.

    >>> valid_text("ok \\udcff end"), valid_text("\\ud800x")
    ('ok \ufffd end', '\ufffdx')
    """
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass
    try:  # surrogateescape'd bytes: decode them again, replacing what is not UTF-8
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    except UnicodeEncodeError:  # other lone surrogates
        return "".join("\ufffd" if "\ud800" <= c <= "\udfff" else c for c in text)


def json_line(record: Any) -> str:
    """One JSONL line (no newline) of ``record``, non-ASCII kept readable, any lone
    surrogate in it replaced (`valid_text`), so a log write never fails on content."""
    return valid_text(json.dumps(record, ensure_ascii=False))


@dataclass(frozen=True)
class ToolCall:
    """One call the agent asked for.

    Attributes:
        name: tool name as written by the agent.
        arguments: decoded JSON arguments (empty when they could not be decoded).
        id: identifier unique within the episode (``call_<turn>_<index>``).
        raw: the exact text of the call as the agent wrote it, for logs.
    """

    name: str
    arguments: dict[str, Any]
    id: str = ""
    raw: str = ""


@dataclass(frozen=True)
class Message:
    """One chat message, OpenAI style.

    Attributes:
        role: "system", "user", "assistant" or "tool".
        content: the text of the message.
        tool_calls: for assistant messages, the calls it made (rendered by templates that
            support them; the rollout never re-renders an assistant message, see docs/design.md §1).
        name: for tool messages, the tool that produced it.
        tool_call_id: for tool messages, the `ToolCall.id` it answers.
    """

    role: Role
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    name: str | None = None
    tool_call_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The dict form chat templates expect (`tokenizer.apply_chat_template`)."""
        d: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            d["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in self.tool_calls
            ]
        if self.name is not None:
            d["name"] = self.name
        if self.tool_call_id is not None:
            d["tool_call_id"] = self.tool_call_id
        return d


@dataclass(frozen=True)
class ToolResult:
    """What a tool reports after executing one call.

    Attributes:
        content: text the model will read in the tool message.
        ok: False when the call failed (bad arguments, exception, timeout); the content
            then explains the failure to the model.
        metadata: structured extras for rewards and logs (e.g. retrieved passage ids,
            ``error`` = one of the `ToolEnv` error kinds).
    """

    content: str
    ok: bool = True
    metadata: dict[str, Any] = field(default_factory=dict)


class StopReason(StrEnum):
    """Why an episode ended. Truncation is never silent: every episode has exactly one."""

    ANSWERED = "answered"
    """The agent gave a final answer (``<answer>...</answer>``)."""
    MAX_TURNS = "max_turns"
    """The turn budget ran out before an answer."""
    MAX_CONTEXT = "max_context"
    """The next turn or tool response would not fit in the context budget."""
    NO_TOOL_CALL = "no_tool_call"
    """The agent ended a turn with neither a tool call nor an answer."""
    ERROR = "error"
    """The environment or the generator failed irrecoverably for this episode."""


@dataclass
class StepResult:
    """What `ToolEnv.step` says one agent turn meant.

    Attributes:
        observation: messages to append after the turn (tool responses); empty when done.
        reward: process reward of this step (0.0 when process rewards are off). Placed on
            the last token of the turn that earned it.
        done: whether the episode ends after this turn.
        stop_reason: set iff ``done``.
        tool_calls: calls parsed from the turn (valid or not).
        tool_results: one result per entry of ``tool_calls``, same order.
        answer: the final answer text when the turn gave one.
        metrics: counters for the run report, e.g. ``tool_calls``, ``tool_errors``,
            ``parse_errors``, ``unknown_tool``, ``bad_arguments``, ``tool_exception``,
            ``tool_timeout``.
    """

    observation: list[Message]
    reward: float
    done: bool
    stop_reason: StopReason | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_results: list[ToolResult] = field(default_factory=list)
    answer: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class Task:
    """One problem an episode is run on.

    Attributes:
        id: unique, stable identifier.
        question: what the user asks.
        answers: accepted gold answers (the first is canonical; the rest are aliases).
        metadata: free-form facts for rewards, splits and reports, e.g. ``hops``, ``type``,
            ``dataset``, ``supporting``.
    """

    id: str
    question: str
    answers: list[str]
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class Turn:
    """Where one agent turn and the inserted segment after it sit in `Trajectory.token_ids`.

    Attributes:
        start: index of the turn's first sampled token.
        end: one past its last sampled token (``token_ids[start:end]`` is the action).
        obs_end: one past the last token of the segment inserted after the turn (tool
            responses plus template glue); equals ``end`` when nothing was inserted.
        reward: process reward of the step, placed on token ``end - 1``.
        text: the decoded action text.
        finish: "stop" when generation ended on a stop token/string, "length" when it hit
            the token budget.
        weight_version: the version of the weights that sampled the turn (the number of
            updates behind them; `agentr1.distributed` checks staleness with it).
    """

    start: int
    end: int
    obs_end: int
    reward: float = 0.0
    text: str = ""
    finish: str = "stop"
    weight_version: int = 0


@dataclass
class ToolLogEntry:
    """One executed tool call, for trajectory files and process rewards."""

    turn: int
    name: str
    arguments: dict[str, Any]
    ok: bool
    content: str
    error: str | None = None


@dataclass
class Trajectory:
    """One episode, token in, token out.

    `token_ids` is the whole state: the prompt, every sampled agent turn exactly as sampled,
    and every inserted segment (tool responses and template glue) tokenized once. Text is
    never decoded and re-tokenized to rebuild it.

    Attributes:
        task_id: `Task.id` of the problem.
        sample_index: index of this sample within its group (0..G-1).
        prompt_len: number of prompt tokens at the start of `token_ids`.
        token_ids: the full token stream. [T_i]
        loss_mask: 1 exactly where the rollout policy sampled the token, else 0. [T_i]
        logprobs: log-prob of each sampled token under the sampling distribution; 0.0 where
            ``loss_mask`` is 0. [T_i]
        turns: one entry per agent turn, in order.
        outcome_reward: reward of the final outcome (set when the episode ends).
        stop_reason: why the episode ended (None only while it is running).
        answer: final answer text, if any.
        tool_log: every executed tool call.
        metrics: per-episode counters (tool calls, errors, EM, F1, ...).
        messages: the conversation as messages (prompt messages, assistant turns, tool
            messages), for logs and for template-render checks.
    """

    task_id: str
    sample_index: int = 0
    prompt_len: int = 0
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    outcome_reward: float = 0.0
    stop_reason: StopReason | None = None
    answer: str | None = None
    tool_log: list[ToolLogEntry] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    messages: list[Message] = field(default_factory=list)

    # The only two places tokens enter a trajectory; the mask contract lives here.
    def append_prompt(self, ids: list[int]) -> None:
        """Append prompt tokens (``loss_mask = 0``); only before the first turn."""
        if self.turns:
            raise ValueError("prompt tokens must come before the first agent turn")
        self.token_ids.extend(ids)
        self.loss_mask.extend([0] * len(ids))
        self.logprobs.extend([0.0] * len(ids))
        self.prompt_len = len(self.token_ids)

    def append_sampled(
        self,
        ids: list[int],
        logprobs: list[float],
        text: str,
        finish: str = "stop",
        weight_version: int = 0,
    ) -> Turn:
        """Append one agent turn exactly as sampled (``loss_mask = 1``)."""
        if len(ids) != len(logprobs):
            raise ValueError(f"{len(ids)} sampled tokens but {len(logprobs)} log-probs")
        start = len(self.token_ids)
        self.token_ids.extend(ids)
        self.loss_mask.extend([1] * len(ids))
        self.logprobs.extend(float(x) for x in logprobs)
        turn = Turn(
            start=start,
            end=len(self.token_ids),
            obs_end=len(self.token_ids),
            text=text,
            finish=finish,
            weight_version=weight_version,
        )
        self.turns.append(turn)
        return turn

    def append_inserted(self, ids: list[int]) -> None:
        """Append tokens the policy did not sample (tool responses, glue): ``loss_mask = 0``."""
        if not self.turns:
            raise ValueError("inserted tokens must follow an agent turn")
        self.token_ids.extend(ids)
        self.loss_mask.extend([0] * len(ids))
        self.logprobs.extend([0.0] * len(ids))
        self.turns[-1].obs_end = len(self.token_ids)

    def mask_turn(self, index: int) -> None:
        """Drop a turn from training (e.g. a turn that broke the env): its mask becomes 0."""
        t = self.turns[index]
        for i in range(t.start, t.end):
            self.loss_mask[i] = 0

    @property
    def num_turns(self) -> int:
        return len(self.turns)

    @property
    def step_rewards(self) -> list[float]:
        """Process reward of each turn, in order."""
        return [t.reward for t in self.turns]

    @property
    def total_reward(self) -> float:
        """Outcome reward plus the sum of process rewards."""
        return self.outcome_reward + sum(self.step_rewards)

    @property
    def response_len(self) -> int:
        """Number of sampled tokens."""
        return sum(self.loss_mask)

    def to_json(self, text: str | None = None) -> str:
        """One JSONL line. ``text`` (decoded token stream) is stored for humans only."""
        d = asdict(self)
        d["stop_reason"] = self.stop_reason.value if self.stop_reason else None
        if text is not None:
            d["text"] = text
        return json_line(d)

    @classmethod
    def from_json(cls, line: str) -> Trajectory:
        """Inverse of `to_json` (the decoded ``text`` field is ignored)."""
        d = json.loads(line)
        d.pop("text", None)
        d["stop_reason"] = StopReason(d["stop_reason"]) if d.get("stop_reason") else None
        d["turns"] = [Turn(**t) for t in d.get("turns", [])]
        d["tool_log"] = [ToolLogEntry(**e) for e in d.get("tool_log", [])]
        d["messages"] = [
            Message(
                role=m["role"],
                content=m["content"],
                tool_calls=tuple(ToolCall(**c) for c in m.get("tool_calls", ())),
                name=m.get("name"),
                tool_call_id=m.get("tool_call_id"),
            )
            for m in d.get("messages", [])
        ]
        return cls(**d)


@dataclass
class TrajectoryGroup:
    """The G samples of one task (a GRPO / RLOO group)."""

    task: Task
    trajectories: list[Trajectory]

    @property
    def rewards(self) -> list[float]:
        return [t.total_reward for t in self.trajectories]


@dataclass
class RolloutBatch:
    """The tensor batch the algorithms take; built only by `rollout.collate.collate`.

    Attributes:
        input_ids_BT: right-padded token ids. [B, T] long
        attention_mask_BT: 1 for real tokens, 0 for padding. [B, T] long
        loss_mask_BT: the mask contract (1 = sampled by the policy). [B, T] float
        old_logprobs_BT: sampling log-probs, 0 where ``loss_mask`` is 0. [B, T] float
        token_rewards_BT: process rewards on each turn's last token plus the outcome
            reward on the last sampled token. [B, T] float
        outcome_B: outcome reward per trajectory. [B] float
        group_index_B: index of the task group each row belongs to. [B] long
    """

    input_ids_BT: torch.Tensor
    attention_mask_BT: torch.Tensor
    loss_mask_BT: torch.Tensor
    old_logprobs_BT: torch.Tensor
    token_rewards_BT: torch.Tensor
    outcome_B: torch.Tensor
    group_index_B: torch.Tensor

    @property
    def size(self) -> int:
        return int(self.input_ids_BT.shape[0])

    def to(self, device: torch.device | str) -> RolloutBatch:
        """The same batch with every tensor on ``device`` (self when already there)."""
        import torch  # only here: this module stays importable without torch

        if self.input_ids_BT.device == torch.device(device):
            return self
        moved = {f.name: getattr(self, f.name).to(device) for f in fields(self)}
        return RolloutBatch(**moved)


@dataclass
class StepContext:
    """Everything a process reward may look at for one step (pure data, no env handle).

    Attributes:
        task: the episode's task.
        turn: 0-based index of this turn.
        text: the agent turn's text.
        calls: well-formed tool calls of the turn.
        results: their results, same order.
        parse_errors: kinds of the malformed pieces of the turn.
        answer: the final answer, if the turn gave one.
        previous: contexts of the earlier steps of the episode, oldest first.
    """

    task: Task
    turn: int
    text: str
    calls: list[ToolCall]
    results: list[ToolResult]
    parse_errors: list[str]
    answer: str | None
    previous: list[StepContext] = field(default_factory=list)
