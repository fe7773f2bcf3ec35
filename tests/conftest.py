"""Settings for the whole suite."""

from __future__ import annotations

from hypothesis import settings

# Examples are checked for results, not speed: on a loaded CI machine one slow
# example must not fail a test (timings are the benchmarks' business).
settings.register_profile("suite", deadline=None)
settings.load_profile("suite")
