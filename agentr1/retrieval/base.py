"""The passage type and the narrow interface every retriever implements."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Passage:
    """One retrievable unit of text.

    Attributes:
        id: stable identifier (unique within a corpus).
        title: the title of the article the passage belongs to.
        text: the passage body.
    """

    id: str
    title: str
    text: str


class Retriever(Protocol):
    """Returns the passages most relevant to each query, best first."""

    def search(self, query: str, k: int) -> list[Passage]: ...

    def search_batch(self, queries: list[str], k: int) -> list[list[Passage]]: ...
