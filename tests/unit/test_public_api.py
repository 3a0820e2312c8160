"""The package's public names: what `retrylib/__init__.py` promises a user."""

from __future__ import annotations

import subprocess
import sys

import pytest

import retrylib
from retrylib import errors
from retrylib.config.loader import load_config
from retrylib.job import run
from retrylib.record import Record

PUBLIC = {
    "ConfigError": errors.ConfigError,
    "NonRetryable": errors.NonRetryable,
    "Record": Record,
    "RetryAfter": errors.RetryAfter,
    "RetrylibError": errors.RetrylibError,
    "Skip": errors.Skip,
    "TopicError": errors.TopicError,
    "load_config": load_config,
    "run": run,
}


def test_all_lists_exactly_the_public_names() -> None:
    assert sorted(retrylib.__all__) == sorted(PUBLIC)


@pytest.mark.parametrize(("name", "home"), PUBLIC.items())
def test_each_public_name_is_the_object_of_its_home_module(name: str, home: object) -> None:
    assert getattr(retrylib, name) is home


def test_a_star_import_gives_the_public_names() -> None:
    namespace: dict[str, object] = {}
    exec("from retrylib import *", namespace)
    assert {name: namespace[name] for name in PUBLIC} == PUBLIC


def test_importing_the_package_imports_none_of_its_modules() -> None:
    # Every Spark Python worker imports the package; the names load on first use.
    script = (
        "import sys, retrylib\nprint(sorted(m for m in sys.modules if m.startswith('retrylib.')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]"


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = retrylib.nope
