"""Settings for the whole suite."""

from __future__ import annotations

import os
from collections import defaultdict

import pytest
from hypothesis import settings

# Stored metadata with fields nobody reads is an error in tests (brokers started
# by the tests inherit this); production brokers ignore such fields.
os.environ["JETSTREAM_STRICT_WIRE"] = "1"

# Spark drivers started by the tests (in-process, notebooks, scripts) live for seconds to minutes:
# the JVM's quick compiler alone starts them faster and spends less CPU than its optimising one
# (on two cores, several at once).  Benchmarks run outside the suite keep the JVM's defaults.
os.environ.setdefault(
    "PYSPARK_SUBMIT_ARGS", "--driver-java-options '-XX:TieredStopAtLevel=1 -XX:+UseSerialGC' pyspark-shell"
)
# The same for every other JVM the tests start (ZooKeeper for each cluster, a standalone Spark
# cluster's daemons and executors, Spark's launcher, the Kafka peer of a benchmark's smoke run):
# a ZooKeeper's start and short life cost 2.2-2.5 s of CPU instead of 3.1.  Each JVM says so on
# stderr ("Picked up JAVA_TOOL_OPTIONS"), which no test reads.
os.environ.setdefault("JAVA_TOOL_OPTIONS", "-XX:TieredStopAtLevel=1")

# Examples are checked for results, not speed: on a loaded CI machine one slow
# example must not fail a test (timings are the benchmarks' business).
settings.register_profile("suite", deadline=None)
settings.load_profile("suite")


def pytest_collection_modifyitems(items: list) -> None:
    """Tests marked ``slow`` run first, the longest (``slow(seconds=...)``, a minute if unsaid)
    first of all: with ``make test``'s workers (pytest-xdist) the long ones start at once
    instead of ending the run alone."""

    def cost(item: pytest.Item) -> float:
        slow = item.get_closest_marker("slow")
        return 0.0 if slow is None else float(slow.kwargs.get("seconds", 60))

    items.sort(key=lambda item: -cost(item))


SPREAD = ("tests/test_benchmarks.py", "tests/test_notebooks.py", "tests/test_readme.py")
"""Modules whose tests share nothing (each runs a script, notebook or document of its own): under
``--dist loadscope`` each of their tests is a unit a worker takes alone, not one module of many
minutes on one worker."""


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``--dist loadscope`` with :data:`SPREAD` split per test, and the units in the order the
    collection sorted them (slow first), not xdist's default of the module with most tests first
    (which started the longest modules last)."""
    if config.getoption("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SlowFirst(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.split("::", 1)[0] in SPREAD:
                return nodeid
            return super()._split_scope(nodeid)

    config.option.loadscopereorder = False
    return SlowFirst(config, log)


ROOM_SECONDS: defaultdict[str, float] = defaultdict(float)
"""Seconds of set-up, call and tear-down per room of tests/ (its first folder) in this run."""
UNIT_SECONDS: defaultdict[str, float] = defaultdict(float)
"""The same per unit a worker takes whole (a module, or a test of :data:`SPREAD`)."""


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Adds each phase's time to its room's total (under xdist the main process sees every report)."""
    path = report.nodeid.split("::", 1)[0]
    parts = path.split("/")
    ROOM_SECONDS[parts[1] if len(parts) > 2 else "top"] += report.duration
    UNIT_SECONDS[report.nodeid if path in SPREAD else path] += report.duration


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter) -> None:
    """One line at the end of a run: where the run's time went, room by room, the most first."""
    if ROOM_SECONDS:
        rooms = sorted(ROOM_SECONDS.items(), key=lambda room: -room[1])
        totals = ", ".join(f"{name} {seconds:.1f}" for name, seconds in rooms)
        terminalreporter.write_line(f"seconds per room (summed over workers): {totals}")
        units = sorted(UNIT_SECONDS.items(), key=lambda unit: -unit[1])[:12]
        longest = ", ".join(f"{name} {seconds:.0f}" for name, seconds in units)
        terminalreporter.write_line(f"longest units a worker takes whole: {longest}")


REMOTE = "JETSTREAM_TEST_SPARK_REMOTE"
"""Set to a Spark Connect server's ``sc://`` address, the ``spark`` fixture is a Connect session
of it (tests/spark/test_connect.py runs the tests marked ``connect`` so, in a process of their own:
a process with a Connect session cannot use a classic one)."""
REGISTER = "JETSTREAM_TEST_SPARK_REGISTER"
"""Set (to anything) with ``REMOTE``, the Connect session calls ``register(spark)`` first."""


@pytest.fixture(scope="session")
def spark():
    """One local Spark session (with Delta's jars) per test process, a worker of ``make test``:
    its JVM starts once instead of once per module.  A process has one Spark context, so no
    test module stops it or starts its own.  (A Spark Connect session instead where ``REMOTE``
    says so.)"""
    if os.environ.get(REMOTE):
        from pyspark.sql import SparkSession

        from pyspark_jetstream.spark import register

        remote = SparkSession.builder.remote(os.environ[REMOTE]).getOrCreate()
        if os.environ.get(REGISTER):
            register(remote)
        yield remote
        remote.stop()
        return
    from pyspark_jetstream.spark.delta import delta_session

    session = delta_session("pyspark-jetstream-tests", **{"spark.sql.shuffle.partitions": "2"})
    yield session
    session.stop()


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    """A nats-server and a broker on it shared by a module's tests, metrics on (some tests read the
    broker's counters).  Directories with their own (a cluster, say) override it."""
    from broker_node.nats_server import NatsServer

    from .broker.harness import BrokerProcess

    directory = tmp_path_factory.mktemp("module") / "broker"
    with (
        NatsServer() as nats_server,
        BrokerProcess(directory, nats_url=nats_server.url, extra_config="[metrics]\nport = 0\n") as broker,
    ):
        yield broker


@pytest.fixture(scope="module")
def client(deployment):
    """A client of the module's ``deployment``."""
    from pyspark_jetstream.client import SyncClient

    with SyncClient(nats_urls=deployment.nats_url, broker=deployment.flight) as connected:
        yield connected
