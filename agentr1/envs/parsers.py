"""Turn parsers: agent text -> tool calls, parse errors and the final answer.

The default is the Hermes / Qwen format::

    <tool_call>{"name": "search", "arguments": {"query": "Velmora"}}</tool_call>
    <answer>Port Azel</answer>

Several calls per turn are allowed. Parsers never raise on model output: every malformed
piece becomes a `ParseError` that the env turns into a tool message and a metric.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from typing import Protocol

from agentr1.types import ToolCall


@dataclass(frozen=True)
class ParseError:
    """One malformed piece of an agent turn.

    Attributes:
        kind: "malformed_json", "not_an_object", "missing_name", "bad_arguments",
            "unclosed_tag", "nested_tag", "too_many_calls", or "parser_error" (a parser
            raised: `ToolEnv.step` makes that a parse error too).
        raw: the offending text (truncated for logs).
        message: what the model is told, naming what is expected.
    """

    kind: str
    raw: str
    message: str


@dataclass
class ParsedTurn:
    """What one agent turn contains.

    Attributes:
        calls: well-formed tool calls, in order.
        errors: malformed calls or tags.
        answer: final answer text (stripped) if the turn gave one, else None.
    """

    calls: list[ToolCall] = field(default_factory=list)
    errors: list[ParseError] = field(default_factory=list)
    answer: str | None = None


class TurnParser(Protocol):
    """Anything that can read an agent turn."""

    def parse(self, text: str, turn_index: int = 0) -> ParsedTurn: ...


THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def strip_think(text: str) -> str:
    """``text`` without its ``<think>...</think>`` blocks (each from an opening tag to the
    next closing tag; an unclosed one is kept). One pass, linear in the text: a regex
    search restarts at every opening tag, quadratic on ``"<think>" * 30000``.

    >>> strip_think("a<think>x</think>b<think>y")
    'ab<think>y'
    """
    out, pos = [], 0
    while (start := text.find(THINK_OPEN, pos)) >= 0:
        end = text.find(THINK_CLOSE, start + len(THINK_OPEN))
        if end < 0:
            break
        out.append(text[pos:start])
        pos = end + len(THINK_CLOSE)
    out.append(text[pos:])
    return "".join(out)


def _load_json(text: str) -> object:
    """`json.loads` that reports what model output can make it raise besides a syntax
    error: an integer of more digits than Python converts (`ValueError`) and nesting
    deeper than the interpreter recurses (`RecursionError`), each as a
    `json.JSONDecodeError` with a message the model can read."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply", text[:200], 0) from None
    except ValueError as e:  # "Exceeds the limit (4300 digits) for integer string conversion"
        raise json.JSONDecodeError(f"a number too large ({str(e)[:80]})", text[:200], 0) from None


def search_call(query: str) -> str:
    """One search call as `HermesParser` reads it; non-ASCII kept as is, so a model copies
    names verbatim instead of learning JSON escapes.

    >>> search_call("Alû")
    '<tool_call>{"name": "search", "arguments": {"query": "Alû"}}</tool_call>'
    """
    call = {"name": "search", "arguments": {"query": query}}
    return f"<tool_call>{json.dumps(call, ensure_ascii=False)}</tool_call>"


def _clip(s: str, n: int = 200) -> str:
    return s if len(s) <= n else s[:n] + "..."


def _unclosed(open_tag: str, close_tag: str, rest: str) -> ParseError:
    return ParseError(
        "unclosed_tag", _clip(rest), f"Error: {open_tag} was not closed with {close_tag}."
    )


@dataclass
class HermesParser:
    """`<tool_call>{json}</tool_call>` calls and an `<answer>...</answer>` final answer.

    Attributes:
        max_calls: calls beyond this many in one turn become "too_many_calls" errors.
        call_open, call_close, answer_open, answer_close: the tags.
    """

    max_calls: int = 4
    call_open: str = "<tool_call>"
    call_close: str = "</tool_call>"
    answer_open: str = "<answer>"
    answer_close: str = "</answer>"

    def parse(self, text: str, turn_index: int = 0) -> ParsedTurn:
        """Parse one turn; reasoning inside ``<think>...</think>`` is ignored.

        >>> p = HermesParser().parse('<tool_call>{"name": "s", "arguments": {"q": 1}}</tool_call>')
        >>> p.calls[0].name, p.calls[0].arguments, p.errors, p.answer
        ('s', {'q': 1}, [], None)
        >>> HermesParser().parse("So: <answer> Paris </answer>").answer
        'Paris'
        """
        out = ParsedTurn()
        text = strip_think(text)
        outside: list[str] = []  # the text outside tool-call blocks, where answers are read
        pos = 0
        while True:
            start = text.find(self.call_open, pos)
            if start < 0:
                break
            outside.append(text[pos:start])
            body_start = start + len(self.call_open)
            end = text.find(self.call_close, body_start)
            if end < 0:
                out.errors.append(_unclosed(self.call_open, self.call_close, text[start:]))
                pos = len(text)
                break
            body = text[body_start:end]
            pos = end + len(self.call_close)
            if self.call_open in body:
                out.errors.append(
                    ParseError(
                        "nested_tag",
                        _clip(text[start:pos]),
                        f"Error: {self.call_open} blocks cannot be nested.",
                    )
                )
                continue
            if len(out.calls) >= self.max_calls:
                out.errors.append(
                    ParseError(
                        "too_many_calls",
                        _clip(body),
                        f"Error: at most {self.max_calls} tool calls per turn; this one was skipped.",
                    )
                )
                continue
            call, err = self._call(body, turn_index, len(out.calls))
            if err is not None:
                out.errors.append(err)
            elif call is not None:
                out.calls.append(call)
        outside.append(text[pos:])
        # An <answer> tag inside a call's arguments is data of the call, not the answer.
        out.answer = self._answer("".join(outside), out)
        return out

    def _call(self, body: str, turn: int, index: int) -> tuple[ToolCall | None, ParseError | None]:
        expected = 'expected {"name": <tool name>, "arguments": {<argument>: <value>}}'
        try:
            obj = _load_json(body.strip())
        except json.JSONDecodeError as e:
            return None, ParseError(
                "malformed_json",
                _clip(body),
                f"Error: the tool call is not valid JSON ({e.msg}); {expected}.",
            )
        if not isinstance(obj, dict):
            return None, ParseError("not_an_object", _clip(body), f"Error: {expected}.")
        name = obj.get("name")
        if not isinstance(name, str) or not name.strip():
            return None, ParseError(
                "missing_name", _clip(body), f"Error: missing tool name; {expected}."
            )
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):  # some models double-encode the arguments
            with contextlib.suppress(json.JSONDecodeError):
                args = _load_json(args) if args.strip() else {}
        if not isinstance(args, dict):
            return None, ParseError(
                "bad_arguments",
                _clip(body),
                f'Error: "arguments" must be a JSON object; {expected}.',
            )
        return ToolCall(
            name=name.strip(), arguments=args, id=f"call_{turn}_{index}", raw=body
        ), None

    def _answer(self, text: str, out: ParsedTurn) -> str | None:
        start = text.rfind(self.answer_open)
        if start < 0:
            return None
        end = text.find(self.answer_close, start)
        if end < 0:
            out.errors.append(_unclosed(self.answer_open, self.answer_close, text[start:]))
            return None
        return text[start + len(self.answer_open) : end].strip()
