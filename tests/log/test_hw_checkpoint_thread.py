"""The periodic high-watermark checkpoint is written off the caller's thread (the commit path runs
on a broker's event loop, and a checkpoint's fsync can take a second while the disk writes back
other data), in order with the checkpoints a truncation and close() write themselves."""

from __future__ import annotations

import threading

import pyarrow as pa

from broker_node.log import hw_checkpoint as checkpoint_module
from broker_node.log.log import Log
from broker_node.log.log_config import LogConfig


def _values(n: int) -> pa.Table:
    return pa.table({"value": pa.array([b"v%d" % i for i in range(n)], pa.binary())})


def test_a_slow_checkpoint_does_not_hold_up_the_commit_and_a_truncation_waits_for_it(tmp_path, monkeypatch):
    gate, writing = threading.Event(), threading.Event()
    written: list[str] = []
    real = checkpoint_module.write_checkpoint

    def slow(path, lines):
        if path.name == checkpoint_module.HIGH_WATERMARK_CHECKPOINT:
            writing.set()
            assert gate.wait(30), "the test never let the checkpoint finish"
            written.extend(lines)
        real(path, lines)

    monkeypatch.setattr(checkpoint_module, "write_checkpoint", slow)
    log = Log.open(tmp_path, LogConfig(high_watermark_checkpoint_interval=0))
    log.append(_values(10))

    commit = threading.Thread(target=setattr, args=(log, "high_watermark", 8))
    commit.start()
    commit.join(10)
    assert not commit.is_alive(), "setting the high watermark waited for its checkpoint's write"
    assert writing.wait(10), "no checkpoint was written"
    log.high_watermark = 9  # one checkpoint in flight at a time: this one is not queued behind it

    truncate = threading.Thread(target=log.truncate_to, args=(4,))
    truncate.start()
    truncate.join(0.2)
    assert truncate.is_alive(), "the truncation's checkpoint did not wait for the one being written"
    gate.set()
    truncate.join(10)
    assert not truncate.is_alive()
    assert written == ["8", "4"]  # the background write, then the truncation's own
    log.close()
    with Log.open(tmp_path, LogConfig()) as reopened:
        assert reopened.high_watermark == 4
