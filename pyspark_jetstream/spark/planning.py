"""Planning on the driver: the options' addresses turned into brokers, once per reader or writer.

:mod:`.options` checks strings and asks no one; this module is where the
driver first talks to the deployment.  A plan is a small frozen value that
the reader or writer carries (and Spark pickles to executors), so an
executor never discovers brokers or asks for NATS servers itself.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from pyspark_jetstream.client.cluster import ClusterConnection
from pyspark_jetstream.client.credentials import Credentials
from pyspark_jetstream.client.hints import listed_streams, unknown_stream
from pyspark_jetstream.protocol.errors import InvalidArgumentError, UnavailableError, UnknownStreamError
from pyspark_jetstream.protocol.streams import StreamConfig

from .options import Addresses, SinkOptions, SourceOptions


@dataclass(frozen=True, slots=True)
class SourcePlan:
    """A reader's options and the brokers it reads from."""

    options: SourceOptions
    broker: str
    """The brokers' Flight addresses to start from, comma-separated."""


@dataclass(frozen=True, slots=True)
class SinkPlan:
    """A writer's options, the brokers and NATS servers it writes through, and its stream's config."""

    options: SinkOptions
    broker: str
    """The brokers' Flight addresses to start from, comma-separated."""
    nats: tuple[str, ...]
    """The NATS servers the sink publishes to: the option ``nats``, or the brokers' own."""
    stream_config: StreamConfig | None = None
    """The option ``stream``'s configuration (``None`` when rows name their subject)."""


def plan_source(options: SourceOptions) -> SourcePlan:
    """The reader's plan: its brokers, found through ``nats`` when ``servers`` is not given."""
    return SourcePlan(options, resolve_broker(options.addresses, options.credentials))


def plan_sink(options: SinkOptions) -> SinkPlan:
    """The writer's plan: its brokers, the NATS servers to publish to, and the stream's
    configuration (an unknown stream fails here, naming the streams there are)."""
    broker = resolve_broker(options.addresses, options.credentials)
    connection = ClusterConnection(
        broker,
        timeout=options.timeout,
        connect_timeout=options.addresses.connect_timeout,
        credentials=options.credentials,
    )
    try:
        nats = options.addresses.nats or _nats_of_brokers(connection)
        config = None
        if options.stream is not None:
            try:
                config = StreamConfig.from_json(connection.describe(options.stream).config)
            except UnknownStreamError as exc:
                raise unknown_stream(
                    exc, options.stream, lambda: listed_streams(connection), writing=True
                ) from None
    finally:
        connection.close()
    return SinkPlan(options, broker, nats, config)


def resolve_broker(addresses: Addresses, credentials: Credentials | None = None) -> str:
    """The brokers' Flight addresses to start from (``servers``), or one found through ``nats``;
    the rest of a cluster is learnt from any of them."""
    if addresses.servers:
        return ",".join(addresses.servers)
    from pyspark_jetstream.client.nats_connection import discover_broker

    try:
        return asyncio.run(
            discover_broker(list(addresses.nats), timeout=addresses.connect_timeout, credentials=credentials)
        )
    except UnavailableError as exc:
        if "TLS problem" in str(exc):
            raise  # the address is right; the option to change is tls.ca
        raise UnavailableError(f"{exc} (set the option 'servers' or 'nats')") from None


def _nats_of_brokers(connection: ClusterConnection) -> tuple[str, ...]:
    """The NATS servers the brokers themselves use (the sink publishes there)."""
    metadata = connection.refresh()  # a lookup: bounded by the connect timeout like the others
    urls = tuple(dict.fromkeys(u for b in metadata.get("brokers", []) for u in b.get("nats", [])))
    if not urls:
        raise InvalidArgumentError("the brokers report no NATS server: give the option 'nats'")
    return urls
