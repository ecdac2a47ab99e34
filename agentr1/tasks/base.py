"""The task protocol: everything the trainer, the evaluation and the CLI need from a task.

A task is a value (`TaskSpec`), not a branch in the trainer: the problems per split, the
tools, the outcome reward and optional process rewards, the metrics to report per
episode, and optionally scripted demonstrations for the SFT warm start and text for a
tokenizer built from scratch. The shortest complete task:

    from agentr1 import Task, TaskSpec, tool

    @tool
    def to_cm(inches: float) -> str:
        '''Convert inches to centimetres.

        Args:
            inches: a length in inches.
        '''
        return f"{inches * 2.54:.2f}"

    def close_enough(answer: str | None, task: Task) -> float:
        try:
            return float(abs(float(answer or "") - float(task.answers[0])) < 0.01)
        except ValueError:
            return 0.0

    spec = TaskSpec(
        name="units",
        splits={"train": [Task("t0", "How many cm is 3 inches?", ["7.62"])], "test": [...]},
        tools=[to_cm],
        outcome_reward=close_enough,
        metrics={"correct": close_enough},
    )

Imports no torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from agentr1.envs.base import EpisodeMetric, ToolEnv
from agentr1.envs.prompts import AUTO, resolve_system_prompt
from agentr1.rewards import OutcomeReward, ProcessReward, em
from agentr1.tools.base import Tool
from agentr1.types import Task

RESERVED_METRICS = frozenset(
    {
        "step",
        "reward",
        "outcome_reward",
        "process_reward",
        "turns",
        "tool_calls",
        "tool_errors",
        "response_len",
        "episode_len",
        "n",
        "phase",
    }
)
"""Names the run logs itself per step or group; a task metric may not take one."""


@runtime_checkable
class ScriptedPolicy(Protocol):
    """A scripted agent that writes demonstrations for the SFT warm start.

    It is run through the real rollout, env and tools, so its demonstrations carry the
    exact tokens and masks RL trains on. It sees what a model would see: the task (for
    its question and, if it needs them, privileged facts such as supporting titles) and
    the contents of the tool responses of this episode so far, in order.
    """

    def next_turn(self, task: Task, observations: Sequence[str]) -> str:
        """The text of the next assistant turn: tool calls (``<tool_call>{...}</tool_call>``)
        or a final answer (``<answer>...</answer>``)."""
        ...


@dataclass
class Demonstrations:
    """One source of warm-start demonstrations.

    Attributes:
        tasks: the problems demonstrated (usually training tasks; `sft.demos` episodes
            are drawn from all sources, shared out evenly).
        policy: the scripted agent (`ScriptedPolicy`).
        tools: the tools of these episodes; None = the task's own tools. (The embedded
            world demonstrates in other worlds: the same task, another corpus.)
    """

    tasks: Sequence[Task]
    policy: ScriptedPolicy
    tools: Sequence[Tool] | None = None


@dataclass(frozen=True)
class TaskContext:
    """What a task factory may want to know about the run that builds it.

    Attributes:
        seed: the run's seed (``train.seed``).
        max_turns: agent turns per episode (``rollout.max_turns``), e.g. to size
            demonstrations that must answer in time.
        warm_start: whether the run will ask for demonstrations (``sft.enabled``), so a
            task can skip building what only they need.
    """

    seed: int = 0
    max_turns: int = 5
    warm_start: bool = True


def score_metric(reward: OutcomeReward) -> dict[str, EpisodeMetric]:
    """The metrics of a task that names none: ``score``, its outcome reward."""
    return {"score": reward}


@dataclass
class TaskSpec:
    """What the trainer needs from a task, and nothing else.

    Attributes:
        name: a short label for logs and reports.
        splits: split name -> problems (`agentr1.types.Task`). "train" is required; every
            other split is an evaluation split unless ``eval_splits`` says otherwise.
        tools: the tools the agent may call (shared by all episodes; `agentr1.tool` turns
            a typed function into one).
        outcome_reward: ``(answer or None, task) -> float`` at the end of each episode;
            exact match against ``Task.answers`` by default.
        process_reward: ``StepContext -> float`` per turn, or None.
        metrics: per-episode metrics by name, each ``(answer or None, task) -> float``,
            averaged in every report; the first is the headline (``primary_metric``: the
            progress bar, ``train.keep_best``). None = ``{"score": outcome_reward}``.
        breakdown: ``Task.metadata`` keys whose values split the evaluation tables
            (e.g. ``("hops", "type")``); empty = overall only.
        eval_splits: the splits evaluated when ``eval.splits`` is empty; None = every
            split but "train".
        system_prompt: the first message; "auto" builds it from the tools
            (`agentr1.envs.prompts.default_system_prompt`, listing them unless the chat
            template renders their schemas); None or "" = no system message.
        demonstrations: ``seed -> [Demonstrations, ...]`` for the SFT warm start, or None
            (then a run must set ``sft.enabled: false``).
        tokenizer_texts: ``() -> [text, ...]`` a tokenizer built from scratch
            (``model.path: tiny``) is trained on; None = the questions, answers, system
            prompt and tool descriptions.
        make_env: builds one env per episode from keyword arguments ``tools``,
            ``system_prompt``, ``outcome_reward``, ``process_reward`` and ``metrics``;
            `ToolEnv` by default (pass a subclass or a function for another parser,
            observation limit or episode logic).
    """

    name: str
    splits: Mapping[str, Sequence[Task]]
    tools: Sequence[Tool] = ()
    outcome_reward: OutcomeReward = em
    process_reward: ProcessReward | None = None
    metrics: Mapping[str, EpisodeMetric] | None = None
    breakdown: Sequence[str] = ()
    eval_splits: Sequence[str] | None = None
    system_prompt: str | None = AUTO
    demonstrations: Callable[[int], Sequence[Demonstrations]] | None = None
    tokenizer_texts: Callable[[], Sequence[str]] | None = None
    make_env: Callable[..., ToolEnv] = ToolEnv
    extras: dict[str, Any] = field(default_factory=dict)
    """Anything else a task's own code wants to carry (not read by the trainer)."""
    data_report: Mapping[str, Any] = field(default_factory=dict)
    """What loading the task's data left out, JSON-able (records skipped with file, line
    and reason; counts): a run's summary shows it as ``data``."""

    def __post_init__(self) -> None:
        errors = []
        if not isinstance(self.splits, Mapping) or not self.splits.get("train"):
            errors.append("splits needs a non-empty 'train' split")
        bad = [k for k, v in dict(self.splits).items() if not all(isinstance(t, Task) for t in v)]
        if bad:
            errors.append(f"splits {bad}: every entry must be an agentr1.Task")
        for s in self.eval_splits or ():
            if s not in self.splits:
                errors.append(f"eval_splits: {s!r} is not a split ({', '.join(self.splits)})")
        names = [t.name for t in self.tools]
        if len(set(names)) != len(names):
            errors.append(f"tool names must be unique, got {names}")
        if self.metrics is not None:
            if not self.metrics:
                errors.append("metrics is empty: give at least one, or None for 'score'")
            taken = sorted(set(self.metrics) & RESERVED_METRICS)
            if taken:
                errors.append(f"metrics {taken}: names the run logs itself; rename them")
        if not callable(self.outcome_reward):
            errors.append("outcome_reward must be a function (answer, task) -> float")
        if errors:
            raise ValueError(f"task {self.name!r}: " + "; ".join(errors))

    @property
    def episode_metrics(self) -> dict[str, EpisodeMetric]:
        """The metrics in effect (``score`` when the task names none)."""
        return dict(self.metrics) if self.metrics is not None else score_metric(self.outcome_reward)

    @property
    def metric_names(self) -> list[str]:
        """Names of `episode_metrics`, headline first."""
        return list(self.episode_metrics)

    @property
    def primary_metric(self) -> str:
        """The headline metric (the first)."""
        return self.metric_names[0]

    @property
    def default_eval_splits(self) -> list[str]:
        """``eval_splits``, or every split but "train"."""
        if self.eval_splits is not None:
            return list(self.eval_splits)
        return [s for s in self.splits if s != "train"]

    def env_factory(
        self, tools: Sequence[Tool] | None = None, listed: bool = True
    ) -> Callable[[], ToolEnv]:
        """A function making one env per episode, with the task's rewards and metrics.

        Args:
            tools: the episode's tools (None = the task's).
            listed: whether an "auto" system prompt lists the tools (False when the chat
                template renders their schemas).
        """
        use = list(self.tools if tools is None else tools)
        prompt = resolve_system_prompt(self.system_prompt, use, listed)
        metrics = self.episode_metrics

        def make() -> ToolEnv:
            return self.make_env(
                tools=use,
                system_prompt=prompt,
                outcome_reward=self.outcome_reward,
                process_reward=self.process_reward,
                metrics=metrics,
            )

        return make

    def replace(self, **changes: Any) -> TaskSpec:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def default_tokenizer_texts(self) -> list[str]:
        """`tokenizer_texts`, or the questions, answers, system prompt and tool
        descriptions (every split, so held-out words are tokens too)."""
        if self.tokenizer_texts is not None:
            return list(self.tokenizer_texts())
        out: list[str] = []
        prompt = resolve_system_prompt(self.system_prompt, list(self.tools))
        if prompt:
            out.append(prompt)
        out += [f"{t.name} {t.description}" for t in self.tools]
        for tasks in self.splits.values():
            for t in tasks:
                out.append(t.question)
                out += [f"<answer>{a}</answer>" for a in t.answers]
        out.append("<tool_call>\n</tool_call>\n<tool_response>\n</tool_response>")
        return out
