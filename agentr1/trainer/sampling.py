"""The order a run draws its training tasks in: seeded, epoch by epoch, checkpointed.

RL draws with `TaskSampler` (``train.seed``); the SFT warm start demonstrates the tasks
`demo_picks` chooses (a sampler seeded ``train.seed + 1``). Both are pure functions of the
task list and the seed, so which training tasks a run has seen can be computed without
the run (e.g. to hold out the ones it never saw).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from agentr1.types import Task


class TaskSampler:
    """Draws training tasks epoch by epoch in a seeded order; its state is checkpointed."""

    def __init__(self, tasks: list[Task], seed: int) -> None:
        self.tasks, self.seed, self.epoch, self.pos = tasks, seed, 0, 0
        self._order = self._perm()

    def _perm(self) -> list[int]:
        order = list(range(len(self.tasks)))
        random.Random(self.seed * 100_003 + self.epoch).shuffle(order)
        return order

    def sample(self, n: int) -> list[Task]:
        out = []
        for _ in range(n):
            if self.pos >= len(self._order):
                self.epoch, self.pos = self.epoch + 1, 0
                self._order = self._perm()
            out.append(self.tasks[self._order[self.pos]])
            self.pos += 1
        return out

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "pos": self.pos}

    def load(self, state: dict[str, int]) -> None:
        self.epoch, self.pos = int(state["epoch"]), int(state["pos"])
        self._order = self._perm()


def demo_picks(task_lists: Sequence[list[Task]], demos: int, seed: int) -> list[list[Task]]:
    """The tasks the SFT warm start demonstrates, per source: ``demos`` shared out evenly
    (the first sources get the remainder), each drawn in the order of a `TaskSampler`
    seeded ``seed + 1`` (RL draws with ``seed``)."""
    n_src = len(task_lists)
    return [
        TaskSampler(tasks, seed + 1).sample(min(len(tasks), demos // n_src + (k < demos % n_src)))
        for k, tasks in enumerate(task_lists)
    ]
