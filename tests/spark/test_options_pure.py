"""Option parsing is pure: no broker, no NATS server, no socket (no Spark needed).

Addresses are turned into brokers by :mod:`pyspark_jetstream.spark.planning`,
once, on the driver; these tests forbid every connection and name lookup,
so any I/O in parsing fails them.
"""

from __future__ import annotations

import socket

import pytest

from pyspark_jetstream.protocol.errors import InvalidArgumentError, OffsetOutOfRangeError
from pyspark_jetstream.spark.options import (
    Addresses,
    include_headers,
    parse_sink_options,
    parse_source_options,
)
from pyspark_jetstream.spark.planning import plan_source, resolve_broker
from pyspark_jetstream.spark.range_reads import PartitionState, RangeSpec, _after_data_loss, plan_ranges

NATS = {"nats": "nats://127.0.0.1:1,nats://127.0.0.1:2"}
"""Nothing listens there; any attempt to ask would fail (and the guard fails it first)."""


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    def refused(*args, **kwargs):
        raise AssertionError(f"option parsing touched the network: {args!r}")

    monkeypatch.setattr(socket.socket, "connect", refused)
    monkeypatch.setattr(socket.socket, "connect_ex", refused)
    monkeypatch.setattr(socket, "create_connection", refused)
    monkeypatch.setattr(socket, "getaddrinfo", refused)


def test_a_source_given_only_nats_parses_without_asking_anyone():
    parsed = parse_source_options({"stream": "orders", **NATS, "timeout": "4"}, streaming=True)
    assert parsed.addresses == Addresses((), ("nats://127.0.0.1:1", "nats://127.0.0.1:2"), 4.0)
    assert parsed.streams == ("orders",) and parsed.timeout == 4.0


def test_a_sink_given_only_servers_parses_without_asking_for_nats():
    parsed = parse_sink_options({"stream": "orders", "servers": "grpc://127.0.0.1:1, grpc://127.0.0.1:2"})
    assert parsed.addresses == Addresses(("grpc://127.0.0.1:1", "grpc://127.0.0.1:2"), (), 10.0)
    sink = parse_sink_options({"stream": "orders", "servers": "grpc://127.0.0.1:1", **NATS})
    assert sink.addresses.nats == ("nats://127.0.0.1:1", "nats://127.0.0.1:2")


def test_servers_are_used_as_given_with_no_discovery():
    parsed = parse_source_options({"stream": "a", "servers": "grpc://h:1,grpc+tls://g:2"}, streaming=False)
    assert plan_source(parsed).broker == "grpc://h:1,grpc+tls://g:2"
    assert resolve_broker(Addresses(("grpc://h:1",)), None) == "grpc://h:1"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"stream": "a"}, "give the option 'servers' .* or 'nats' .*no default address"),
        ({"stream": "a", "servers": "h:1"}, "option 'servers' has 'h:1'; use grpc://host:port"),
        ({"stream": "a", "nats": "h:4222"}, "option 'nats' has 'h:4222'; use nats://host:port"),
        # With only 'nats' given, a later bad option used to be found after asking NATS for a broker.
        ({"stream": "a", **NATS, "startingTimestamp": "soon"}, "option 'startingTimestamp' is 'soon'"),
        ({"stream": "a", **NATS, "timeout": "0"}, "option 'timeout' must be"),
        ({"stream": "a", **NATS, "includeHeaders": "yes"}, "option 'includeHeaders' must be true or false"),
    ],
)
def test_source_errors_name_the_option_without_a_broker(options, message):
    with pytest.raises(InvalidArgumentError, match=message):
        parse_source_options(options, streaming=True)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"stream": "a"}, "no default address"),
        ({"stream": "a", "servers": "grpc://h:1", "nats": "h:4222"}, "option 'nats' has 'h:4222'"),
        ({"stream": "a", **NATS, "maxBatchBytes": "1"}, "option 'maxBatchBytes' must be"),
        ({"stream": "a b", **NATS}, "option 'stream'"),
    ],
)
def test_sink_errors_name_the_option_without_a_broker(options, message):
    with pytest.raises(InvalidArgumentError, match=message):
        parse_sink_options(options)


def test_include_headers_for_the_schema_is_parsed_like_the_reader_does():
    assert include_headers({}) is False
    assert include_headers({"includeheaders": "TRUE"}) is True  # Spark lower-cases option names
    assert include_headers({"includeHeaders": " false "}) is False
    with pytest.raises(InvalidArgumentError, match="option 'includeHeaders' must be true or false"):
        include_headers({"includeHeaders": "maybe"})


def test_planned_ranges_carry_the_partition_state_they_were_planned_with():
    parsed = parse_source_options({"stream": "s", "servers": "grpc://h:1"}, streaming=False)
    layout = {"s": {"0": PartitionState(5, 9)}}
    ranges = plan_ranges("grpc://h:1", parsed, {"s": {"0": 3, "1": 0}}, {"s": {"0": 9, "1": 2}}, layout)
    assert ranges == [RangeSpec("grpc://h:1", "s", 0, 3, 9, 5), RangeSpec("grpc://h:1", "s", 1, 0, 2, None)]


class _NoDescribe:
    def describe(self, stream):
        raise AssertionError("the read asked the broker again")


@pytest.mark.parametrize("refusal_fields", [{"offset": 3, "log_start_offset": 7}, {}])
def test_data_loss_is_named_from_the_refusal_or_the_plan_without_describing_again(refusal_fields):
    spec = RangeSpec("grpc://h:1", "s", 0, 3, 20, log_start_offset=7)
    refusal = OffsetOutOfRangeError("gone", **refusal_fields)
    with pytest.raises(
        OffsetOutOfRangeError, match=r"offsets 3 to 6 were deleted by retention.*failOnDataLoss"
    ):
        _after_data_loss(_NoDescribe(), spec, 3, refusal, True, from_leader=True)  # type: ignore[arg-type]
    assert _after_data_loss(_NoDescribe(), spec, 3, refusal, False, from_leader=True) == 7  # type: ignore[arg-type]
