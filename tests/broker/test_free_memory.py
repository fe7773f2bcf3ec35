"""Freed memory handed back to the system: glibc keeps what a thread frees in that thread's arena,
and a broker frees from many threads."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

FRAGMENTED = """
    import threading

    from broker_node.free_memory import FreeMemory, _anonymous_bytes

    kept = []

    def work():  # ~100 MB allocated on a thread, a 32nd of it kept: holes the arena holds on to
        blocks = [bytes(2000) for _ in range(50_000)]
        kept.extend(blocks[::32])
        blocks.clear()

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    free = FreeMemory()
    before = _anonymous_bytes()
    free.release()
    print(before, _anonymous_bytes(), free.releases, free.released_bytes)
"""


def test_memory_a_thread_freed_between_live_blocks_is_handed_back():
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(FRAGMENTED)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    before, after, releases, released = map(int, done.stdout.split())
    assert before > 80 * 2**20, f"the holes were not made: {before} bytes resident"
    assert after < before - 50 * 2**20, f"{before} -> {after} bytes: the holes were not handed back"
    assert releases == 1 and released >= before - after - 2**20, (releases, released)
