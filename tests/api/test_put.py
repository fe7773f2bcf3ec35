"""An idempotent producer's chunks put straight to a partition's leader over Flight
(:mod:`pyspark_jetstream.protocol.put`): stored exactly as the same producer's envelope batches on
NATS, acked in order, with every bad input refused by name."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import signal
import time
from pathlib import Path

import pyarrow as pa
import pytest
from pyarrow import flight

from pyspark_jetstream.client import SyncClient, putting
from pyspark_jetstream.client.putting import Putter
from pyspark_jetstream.protocol.ack import Ack, decode_ack
from pyspark_jetstream.protocol.envelope import AckPolicy, Envelope, encode, split_position, typed_batch
from pyspark_jetstream.protocol.errors import (
    ErrorCode,
    InvalidArgumentError,
    LimitExceededError,
    MessageTooLargeError,
    OutOfOrderSequenceError,
    UnavailableError,
)
from pyspark_jetstream.protocol.put import (
    PUT_SCHEMA,
    PutRequest,
    check_chunk,
    chunk_message,
    chunk_metadata,
    parse_chunk_metadata,
    parse_put_command,
)

from ..broker.harness import BrokerProcess, publish_plain, scrape, wait_until


def _chunk(*values: bytes) -> pa.RecordBatch:
    return pa.record_batch({"value": pa.array(values, pa.binary())})


def _putter(client, producer: str, epoch: int = 0, policy: AckPolicy = AckPolicy.ALL) -> Putter:
    """A putter the test closes (an open put holds up the broker's shutdown: gRPC waits for it)."""
    putter = client.putter(producer, epoch, policy)
    _open.append(putter)
    return putter


_open: list[Putter] = []


@pytest.fixture(autouse=True)
def _closed_putters(client):  # closed before the client and its broker stop
    yield
    while _open:
        _open.pop().close()


def test_chunks_are_stored_in_order_once_each_and_acked_with_their_offsets(client):
    client.create_stream("puts", "puts", partitions=2)
    putter = _putter(client, "producer-a", epoch=3)
    futures = [putter.send("puts", 1, n, _chunk(b"%d-a" % n, b"%d-b" % n)) for n in range(20)]
    acks = [f.result(10) for f in futures]
    assert [(a.first_offset, a.last_offset) for a in acks] == [(2 * n, 2 * n + 1) for n in range(20)]
    assert all(a.ok and not a.duplicate and a.correlation_id == str(n) for n, a in enumerate(acks))
    # The same producer sending its last chunk again (a retried task): a duplicate, with the
    # original's offsets; an older one, a duplicate too (its offsets are no longer remembered).
    again = putter.send("puts", 1, 19, _chunk(b"19-a", b"19-b")).result(10)
    assert again.duplicate and (again.first_offset, again.last_offset) == (38, 39)
    assert putter.send("puts", 1, 7, _chunk(b"7-a", b"7-b")).result(10).duplicate
    putter.close()
    table = client.fetch("puts", 1).to_table()
    assert table.column("value").to_pylist() == [b"%d-%s" % (n, s) for n in range(20) for s in (b"a", b"b")]
    # Stored as the producer's envelope batches are: its id and (epoch, sequence) on each row,
    # the partition's subject as theirs.
    assert set(table.column("producer_id").to_pylist()) == {"producer-a"}
    positions = [split_position(p) for p in table.column("sequence").to_pylist()]
    assert positions == [(3, n) for n in range(20) for _ in range(2)]
    assert set(table.column("subject").to_pylist()) == {"puts.1"}
    assert client.fetch("puts", 0).num_rows == 0


def test_a_skipped_sequence_is_refused_and_nothing_after_the_gap_is_stored(client):
    client.create_stream("gaps", "gaps")
    putter = _putter(client, "producer-gap")
    assert putter.send("gaps", 0, 0, _chunk(b"0")).result(10).ok
    with pytest.raises(OutOfOrderSequenceError):
        putter.send("gaps", 0, 2, _chunk(b"2")).result(10)
    # The put goes on: the missing chunk, then the one refused.
    assert putter.send("gaps", 0, 1, _chunk(b"1")).result(10).ok
    assert putter.send("gaps", 0, 2, _chunk(b"2")).result(10).ok
    putter.close()
    assert client.fetch("gaps", 0).to_table().column("value").to_pylist() == [b"0", b"1", b"2"]


def test_a_new_epoch_fences_the_old_one(client):
    client.create_stream("fence", "fence")
    new = _putter(client, "producer-f", epoch=5)
    assert new.send("fence", 0, 0, _chunk(b"new")).result(10).ok
    old = _putter(client, "producer-f", epoch=4)
    with pytest.raises(Exception, match="epoch|fenced") as raised:
        old.send("fence", 0, 0, _chunk(b"old")).result(10)
    assert raised.value.code is ErrorCode.PRODUCER_FENCED
    new.close()
    old.close()
    assert client.fetch("fence", 0).to_table().column("value").to_pylist() == [b"new"]


def test_a_put_to_a_partition_led_nowhere_here_or_unknown_is_refused_by_name(client, broker):
    client.create_stream("known", "known")
    putter = _putter(client, "producer-u")
    with pytest.raises(Exception, match="nope") as raised:
        putter.send("nope", 0, 0, _chunk(b"x")).result(10)
    assert raised.value.code in (ErrorCode.UNKNOWN_STREAM, ErrorCode.NOT_LEADER)
    with pytest.raises(Exception, match="partition") as raised:
        putter.send("known", 3, 0, _chunk(b"x")).result(10)
    putter.close()
    assert client.fetch("known", 0).num_rows == 0


def test_malformed_chunks_are_refused_naming_what_is_wrong_and_the_put_goes_on(client, broker):
    client.create_stream("bad", "bad")
    request = PutRequest("bad", 0, "producer-bad", 0, AckPolicy.LEADER)
    raw = flight.connect(broker.flight)
    descriptor = flight.FlightDescriptor.for_command(request.to_command())
    writer, reader = raw.do_put(descriptor, PUT_SCHEMA)

    def refusal(message: bytes) -> Ack:
        writer.write_metadata(pa.py_buffer(message))
        refused = decode_ack(reader.read().to_pybytes())
        assert refused.error is ErrorCode.INVALID_ARGUMENT, refused
        return refused

    extra = pa.record_batch({"value": pa.array([b"v"], pa.binary()), "extra": [1]})
    assert "extra" in refusal(chunk_message(0, extra)).message
    ipc = chunk_message(0, _chunk(b"v")).split(b"\n", 1)[1]
    assert "sequence" in refusal(b'{"seq": 1}\n' + ipc).message
    assert "no header line found" in refusal(b'{"sequence": 1}').message
    assert "not an Arrow IPC stream" in refusal(b'{"sequence": 1}\nnot arrow').message
    # A value column of the wrong type.
    assert "'value' is string" in refusal(chunk_message(0, pa.record_batch({"value": ["text"]}))).message
    writer.done_writing()
    writer.close()
    # A put of wire version 1 (chunks as its own record batches, which Flight would decode, and
    # decompress, before they could be sized): refused as a call, before any chunk is read.
    writer, reader = raw.do_put(descriptor, pa.schema([("value", pa.binary())]))
    with pytest.raises(flight.FlightError, match=r"a put's schema must be empty, its chunks in app_metadata"):
        writer.write_with_metadata(_chunk(b"v"), pa.py_buffer(chunk_metadata(0)))
        writer.close()
    # A descriptor that is not a put: refused as before; a malformed put: refused naming fields.
    for command, match in [
        (b'{"read": 1}', "not supported"),
        (b'{"put": {"stream": "bad"}}', "exactly the fields"),
        (
            b'{"put": '
            + json.dumps({**json.loads(request.to_command())["put"], "ack_policy": "none"}).encode()
            + b"}",
            "ack_policy must be leader or all",
        ),
    ]:
        writer, reader = raw.do_put(flight.FlightDescriptor.for_command(command), PUT_SCHEMA)
        with pytest.raises(flight.FlightError, match=match):
            writer.close()
    raw.close()
    assert client.fetch("bad", 0).num_rows == 0


def test_a_chunk_over_the_partitions_batch_limit_is_refused_as_too_large(client):
    """The log's batch limit (16 MiB by default) bounds a chunk as it bounds an envelope batch on
    NATS; the chunk is refused whole, and the put goes on."""
    client.create_stream("big", "big")
    putter = _putter(client, "producer-big")
    with pytest.raises(MessageTooLargeError, match="over the limit of 16777216"):
        putter.send("big", 0, 0, _chunk(*[b"x" * 900_000] * 19)).result(10)
    assert putter.send("big", 0, 0, _chunk(b"x" * 1000)).result(10).ok
    putter.close()


def test_protocol_parsing_refuses_bad_values_by_name():
    assert parse_put_command(b'{"read_request": {}}') is None
    with pytest.raises(InvalidArgumentError, match="producer_epoch"):
        PutRequest("s", 0, "p", -1)
    with pytest.raises(InvalidArgumentError, match="producer_id"):
        PutRequest("s", 0, "")
    with pytest.raises(InvalidArgumentError, match="partition"):
        PutRequest("s", 5000, "p")
    with pytest.raises(InvalidArgumentError, match="invalid stream name '__cursors'"):
        PutRequest("__cursors", 0, "p")  # the broker's own streams take no puts
    request = PutRequest("s", 2, "p", 9, AckPolicy.ALL)
    assert parse_put_command(request.to_command()) == request
    assert parse_chunk_metadata(chunk_metadata(2**32 - 1)) == 2**32 - 1
    for bad in [None, b"", b"[]", b'{"sequence": -1}', b'{"sequence": true}', b'{"sequence": 1, "x": 2}']:
        with pytest.raises(InvalidArgumentError):
            parse_chunk_metadata(bad)


def test_acks_wait_for_the_commit_with_all_and_a_closed_putter_answers_every_chunk(client):
    client.create_stream("commit", "commit")
    putter = _putter(client, "producer-c", policy=AckPolicy.ALL)
    futures = [putter.send("commit", 0, n, _chunk(b"%d" % n)) for n in range(50)]
    putter.close()  # waits for every answer
    assert all(f.done() for f in futures)
    assert [f.result().first_offset for f in futures] == list(range(50))
    assert client.fetch("commit", 0).high_watermark == 50
    # A closed putter's partition put is gone: a new send opens a new one.
    assert putter.send("commit", 0, 50, _chunk(b"50")).result(10).first_offset == 50
    putter.close()


def test_a_producer_that_gives_up_does_not_wait_for_a_broker_that_stopped_answering(client, broker):
    """A failed Spark task ends its puts at once even when the broker hangs (here: stopped with
    SIGSTOP); its retry, once the broker answers again, stores every chunk exactly once."""
    client.create_stream("hung", "hung")
    putter = _putter(client, "producer-h")
    assert putter.send("hung", 0, 0, _chunk(b"0")).result(10).ok
    os.kill(broker.process.pid, signal.SIGSTOP)
    try:
        waiting = putter.send("hung", 0, 1, _chunk(b"1"))
        started = time.monotonic()
        putter.close(error=UnavailableError("the task gave up"))
        assert time.monotonic() - started < 2
        with pytest.raises(UnavailableError, match="the task gave up"):
            waiting.result(1)
    finally:
        os.kill(broker.process.pid, signal.SIGCONT)
    retry = _putter(client, "producer-h")
    assert retry.send("hung", 0, 0, _chunk(b"0")).result(10).duplicate
    assert retry.send("hung", 0, 1, _chunk(b"1")).result(10).ok  # stored now, or a duplicate
    retry.close()
    assert client.fetch("hung", 0).to_table().column("value").to_pylist() == [b"0", b"1"]


def test_a_chunk_whose_buffers_do_not_hold_up_is_refused_before_it_is_stored():
    """Validated in full, as an envelope's batch is: offsets out of order, invalid UTF-8."""
    data = pa.py_buffer(b"abcdef")
    offsets = pa.py_buffer(pa.array([0, 5, 3], pa.int32()).buffers()[1].to_pybytes())
    backwards = pa.Array.from_buffers(pa.binary(), 2, [None, offsets, data])
    with pytest.raises(InvalidArgumentError, match="not a valid Arrow batch"):
        check_chunk(pa.record_batch({"value": backwards}))
    bad_text = pa.Array.from_buffers(
        pa.string(),
        1,
        [
            None,
            pa.py_buffer(pa.array([0, 2], pa.int32()).buffers()[1].to_pybytes()),
            pa.py_buffer(b"\xff\xfe"),
        ],
    )
    typed = typed_batch(pa.record_batch({"note": bad_text}), 1)
    with pytest.raises(InvalidArgumentError, match="not a valid Arrow batch"):
        check_chunk(typed)
    check_chunk(_chunk(b"fine"))


def test_a_put_left_idle_is_closed_when_the_producer_sends_elsewhere(client, monkeypatch):
    """An open put holds two of the broker's threads and holds up its shutdown: one idle for
    ``IDLE_SECONDS`` is closed at the next chunk for another partition (and opened again if needed)."""
    monkeypatch.setattr(putting, "IDLE_SECONDS", 0.2)
    client.create_stream("idle", "idle", partitions=2)
    putter = _putter(client, "producer-i")
    assert putter.send("idle", 0, 0, _chunk(b"a")).result(10).ok
    time.sleep(0.3)  # idleness is what is tested: longer than IDLE_SECONDS without a chunk
    assert putter.send("idle", 1, 0, _chunk(b"b")).result(10).ok
    assert set(putter._puts) == {("idle", 1)}
    assert putter.send("idle", 0, 1, _chunk(b"c")).result(10).ok  # a new put, the same producer
    putter.close()
    assert client.fetch("idle", 0).to_table().column("value").to_pylist() == [b"a", b"c"]


def test_open_puts_are_limited_and_a_closed_one_gives_its_place_back(tmp_path, nats_server):
    """Each open put holds two of the broker's threads: ``[flight] max_open_puts`` bounds them, all
    producers together, and a put past it is refused naming the limit, with nothing stored."""
    # The extra configuration continues the [flight] table.
    broker = BrokerProcess(
        tmp_path / "b", nats_url=nats_server.url, extra_config="max_open_puts = 2\n[metrics]\nport = 0\n"
    ).start()
    putters: list[Putter] = []
    try:
        with SyncClient(nats_urls=broker.nats_url, broker=broker.flight) as client:
            client.create_stream("limited", "limited", partitions=3)
            putters += [client.putter(f"producer-{n}", 0, AckPolicy.LEADER) for n in range(3)]
            first, second, third = putters
            assert first.send("limited", 0, 0, _chunk(b"a")).result(10).ok
            assert second.send("limited", 1, 0, _chunk(b"b")).result(10).ok
            open_puts = ("jetstream_flight_open_puts", ())
            assert scrape(broker)[open_puts] == 2
            with pytest.raises(LimitExceededError, match=r"\(\[flight\] max_open_puts\) is 2"):
                third.send("limited", 2, 0, _chunk(b"c")).result(10)
            assert client.fetch("limited", 2).num_rows == 0
            assert scrape(broker)[open_puts] == 2  # the refused put was never counted
            first.close()  # its place is free again
            wait_until(lambda: scrape(broker)[open_puts] == 1, message="the closed put to be counted out")
            assert third.send("limited", 2, 0, _chunk(b"c")).result(10).ok
            assert client.fetch("limited", 2).to_table().column("value").to_pylist() == [b"c"]
            for putter in putters:
                putter.close()
    finally:
        for putter in putters:
            putter.close(error=UnavailableError("the test ended"))
        broker.stop()


GiB = 2**30
NOISE = 4 * 2**20


def _bomb_batch(*, typed: bool = False) -> pa.RecordBatch:
    """A chunk's batch of two values, a gibibyte of zeros and 4 MiB of random bytes (a typed one's:
    the gibibyte alone, as a string field): about 4 MiB (33 KB typed) once compressed with zstd."""
    size = GiB if typed else GiB + NOISE
    data = bytearray(size)  # zeros, not touched until compressed
    if not typed:
        data[GiB:] = os.urandom(NOISE)
    bounds = [0, GiB] if typed else [0, GiB, size]
    offsets = pa.py_buffer(pa.array(bounds, pa.int32()).buffers()[1].to_pybytes())
    kind = pa.string() if typed else pa.binary()
    values = pa.Array.from_buffers(kind, len(bounds) - 1, [None, offsets, pa.py_buffer(data)])
    if typed:
        return typed_batch(pa.record_batch({"note": values}), 1)
    return pa.record_batch({"value": values})


@functools.cache
def _bomb(*, typed: bool = False) -> bytes:
    """:func:`_bomb_batch` as a put chunk's IPC stream, compressed with zstd."""
    return chunk_message(0, _bomb_batch(typed=typed), "zstd").split(b"\n", 1)[1]


def _memory(broker, field: str) -> int:
    """A figure of the broker process's memory, in bytes: ``VmRSS`` (resident now) or ``VmHWM``
    (the most it has been resident since its start or :func:`_forget_peak`)."""
    status = Path(f"/proc/{broker.process.pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith(field + ":"))) * 1024


def _forget_peak(broker) -> None:
    """Start the broker's ``VmHWM`` again from what is resident now (Linux's ``clear_refs``)."""
    Path(f"/proc/{broker.process.pid}/clear_refs").write_text("5")


def test_a_compressed_chunk_declaring_a_gibibyte_is_refused_before_it_is_decompressed(client, broker):
    """Sized from its IPC headers (each compressed buffer's declared length) against the partition's
    batch limit, on every way a chunk comes: a put (plain or typed) and an envelope on NATS; a put
    of the old wire, whose record batches Flight itself would decompress, is refused unread."""
    limit = 16 * 2**20  # the log's max_batch_bytes, the partition's batch limit
    client.create_stream("bomb", "bomb")
    client.create_stream("typed-bomb", "typed-bomb", schema={"fields": [{"name": "note", "type": "string"}]})
    plain, typed = _bomb(), _bomb(typed=True)
    assert 4 * 2**20 < len(plain) < 5 * 2**20 and len(typed) < 100_000
    raw = flight.connect(broker.flight)
    puts = {
        stream: raw.do_put(
            flight.FlightDescriptor.for_command(PutRequest(stream, 0, f"p-{stream}").to_command()),
            PUT_SCHEMA,
        )
        for stream in ("bomb", "typed-bomb")
    }

    def put(stream: str, message: bytes) -> Ack:
        writer, reader = puts[stream]
        writer.write_metadata(pa.py_buffer(message))
        return decode_ack(reader.read().to_pybytes())

    def refuse_bombs() -> None:
        for sequence in range(2, 5):  # a few at once
            for stream, bomb in (("bomb", plain), ("typed-bomb", typed)):
                refused = put(stream, chunk_metadata(sequence) + b"\n" + bomb)
                assert refused.error is ErrorCode.TOO_LARGE, refused
                said = re.fullmatch(
                    rf"the chunk would decode to (\d+) bytes, over the limit of {limit} for {stream}/0 "
                    r"\(checked before decompressing it\); put smaller chunks",
                    refused.message,
                )
                assert said is not None and int(said.group(1)) >= GiB, refused.message

    try:
        assert put("bomb", chunk_message(0, _chunk(b"warm-up"))).ok  # the put's threads and buffers exist
        _forget_peak(broker)
        before = _memory(broker, "VmRSS")
        refuse_bombs()
        # The old wire: the batch would be decoded by Flight on reading it, so the put is refused first.
        old = raw.do_put(
            flight.FlightDescriptor.for_command(PutRequest("bomb", 0, "p-old").to_command()),
            _bomb_batch().schema,
            options=flight.FlightCallOptions(write_options=pa.ipc.IpcWriteOptions(compression="zstd")),
        )[0]
        with pytest.raises(flight.FlightError, match="a put's schema must be empty"):
            old.write_with_metadata(_bomb_batch(), pa.py_buffer(chunk_metadata(0)))
            old.close()
        # On NATS, the same batch as an envelope's is sized first too (see test_ingest's bomb).
        header = encode(
            Envelope(batch=pa.record_batch({"value": [b"v"]}), ack_inbox="acks", correlation_id="7")
        )
        small = len(header) - header.index(b"\xff\xff\xff\xff") + 4
        envelope = header[: len(header) - small] + len(typed).to_bytes(4, "little") + typed
        publish_plain(broker.nats_url, [("bomb", envelope, None)])
        assert put("bomb", chunk_message(1, _chunk(b"after"))).ok
        # The peak, not what is resident after: a decompression freed again is caught too.  Receiving
        # the chunks (~18 MB, held by gRPC and again as Arrow buffers) is all a refusal may cost; one
        # decoded bomb alone would add a GiB.
        peak = _memory(broker, "VmHWM") - before
        assert peak < 4 * limit, f"the broker's peak grew by {peak} bytes while refusing"
        # Refused chunks are not kept: nine more rounds of them (~120 MB received) leave the broker
        # about as large as one did (the allocator's caches fill, 22-38 MB here, then stay).
        for _ in range(9):
            refuse_bombs()
        kept = _memory(broker, "VmRSS") - before
        assert kept < 4 * limit, f"the broker kept {kept} bytes after refusing ten rounds"
    finally:
        with contextlib.ExitStack() as closing:  # each closed, whatever the others raise
            closing.callback(raw.close)
            for writer, _ in puts.values():
                closing.callback(writer.close)
                closing.callback(writer.done_writing)
    assert client.fetch("bomb").to_table().column("value").to_pylist() == [b"warm-up", b"after"]
    assert client.fetch("typed-bomb").num_rows == 0
