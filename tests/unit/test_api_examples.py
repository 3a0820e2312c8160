"""The examples in the public names' docstrings: each name has one, and each runs as written
(but for the lines marked +SKIP, which would start Spark)."""

from __future__ import annotations

import doctest
import inspect
import sys

import pytest

from retrylib import errors, job, record
from retrylib.task import hooks

# Where a user reads about each name; the hooks are the user's own functions, described in
# the module that calls them.
DOCUMENTED = {
    "Record": record.Record,
    "NonRetryable": errors.NonRetryable,
    "RetryAfter": errors.RetryAfter,
    "Skip": errors.Skip,
    "run": job.run,
    "hooks": hooks,
}
MODULES = sorted({inspect.getmodule(documented).__name__ for documented in DOCUMENTED.values()})


@pytest.mark.parametrize(("name", "documented"), DOCUMENTED.items(), ids=list(DOCUMENTED))
def test_each_public_name_has_an_example(name: str, documented: object) -> None:
    [docstring] = doctest.DocTestFinder(recurse=False).find(documented, name)
    assert docstring.examples


@pytest.mark.parametrize("module", MODULES)
def test_the_examples_run_as_written(module: str) -> None:
    failed, attempted = doctest.testmod(sys.modules[module])  # reports failures on stdout
    assert attempted and not failed
