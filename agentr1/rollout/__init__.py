"""The multi-turn rollout: chat formats, the episode loop, collation and trajectory files.

Imports no backend: the rollout knows the `Generator` protocol only.
"""

from agentr1.rollout.chat import ChatFormat
from agentr1.rollout.io import read_trajectories, write_trajectories
from agentr1.rollout.loop import RolloutConfig, RolloutStats, run_rollout

__all__ = [
    "ChatFormat",
    "RolloutConfig",
    "RolloutStats",
    "read_trajectories",
    "run_rollout",
    "write_trajectories",
]
