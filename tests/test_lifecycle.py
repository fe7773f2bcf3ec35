"""StartStop: a with block starts and stops, and a start that fails is stopped too."""

from __future__ import annotations

from typing import Self

import pytest

from pyspark_jetstream.lifecycle import StartStop


class Recorded(StartStop):
    def __init__(self, *, failing: bool) -> None:
        self.failing = failing
        self.calls: list[str] = []

    def start(self) -> Self:
        self.calls.append("start")
        if self.failing:
            raise RuntimeError("the second process did not come up")
        return self

    def stop(self) -> None:
        self.calls.append("stop")


def test_a_with_block_starts_then_stops():
    with Recorded(failing=False) as started:
        assert started.calls == ["start"]
    assert started.calls == ["start", "stop"]


def test_a_start_that_fails_is_stopped_and_its_error_raised():
    recorded = Recorded(failing=True)
    with pytest.raises(RuntimeError, match="did not come up"), recorded:
        pass
    assert recorded.calls == ["start", "stop"]
