"""Every number on the wire or in a stream config is bounded, finite and fits its Arrow/Spark type.

Pure: no server (tests/api/test_flight_validation.py sends the same over
real Flight).
"""

from __future__ import annotations

import json
import math

import pytest

from pyspark_jetstream.protocol.errors import InvalidArgumentError
from pyspark_jetstream.protocol.flight import (
    ReadRequest,
    StartPosition,
    decode_json_object,
    validate_body_int,
    validate_offset,
)
from pyspark_jetstream.protocol.streams import StreamConfig

INT64_MAX = 2**63 - 1


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("partitions", 0),
        ("partitions", 1025),
        ("replication_factor", 0),
        ("replication_factor", 17),
        ("segment_bytes", 1),
        ("segment_bytes", 1023),
        ("segment_bytes", 4 * 1024**3 + 1),
        ("max_message_bytes", 0),
        ("max_message_bytes", 64 * 1024**2 + 1),
        ("retention_age", -1),
        ("retention_age", math.nan),
        ("retention_age", math.inf),
        ("retention_age", 1e300),
        ("retention_bytes", -1),
        ("retention_bytes", 2**63),
        ("retention_messages", 2**63),
        ("retention_messages", 1.5),
        ("segment_bytes", 65536.0),
        ("partitions", True),
    ],
)
def test_stream_numbers_are_bounded_and_errors_name_option_value_and_range(option, value):
    with pytest.raises(InvalidArgumentError, match=f"^{option} must be") as info:
        StreamConfig(name="s", subject="s", **{option: value})
    message = str(info.value)
    assert f"got {value!r}" in message
    assert " to " in message or "up to" in message  # the range


def test_stream_number_limits_are_inclusive():
    config = StreamConfig(
        name="s",
        subject="s",
        partitions=1024,
        replication_factor=16,
        segment_bytes=1024,
        max_message_bytes=64 * 1024**2,
        retention_age=0,
        retention_bytes=INT64_MAX,
        retention_messages=0,
    )
    assert StreamConfig.from_json(config.to_json()) == config
    assert StreamConfig(name="s", subject="s", segment_bytes=4 * 1024**3).segment_bytes == 4 * 1024**3


def test_stream_config_from_json_refuses_nan_from_the_wire():
    data = json.loads('{"name": "s", "subject": "s", "retention_age": NaN}')
    with pytest.raises(InvalidArgumentError, match="retention_age must be"):
        StreamConfig.from_json(data)


# ---- tickets and action bodies -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("ticket", "field"),
    [
        (b'{"stream": "s", "start": {"timestamp": NaN}}', "timestamp"),
        (b'{"stream": "s", "start": {"timestamp": Infinity}}', "timestamp"),
        (b'{"stream": "s", "start": {"timestamp": -Infinity}}', "timestamp"),
        (b'{"stream": "s", "start": {"timestamp": 1e300}}', "timestamp"),
        (b'{"stream": "s", "max_wait": NaN}', "max_wait"),
        (b'{"stream": "s", "follow": Infinity}', "follow"),
        (b'{"stream": "s", "start": {"offset": 9223372036854775808}}', "offset"),
        (b'{"stream": "s", "partition": 9223372036854775808}', "partition"),
        (b'{"stream": "s", "partition": 1024}', "partition"),
        (b'{"stream": "s", "max_records": 9223372036854775808}', "max_records"),
        (b'{"stream": "s", "max_bytes": 9223372036854775808}', "max_bytes"),
    ],
)
def test_ticket_numbers_are_finite_and_fit_int64(ticket, field):
    with pytest.raises(InvalidArgumentError, match=field):
        ReadRequest.from_ticket(ticket)


def test_ticket_number_limits_are_inclusive():
    request = ReadRequest.from_ticket(
        json.dumps(
            {
                "stream": "s",
                "partition": 1023,
                "start": {"offset": INT64_MAX},
                "max_records": INT64_MAX,
                "max_bytes": INT64_MAX,
            }
        ).encode()
    )
    assert (request.partition, request.start, request.max_records) == (
        1023,
        StartPosition("offset", INT64_MAX),
        INT64_MAX,
    )
    # Python's datetime spans years 1 to 9999; the client converts timestamps to it.
    for seconds in (-62135596800, 0, 253402300799):
        ticket = json.dumps({"stream": "s", "start": {"timestamp": seconds}}).encode()
        assert ReadRequest.from_ticket(ticket).start == StartPosition("timestamp", float(seconds))


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 100_000 + b"]" * 100_000,
        b'{"stream": "s", "start": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b'{"stream": "s", "start": ' + b"[" * 900 + b"]" * 900 + b"}",
        b'{"a": ' * 50_000 + b"1" + b"}" * 50_000,
    ],
)
def test_deeply_nested_json_is_an_invalid_argument(body):
    with pytest.raises(InvalidArgumentError, match="nest"):
        ReadRequest.from_ticket(body)
    with pytest.raises(InvalidArgumentError, match="nest"):
        decode_json_object(body, "body of set_cursor")


def test_errors_show_a_bounded_excerpt_of_huge_values():
    ticket = json.dumps({"stream": "s", "start": "x" * 1_000_000}).encode()
    with pytest.raises(InvalidArgumentError, match="invalid start") as info:
        ReadRequest.from_ticket(ticket)
    assert len(str(info.value)) < 500


def test_huge_integers_are_named_without_printing_them():
    with pytest.raises(InvalidArgumentError, match="got an integer of 16610 bits"):
        StreamConfig(name="s", subject="s", partitions=10**5000)


def test_validate_offset_bounds_offsets_to_int64():
    assert validate_offset("offset", 0) == 0
    assert validate_offset("offset", INT64_MAX) == INT64_MAX
    for value in (2**63, -1, True, 1.0, "1", None, math.nan):
        with pytest.raises(
            InvalidArgumentError,
            match=r"^offset must be an integer from 0 to 9223372036854775807: offsets must not be negative",
        ):
            validate_offset("offset", value)


def test_validate_body_int_bounds_partitions_and_offsets():
    assert validate_body_int("partition", 1023) == 1023
    assert validate_body_int("offset", INT64_MAX) == INT64_MAX
    with pytest.raises(InvalidArgumentError, match="partition must be a non-negative integer up to 1023"):
        validate_body_int("partition", 1024)
    with pytest.raises(InvalidArgumentError, match="offset must be an integer from 0 to 9223372036854775807"):
        validate_body_int("offset", 2**63)
