"""Loading the user's handler, and what its calls end in: the failure a record fails with,
and the rows it returned, checked.

Everything a handler can do wrong becomes a failure here, so the caller routes the record
to retry or the dead letter instead of crashing the task: raising anything (also
`SystemExit` or `KeyboardInterrupt` raised inside the handler), or returning rows that do
not fit the output schema. How long a call may run is `task.call_bounds`'.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from retrylib.config.importing import import_object
from retrylib.handler import BadHandlerResult, HandlerRaisedBaseException, HandlerTimeout
from retrylib.record import Record

Handler = Callable[[Record], Any]

_loaded: dict[tuple[str, tuple[str, ...]], Handler] = {}


def load_handler(spec: str, paths: Sequence[str] = ()) -> Handler:
    """Import the handler `spec` ("module:function") once per process; raises on failure."""
    cache_key = (spec, tuple(paths))
    if cache_key not in _loaded:
        handler = import_object(spec, paths)
        if not callable(handler):
            raise TypeError(f"handler {spec!r} is not callable")
        _loaded[cache_key] = handler
    return _loaded[cache_key]


Failure = Exception | HandlerTimeout
"""What a record fails with: an `Exception`, or the `HandlerTimeout` of a call past its
limit (a `BaseException`, so that a handler's `except Exception` does not catch it)."""


def as_failure(raised: BaseException) -> Failure:
    """What a handler raised, as the exception its record fails with: an Exception or a
    `HandlerTimeout` as it is, any other BaseException (SystemExit, KeyboardInterrupt, ...)
    as a `HandlerRaisedBaseException` naming it."""
    if isinstance(raised, (Exception, HandlerTimeout)):
        return raised
    detail = _text(raised)
    failure = HandlerRaisedBaseException(
        f"handler raised {type(raised).__name__}" + (f": {detail}" if detail else "")
    )
    failure.__cause__ = raised
    return failure


def _text(error: BaseException) -> str:
    try:
        return str(error)
    except Exception:
        return "<unprintable>"


def result_rows(result: Any, columns: frozenset[str]) -> list[dict[str, Any]]:
    """The output rows of one handler call: None -> [], dict -> [dict], list of dicts as is.

    Raises `BadHandlerResult` naming the problem when the result has another type or a row
    has a key that is not an output column (a missing key becomes a null).
    """
    if result is None:
        return []
    rows = [result] if isinstance(result, dict) else result
    if not isinstance(rows, list):
        raise BadHandlerResult(
            f"handler returned {type(result).__name__}; return a dict, a list of dicts or None"
        )
    for row in rows:
        if not isinstance(row, dict):
            raise BadHandlerResult(f"handler returned a list holding {type(row).__name__}")
        unknown = row.keys() - columns
        if unknown:
            raise BadHandlerResult(
                f"handler returned column(s) {sorted(unknown)} not in the output schema "
                f"{sorted(columns)}"
            )
    return rows
