"""Malformed tickets and action bodies over real Arrow Flight: ``invalid_argument``, never a crash.

A broker process serves; raw Flight calls send exactly the bytes a buggy or
hostile client could (NaN, huge integers, deep nesting), then the broker must
still serve ordinary requests.
"""

from __future__ import annotations

import contextlib
import json

import pyarrow as pa
import pytest
from pyarrow import flight


@pytest.fixture
def raw(broker):
    connection = flight.connect(broker.flight)
    yield connection
    connection.close()


def _error_of(call) -> str:
    with pytest.raises(flight.FlightError) as info:
        call()
    return str(info.value)


def _action(raw, name: str, body: bytes) -> list:
    return list(raw.do_action(flight.Action(name, body)))


@pytest.mark.parametrize(
    ("ticket", "field"),
    [
        (b'{"stream": "s", "start": {"timestamp": NaN}}', "timestamp"),
        (b'{"stream": "s", "start": {"timestamp": Infinity}}', "timestamp"),
        (b'{"stream": "s", "start": {"timestamp": 1e300}}', "timestamp"),
        (b'{"stream": "s", "max_wait": NaN}', "max_wait"),
        (b'{"stream": "s", "follow": Infinity}', "follow"),
        (b'{"stream": "s", "start": {"offset": 9223372036854775808}}', "offset"),
        (b'{"stream": "s", "partition": 9223372036854775808}', "partition"),
        (b'{"stream": "s", "start": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nest"),
    ],
)
def test_bad_tickets_are_invalid_arguments(client, raw, ticket, field):
    client.create_stream("s", "s")
    client.publish("s", b"x")
    text = _error_of(lambda: raw.do_get(flight.Ticket(ticket)).read_all())
    assert "[invalid_argument]" in text and field in text, text
    assert client.fetch("s", 0).num_rows == 1  # still serving


@pytest.mark.parametrize(
    ("name", "body", "field"),
    [
        (
            "set_cursor",
            b'{"consumer": "c", "stream": "s", "partition": 0, "offset": 9223372036854775808}',
            "offset",
        ),
        (
            "set_cursor",
            b'{"consumer": "c", "stream": "s", "partition": 9223372036854775808, "offset": 1}',
            "partition",
        ),
        ("fetch_cursor", b'{"consumer": "c", "stream": "s", "partition": 9223372036854775808}', "partition"),
        ("set_cursor", b'{"consumer": "c", "stream": "s", "partition": 0, "offset": NaN}', "offset"),
        ("set_cursor", b'{"a": ' * 50_000 + b"1" + b"}" * 50_000, "nest"),
        ("create_stream", b'{"name": "t", "subject": "t", "retention_age": NaN}', "retention_age"),
        ("create_stream", b'{"name": "t", "subject": "t", "retention_age": Infinity}', "retention_age"),
        ("create_stream", b'{"name": "t", "subject": "t", "segment_bytes": 1}', "segment_bytes"),
        ("create_stream", b'{"name": "t", "subject": "t", "partitions": 100000}', "partitions"),
        (
            "create_stream",
            b'{"name": "t", "subject": "t", "max_message_bytes": 1073741824}',
            "max_message_bytes",
        ),
        ("create_stream", b'{"name": "t", "subject": "t", "group": "' + b"g" * 300 + b'"}', "group"),
        ("create_stream", b'{"name": "t", "subject": "_INBOX.>"}', "_INBOX"),
        ("create_stream", b'{"name": "t", "subject": ">"}', "'>'"),
        ("create_stream", b'{"name": "t", "subject": "$JS.API.>"}', "$JS"),
        ("create_stream", b'{"name": "t", "subject": "_PJS.discover"}', "_PJS"),
    ],
)
def test_bad_action_bodies_are_invalid_arguments(client, raw, name, body, field):
    client.create_stream("s", "s")
    text = _error_of(lambda: _action(raw, name, body))
    assert "[invalid_argument]" in text and field in text, text
    assert "t" not in [s.config["name"] for s in client.list_streams()]
    assert client.fetch_cursor("c", "s", 0) is None


def test_cursor_offsets_up_to_int64_max_are_stored(client):
    client.create_stream("s", "s")
    client.set_cursor("c", "s", 0, 2**63 - 1)
    assert client.fetch_cursor("c", "s", 0) == 2**63 - 1


def test_create_stream_body_with_nan_is_not_stored(client, raw):
    body = json.dumps({"name": "t", "subject": "t", "retention_age": float("nan")}).encode()
    assert b"NaN" in body  # Python's json writes it; the broker's json reads it
    text = _error_of(lambda: _action(raw, "create_stream", body))
    assert "[invalid_argument] retention_age must be" in text


def _put(raw) -> None:
    table = pa.table({"value": [b"x"]})
    writer, _ = raw.do_put(flight.FlightDescriptor.for_path("orders"), table.schema)
    writer.write_table(table)
    writer.close()


def _exchange(raw) -> None:
    writer, reader = raw.do_exchange(flight.FlightDescriptor.for_command(b"orders"))
    try:
        writer.done_writing()
        reader.read_all()
    finally:
        with contextlib.suppress(flight.FlightError):
            writer.close()  # the refusal again, which the call raised already


@pytest.mark.parametrize(("call", "method"), [(_put, "do_put"), (_exchange, "do_exchange")])
def test_writing_over_flight_is_refused_naming_what_to_use(raw, broker, call, method):
    message = _error_of(lambda: call(raw))
    assert message.startswith(f"[invalid_argument] Flight {method} is not supported: streams are written")
    assert "Client.publish" in message
    assert "Traceback" not in message and "NotImplementedError" not in message
    assert raw.list_actions()  # still serving
