"""Resolving "module:attribute" references from config (handlers, exception classes)."""

from __future__ import annotations

import builtins
import importlib
import sys
from collections.abc import Iterable


def import_object(spec: str, search_paths: Iterable[str] = ()) -> object:
    """Import `spec`, written "package.module:attribute" (or a builtin name such as "ValueError").

    `search_paths` are put at the front of `sys.path` first. Raises `ImportError` naming the
    module, or `AttributeError` naming the attribute, when the reference does not resolve.
    """
    for path in reversed(list(search_paths)):
        if path not in sys.path:
            sys.path.insert(0, path)
    module_name, sep, attribute = spec.partition(":")
    if not sep:
        if hasattr(builtins, spec):
            return getattr(builtins, spec)
        raise ImportError(f"{spec!r} is not a builtin; write it as 'module:name'")
    if not module_name or not attribute:
        raise ImportError(f"{spec!r} must look like 'module:name'")
    module = importlib.import_module(module_name)
    target: object = module
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError as e:
            raise AttributeError(f"module {module_name!r} has no attribute {attribute!r}") from e
    return target
