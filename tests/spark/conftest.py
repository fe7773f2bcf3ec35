"""Stream names for the Spark tests (their broker, ``deployment``, and Spark session are the suite's:
tests/conftest.py)."""

from __future__ import annotations

import itertools

import pytest

_names = itertools.count()


@pytest.fixture
def name():
    """A fresh stream name per test (the broker is shared by the module)."""
    return f"s{next(_names)}"
