"""Settings for the whole suite."""

from __future__ import annotations

import os

from hypothesis import settings

# Stored metadata with fields nobody reads is an error in tests (brokers started
# by the tests inherit this); production brokers ignore such fields.
os.environ["JETSTREAM_STRICT_WIRE"] = "1"

# Examples are checked for results, not speed: on a loaded CI machine one slow
# example must not fail a test (timings are the benchmarks' business).
settings.register_profile("suite", deadline=None)
settings.load_profile("suite")


def pytest_collection_modifyitems(items: list) -> None:
    """Tests marked ``slow`` (whole modules of a minute or more) run first: with ``make test``'s
    workers (pytest-xdist) the long ones start at once instead of ending the run alone."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
