"""A calculator tool that evaluates arithmetic safely: an AST walk, never `eval`."""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from typing import Any

from agentr1.tools.base import tool

_BINOPS: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}
_FUNCS: dict[str, Callable[..., float]] = {
    "sqrt": math.sqrt,
    "abs": abs,
    "round": round,
    "min": min,
    "max": max,
    "log": math.log,
    "exp": math.exp,
}
_CONSTS = {"pi": math.pi, "e": math.e}
MAX_EXPRESSION_CHARS = 200
MAX_MAGNITUDE = 1e100  # keeps `9**9**9`-style inputs from eating the CPU
MAX_ROUND_DIGITS = 400  # past ±400 digits round() changes nothing a float or 1e100 can hold


class CalculatorError(ValueError):
    """An expression the calculator refuses; the message is shown to the model."""


def evaluate(expression: str) -> float | int:
    """Evaluate an arithmetic expression.

    Allowed: numbers, + - * / // % **, parentheses, and sqrt abs round min max log exp,
    pi, e.

    >>> evaluate("2 * (3 + 4) ** 2")
    98
    >>> evaluate("sqrt(16) / 8")
    0.5
    >>> evaluate("__import__('os')")
    Traceback (most recent call last):
    ...
    agentr1.tools.calculator.CalculatorError: unsupported expression: Call to '__import__'
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as e:
        raise CalculatorError(f"not an arithmetic expression: {e.msg}") from None
    value: float | int = _eval(tree.body)
    return value


def _check(x: Any) -> Any:
    if isinstance(x, int | float) and abs(x) > MAX_MAGNITUDE:
        raise CalculatorError("result too large")
    return x


def _check_digits(n: Any) -> None:
    """``round``'s digits: an integer within ±`MAX_ROUND_DIGITS`. ``round(1, -10**99)``
    never returns and ``round(1, -3*10**7)`` holds the interpreter (and its lock) for
    30 s; no timeout can stop a computation that holds the interpreter lock."""
    if isinstance(n, bool) or not isinstance(n, int):
        raise CalculatorError(f"round: digits must be an integer, got {n!r}")
    if abs(n) > MAX_ROUND_DIGITS:
        shown = str(n) if len(str(n)) <= 20 else f"{str(n)[:12]}... ({len(str(n))} digits)"
        raise CalculatorError(f"round: digits must be within ±{MAX_ROUND_DIGITS}, got {shown}")


def _eval(node: ast.AST) -> Any:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        if isinstance(node.value, bool):
            raise CalculatorError("booleans are not numbers here")
        return _check(node.value)
    if isinstance(node, ast.Name) and node.id in _CONSTS:
        return _CONSTS[node.id]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > 1000:
            raise CalculatorError("exponent too large")
        try:
            return _check(_BINOPS[type(node.op)](left, right))
        except ZeroDivisionError:
            raise CalculatorError("division by zero") from None
        except OverflowError:
            raise CalculatorError("result too large") from None
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in _FUNCS
        and not node.keywords
    ):
        args = [_eval(a) for a in node.args]
        if node.func.id == "round" and len(args) == 2:
            _check_digits(args[1])
        try:
            return _check(_FUNCS[node.func.id](*args))
        except (ValueError, TypeError, OverflowError) as e:
            raise CalculatorError(f"{node.func.id}: {e}") from None
    what = type(node).__name__
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        what = f"Call to {node.func.id!r}"
    raise CalculatorError(f"unsupported expression: {what}")


@tool(timeout_s=2.0)
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression and return the number.

    Args:
        expression: arithmetic such as "(1971 - 1934) * 2"; supports + - * / // % **,
            parentheses, sqrt, abs, round, min, max, log, exp, pi and e.
    """
    value = evaluate(expression)
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        value = int(value)
    return str(value)
