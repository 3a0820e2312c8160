"""The package's public names."""

from __future__ import annotations

import pytest

import retrylib


def test_every_public_name_resolves_and_is_listed() -> None:
    for name in retrylib.__all__:
        assert getattr(retrylib, name).__name__ == name
    assert set(retrylib.__all__) <= set(dir(retrylib))


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = retrylib.nope
