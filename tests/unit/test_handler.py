"""What a handler call ends in: the failure a record fails with, and the rows it returned,
checked; loading the handler. (How long a call may run: test_call_bounds.py.)"""

from __future__ import annotations

import pytest

from retrylib.handler import BadHandlerResult, HandlerRaisedBaseException, HandlerTimeout
from retrylib.task.handler import as_failure, load_handler, result_rows

COLUMNS = frozenset({"key", "total"})


# -- as_failure: what a record fails with ---------------------------------------------------


@pytest.mark.parametrize(
    ("raised", "message"),
    [
        (SystemExit(3), "handler raised SystemExit: 3"),
        (SystemExit(), "handler raised SystemExit"),
        (KeyboardInterrupt(), "handler raised KeyboardInterrupt"),
        (GeneratorExit("closing"), "handler raised GeneratorExit: closing"),
    ],
)
def test_base_exceptions_become_ordinary_failures(raised, message):
    failure = as_failure(raised)
    assert isinstance(failure, HandlerRaisedBaseException)
    assert str(failure) == message
    assert failure.__cause__ is raised
    assert isinstance(failure, Exception)


def test_a_custom_base_exception_with_an_unprintable_message():
    class Weird(BaseException):
        def __str__(self):
            raise RuntimeError("no")

    assert str(as_failure(Weird())) == "handler raised Weird: <unprintable>"


def test_exceptions_and_the_timeout_are_failures_as_they_are():
    error = ValueError("bad")
    assert as_failure(error) is error
    timeout = HandlerTimeout("handler did not return within 1s")
    assert as_failure(timeout) is timeout


def test_the_timeout_is_not_caught_by_except_exception():
    """As `asyncio.CancelledError`: a handler's `except Exception` lets it through."""
    assert not issubclass(HandlerTimeout, Exception)
    assert issubclass(HandlerTimeout, BaseException)
    assert HandlerTimeout.__module__ + "." + HandlerTimeout.__qualname__ == (
        "retrylib.handler.HandlerTimeout"
    )


# -- result_rows --------------------------------------------------------------------------


def test_results_become_lists_of_rows():
    assert result_rows(None, COLUMNS) == []
    assert result_rows({"key": "a"}, COLUMNS) == [{"key": "a"}]
    assert result_rows([{"key": "a"}, {"total": 1}], COLUMNS) == [{"key": "a"}, {"total": 1}]
    assert result_rows([], COLUMNS) == []


@pytest.mark.parametrize(
    ("result", "message"),
    [
        ("a string", "handler returned str; return a dict, a list of dicts or None"),
        (("a", "tuple"), "handler returned tuple; return a dict, a list of dicts or None"),
        (42, "handler returned int; return a dict, a list of dicts or None"),
        ([{"key": "a"}, "b"], "handler returned a list holding str"),
        ({"key": "a", "nope": 1}, "column(s) ['nope'] not in the output schema ['key', 'total']"),
        ([{"zz": 1, "aa": 2}], "column(s) ['aa', 'zz'] not in the output schema"),
    ],
)
def test_bad_results_are_named(result, message):
    with pytest.raises(BadHandlerResult) as info:
        result_rows(result, COLUMNS)
    assert message in str(info.value)


# -- load_handler -------------------------------------------------------------------------


def test_load_handler_imports_once_and_checks_callable(tmp_path):
    (tmp_path / "unit_handler_mod.py").write_text(
        "calls = 0\ndef h(r):\n    return None\nnot_fn = 3\n"
    )
    first = load_handler("unit_handler_mod:h", [str(tmp_path)])
    assert load_handler("unit_handler_mod:h", [str(tmp_path)]) is first
    with pytest.raises(TypeError, match="is not callable"):
        load_handler("unit_handler_mod:not_fn", [str(tmp_path)])
    with pytest.raises(ImportError):
        load_handler("no_such_module_here:h", [str(tmp_path)])
