"""The default system prompt, built from the task's tools (not a search-only sentence).

`default_system_prompt(tools, listed)` says how to call a tool in the default turn format
(Hermes / Qwen ``<tool_call>{...}</tool_call>``, answers in ``<answer>...</answer>``) and,
unless the chat template already renders the tools' JSON schemas (``listed=False``: the
Qwen2.5 template's ``tools=`` block), lists each tool with its parameters. Imports no torch.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

AUTO = "auto"
"""``system_prompt: auto``: build the system message from the tools (`default_system_prompt`)."""


def _signature(parameters: dict[str, Any]) -> str:
    """``name: type, ...`` of a JSON schema's properties (optional ones marked ``?``).

    >>> _signature({"properties": {"q": {"type": "string"}, "k": {"type": "integer"}},
    ...             "required": ["q"]})
    'q: string, k?: integer'
    """
    props = parameters.get("properties", {})
    required = set(parameters.get("required", []))
    return ", ".join(
        f"{name}{'' if name in required else '?'}: {spec.get('type', 'any')}"
        for name, spec in props.items()
    )


def default_system_prompt(tools: Sequence[Any], listed: bool = True) -> str:
    """The system message for an agent with ``tools`` (each has ``name``, ``description``
    and a JSON-schema ``parameters``).

    Args:
        tools: the tools the agent may call (none: it only answers).
        listed: list the tools in the message; False when the chat template renders
            their schemas itself.

    >>> print(default_system_prompt([]))
    Answer the question. Give the final answer as <answer>...</answer>.
    """
    if not tools:
        return "Answer the question. Give the final answer as <answer>...</answer>."
    first = tools[0]
    example_args = {k: "..." for k in list(first.parameters.get("properties", {}))[:1]}
    example = json.dumps({"name": first.name, "arguments": example_args})
    lines = [
        "Answer the question. You can call tools: write "
        f"<tool_call>{example}</tool_call> and read the result that comes back. Call them "
        "as often as you need, then give the final answer as <answer>...</answer>."
    ]
    if listed:
        lines.append("Tools:")
        lines += [f"- {t.name}({_signature(t.parameters)}): {t.description}" for t in tools]
    return "\n".join(lines)


def resolve_system_prompt(
    prompt: str | None, tools: Sequence[Any], listed: bool = True
) -> str | None:
    """``prompt`` itself, or the default one when it is `AUTO`; None or "" = no system
    message."""
    if prompt == AUTO:
        return default_system_prompt(tools, listed)
    return prompt or None
