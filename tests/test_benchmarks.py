"""Every benchmark still runs and still prints every figure its recorded ``--quick`` run printed.

Each ``bench/*_bench.py`` runs at its ``--smoke`` size (seconds; the figures
mean nothing); its last line must be a JSON object of finite numbers holding
every key of its latest ``--quick`` run in ``bench/results/`` (``make bench``
writes those). A benchmark that stops importing, fails, or drops a figure
fails here; one never recorded fails too, until ``make bench`` records it.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.run_benchmarks import RESULTS, benchmarks, last_json_line

pytestmark = pytest.mark.slow  # started first when the suite runs in parallel (tests/conftest.py)

ROOT = Path(__file__).resolve().parent.parent


def recorded_keys() -> dict[str, set[str]]:
    """Each benchmark's figure names in its latest recorded ``--quick`` run."""
    keys: dict[str, set[str]] = {}
    for path in sorted(RESULTS.glob("*.json")):  # named by UTC time: oldest first
        record = json.loads(path.read_text())
        if record.get("size") == "quick":
            for name, figures in record["benchmarks"].items():
                keys[name] = set(figures)
    return keys


RECORDED = recorded_keys()


LONGER = {"spark_bench": 380}
"""Seconds a smoke run took in a clean-clone run, where it was over a minute: the longest start first."""


@pytest.mark.parametrize(
    "script",
    [pytest.param(p, marks=pytest.mark.slow(seconds=LONGER.get(p.stem, 60))) for p in benchmarks()],
    ids=lambda p: p.stem,
)
def test_a_benchmark_runs_at_its_smoke_size_and_prints_every_figure(script: Path) -> None:
    assert script.stem in RECORDED, f"{script.stem} has no recorded --quick run in {RESULTS}: run make bench"
    command = [sys.executable, str(script), "--smoke"]
    run = subprocess.run(command, check=False, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    figures = last_json_line(run.stdout)
    missing = RECORDED[script.stem] - set(figures)
    assert not missing, f"{script.stem} no longer prints {sorted(missing)}"
    odd = {k: v for k, v in figures.items() if not isinstance(v, int | float) or not math.isfinite(v)}
    assert not odd, f"{script.stem} printed figures that are not finite numbers: {odd}"


def test_kafka_peer_fetch_as_bootstrap_runs_it(tmp_path: Path) -> None:
    """``python -m bench.kafka_peer --fetch-jars`` (what bootstrap runs) reports Maven's failure in one
    line; every helper it calls is defined by the time the script's ``main`` runs."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "mvn").write_text("#!/bin/sh\necho 'no repository reachable' >&2\nexit 3\n")
    (fake / "mvn").chmod(0o755)
    done = subprocess.run(
        [sys.executable, "-m", "bench.kafka_peer", "--fetch-jars"],
        cwd=ROOT,
        env={"PATH": f"{fake}:/usr/bin:/bin", "PYSPARK_JETSTREAM_JARS": str(tmp_path / "jars")},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert "error: mvn could not fetch org.apache.kafka:kafka_2.13" in done.stderr
    assert "no repository reachable" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_soak_fails_on_memory_that_stays_grown_not_on_one_sample():
    """The soak judges a broker's memory from the medians of a tenth of the samples at each end of
    the run (one high sample is not growth), and its threads from the first and last samples."""
    from bench.soak import Run, Sample, verdict

    def run(anonymous: list[int]) -> Run:
        figures = {"rss_bytes": 0, "threads": 20, "open_files": 40}
        samples = [
            Sample(600.0 + 10 * n, {"broker-1": figures | {"rss_anon_bytes": a}}, 5.0, 0, n)
            for n, a in enumerate(anonymous)
        ]
        return Run(peak_rate=1.0, peak_rate_alone=1.0, target_rate=0.7, samples=samples)

    flat = [100] * 40
    assert verdict(run([*flat[:-1], 115]), warm_up=600) == [], "one high sample at the end"
    assert verdict(run(flat[:20] + [112] * 20), warm_up=600) == [
        "broker-1 rss_anon_bytes grew 12%: 100 -> 112"
    ]
    late_threads = run(flat)
    late_threads.samples[-1].brokers["broker-1"]["threads"] = 23
    assert verdict(late_threads, warm_up=600) == ["broker-1 threads grew 15%: 20 -> 23"]
