"""The subject limits of ``protocol.streams`` checked against a real nats-server.

nats-server closes a client connection whose protocol line arguments (for
``SUB``: subject, queue group and sid) are longer than its ``max_control_line``
(4096 bytes by default).  The longest stream subject, with the longest
partition suffix and queue group, must subscribe and receive; a line one byte
over the server's limit is what the broker used to send for a long subject.
"""

from __future__ import annotations

import asyncio
import json
import socket

import nats
import pytest
from pyarrow import flight

from pyspark_jetstream.protocol.errors import InvalidArgumentError
from pyspark_jetstream.protocol.streams import (
    MAX_GROUP_LENGTH,
    MAX_PARTITIONS,
    MAX_SUBJECT_BYTES,
    StreamConfig,
)

from .harness import wait_until

MAX_CONTROL_LINE = 4096
"""nats-server's default ``max_control_line``."""
LONGEST_SID = "9" * 20  # a sid is a client's counter; 20 digits hold any 64-bit one


class RawNats:
    """A NATS connection speaking the text protocol directly, to control every byte of a line."""

    def __init__(self, url: str) -> None:
        host, port = url.removeprefix("nats://").rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.buffer = b""
        assert self._read_line().startswith(b"INFO ")
        connect = {"verbose": False, "pedantic": False, "headers": True, "protocol": 1}
        self.send(b"CONNECT " + json.dumps(connect).encode() + b"\r\n")

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def line(self) -> bytes:
        """The next line from the server, answering its PINGs and skipping its INFO updates."""
        while True:
            line = self._read_line()
            if line == b"PING":
                self.send(b"PONG\r\n")
            elif not line.startswith(b"INFO "):
                return line

    def _read_line(self) -> bytes:
        while b"\r\n" not in self.buffer:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError(f"the server closed the connection; unread: {self.buffer!r}")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\r\n", 1)
        return line

    def ping(self) -> bytes:
        """PING and return the server's answer: PONG, or -ERR."""
        self.send(b"PING\r\n")
        return self.line()

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def raw(nats_server):
    connection = RawNats(nats_server.url)
    yield connection
    connection.close()


def _longest_partition_subject() -> tuple[str, str]:
    """The longest subject a partition can listen on, and the longest queue group."""
    config = StreamConfig(
        name="s", subject="a" * 1022 + ".b", partitions=1024, group="g" * 200, replication_factor=1
    )
    assert len(config.subject.encode()) == 1024
    subject = config.partition_subjects()[-1]
    assert subject.endswith(".1023")
    assert config.group is not None
    return subject, config.group


def test_the_subject_budget_fits_nats_servers_control_line():
    suffix = len(f".{MAX_PARTITIONS - 1}")
    sub_arguments = MAX_SUBJECT_BYTES + suffix + 1 + MAX_GROUP_LENGTH + 1 + len(LONGEST_SID)
    assert sub_arguments <= MAX_CONTROL_LINE
    # A publisher's HPUB line still has room for a long reply subject and both sizes.
    assert MAX_CONTROL_LINE - (MAX_SUBJECT_BYTES + suffix + 3 + 2 * 10) >= 2048


def test_the_longest_partition_subject_and_group_subscribe_and_receive(raw):
    subject, group = _longest_partition_subject()
    raw.send(f"SUB {subject} {group} {LONGEST_SID}\r\n".encode())
    assert raw.ping() == b"PONG"
    reply = "_INBOX." + "r" * 200
    raw.send(f"HPUB {subject} {reply} 12 17\r\nNATS/1.0\r\n\r\nhello\r\n".encode())
    assert raw.line() == f"HMSG {subject} {LONGEST_SID} {reply} 12 17".encode()


def test_a_real_client_subscribes_on_the_longest_partition_subject(nats_server):
    subject, group = _longest_partition_subject()

    async def round_trip() -> bytes:
        nc = await nats.connect(nats_server.url, allow_reconnect=False)
        try:
            sub = await nc.subscribe(subject, queue=group)
            await nc.flush()
            await nc.publish(subject, b"hello", reply="_INBOX.x", headers={"k": "v"})
            return (await sub.next_msg(timeout=5)).data
        finally:
            await nc.close()

    assert asyncio.run(round_trip()) == b"hello"


def test_one_byte_over_max_control_line_closes_the_connection(nats_server):
    group = "g" * 200
    # SUB arguments: subject, space, group, space, sid.
    fits = "x" * (MAX_CONTROL_LINE - len(group) - len(LONGEST_SID) - 2)
    ok = RawNats(nats_server.url)
    try:
        ok.send(f"SUB {fits} {group} {LONGEST_SID}\r\n".encode())
        assert ok.ping() == b"PONG"
    finally:
        ok.close()
    over = RawNats(nats_server.url)
    try:
        over.send(f"SUB {fits}x {group} {LONGEST_SID}\r\n".encode())
        assert b"maximum control line exceeded" in over.ping().lower()
        with pytest.raises(ConnectionError):  # and the server hung up
            over.ping()
    finally:
        over.close()
    # The old validation accepted that subject for a stream; now it is refused before storing.
    with pytest.raises(InvalidArgumentError, match="at most 1024 bytes"):
        StreamConfig(name="s", subject=f"{fits}x", group=group)


def test_an_overlong_subject_is_refused_and_ingest_keeps_working(client, broker):
    # Before subjects were bounded, this stream's SUB line went over nats-server's
    # max_control_line: the server closed the broker's connection, and the broker
    # died again on every restart while subscribing to the stored stream.
    subject = "x." * 2500 + "x"
    with pytest.raises(InvalidArgumentError, match="at most 1024 bytes"):
        client.create_stream("long", subject)
    body = json.dumps({"name": "long", "subject": subject}).encode()
    with flight.connect(broker.flight) as raw, pytest.raises(flight.FlightError) as info:
        list(raw.do_action(flight.Action("create_stream", body)))
    text = str(info.value)
    assert "[invalid_argument] invalid subject 'x.x.x" in text and "at most 1024 bytes" in text, text[:300]
    client.create_stream("after", "after")
    ack = client.publish("after", b"still ingesting")
    assert ack is not None and ack.first_offset == 0
    wait_until(lambda: client.fetch("after", 0).num_rows == 1, message="the message to be stored")
    assert "long" not in [s.config["name"] for s in client.list_streams()]
    assert broker.process.poll() is None
