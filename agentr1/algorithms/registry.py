"""The advantage-estimator registry, so the trainer picks an estimator in one line.

    out = get_advantage(cfg.estimator)(inputs, cfg)   # every estimator, one signature

``cfg.estimator`` is a registered name or an import path (``my_pkg.adv:my_estimator``),
resolved by the registry mechanism every plug-in kind shares (`agentr1.registry`).

Notation: B = batch rows (trajectories), T = tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from agentr1.registry import Registry, UnknownNameError

if TYPE_CHECKING:  # advantages.py imports this module at run time; types only here
    from agentr1.algorithms.advantages import AdvantageFn

__all__ = [
    "Registry",
    "UnknownNameError",
    "advantage_names",
    "get_advantage",
    "register_advantage",
]

_ADVANTAGES: Registry[AdvantageFn] = Registry("advantage estimator")


def register_advantage(name: str) -> Callable[[AdvantageFn], AdvantageFn]:
    """Register an advantage estimator ``(AdvantageInputs, AdvantageConfig) -> AdvantageOutput``."""
    return _ADVANTAGES.register(name)


def get_advantage(name: str) -> AdvantageFn:
    """The estimator registered under ``name``, or the function an import path names
    (`UnknownNameError` lists the valid names; `agentr1.registry.ImportPathError` says
    which part of a path did not resolve)."""
    fn: AdvantageFn = _ADVANTAGES.resolve(name)
    return fn


def advantage_names() -> list[str]:
    """Names of all registered advantage estimators, sorted."""
    return _ADVANTAGES.names()
