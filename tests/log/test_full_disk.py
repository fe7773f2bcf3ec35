"""A full disk: a clean log opens and serves without writing, and close says what it could not do."""

from __future__ import annotations

import pytest

from broker_node.log import FsyncPolicy, Log, LogClosedError, LogConfig, LogStorageError

from .helpers import FakeClock, fill_the_disk, open_files_under, rows, values

SEGMENT_SIZES = [4_000, 64_000, 1_000_000]


@pytest.mark.parametrize("segment_bytes", SEGMENT_SIZES)
def test_a_clean_log_opens_reads_and_closes_on_a_full_disk(tmp_path, monkeypatch, segment_bytes):
    config = LogConfig(segment_bytes=segment_bytes)
    with Log.open(tmp_path, config) as log:
        for i in range(40):
            log.append(values(5, start=5 * i))
        log.assign_leader_epoch(2)
        log.append(values(3))
        log.high_watermark = 150
        expected = rows(log)
    fill_the_disk(monkeypatch)
    log = Log.open(tmp_path, config)  # nothing is damaged: nothing needs writing
    assert rows(log) == expected
    assert (log.high_watermark, log.leader_epochs) == (150, ((0, 0), (2, 200)))
    log.close()  # nothing changed since the open: nothing to flush either
    assert open_files_under(tmp_path) == []


def test_a_failed_append_on_a_full_disk_leaves_a_log_that_reopens_there(tmp_path, monkeypatch):
    with Log.open(tmp_path) as log:
        log.append(values(10))
    log = Log.open(tmp_path)
    fill_the_disk(monkeypatch)
    with pytest.raises(LogStorageError, match="No space left"):
        log.append(values(1))
    log.close()  # the failed append was cut back: nothing is left to flush
    with Log.open(tmp_path) as reopened:  # the disk is still full
        assert [r[0] for r in rows(reopened)] == list(range(10))
    assert open_files_under(tmp_path) == []


@pytest.mark.parametrize("fsync", [FsyncPolicy.NEVER, FsyncPolicy.ALWAYS])
def test_close_on_a_full_disk_releases_everything_and_names_what_failed(tmp_path, monkeypatch, fsync):
    clock = FakeClock()
    config = LogConfig(segment_bytes=4_000, fsync=fsync, high_watermark_checkpoint_interval=3600)
    log = Log.open(tmp_path, config, clock=clock)
    for i in range(30):
        log.append(values(5, start=5 * i))
    log.high_watermark = 100  # not checkpointed yet: within the interval
    expected = rows(log)
    assert open_files_under(tmp_path)
    fill_the_disk(monkeypatch)
    with pytest.raises(LogStorageError) as info:
        log.close()
    message = str(info.value)
    assert f"could not checkpoint the high watermark of {tmp_path}" in message
    assert "No space left on device" in message
    if fsync is FsyncPolicy.NEVER:  # appends since the last fsync: close had to flush them
        assert "could not fsync" in message
    assert open_files_under(tmp_path) == []
    with pytest.raises(LogClosedError):
        log.read(0)
    log.close()  # closed for good: a second close has nothing left to do
    monkeypatch.undo()
    with Log.open(tmp_path, config) as reopened:
        assert rows(reopened) == expected
