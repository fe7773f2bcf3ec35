"""The log starts no threads of its own behind a caller's back.

Arrow's compute functions that group rows run on Arrow's own thread pool
unless told not to, and that pool, once started, keeps its threads for the
life of the process: a broker's first compaction (or first append with
headers) grew every broker by a thread per core, for good.  Each check runs
in a fresh interpreter, where no earlier test has started that pool.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHECK = """
    import os
    import threading
    from pathlib import Path

    import pyarrow as pa

    from broker_node.log import Log, LogConfig, Record
    from pyspark_jetstream.protocol.schema import LOG_SCHEMA

    def native_threads():
        return len(os.listdir("/proc/self/task")) - threading.active_count()

    # max_message_bytes below a batch's buffers: its messages are sized one by one (with headers).
    with Log.open(Path({directory!r}), LogConfig(segment_bytes=4000, max_message_bytes=32)) as log:
        log.append([Record(b"first", key=b"k")])
        before = native_threads()
        headers = pa.array([[{{"key": "h", "value": b"x"}}], None], LOG_SCHEMA.field("headers").type)
        for n in range(300):
            log.append(pa.record_batch({{"value": [b"v%d" % n, None], "key": [b"k%d" % (n % 7)] * 2,
                                         "headers": headers}}))
        log.high_watermark = log.log_end_offset
        removed = log.compact()
        print(before, native_threads(), removed)
"""


def test_appending_with_headers_and_compacting_start_no_threads(tmp_path):
    code = textwrap.dedent(CHECK.format(directory=str(tmp_path / "log")))
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    before, after, removed = map(int, done.stdout.split())
    assert removed > 0, "nothing was compacted, so the check proved nothing"
    assert after == before, f"{after - before} native threads were started and kept"
