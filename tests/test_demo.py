"""``make demo``: the README's first command runs end to end and says what it did, truthfully."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # started first when the suite runs in parallel (tests/conftest.py)

ROOT = Path(__file__).resolve().parent.parent


def test_the_demo_counts_every_order_and_its_cursor_has_no_lag_and_leaves_no_directory(tmp_path):
    env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "TMPDIR": str(tmp_path),  # where its directory goes, so that this test alone looks there
    }
    run = subprocess.run(
        [sys.executable, "scripts/demo.py"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-4000:]
    assert "counted 200,000 of 200,000 orders" in run.stdout, output[-4000:]
    # The cursor is the next offset the query reads: at the end of the log once it has read it all.
    assert "orders/0 at offset 200000 of 200000 (lag 0" in run.stdout, output[-4000:]
    (workdir,) = re.findall(r"embedded nats-server in (\S+)", run.stdout)
    assert Path(workdir).parent == tmp_path, workdir
    assert not Path(workdir).exists(), f"make demo left {workdir} behind"
    assert not list(tmp_path.glob("jetstream-demo-*"))
