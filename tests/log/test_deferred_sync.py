"""A roll's and an interval's fsyncs are paid on the background thread, the manifest first."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from broker_node.log import Log, LogConfig
from broker_node.log.deferred_sync import background
from broker_node.log.manifest import MANIFEST, read_manifest

from .helpers import values


def _recording_fsyncs(monkeypatch) -> list[tuple[str, str]]:
    """Every fsync from now on: ``(thread name, path of the file or directory)``."""
    synced: list[tuple[str, str]] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append((threading.current_thread().name, os.readlink(f"/proc/self/fd/{fd}")))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return synced


def _drained() -> None:
    background().submit(lambda: None).result()  # one thread, in submission order


def test_a_roll_made_by_an_append_syncs_nothing_on_the_appending_thread(tmp_path: Path, monkeypatch):
    with Log.open(tmp_path, LogConfig(segment_bytes=4_000)) as log:
        log.append(values(1))
        _drained()
        synced = _recording_fsyncs(monkeypatch)
        for _ in range(20):  # several rolls
            log.append(values(5))
        assert len(log._segments) > 2
        _drained()
        assert synced, "a roll owes the manifest's fsync and its directory's"
        assert {name for name, _ in synced} == {"log-sync_0"}
        assert str(tmp_path / MANIFEST) in [path for _, path in synced]
        assert str(tmp_path) in [path for _, path in synced]
        assert read_manifest(tmp_path) == [s.base_offset for s in log._segments]


def test_under_interval_a_sealed_segment_is_synced_after_the_manifest_listing_its_successor(
    tmp_path: Path, monkeypatch
):
    config = LogConfig(segment_bytes=4_000, fsync="interval", fsync_interval=3600.0)
    with Log.open(tmp_path, config) as log:
        log.append(values(1))
        _drained()
        synced = _recording_fsyncs(monkeypatch)
        first = log._segments[0]
        while len(log._segments) == 1:
            log.append(values(5))
        _drained()
        paths = [path for _, path in synced]
        assert {name for name, _ in synced} == {"log-sync_0"}
        assert paths.index(str(tmp_path / MANIFEST)) < paths.index(str(first.path))
        assert str(first.offset_index_path) in paths


def test_closing_pays_what_is_owed(tmp_path: Path, monkeypatch):
    log = Log.open(tmp_path, LogConfig(segment_bytes=4_000))
    log.append(values(1))
    _drained()
    gate = threading.Event()
    background().submit(gate.wait, 30)  # the background thread is busy: the roll's debt waits
    try:
        while len(log._segments) == 1:
            log.append(values(5))
        assert log._deferred.owed
        synced = _recording_fsyncs(monkeypatch)
        log.close()
        assert not log._deferred.owed
        assert str(tmp_path / MANIFEST) in [path for _, path in synced]
    finally:
        gate.set()
        _drained()
