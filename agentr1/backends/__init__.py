"""Generation backends behind the narrow `Generator` protocol (hf by default)."""

from agentr1.backends.base import Completion, Generator, SamplingParams

__all__ = ["Completion", "Generator", "SamplingParams"]
