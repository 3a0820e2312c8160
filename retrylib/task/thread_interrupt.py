"""Interrupting a user call that runs in a thread other than the main one.

SIGALRM reaches only a process's main thread, so a call on a lane (`task.lanes`) or in a
driver thread (`task.bounded_call`) is interrupted by an asynchronous exception instead:
CPython raises it in the thread when the thread next runs Python code. Like SIGALRM it
cannot reach a call waiting in C code until that returns, and a call that catches
`BaseException` goes on; each caller says what it does then.

The exception is raised with no arguments (the interpreter instantiates the class), so the
caller keeps the message it gives the record's failure itself.
"""

from __future__ import annotations

import ctypes

from retrylib.handler import HandlerTimeout

_set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
_set_async_exc.argtypes = (ctypes.c_ulong, ctypes.py_object)
_set_async_exc.restype = ctypes.c_int


def interrupt_thread(ident: int) -> bool:
    """Raise `HandlerTimeout` in the thread `ident` when it next runs Python code; False
    when no such thread runs."""
    return _set_async_exc(ident, HandlerTimeout) == 1


def landing() -> None:
    """Nothing, called where an interrupt sent just before a call ended must land: the call
    of a Python function is where CPython raises an asynchronous exception it has pending."""
