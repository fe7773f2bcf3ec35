"""Prometheus metrics and a health check over HTTP: ``/metrics`` and ``/healthz``.

Everything is read at scrape time from what the broker already keeps (its
status, its health, the Flight server's request counts), so serving metrics
costs the write and read paths nothing.  Names (all prefixed ``jetstream_``):

==========================================  =====================================================
metric                                      labels, meaning
==========================================  =====================================================
``partition_log_start_offset``              stream, partition: first offset kept here
``partition_log_end_offset``                stream, partition: next offset to be written here
``partition_high_watermark``                stream, partition: offsets below it are committed
``partition_size_bytes``                    stream, partition: bytes of its segments on disk
``partition_segments``                      stream, partition: segment files
``partition_damaged_offsets``               stream, partition: offsets that cannot be read
``partition_leader``                        stream, partition: 1 where this broker leads it
``partition_in_sync_replicas``              stream, partition: size of the ISR
``partition_under_replicated``              stream, partition: 1 when the ISR lacks a replica
``cursor_offset``                           consumer, stream, partition: the stored position
``cursor_lag``                              consumer, stream, partition: committed messages after it
``nats_connected``                          1 while the NATS connection is up
``healthy``                                 1 when ``/healthz`` would answer 200
``flight_requests_total``                   kind, code: Flight calls served, by outcome
``flight_follow_readers``                   Flight follow reads open now
``flight_waiting_readers``                  follow and long-polling reads holding a thread now
``flight_open_puts``                        producers' puts open now
``arrow_allocated_bytes``                   bytes Arrow's memory pool has handed out and not had back
``memory_releases_total``                   times freed memory was handed back to the system (glibc's
                                            ``malloc_trim``, every ``maintenance_interval``)
``memory_released_bytes_total``             anonymous resident memory those times took away
``live_tail_batches_total``                 stream, partition: batches published on the live tail
``partition_messages_in_total``             stream, partition: messages appended here as leader
``producer_not_stored_total``               stream, partition, verdict: an idempotent producer's
                                            envelopes stored nothing, as ``duplicate`` (sent
                                            again), ``out_of_order`` or ``fenced`` (refused);
                                            an in-order producer on a healthy cluster sends none
``mirror_lag_messages``                     stream, partition, source: messages the source committed that
                                            the mirror led here has not copied yet (-1: not known yet)
``mirror_lag_seconds``                      stream, partition, source: seconds since the mirror last had
                                            everything the source had committed (0: caught up)
``mirror_up``                               stream, partition, source: 1 while its last read of the
                                            source succeeded (the error is in ``stream info``)
``ack_latency_seconds``                     stream: histogram of the time from a publish reaching
                                            the broker to its ack (``ALL``: committed by the ISR)
==========================================  =====================================================

Counters count from the broker's start (``messages_in`` from the partition's
opening here), so use them with ``rate()``.  The ack latency is counted by
the ingestion loop itself in fixed buckets (see
:mod:`broker_node.ingest.latency`) and only read here; for its quantiles use
``histogram_quantile(0.99, sum by (le) (rate(jetstream_ack_latency_seconds_bucket[5m])))``.

``/healthz`` answers 200 with ``{"ok": true}`` or 503 with the problems (the
same list as ``jetstream health``), for supervisors and load balancers.
"""

from __future__ import annotations

import json
import logging
import socketserver
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, NamedTuple, Protocol
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import pyarrow as pa
from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

logger = logging.getLogger(__name__)

PREFIX = "jetstream_"


class BrokerState(Protocol):
    """What the metrics read of a broker, at scrape time."""

    def status(self) -> dict[str, Any]: ...
    def health(self) -> dict[str, Any]: ...


class PartitionFiles(NamedTuple):
    """What one partition's log holds on disk."""

    size_bytes: int
    """Bytes of its segments."""
    segments: int
    """Segment files."""


class Counts(Protocol):
    """Counters kept by the broker's parts."""

    def flight_requests(self) -> Mapping[tuple[str, str], int]: ...
    def follow_readers(self) -> int: ...
    def waiting_readers(self) -> int: ...
    def open_puts(self) -> int: ...
    def memory_released(self) -> tuple[int, int]: ...
    def live_tail_batches(self) -> Mapping[tuple[str, int], int]: ...
    def nats_connected(self) -> bool: ...
    def partition_files(self) -> Mapping[tuple[str, int], PartitionFiles]: ...
    def partition_messages_in(self) -> Mapping[tuple[str, int], int]: ...
    def producer_not_stored(self) -> Mapping[tuple[str, int, str], int]: ...
    def ack_latency(self) -> Mapping[str, tuple[list[tuple[float, int]], float]]:
        """Per stream: cumulative counts per bucket upper bound (``inf`` last), and the sum."""
        ...


class BrokerCollector(Collector):
    """Turns the broker's status into Prometheus metrics on each scrape."""

    def __init__(self, state: BrokerState, counts: Counts) -> None:
        self.state = state
        self.counts = counts

    def collect(self) -> Iterable[Metric]:
        """Every metric of the table in the module docstring."""
        status = self.state.status()
        health = status["health"]
        labels = ["stream", "partition"]
        gauges = {
            name: GaugeMetricFamily(PREFIX + name, text, labels=labels)
            for name, text in (
                ("partition_log_start_offset", "First offset kept on this broker."),
                ("partition_log_end_offset", "Next offset to be written on this broker."),
                ("partition_high_watermark", "Offsets below it are committed."),
                ("partition_size_bytes", "Bytes of the partition's segments on disk."),
                ("partition_segments", "Segment files of the partition."),
                ("partition_damaged_offsets", "Offsets that cannot be read (damaged, not yet repaired)."),
                ("partition_leader", "1 where this broker leads the partition."),
                ("partition_in_sync_replicas", "Replicas in the in-sync set."),
                ("partition_under_replicated", "1 when the in-sync set lacks a replica."),
            )
        }
        files = self.counts.partition_files()
        streams = {s["config"]["name"]: s for s in status["streams"]}
        for held in status["partitions"]:
            key = (held["stream"], held["partition"])
            values = [held["stream"], str(held["partition"])]
            replicas = _replicas(streams.get(held["stream"]), held["partition"])
            on_disk = files.get(key, PartitionFiles(size_bytes=0, segments=0))
            for name, value in (
                ("partition_log_start_offset", held["log_start_offset"]),
                ("partition_log_end_offset", held["log_end_offset"]),
                ("partition_high_watermark", held["high_watermark"]),
                ("partition_size_bytes", on_disk.size_bytes),
                ("partition_segments", on_disk.segments),
                ("partition_damaged_offsets", sum(last - first + 1 for first, last, _ in held["damaged"])),
                ("partition_leader", 1 if held["role"] == "leader" else 0),
                ("partition_in_sync_replicas", len(held["isr"])),
                ("partition_under_replicated", 1 if replicas and len(held["isr"]) < replicas else 0),
            ):
                gauges[name].add_metric(values, value)
        yield from gauges.values()

        cursor_labels = ["consumer", "stream", "partition"]
        offsets = GaugeMetricFamily(
            PREFIX + "cursor_offset", "A consumer's stored position.", labels=cursor_labels
        )
        lags = GaugeMetricFamily(
            PREFIX + "cursor_lag", "Committed messages after a consumer's position.", labels=cursor_labels
        )
        for cursor in status["cursors"]:
            values = [cursor["consumer"], cursor["stream"], str(cursor["partition"])]
            offsets.add_metric(values, cursor["offset"])
            if cursor["lag"] is not None:
                lags.add_metric(values, cursor["lag"])
        yield offsets
        yield lags
        yield from _mirrors(status.get("mirrors", []))

        requests = CounterMetricFamily(
            PREFIX + "flight_requests", "Flight calls served, by kind and outcome.", labels=["kind", "code"]
        )
        for (kind, code), count in sorted(self.counts.flight_requests().items()):
            requests.add_metric([kind, code], count)
        yield requests
        for name, text, value in (
            ("nats_connected", "1 while the NATS connection is up.", int(self.counts.nats_connected())),
            ("healthy", "1 when /healthz answers 200.", int(health["ok"])),
            ("flight_follow_readers", "Flight follow reads open now.", self.counts.follow_readers()),
            (
                "flight_waiting_readers",
                "Follow and long-polling reads holding a Flight thread now ([flight] max_waiting_readers).",
                self.counts.waiting_readers(),
            ),
            (
                "flight_open_puts",
                "Producers' puts open now, each holding two threads ([flight] max_open_puts).",
                self.counts.open_puts(),
            ),
            (
                "arrow_allocated_bytes",
                "Bytes Arrow's memory pool has handed out and not had back (batches held now).",
                pa.total_allocated_bytes(),
            ),
        ):
            yield GaugeMetricFamily(PREFIX + name, text, value=value)
        releases, released = self.counts.memory_released()
        yield CounterMetricFamily(
            PREFIX + "memory_releases", "Times freed memory was handed back to the system.", value=releases
        )
        yield CounterMetricFamily(
            PREFIX + "memory_released_bytes",
            "Anonymous resident memory those times took away (memory the allocator had kept).",
            value=released,
        )
        yield _per_partition(
            "live_tail_batches", "Batches published on the live tail.", self.counts.live_tail_batches()
        )
        yield _per_partition(
            "partition_messages_in",
            "Messages appended by this broker as the partition's leader.",
            self.counts.partition_messages_in(),
        )
        not_stored = CounterMetricFamily(
            PREFIX + "producer_not_stored",
            "Idempotent producers' envelopes that stored nothing: duplicate, out_of_order or fenced.",
            labels=["stream", "partition", "verdict"],
        )
        for (stream, partition, verdict), count in sorted(self.counts.producer_not_stored().items()):
            not_stored.add_metric([stream, str(partition), verdict], count)
        yield not_stored
        latency = HistogramMetricFamily(
            PREFIX + "ack_latency_seconds",
            "Seconds from a publish reaching the broker to its ack (ALL: once the in-sync replicas have it).",
            labels=["stream"],
        )
        for stream, (buckets, total) in sorted(self.counts.ack_latency().items()):
            latency.add_metric([stream], [(_bound(le), count) for le, count in buckets], total)
        yield latency


def _per_partition(name: str, documentation: str, counts: Mapping[tuple[str, int], int]) -> Metric:
    """A counter with one sample per ``(stream, partition)`` of ``counts``, in their order."""
    family = CounterMetricFamily(PREFIX + name, documentation, labels=["stream", "partition"])
    for (stream, partition), count in sorted(counts.items()):
        family.add_metric([stream, str(partition)], count)
    return family


def _bound(le: float) -> str:
    """A bucket's ``le`` label as Prometheus writes it (``+Inf``, ``0.005``)."""
    return "+Inf" if le == float("inf") else repr(le)


def _replicas(stream: dict[str, Any] | None, partition: int) -> int:
    if stream is None:
        return 0
    for info in stream.get("partitions", []):
        if info.get("partition") == partition:
            return len(info.get("replicas", []))
    return 0


class _Server(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("metrics: %s", format % args)


class MetricsServer:
    """``/metrics`` and ``/healthz`` on ``host:port`` (0 picks a free port), in a daemon thread."""

    def __init__(self, host: str, port: int, state: BrokerState, counts: Counts) -> None:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(BrokerCollector(state, counts))
        metrics_app = make_wsgi_app(registry)

        def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterator[bytes]:
            if environ.get("PATH_INFO") == "/healthz":
                try:
                    health = state.health()
                except Exception as exc:  # noqa: BLE001 - the check itself failing is a failure
                    health = {"ok": False, "problems": [f"health check failed: {exc}"]}
                code = "200 OK" if health["ok"] else "503 Service Unavailable"
                start_response(code, [("Content-Type", "application/json")])
                return iter([json.dumps(health).encode()])
            return iter(metrics_app(environ, start_response))

        self._server = make_server(host, port, app, server_class=_Server, handler_class=_QuietHandler)
        self.port = self._server.server_port
        self.address = f"http://{host}:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="metrics", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop serving."""
        self._server.shutdown()
        self._server.server_close()


def _mirrors(statuses: list[dict[str, Any]]) -> Iterator[Metric]:
    """The mirror gauges of the partitions mirrored here (see the module docstring)."""
    labels = ["stream", "partition", "source"]
    families = {
        "lag_messages": GaugeMetricFamily(
            PREFIX + "mirror_lag_messages", "Messages the source committed not copied yet.", labels=labels
        ),
        "lag_seconds": GaugeMetricFamily(
            PREFIX + "mirror_lag_seconds",
            "Seconds since the mirror last had all the source's.",
            labels=labels,
        ),
    }
    up = GaugeMetricFamily(
        PREFIX + "mirror_up", "1 while the last read of the source succeeded.", labels=labels
    )
    for status in statuses:
        values = [status["stream"], str(status["partition"]), status["source"]]
        for key, family in families.items():
            family.add_metric(values, status[key])
        up.add_metric(values, 0 if status["last_error"] else 1)
    yield from families.values()
    yield up
