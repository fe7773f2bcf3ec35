"""Cluster metadata: brokers, streams, partition leaders, ISR and leader epochs.

:class:`~.base.Coordinator` is the interface; :class:`~.local.LocalCoordinator`
keeps it on disk for a single broker (the embedded default).  The ZooKeeper
implementation (the package :mod:`.zookeeper`) is the only importer of kazoo.
"""
