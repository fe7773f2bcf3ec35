"""The fault matrix's nemesis: the order it heals combined faults in (no cluster needed)."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from .matrix import Nemesis


class _ZooKeeper:
    def __init__(self, healed: list[str]) -> None:
        self.healed = healed

    def start(self) -> None:
        self.healed.append("restart-zookeeper")


class _Cluster:
    def __init__(self, healed: list[str]) -> None:
        self.zookeeper = _ZooKeeper(healed)


class _Recorded(Nemesis):
    """A nemesis whose faults only record their heals."""

    def __init__(self) -> None:
        self.healed: list[str] = []
        super().__init__(_Cluster(self.healed), random.Random(0))  # type: ignore[arg-type]

    def _inject(self, fault: str, hold: float, busy: set[str]) -> tuple[Callable[[], None], float]:
        if fault == "restart-zookeeper":
            return self.cluster.zookeeper.start, 0.0
        return (lambda: self.healed.append(fault)), 0.0


@pytest.mark.parametrize(
    ("faults", "heals"),
    [
        # A restarted broker waits for ZooKeeper only so long: ZooKeeper comes back first.
        ("restart-zookeeper+kill-follower", ["restart-zookeeper", "kill-follower"]),
        ("kill-leader+restart-zookeeper", ["restart-zookeeper", "kill-leader"]),
        ("kill-leader+pause-leader", ["pause-leader", "kill-leader"]),
    ],
)
def test_combined_faults_heal_in_reverse_with_zookeeper_first(faults, heals):
    nemesis = _Recorded()
    nemesis.run(faults, 0.0)
    assert nemesis.healed == heals
