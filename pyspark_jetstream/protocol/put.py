"""The wire of a producer's writes over Flight: chunks straight to a partition's leader.

An idempotent producer (the Spark sink's tasks) may write a partition's
chunks with one Flight ``do_put`` to the partition's leader instead of
publishing them on NATS: the bytes then cross one connection instead of two
(client to nats-server to broker), and the broker reads them as Arrow
without decoding an envelope.  The descriptor is a command whose bytes are
JSON::

    {"put": {"stream": "orders", "partition": 0, "producer_id": "spark-write-...-3",
             "producer_epoch": 0, "ack_policy": "all"}}

Each chunk holds the columns an envelope batch has (``value``, optionally
``key`` and ``headers``; or a typed batch's ``typed`` column) and travels in
the ``app_metadata`` of one metadata-only message (wire version 2): a header
line of JSON with its producer sequence, a newline, then the chunk's record
batch as an Arrow IPC stream (its schema message and one record-batch message,
whose buffers may be compressed); the put's own schema is empty::

    {"sequence": 12}\n<Arrow IPC stream>

The leader reads the IPC stream's headers and each compressed buffer's
declared uncompressed length (:func:`.ipc.decoded_size`) and refuses a chunk
that would decode past the partition's batch limit before anything is
decompressed: a chunk of kilobytes that declares gigabytes costs it nothing.
Version 1 (feature ``puts``) sent each chunk as the put's own record batch,
which Flight decodes -- decompressing it -- before the leader can look at its
size; with an empty schema, a record batch Flight still carries has no column
to decode into, so nothing of it is decompressed, and it is refused.

The leader stores each chunk exactly as it
stores the same producer's envelope batch on NATS (the same producer table:
a repeated sequence is a duplicate, a skipped one is out of order) and
answers each chunk, in the order they came, with one metadata-only message:
its ack in the ack format of :mod:`.ack`, whose ``correlation_id`` is the
sequence as text.  A chunk that cannot be stored is answered with a refusal
like any ack; a put the broker cannot take at all (not the leader, no
``write`` grant, a malformed descriptor, a schema that is not empty) fails as
a Flight call, with the error of :mod:`.flight`.  Producers put only while
every broker registers :data:`PUTS_FEATURE`, and publish on NATS otherwise.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pyarrow as pa

from .envelope import MAX_EPOCH, MAX_SEQUENCE, TYPED_COLUMN, AckPolicy, typed_version
from .errors import InvalidArgumentError, MessageTooLargeError, shown
from .flight import decode_json_object, validate_partition
from .ipc import decoded_size
from .schema import HEADER_TYPE
from .streams import validate_stream_name

PUTS_FEATURE = "puts2"
"""The feature a broker registers when it takes puts of wire version 2 (an older one's ``puts``
took version 1, see the module docstring)."""
PUT_SCHEMA = pa.schema([])
"""A put's own schema: empty, the chunks travel in ``app_metadata``."""
_POLICY_NAMES = {"leader": AckPolicy.LEADER, "all": AckPolicy.ALL}
"""The ack policies a put may ask for (``none`` makes no sense: every chunk is answered)."""
_TYPES = {"key": pa.binary(), "value": pa.binary(), "headers": HEADER_TYPE}
"""The columns a chunk may carry beside its values, and their types."""


@dataclass(frozen=True, slots=True)
class PutRequest:
    """One producer's put to one partition (the descriptor)."""

    stream: str
    partition: int
    producer_id: str
    producer_epoch: int = 0
    ack_policy: AckPolicy = AckPolicy.LEADER

    def __post_init__(self) -> None:
        validate_stream_name(self.stream)
        validate_partition("put partition", self.partition)
        if not isinstance(self.producer_id, str) or not 0 < len(self.producer_id.encode()) <= 0xFFFF:
            raise InvalidArgumentError(
                "put producer_id must be a non-empty string of at most 65535 bytes, "
                f"got {shown(self.producer_id)}"
            )
        epoch = self.producer_epoch
        if isinstance(epoch, bool) or not isinstance(epoch, int) or not 0 <= epoch <= MAX_EPOCH:
            raise InvalidArgumentError(f"put producer_epoch must be 0 to {MAX_EPOCH}, got {shown(epoch)}")
        if self.ack_policy not in _POLICY_NAMES.values():
            raise InvalidArgumentError(f"put ack_policy must be leader or all, got {shown(self.ack_policy)}")

    def to_command(self) -> bytes:
        """The descriptor's command bytes."""
        policy = next(name for name, p in _POLICY_NAMES.items() if p is self.ack_policy)
        body = {
            "stream": self.stream,
            "partition": self.partition,
            "producer_id": self.producer_id,
            "producer_epoch": self.producer_epoch,
            "ack_policy": policy,
        }
        return json.dumps({"put": body}, separators=(",", ":")).encode()


def parse_put_command(command: bytes) -> PutRequest | None:
    """The put a descriptor's command asks for; ``None`` if it is not a put (another kind of call);
    ``InvalidArgumentError`` naming the field if it is a malformed one."""
    if not command.startswith(b'{"put"'):
        return None
    outer = decode_json_object(command, "put descriptor")
    body = outer.get("put")
    fields = {"stream", "partition", "producer_id", "producer_epoch", "ack_policy"}
    if set(outer) != {"put"} or not isinstance(body, dict) or set(body) != fields:
        raise InvalidArgumentError(
            f'a put descriptor is {{"put": {{...}}}} with exactly the fields {sorted(fields)}'
        )
    policy = _POLICY_NAMES.get(body["ack_policy"]) if isinstance(body["ack_policy"], str) else None
    if policy is None:
        raise InvalidArgumentError(f"put ack_policy must be leader or all, got {shown(body['ack_policy'])}")
    return PutRequest(body["stream"], body["partition"], body["producer_id"], body["producer_epoch"], policy)


def chunk_metadata(sequence: int) -> bytes:
    """A chunk's header line (without its newline): its producer sequence."""
    return b'{"sequence":%d}' % sequence


def chunk_message(sequence: int, batch: pa.RecordBatch, compression: str | None = None) -> bytes:
    """A chunk's ``app_metadata``: its header line, then ``batch`` as an Arrow IPC stream (buffers
    compressed with ``compression``, ``lz4`` or ``zstd``, if given)."""
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.ipc.new_stream(sink, batch.schema, options=options) as writer:
        writer.write_batch(batch)
    return chunk_metadata(sequence) + b"\n" + sink.getvalue().to_pybytes()


def split_chunk(message: pa.Buffer | bytes | None) -> tuple[int, pa.Buffer]:
    """A chunk's producer sequence and its IPC stream, undecoded; ``InvalidArgumentError`` if the
    message is not a chunk (no header line, or one without a sequence)."""
    if message is None:
        raise InvalidArgumentError(
            'a put chunk is app_metadata {"sequence": N}, a newline, then an Arrow IPC stream; got none'
        )
    buffer = message if isinstance(message, pa.Buffer) else pa.py_buffer(message)
    end = buffer.slice(0, min(64, buffer.size)).to_pybytes().find(b"\n")
    if end < 0:
        raise InvalidArgumentError(
            'a put chunk is app_metadata {"sequence": N}, a newline, then an Arrow IPC stream; '
            "no header line found"
        )
    return parse_chunk_metadata(buffer.slice(0, end).to_pybytes()), buffer.slice(end + 1)


def decode_chunk(stream: pa.Buffer, limit: int, where: str) -> pa.RecordBatch:
    """The record batch of a chunk's IPC ``stream``, once its declared decoded size (every buffer's
    uncompressed length, read before anything is decompressed) is found within ``limit`` bytes
    (``MessageTooLargeError`` naming the limit and ``where``, the partition, otherwise);
    ``InvalidArgumentError`` if it is not one record batch in Arrow IPC."""
    try:
        size = decoded_size(stream)
    except ValueError as exc:
        raise InvalidArgumentError(f"a put chunk is not an Arrow IPC stream: {exc}") from None
    if size > limit:
        raise MessageTooLargeError(
            f"the chunk would decode to {size} bytes, over the limit of {limit} for {where} (checked "
            "before decompressing it); put smaller chunks"
        )
    try:
        reader = pa.ipc.open_stream(stream)
        batches = list(reader)
    except (pa.ArrowException, OSError) as exc:
        raise InvalidArgumentError(f"a put chunk is not an Arrow IPC stream: {exc}") from None
    if len(batches) != 1:
        raise InvalidArgumentError(f"a put chunk holds one record batch, got {len(batches)}")
    return batches[0]


def parse_chunk_metadata(metadata: pa.Buffer | bytes | None) -> int:
    """A chunk's producer sequence; ``InvalidArgumentError`` if its metadata does not say one."""
    if metadata is None:
        raise InvalidArgumentError('a put chunk needs app_metadata {"sequence": N}, got none')
    data = decode_json_object(bytes(metadata), "put chunk metadata")
    sequence = data.get("sequence")
    if set(data) != {"sequence"} or isinstance(sequence, bool) or not isinstance(sequence, int):
        raise InvalidArgumentError(f'a put chunk\'s app_metadata is {{"sequence": N}}, got {shown(data)}')
    if not 0 <= sequence <= MAX_SEQUENCE:
        raise InvalidArgumentError(f"a put chunk's sequence must be 0 to {MAX_SEQUENCE}, got {sequence}")
    return sequence


def check_chunk(batch: pa.RecordBatch) -> None:
    """Refuse, naming what is wrong, a chunk whose columns an envelope batch could not have."""
    schema = batch.schema
    names = schema.names
    values = TYPED_COLUMN if TYPED_COLUMN in names else "value"
    unknown = sorted(set(names) - {values, "key", "headers"})
    if unknown or len(set(names)) != len(names):
        raise InvalidArgumentError(
            f"a put chunk has the columns value (or typed), key and headers, each once; got {names}"
        )
    for name in names:
        wanted = _TYPES.get(name)
        if wanted is not None and schema.field(name).type != wanted:
            raise InvalidArgumentError(
                f"a put chunk's column {name!r} is {schema.field(name).type}, not {wanted}"
            )
    if values == TYPED_COLUMN:
        if not pa.types.is_struct(schema.field(TYPED_COLUMN).type):
            raise InvalidArgumentError(
                "a typed put chunk's column 'typed' must be a struct of the schema's fields"
            )
        if typed_version(batch) is None:
            raise InvalidArgumentError("a typed put chunk's column 'typed' does not say its schema version")
    if batch.num_rows == 0:
        raise InvalidArgumentError("a put chunk has no rows")
    try:  # as an envelope's batch is: offsets in bounds, UTF-8 valid, null counts true
        batch.validate(full=True)
    except pa.ArrowInvalid as exc:
        raise InvalidArgumentError(f"a put chunk is not a valid Arrow batch: {exc}") from None
