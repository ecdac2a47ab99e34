"""Typed dataclass configs from YAML plus ``a.b=value`` overrides, validated once.

`build(cls, data, source)` turns nested dicts into nested dataclasses, checking every key
and type; errors name the source (file or override) and the dotted field, and list the
valid keys. `to_dict` goes back (for ``config.yaml`` in the run directory).
"""

from __future__ import annotations

import dataclasses
import keyword
import re
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")
_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)")


class ConfigError(ValueError):
    """A config value that is missing, unknown or of the wrong type."""


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping of {tp.__name__} fields, got {value!r}")
        return build(tp, value, where)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, where)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(
            errors[0] if len(errors) == 1 else f"{where}: {value!r} matches none of {tp}"
        )
    if origin is typing.Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise ConfigError(f"{where}: {value!r} is not one of {list(allowed)}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        args = typing.get_args(tp)
        item = args[0] if args else Any
        out = [_coerce(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(out) if origin is tuple else out
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return dict(value)
    if tp is Any:
        return value
    if tp is float:
        if isinstance(value, str) and _NUMBER.fullmatch(value.strip()):
            return float(value)  # "1e-3" in a YAML file: YAML 1.1 leaves it a string
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {value!r}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    if isinstance(tp, type) and not isinstance(value, tp):
        raise ConfigError(f"{where}: expected {_type_name(tp)}, got {value!r}")
    return value


def field_key(name: str) -> str:
    """The YAML key of dataclass field ``name``: a field named after a Python keyword
    carries a trailing underscore in Python (``async_``), none in a recipe (``async``)."""
    bare = name[:-1] if name.endswith("_") else name
    return bare if keyword.iskeyword(bare) else name


def build(cls: type[T], data: dict[str, Any], where: str = "") -> T:
    """Construct dataclass ``cls`` from a (nested) dict; unknown keys are errors."""
    hints = typing.get_type_hints(cls)
    fields = {field_key(f.name): f for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    kwargs = {}
    for key, value in data.items():
        path = f"{where}.{key}" if where else key
        if key not in fields:
            raise ConfigError(
                f"{path}: unknown field; valid fields of {cls.__name__}: {', '.join(sorted(fields))}"
            )
        f = fields[key]
        key = f.name
        if isinstance(value, dict) and f.default_factory is not dataclasses.MISSING:
            # A partial section overrides the field's own default, not the class defaults
            # of its type (e.g. Config.rollout's defaults differ from RolloutConfig's).
            default = f.default_factory()
            if dataclasses.is_dataclass(default):
                value = _merge(default, value)
        kwargs[key] = _coerce(value, hints[key], path)
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"{where or cls.__name__}: {e}") from None


def _merge(default: Any, top: dict[str, Any]) -> dict[str, Any]:
    """``top`` over the dict form of dataclass ``default``: nested dataclass sections merge
    field by field; any other value in ``top`` (a dict-valued field included, e.g. a map of
    eval splits) replaces the default whole, so a recipe can drop default entries."""
    out = {
        field_key(f.name): to_dict(getattr(default, f.name)) for f in dataclasses.fields(default)
    }
    names = {field_key(f.name): f.name for f in dataclasses.fields(default)}
    for k, v in top.items():
        sub = getattr(default, names.get(k, k), None)
        nested = isinstance(v, dict) and dataclasses.is_dataclass(sub) and not isinstance(sub, type)
        out[k] = _merge(sub, v) if nested else v
    return out


def to_dict(obj: Any) -> Any:
    """Dataclass tree -> plain dicts/lists (tuples become lists), for YAML."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {field_key(f.name): to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, list | tuple):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def apply_override(data: dict[str, Any], override: str) -> None:
    """Apply one ``a.b.c=value`` override in place (the value is parsed as YAML)."""
    if "=" not in override:
        raise ConfigError(f"override {override!r}: expected the form section.field=value")
    key, raw = override.split("=", 1)
    parts = key.strip().split(".")
    if not all(parts):
        raise ConfigError(f"override {override!r}: empty field name")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as e:
        raise ConfigError(f"override {override!r}: value is not valid YAML: {e}") from None
    if isinstance(value, str) and _NUMBER.fullmatch(value.strip()):
        value = float(value)  # YAML 1.1 reads "1e-3" as a string; users mean a number
    node = data
    for p in parts[:-1]:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {override!r}: {p} is not a section")
    node[parts[-1]] = value


def load(cls: type[T], path: str | Path | None = None, overrides: list[str] | None = None) -> T:
    """Load ``cls`` from a YAML file (optional) plus overrides; errors name their source."""
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.exists():
            raise ConfigError(f"{p}: no such recipe file")
        try:
            loaded = yaml.safe_load(p.read_text(encoding="utf-8"))
        except yaml.YAMLError as e:
            raise ConfigError(f"{p}: not valid YAML: {e}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{p}: the top level must be a mapping of sections")
        data = loaded or {}
    for o in overrides or []:
        apply_override(data, o)
    try:
        return build(cls, data)
    except ConfigError as e:
        src = f"{path}" if path else "config"
        raise ConfigError(f"{src}: {e}") from None
