"""Spark's numeric options are bounded: errors name the option, the value and the range (no Spark needed)."""

from __future__ import annotations

import pytest

from pyspark_jetstream.protocol.errors import InvalidArgumentError
from pyspark_jetstream.spark.options import parse_sink_options, parse_source_options

SERVERS = {"servers": "grpc://127.0.0.1:1"}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"maxRecordsPerTrigger": str(2**63)},
            r"'maxRecordsPerTrigger' must be a positive integer up to 9223",
        ),
        ({"maxRecordsPerPartition": "0"}, r"'maxRecordsPerPartition' must be a positive integer up to 9223"),
        ({"timeout": "nan"}, r"'timeout' must be a number of seconds from 0\.1 to 3600, got 'nan'"),
        ({"timeout": "inf"}, r"'timeout' must be a number of seconds from 0\.1 to 3600, got 'inf'"),
        ({"timeout": "100000"}, r"'timeout' must be a number of seconds from 0\.1 to 3600"),
        ({"startingTimestamp": "9" * 30}, r"'startingTimestamp' .*up to 253402300799999"),
        ({"startingOffsets": '{"a": {"0": 9223372036854775808}}'}, r"offset 9223372036854775808 of a/0"),
        ({"startingOffsets": '{"a": {"1024": 5}}'}, r"partition '1024' of 'a' must be"),
        ({"startingOffsets": '{"a": {"' + "9" * 5000 + '": 5}}'}, r"partition '9999.*' of 'a' must be"),
        (
            {"startingOffsetsByTimestamp": '{"a": {"1024": 5}}'},
            r"'startingOffsetsByTimestamp': partition '1024' of 'a' must be a partition number",
        ),
        ({"startingOffsets": "[" * 100_000}, r"option 'startingOffsets' is '\[\[\[.*: use"),
    ],
)
def test_source_numbers_are_bounded(options, message):
    with pytest.raises(InvalidArgumentError, match=message):
        parse_source_options({"stream": "a", **SERVERS, **options}, streaming=True)


def test_batch_ending_numbers_are_bounded():
    with pytest.raises(InvalidArgumentError, match=r"'endingTimestamp' .*up to 253402300799999"):
        parse_source_options({"stream": "a", **SERVERS, "endingTimestamp": "9" * 16}, streaming=False)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("1", r"'maxBatchBytes' must be an integer from 64 to 67108864 \(64 MiB\), got '1'"),
        ("67108865", r"'maxBatchBytes' must be an integer from 64 to 67108864 \(64 MiB\)"),
        ("1e3", r"'maxBatchBytes' must be an integer"),
    ],
)
def test_sink_numbers_are_bounded(value, message):
    with pytest.raises(InvalidArgumentError, match=message):
        parse_sink_options({"stream": "a", **SERVERS, "maxBatchBytes": value})


def test_option_limits_are_inclusive():
    source = parse_source_options(
        {
            "stream": "a",
            **SERVERS,
            "maxRecordsPerTrigger": str(2**63 - 1),
            "timeout": "3600",
            "startingOffsets": '{"a": {"1023": 9223372036854775807}}',
            "startingTimestamp": "253402300799999",
        },
        streaming=True,
    )
    assert source.max_records_per_trigger == 2**63 - 1 and source.timeout == 3600
    sink = parse_sink_options({"stream": "a", **SERVERS, "nats": "nats://127.0.0.1:1", "maxBatchBytes": "64"})
    assert sink.max_batch_bytes == 64
