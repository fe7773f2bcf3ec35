"""The ZooKeeper coordinator, in rooms of one job each (see :mod:`.coordinator`); the only
importer of kazoo."""

from .coordinator import ZooKeeperCoordinator

__all__ = ["ZooKeeperCoordinator"]
