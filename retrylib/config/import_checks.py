"""The config's references to the user's code ("module:name": the handler, hooks, the
breaker's health check, exception classes) checked by importing them, with the handler's
paths: a name that does not import, or imports as the wrong kind of thing, is a problem.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from retrylib.config.importing import import_object
from retrylib.config.values import Problems


def check_import(
    problems: Problems,
    key: str,
    reference: str,
    paths: tuple[str, ...],
    test: Callable[[Any], bool],
    noun: str,
) -> None:
    """Record a problem unless `reference` imports (with `paths` on sys.path) and passes `test`."""
    try:
        target = import_object(reference, paths)
    except Exception as e:  # importing user code may raise anything; report it, don't crash
        problems.add(
            key,
            f"cannot import {json.dumps(reference)}: {type(e).__name__}: {e}; check the name and "
            f"that its module is under handler.paths {json.dumps(list(paths))}",
        )
        return
    if not test(target):
        problems.add(
            key, f"{json.dumps(reference)} is not {noun}, got {type(target).__name__}; name one"
        )


def check_exception_classes(
    problems: Problems, key: str, references: tuple[str, ...], paths: tuple[str, ...]
) -> None:
    """Each of `references` (the list or table at `key`) must import, with the handler's
    paths, as an exception class."""

    def is_exception_class(target: object) -> bool:
        return isinstance(target, type) and issubclass(target, BaseException)

    for i, reference in enumerate(references):
        where = f"{key}[{i}]" if key == "retry.non_retryable" else f"{key}.{reference}"
        check_import(problems, where, reference, paths, is_exception_class, "an exception class")


def check_callable(problems: Problems, key: str, reference: str, paths: tuple[str, ...]) -> None:
    """`reference` (the value at `key`) must import, with the handler's paths, as a callable."""
    check_import(problems, key, reference, paths, callable, "callable")
