"""One registry mechanism for every plug-in kind: tasks, tools, rewards, advantage estimators.

A recipe names a part either by its registered name or by where its code is:

    task.name: world                          # a registered name
    task.name: my_pkg.tasks:make_task         # an import path, module:attribute
    task.name: my_pkg.tasks.make_task         # the same, with a dot before the attribute
    task.name: units_task.py                  # a Python file (next to the recipe, or cwd),
    task.name: units_task.py:make_task        #   with its default attribute or a named one

`Registry.resolve(ref)` does all of it; every failure is one line that says what was
wrong and what is valid (`UnknownNameError` for a name, `ImportPathError` for a path).
Built-in entries may be declared lazily (``builtins={"world": "agentr1.tasks.world:make_task"}``)
so that importing the registry imports none of them. Imports no torch.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Generic, TypeVar

T = TypeVar("T")

PATH_HINT = "or an import path such as 'my_pkg.module:name' or a file 'my_file.py:name'"


class UnknownNameError(KeyError, ValueError):
    """A name that is not registered. Both ``except KeyError`` and ``except ValueError``
    catch it; the message lists the valid names, sorted."""

    def __str__(self) -> str:  # KeyError would print the message repr()-quoted
        return str(self.args[0]) if self.args else ""


class ImportPathError(ValueError):
    """An import path or file reference that does not resolve (module, file or attribute)."""


def is_reference(ref: str) -> bool:
    """Whether ``ref`` is an import path or a file rather than a registered name.

    >>> [is_reference(r) for r in ("grpo", "pkg.mod:fn", "pkg.mod.fn", "t.py", "a/b.py:f")]
    [False, True, True, True, True]
    """
    return ":" in ref or "." in ref or "/" in ref


def split_file_ref(ref: str) -> tuple[str, str | None] | None:
    """(file, attribute or None) when ``ref`` names a ``.py`` file, else None.

    >>> split_file_ref("tasks/units.py:make"), split_file_ref("units.py"), split_file_ref("a.b:c")
    (('tasks/units.py', 'make'), ('units.py', None), None)
    """
    head, sep, attr = ref.rpartition(":")
    if sep and head.endswith(".py"):
        return head, attr or None
    if ref.endswith(".py"):
        return ref, None
    return None


def load_file_module(path: Path) -> Any:
    """Import a Python file as a module (once per file content; kept in ``sys.modules``
    so that dataclasses and pickling inside it work)."""
    text = path.read_bytes()
    digest = hashlib.sha256(str(path).encode() + b"\0" + text).hexdigest()[:12]
    name = f"agentr1_user_{path.stem}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportPathError(f"{path}: cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[name]
        line = _error_line(e, path)
        raise ImportPathError(f"importing {path} failed{line}: {type(e).__name__}: {e}") from e
    return module


def _error_line(e: BaseException, path: Path) -> str:
    """' (line N)' of the innermost frame of ``e`` that is in ``path``, or ''."""
    if isinstance(e, SyntaxError) and e.lineno:
        return f" (line {e.lineno})"
    tb, line = e.__traceback__, None
    while tb is not None:
        if Path(tb.tb_frame.f_code.co_filename) == path:
            line = tb.tb_lineno
        tb = tb.tb_next
    return f" (line {line})" if line else ""


def _public_names(module: Any) -> str:
    names = sorted(n for n in vars(module) if not n.startswith("_"))
    return ", ".join(names[:12]) + (", ..." if len(names) > 12 else "") or "nothing public"


def import_object(
    ref: str,
    kind: str,
    base_dirs: Iterable[Path] = (),
    default_attr: str | None = None,
) -> Any:
    """The object an import path or file reference names.

    Args:
        ref: ``module:attr``, ``module.attr``, ``file.py`` or ``file.py:attr``.
        kind: what is looked up, for messages ("task", "tool", ...).
        base_dirs: where a relative file is looked for first (then the current directory).
        default_attr: the attribute a bare module or file reference means.

    Raises:
        ImportPathError: one line naming the reference and what did not resolve.
    """
    file_ref = split_file_ref(ref)
    if file_ref is not None:
        file, attr = file_ref
        candidates = [Path(file).expanduser()]
        if not candidates[0].is_absolute():
            candidates = [Path(d) / file for d in base_dirs] + [Path.cwd() / file]
        found = next((p.resolve() for p in candidates if p.is_file()), None)
        if found is None:
            where = ", ".join(str(p.parent) for p in candidates)
            raise ImportPathError(f"{kind} {ref!r}: no such file (looked in {where})")
        module = load_file_module(found)
        origin = str(found)
    else:
        if ":" in ref:
            mod_name, attr_part = ref.split(":", 1)
            attr = attr_part or None
        elif "." in ref:
            mod_name, attr = ref.rsplit(".", 1)
        else:
            mod_name, attr = ref, None
        try:
            module = importlib.import_module(mod_name)
        except ModuleNotFoundError as e:
            raise ImportPathError(
                f"{kind} {ref!r}: cannot import module {mod_name!r} ({e})"
            ) from None
        except Exception as e:
            raise ImportPathError(
                f"{kind} {ref!r}: importing {mod_name!r} failed: {type(e).__name__}: {e}"
            ) from e
        origin = mod_name
    attr = attr or default_attr
    if attr is None:
        raise ImportPathError(f"{kind} {ref!r}: name the object too, e.g. '{ref}:my_{kind}'")
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ImportPathError(
                f"{kind} {ref!r}: {origin} has no attribute {attr!r} "
                f"(it defines: {_public_names(module)})"
            )
        obj = getattr(obj, part)
    return obj


class Registry(Generic[T]):
    """Maps names to entries of one kind, with lazy built-ins and import-path references.

    Args:
        kind: what the entries are, for messages (e.g. "advantage estimator").
        builtins: name -> ``"module:attr"`` entries imported on first use.
        default_attr: the attribute a bare module or file reference means (e.g.
            ``"make_task"``: ``task.name: units.py`` is ``units.py:make_task``).
    """

    def __init__(
        self,
        kind: str,
        builtins: Mapping[str, str] | None = None,
        default_attr: str | None = None,
    ) -> None:
        self.kind = kind
        self.default_attr = default_attr
        self._entries: dict[str, T] = {}
        self._lazy: dict[str, str] = dict(builtins or {})

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator that registers an entry under ``name``; a taken name raises ValueError
        naming what holds it."""
        if not isinstance(name, str) or not name or is_reference(name):
            raise ValueError(
                f"a {self.kind} name must be a non-empty string without '.', ':' or '/', "
                f"got {name!r}"
            )

        def decorator(entry: T) -> T:
            where = f"{getattr(entry, '__module__', '')}:{getattr(entry, '__qualname__', '')}"
            if self._lazy.get(name) == where:  # a built-in registering itself on import
                del self._lazy[name]
                self._entries[name] = entry
                return entry
            if name in self._entries or name in self._lazy:
                held = self._entries.get(name, self._lazy.get(name))
                taken_by = getattr(held, "__qualname__", None) or repr(held)
                raise ValueError(f"{self.kind} {name!r} is already registered (by {taken_by})")
            self._entries[name] = entry
            return entry

        return decorator

    def add(self, name: str, entry: T) -> T:
        """`register` without the decorator."""
        return self.register(name)(entry)

    def get(self, name: str) -> T:
        """The entry registered under ``name``; raises `UnknownNameError` listing valid names."""
        if name in self._entries:
            return self._entries[name]
        if name in self._lazy:
            entry: T = import_object(self._lazy[name], self.kind)
            # The import may have registered it already (`register` on a built-in).
            self._entries.setdefault(name, entry)
            self._lazy.pop(name, None)
            return self._entries[name]
        valid = ", ".join(self.names()) or "(none registered)"
        raise UnknownNameError(f"unknown {self.kind} {name!r}; valid: {valid}")

    def resolve(self, ref: str, base_dirs: Iterable[Path] = ()) -> Any:
        """A registered name, or else an import path / file (`import_object`).

        Raises:
            UnknownNameError: a plain name that is not registered (valid names listed).
            ImportPathError: a path that does not resolve.
        """
        if not isinstance(ref, str) or not ref:
            raise UnknownNameError(
                f"{self.kind}: expected a name or import path, got {ref!r}; "
                f"valid: {', '.join(self.names())}, {PATH_HINT}"
            )
        if not is_reference(ref):
            try:
                return self.get(ref)
            except UnknownNameError:
                valid = ", ".join(self.names()) or "(none registered)"
                raise UnknownNameError(
                    f"unknown {self.kind} {ref!r}; valid: {valid}, {PATH_HINT}"
                ) from None
        return import_object(ref, self.kind, base_dirs, self.default_attr)

    def names(self) -> list[str]:
        """Registered names (built-ins included), sorted."""
        return sorted({*self._entries, *self._lazy})

    def __contains__(self, name: object) -> bool:
        return name in self._entries or name in self._lazy
