"""Truncation at a batch boundary while buffers of the cut bytes are still held.

A file log's frames are buffers of its memory-mapped segment files.  Reading
a page that was cut off a mapped file kills the process (SIGBUS), so each
check runs in a child process and looks at how it ended.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SETUP = """
    from pathlib import Path
    from broker_node.log import Log, LogStorageError, Record

    directory = Path({directory!r})
    big = [Record(value=bytes([n % 251]) * 1000) for n in range(300)]  # ~300 KB: many pages
    with Log.open(directory) as log:
        log.append(big[:2])
        log.append(big)
    log = Log.open(directory)  # reopened: its frames are buffers of the mapped file
    held = [bytes(f.data) for f in log.read_frames(0)], log.read_frames(0)
"""


def run(directory: Path, body: str) -> subprocess.CompletedProcess[str]:
    code = textwrap.dedent(SETUP.format(directory=str(directory))) + textwrap.dedent(body)
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )


def test_frames_held_across_a_truncation_keep_their_bytes(tmp_path):
    done = run(
        tmp_path / "log",
        """
        copies, frames = held
        log.truncate_to(2)  # at the boundary of the second batch: the file loses ~300 KB
        log.append([Record(value=b"new")])
        assert [bytes(f.data) for f in frames] == copies, "a held frame changed"
        assert log.log_end_offset == 3
        print("ok")
        """,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", (done.returncode, done.stderr[-2000:])


def test_a_truncation_the_disk_cannot_take_leaves_the_log_whole_and_writable(tmp_path):
    done = run(
        tmp_path / "log",
        """
        import resource, signal
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        copies, frames = held
        end = log.log_end_offset
        resource.setrlimit(resource.RLIMIT_FSIZE, (1024, resource.RLIM_INFINITY))  # the disk is full
        try:
            log.truncate_to(2)
        except LogStorageError as exc:
            assert "cannot cut" in str(exc), exc
        else:
            raise AssertionError("the truncation did not fail")
        assert not list(directory.glob("*.tmp")), "a partial copy was left"
        assert log.log_end_offset == end and [bytes(f.data) for f in log.read_frames(0)] == copies
        resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        log.truncate_to(2)
        log.append([Record(value=b"new")])
        assert log.log_end_offset == 3
        log.close()
        with Log.open(directory) as again:
            assert again.log_end_offset == 3
        print("ok")
        """,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", (done.returncode, done.stderr[-2000:])
