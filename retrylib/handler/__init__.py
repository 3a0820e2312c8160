"""How a handler call fails, as retrylib names it: the exceptions `task.handler` raises in
place of what a handler did wrong.

Their qualified names are data: a dead letter records its failure's class as
`retrylib.handler.HandlerTimeout` (say), redrive filters by it, and a config may name one in
`retry.non_retryable` or a dead-letter route. So they keep this module path whatever moves
around them.
"""

from __future__ import annotations


class HandlerTimeout(BaseException):
    """Raised when one handler call (or record hook call) runs longer than
    `handler.timeout`.

    A `BaseException`, as `asyncio.CancelledError` is: a handler that retries its dependency
    in a loop under `except Exception` must not catch it. (Up to 0.2.0 it was an
    `Exception`.)"""


class BadHandlerResult(Exception):
    """Raised when a handler returns something other than a dict, a list of dicts or None,
    or a dict whose keys are not columns of the output schema."""


class HandlerRaisedBaseException(Exception):
    """Raised in place of a BaseException (SystemExit, KeyboardInterrupt, ...) that escaped
    the handler, so that it counts as an ordinary failure."""


class HandlerCrashed(Exception):
    """Raised when a handler call killed the process it ran in (os._exit, a signal, a crash
    in native code)."""
