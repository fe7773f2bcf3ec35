"""Kafka as the Spark benchmark's peer: its jars, a single-node KRaft broker, and a topic admin.

Jars.  Two sets, fetched once with Maven (``mvn``, which honours the mirrors
of ``~/.m2/settings.xml``) into subdirectories of the Delta jars' cache
(``$PYSPARK_JETSTREAM_JARS`` or ``~/.cache/pyspark-jetstream/jars``):

* ``kafka_2.13-<version>/``: the broker, ``org.apache.kafka:kafka_2.13`` with
  its runtime dependencies, plus ``slf4j-simple`` so that a broker that fails
  to start says why in its log.  It runs in a JVM of its own.
* ``spark-sql-kafka-0-10_2.13-<spark>/``: Spark's Kafka connector for the
  installed PySpark and the three jars it needs that Spark does not ship
  (``kafka-clients``, ``commons-pool2``, the token provider), at the versions
  its pom names.  They go on ``spark.jars`` of the session that reads and
  writes Kafka: a JVM keeps the class path it started with.

A folder appears whole or not at all (Maven fills a staging folder that is
then renamed), so an interrupted fetch is simply done again.

Broker.  :class:`KafkaBroker` formats a KRaft log directory
(``kafka.tools.StorageTool format``) and starts ``kafka.Kafka`` as broker and
controller on two free ports; :meth:`KafkaBroker.close` stops it by its pid
(SIGTERM, then SIGKILL after a bound) and removes its directory.  Should the
benchmark be killed before it can, the kernel sends the broker SIGTERM
(``setpriv --pdeathsig``, where util-linux has it).

Admin.  :class:`KafkaAdmin` creates topics and sums their end offsets with
``kafka-clients``' ``Admin`` in Spark's own JVM (through py4j), so no third
JVM starts; creating the first topic is also how the benchmark learns that
the broker is ready.

    python -m bench.kafka_peer --fetch-jars    # fill the cache (scripts/bootstrap.sh runs it)
"""

from __future__ import annotations

import argparse
import base64
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pyspark_jetstream.spark.delta import jar_cache

KAFKA_VERSION = "3.9.2"
"""The broker's version: the line of the ``kafka-clients`` that Spark's connector depends on."""
SCALA_VERSION = "2.13"
BROKER_COORDINATES = (
    f"org.apache.kafka:kafka_{SCALA_VERSION}:{KAFKA_VERSION}",
    "org.slf4j:slf4j-simple:1.7.36",
)
CONNECTOR_ARTIFACTS = (
    f"spark-sql-kafka-0-10_{SCALA_VERSION}",
    f"spark-token-provider-kafka-0-10_{SCALA_VERSION}",
    "kafka-clients",
    "commons-pool2",
)
"""The connector and what it needs beside Spark's own jars (Spark's Structured Streaming + Kafka guide)."""
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.6.1"
BROKER_JVM = (
    "-Xmx1G",
    "-Xms1G",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
)
"""Kafka's own defaults: the heap of ``kafka-server-start.sh`` and the JVM options of
``kafka-run-class.sh`` (a smaller heap made the peer read ~35% slower than a default Kafka)."""
START_TIMEOUT = 60.0
STOP_TIMEOUT = 30.0
ADMIN_TIMEOUT_MS = 60_000


class KafkaPeerError(Exception):
    """The peer could not be set up: Maven failed, or the broker did not start or answer."""


def connector_coordinate() -> str:
    """Spark's Kafka connector for the installed PySpark."""
    import pyspark

    return f"org.apache.spark:spark-sql-kafka-0-10_{SCALA_VERSION}:{pyspark.__version__}"


def broker_jars(cache: Path | None = None) -> Path:
    """The folder of the broker's jars, fetched first if it is not in the cache."""
    folder = (cache or jar_cache()) / f"kafka_{SCALA_VERSION}-{KAFKA_VERSION}"
    return _fetched(folder, BROKER_COORDINATES, only=())


def connector_jars(cache: Path | None = None) -> list[Path]:
    """The connector's jars for ``spark.jars``, fetched first if they are not in the cache."""
    coordinate = connector_coordinate()
    _group, artifact, version = coordinate.split(":")
    folder = _fetched(
        (cache or jar_cache()) / f"{artifact}-{version}", (coordinate,), only=CONNECTOR_ARTIFACTS
    )
    return sorted(folder.glob("*.jar"))


def _fetched(folder: Path, coordinates: Sequence[str], only: Sequence[str]) -> Path:
    """``folder`` holding the jars of ``coordinates`` and their runtime dependencies (those named
    ``only``, when given); Maven fills a staging folder that is renamed to ``folder``."""
    if folder.is_dir():
        return folder
    command = shutil.which("mvn")
    if command is None:
        raise KafkaPeerError(f"Maven (mvn) is not installed, so {', '.join(coordinates)} cannot be fetched")
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent, prefix=".fetch-") as scratch:
        dependencies = "".join(
            "<dependency><groupId>{}</groupId><artifactId>{}</artifactId><version>{}</version></dependency>".format(
                *c.split(":")
            )
            for c in coordinates
        )
        (Path(scratch) / "pom.xml").write_text(
            '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
            "<groupId>local</groupId><artifactId>kafka-peer-jars</artifactId><version>1</version>"
            f"<packaging>pom</packaging><dependencies>{dependencies}</dependencies></project>\n"
        )
        staging = Path(scratch) / "jars"
        _run(
            [
                command,
                "-q",
                "-B",
                f"{DEPENDENCY_PLUGIN}:copy-dependencies",
                "-DincludeScope=runtime",
                f"-DoutputDirectory={staging}",
                *([f"-DincludeArtifactIds={','.join(only)}"] if only else []),
            ],
            f"mvn could not fetch {', '.join(coordinates)}",
            cwd=scratch,
        )
        found = {p.name for p in staging.glob("*.jar")}
        missing = [a for a in only if not any(name.startswith(f"{a}-") for name in found)]
        if not found or missing:
            raise KafkaPeerError(
                f"mvn fetched {sorted(found)} for {', '.join(coordinates)}, without {missing}"
            )
        os.replace(staging, folder)
    return folder


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class KafkaBroker:
    """A single-node KRaft Kafka (broker and controller in one JVM) on free ports.

    ``start()`` returns once the broker's port accepts connections; use it as a
    context manager, or call :meth:`close` in a ``finally``: it stops the JVM
    by pid whatever happened, so no broker outlives the benchmark.
    """

    def __init__(
        self, directory: Path | None = None, *, partitions: int = 4, jars: Path | None = None
    ) -> None:
        """``directory`` (new, or a temporary one) holds its configuration, log and data; ``close()``
        removes it.  ``partitions`` is the topics' default; ``jars`` defaults to :func:`broker_jars`."""
        self.jars = jars
        self.partitions = partitions
        self.directory = directory or Path(tempfile.mkdtemp(prefix="kafka-peer-"))
        self.directory.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.controller_port = free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.log_path = self.directory / "kafka.log"
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> KafkaBroker:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def start(self) -> None:
        """Format the log directory and start the broker; ``KafkaPeerError`` (with its log) if it fails."""
        jars = self.jars or broker_jars()
        properties = self.directory / "server.properties"
        properties.write_text(
            "\n".join(
                [
                    "process.roles=broker,controller",
                    "node.id=1",
                    f"controller.quorum.voters=1@127.0.0.1:{self.controller_port}",
                    f"listeners=PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
                    f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}",
                    "controller.listener.names=CONTROLLER",
                    "inter.broker.listener.name=PLAINTEXT",
                    "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
                    f"log.dirs={self.directory / 'logs'}",
                    f"num.partitions={self.partitions}",
                    "auto.create.topics.enable=false",
                    "offsets.topic.replication.factor=1",
                    "transaction.state.log.replication.factor=1",
                    "transaction.state.log.min.isr=1",
                    "group.initial.rebalance.delay.ms=0",
                    "",
                ]
            )
        )
        java = [
            "java",
            *BROKER_JVM,
            "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
            "-cp",
            f"{jars}/*",
        ]
        # Kafka's Uuid: 16 bytes in URL-safe base64, unpadded; it may start with '-', hence '--cluster-id='.
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        _run(
            [
                *java,
                "kafka.tools.StorageTool",
                "format",
                f"--cluster-id={cluster_id}",
                f"--config={properties}",
            ],
            "kafka-storage format failed",
        )
        # setpriv (util-linux) has the kernel send SIGTERM to the broker when the benchmark dies
        # without running its finally blocks (SIGKILL, e.g. a test's timeout).
        orphan_guard = ["setpriv", "--pdeathsig", "TERM", "--"] if shutil.which("setpriv") else []
        with self.log_path.open("wb") as log:
            self._process = subprocess.Popen(
                [*orphan_guard, *java, "kafka.Kafka", str(properties)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C in the terminal reaches the benchmark, which stops it
            )
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if self._process.poll() is not None:
                raise KafkaPeerError(
                    f"Kafka exited with {self._process.returncode} at start: {self.log_tail()}"
                )
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise KafkaPeerError(
                        f"Kafka did not listen on {self.bootstrap} within {START_TIMEOUT:g} s: "
                        f"{self.log_tail()}"
                    ) from None
                time.sleep(0.2)

    def close(self) -> None:
        """Stop the broker (SIGTERM, SIGKILL after ``STOP_TIMEOUT`` s), wait for it, remove its directory."""
        process, self._process = self._process, None
        try:
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(STOP_TIMEOUT)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)

    def log_tail(self) -> str:
        """The last 2,000 characters of the broker's log (for an error)."""
        try:
            return self.log_path.read_text(errors="replace")[-2000:]
        except OSError:
            return "(no log)"


class KafkaAdmin:
    """``kafka-clients``' Admin in Spark's JVM: topics and their end offsets.

    Needs a session whose ``spark.jars`` hold :func:`connector_jars`.  Each
    call waits up to ``ADMIN_TIMEOUT_MS`` for the broker (Kafka's own retries).
    """

    def __init__(self, spark: Any, bootstrap: str) -> None:
        self._jvm = spark.sparkContext._jvm
        properties = self._jvm.java.util.Properties()
        properties.setProperty("bootstrap.servers", bootstrap)
        properties.setProperty("default.api.timeout.ms", str(ADMIN_TIMEOUT_MS))
        self._admin = self._jvm.org.apache.kafka.clients.admin.Admin.create(properties)

    def create_topic(self, name: str, partitions: int) -> None:
        """Create ``name`` with ``partitions`` partitions, replication 1, and return once the broker
        names a leader for each (the controller has the topic before the broker has applied it);
        ``KafkaPeerError`` after ``ADMIN_TIMEOUT_MS``."""
        topic = self._jvm.org.apache.kafka.clients.admin.NewTopic(name, partitions, 1)
        self._admin.createTopics(self._jvm.java.util.Collections.singletonList(topic)).all().get()
        deadline = time.monotonic() + ADMIN_TIMEOUT_MS / 1000
        while True:
            leaderless = self._leaderless(name)
            if not leaderless:
                return
            if time.monotonic() > deadline:
                what = f"partitions {leaderless}" if isinstance(leaderless, list) else leaderless
                raise KafkaPeerError(f"topic {name}: no leader after creation: {what}")
            time.sleep(0.05)

    def _leaderless(self, name: str) -> list[int] | str:
        """The partitions of ``name`` with no leader yet, or why the broker cannot say (it has not
        applied the new topic: it answers that it does not host it)."""
        from py4j.protocol import Py4JJavaError

        described = self._admin.describeTopics(self._jvm.java.util.Collections.singletonList(name))
        try:
            partitions = described.allTopicNames().get().get(name).partitions()
        except Py4JJavaError as exc:
            cause = exc.java_exception.getCause()
            if cause is not None and cause.getClass().getSimpleName() == "UnknownTopicOrPartitionException":
                return f"not known to the broker yet ({cause.getMessage()})"
            raise
        return [int(p.partition()) for p in partitions if p.leader() is None]

    def end_offsets(self, name: str) -> int:
        """The sum of ``name``'s partitions' end offsets: how many records it holds (none deleted)."""
        kafka = self._jvm.org.apache.kafka
        described = self._admin.describeTopics(self._jvm.java.util.Collections.singletonList(name))
        wanted = self._jvm.java.util.HashMap()
        for info in described.allTopicNames().get().get(name).partitions():
            partition = kafka.common.TopicPartition(name, info.partition())
            wanted.put(partition, kafka.clients.admin.OffsetSpec.latest())
        offsets = self._admin.listOffsets(wanted).all().get()
        return sum(int(info.offset()) for info in offsets.values())

    def close(self) -> None:
        self._admin.close()


def _run(argv: list[str], failure: str, cwd: str | None = None) -> None:
    """Run ``argv``; raise :class:`KafkaPeerError` with ``failure`` and the end of its output if it fails."""
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise KafkaPeerError(
            f"{failure} (exit {done.returncode}): {(done.stdout + done.stderr).strip()[-2000:]}"
        )


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bench.kafka_peer --fetch-jars``: fill the jar cache."""
    parser = argparse.ArgumentParser(prog="python -m bench.kafka_peer")
    parser.add_argument(
        "--fetch-jars", action="store_true", help="copy the broker's and the connector's jars"
    )
    args = parser.parse_args(argv)
    if args.fetch_jars:
        try:
            print(broker_jars())
            print("\n".join(str(p) for p in connector_jars()))
        except KafkaPeerError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
