"""A tiny name registry, so the trainer picks an advantage estimator in one line.

    out = get_advantage(cfg.estimator)(inputs, cfg)   # every estimator, one signature

Notation: B = batch rows (trajectories), T = tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:  # advantages.py imports this module at run time; types only here
    from agentr1.algorithms.advantages import AdvantageFn

F = TypeVar("F", bound=Callable[..., object])


class UnknownNameError(KeyError, ValueError):
    """A name that is not registered. Both ``except KeyError`` and ``except ValueError``
    catch it; the message lists the valid names, sorted."""

    def __str__(self) -> str:  # KeyError would print the message repr()-quoted
        return str(self.args[0]) if self.args else ""


class Registry(Generic[F]):
    """Maps names to functions of one kind.

    Args:
        kind: what the entries are, for error messages (e.g. "advantage estimator").
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, F] = {}

    def register(self, name: str) -> Callable[[F], F]:
        """Decorator that registers ``fn`` under ``name``; a taken name raises ValueError."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"a {self.kind} name must be a non-empty string, got {name!r}")

        def decorator(fn: F) -> F:
            if name in self._entries:
                taken_by = getattr(self._entries[name], "__qualname__", repr(self._entries[name]))
                raise ValueError(f"{self.kind} {name!r} is already registered (by {taken_by})")
            self._entries[name] = fn
            return fn

        return decorator

    def get(self, name: str) -> F:
        """The entry registered under ``name``; raises `UnknownNameError` listing valid names."""
        try:
            return self._entries[name]
        except KeyError:
            valid = ", ".join(self.names()) or "(none registered)"
            raise UnknownNameError(f"unknown {self.kind} {name!r}; valid: {valid}") from None

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries


_ADVANTAGES: Registry[AdvantageFn] = Registry("advantage estimator")


def register_advantage(name: str) -> Callable[[AdvantageFn], AdvantageFn]:
    """Register an advantage estimator ``(AdvantageInputs, AdvantageConfig) -> AdvantageOutput``."""
    return _ADVANTAGES.register(name)


def get_advantage(name: str) -> AdvantageFn:
    """The estimator registered under ``name`` (UnknownNameError lists the valid names)."""
    return _ADVANTAGES.get(name)


def advantage_names() -> list[str]:
    """Names of all registered advantage estimators, sorted."""
    return _ADVANTAGES.names()
