"""The envelope: how a producer wraps a NATS payload to ask for keys, headers and acks.

Any NATS payload that does not decode as an envelope is stored as a plain
message, so a payload is only an envelope if *all* of it parses.

Layout, version 2 (integers little-endian)::

    offset  size  field
    0       4     magic: 0x8E 'J' 'S' 'E'
    4       1     version: 2
    5       1     flags: bit 0 key present, bit 1 value present,
                  bit 2 payload is an Arrow batch, bit 3 producer present,
                  bit 4 target present, bit 5 message id present, bit 6 the
                  batch is typed; other bits zero.  Bits 1 and 2 are
                  exclusive, and so are bit 5 and bits 2 and 3; bit 6 goes
                  with bit 2.
    6       1     ack policy: 0 NONE, 1 LEADER, 2 ALL
    7       1     reserved: 0
    8       ...   str16  ack inbox        (length 0: no ack requested)
                  str16  correlation id
                  if target:   str16 stream, u32 partition
                  if producer: str16 producer id, u32 epoch, u32 sequence
                  if message id: str16 message id
                  if key:      bytes32 key
                  u16 header count, then per header: str16 name, bytes32 value
                  if value:    bytes32 value
                  if batch:    bytes32 Arrow IPC stream of one or more batches with
                               a ``value`` column (a typed batch: a ``typed`` column
                               instead) and optionally ``key`` and ``headers``

    str16   = u16 length, then that many bytes of UTF-8
    bytes32 = u32 length, then that many bytes

The message must end exactly after the last field.  Neither value nor batch
means a null value (a tombstone).  There is no checksum: NATS delivers payloads
intact, and the log checksums what it stores.  Version 1 (no target, an i64
sequence and no epoch) is no longer accepted: such payloads are stored plain.

Target
    The stream and partition the producer publishes to.  Several streams may
    listen on one subject and each stores its own copy, but only the target
    partition acks, so a producer always learns the offsets of the stream it
    named.  Without a target, every partition that stores the message acks it.

Producer
    An idempotent producer numbers its messages: ``epoch`` (0 to 2**31 - 1)
    and ``sequence`` (0 to 2**32 - 1).  In the target partition, a new epoch
    must start at sequence 0 and each next message is the previous sequence
    plus one; a repeat is acked as a duplicate, a gap is refused as out of
    order, an older epoch is refused as fenced (see
    ``broker_node/replication/producers.py``).  In the log both travel as one
    int64: ``epoch << 32 | sequence`` (:func:`producer_position`).

Message id
    Any publisher's id for the message (see
    :mod:`.headers`): within the stream's ``duplicate_window`` a repeat is
    acked as a duplicate with the original offset.  The broker stores it as
    the ``Nats-Msg-Id`` header of the stored record.  Only for one message
    that is not an idempotent producer's (the two kinds of de-duplication are
    not combined).  Added without a new version: an envelope without one is
    byte for byte what it was.

Typed batches
    A typed stream's rows as the columns of its fields rather than JSON
    values (see :mod:`.typed_rows`): the batch's ``typed`` column is a struct
    of one schema version's fields, and that column's field metadata says
    which version (``jetstream.schema_version``, in decimal).  The partition
    leader checks the columns against that version and stores them without
    parsing JSON; each row's value is their JSON text.  Added without a new
    version: a broker from before typed batches refuses bit 6, so it takes
    the payload for a plain message, which a typed stream refuses (it is not
    a JSON object) -- and clients send typed batches only once every broker
    registers the ``typed-batches`` feature.

Batches
    The batch's IPC buffers may be compressed; its decoded size is checked
    against the caller's limit before anything is decompressed
    (:mod:`.ipc`), so a small payload cannot expand into gigabytes.
"""

from __future__ import annotations

import enum
import struct
from typing import NamedTuple

import pyarrow as pa

from .headers import message_id_problem
from .ipc import decoded_size

MAGIC = b"\x8eJSE"
VERSION = 2
_HEADER = struct.Struct("<4sBBBB")
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_EPOCH_SEQUENCE = struct.Struct("<II")
_KEY, _VALUE, _BATCH, _PRODUCER, _TARGET, _MESSAGE_ID, _TYPED = 1, 2, 4, 8, 16, 32, 64
MAX_EPOCH = 2**31 - 1
MAX_SEQUENCE = 2**32 - 1
_BATCH_COLUMNS = frozenset({"key", "value", "headers"})
TYPED_COLUMN = "typed"
"""A typed batch's column of the rows' fields (a struct), in place of ``value``."""
SCHEMA_VERSION_KEY = b"jetstream.schema_version"
"""The ``typed`` column's field metadata: the schema version of its fields, in decimal."""
_TYPED_COLUMNS = frozenset({"key", TYPED_COLUMN, "headers"})
_CARRIED = ("key", "headers")
"""A typed batch's columns that are not fields: they travel beside the typed columns."""


class AckPolicy(enum.IntEnum):
    """When the broker acks a message."""

    NONE = 0
    """No ack."""
    LEADER = 1
    """Once the partition leader has stored it."""
    ALL = 2
    """Once every in-sync replica has stored it (committed)."""


_POLICIES = tuple(AckPolicy)


class EnvelopeError(ValueError):
    """The payload starts like an envelope but is not a valid one (it is stored as plain)."""


class BatchTooLargeError(EnvelopeError):
    """A well-formed envelope whose batch would decode past the limit: refused, not stored.

    Carries what the ingest needs to tell the producer.
    """

    def __init__(self, size: int, limit: int, header: Envelope) -> None:
        super().__init__(f"the batch decodes to {size} bytes, over the limit of {limit}")
        self.size = size
        self.limit = limit
        self.header = header
        """The envelope without its messages: who to ack, and the target."""


def producer_position(epoch: int, sequence: int) -> int:
    """The int64 the log stores for a producer's ``(epoch, sequence)``."""
    return epoch << 32 | sequence


def split_position(position: int) -> tuple[int, int]:
    """``(epoch, sequence)`` of a stored producer position."""
    return position >> 32, position & MAX_SEQUENCE


class Envelope(NamedTuple):
    """A decoded envelope: one message (``value``) or many (``batch``).

    A named tuple rather than a dataclass: one is built per message, and tuples build fastest.
    """

    value: bytes | None = None
    key: bytes | None = None
    headers: tuple[tuple[str, bytes], ...] = ()
    ack_inbox: str | None = None
    correlation_id: str = ""
    ack_policy: AckPolicy = AckPolicy.LEADER
    producer_id: str | None = None
    sequence: int | None = None
    batch: pa.RecordBatch | None = None
    """Many messages: columns ``value`` (or ``typed``, see :func:`typed_batch`) and optionally
    ``key`` and ``headers``."""
    stream: str | None = None
    """The target stream (with ``partition``): only that partition acks."""
    partition: int | None = None
    producer_epoch: int = 0
    message_id: str | None = None
    """The publisher's id for the message, for de-duplication within the stream's window."""

    @property
    def message_count(self) -> int:
        """How many messages the envelope carries."""
        return self.batch.num_rows if self.batch is not None else 1


def encode(envelope: Envelope) -> bytes:
    """Serialize ``envelope``; raises ``EnvelopeError`` for a field that cannot be encoded."""
    if envelope.batch is not None and envelope.value is not None:
        raise EnvelopeError("an envelope carries either one value or a batch, not both")
    if (envelope.producer_id is None) != (envelope.sequence is None):
        raise EnvelopeError("producer_id and sequence go together")
    if (envelope.stream is None) != (envelope.partition is None):
        raise EnvelopeError("the target stream and partition go together")
    if envelope.message_id is not None:
        if envelope.batch is not None or envelope.producer_id is not None:
            raise EnvelopeError("a message id goes with one message, not a batch or an idempotent producer's")
        problem = message_id_problem(envelope.message_id)
        if problem is not None:
            raise EnvelopeError(problem)
    flags = (
        (_KEY if envelope.key is not None else 0)
        | (_VALUE if envelope.value is not None else 0)
        | (_BATCH if envelope.batch is not None else 0)
        | (_PRODUCER if envelope.producer_id is not None else 0)
        | (_TARGET if envelope.stream is not None else 0)
        | (_MESSAGE_ID if envelope.message_id is not None else 0)
        | (_TYPED if envelope.batch is not None and TYPED_COLUMN in envelope.batch.schema.names else 0)
    )
    parts: list[bytes | memoryview] = [
        _HEADER.pack(MAGIC, VERSION, flags, int(envelope.ack_policy), 0),
        _str16(envelope.ack_inbox or "", "ack inbox"),
        _str16(envelope.correlation_id, "correlation id"),
    ]
    if envelope.stream is not None:
        parts += [
            _str16(envelope.stream, "stream"),
            _U32.pack(_bounded("partition", envelope.partition, 2**32 - 1)),
        ]
    if envelope.producer_id is not None:
        epoch = _bounded("producer epoch", envelope.producer_epoch, MAX_EPOCH)
        sequence = _bounded("sequence", envelope.sequence, MAX_SEQUENCE)
        parts += [_str16(envelope.producer_id, "producer id"), _EPOCH_SEQUENCE.pack(epoch, sequence)]
    if envelope.message_id is not None:
        parts.append(_str16(envelope.message_id, "message id"))
    if envelope.key is not None:
        parts.append(_bytes32(envelope.key))
    if len(envelope.headers) > 0xFFFF:
        raise EnvelopeError(f"too many headers: {len(envelope.headers)} (at most 65535)")
    parts.append(_U16.pack(len(envelope.headers)))
    for name, value in envelope.headers:
        parts += [_str16(name, "header name"), _bytes32(value)]
    if envelope.value is not None:
        parts.append(_bytes32(envelope.value))
    if envelope.batch is not None:
        ipc = _ipc_buffer(envelope.batch)
        parts += [_U32.pack(ipc.size), memoryview(ipc)]  # joined without an extra copy of the batch
    return b"".join(parts)


def looks_like_envelope(payload: bytes) -> bool:
    """Whether ``payload`` starts with the envelope magic bytes."""
    return payload[:4] == MAGIC


def decode(payload: bytes, *, max_batch_bytes: int | None = None) -> Envelope:
    """Parse an envelope; raises ``EnvelopeError`` for anything that is not exactly one.

    A batch that would take more than ``max_batch_bytes`` once decoded is
    refused before it is decompressed.
    """
    size = len(payload)
    if size < _HEADER.size:
        raise EnvelopeError(f"{size} bytes is too short for an envelope")
    magic, version, flags, policy, reserved = _HEADER.unpack_from(payload, 0)
    if magic != MAGIC:
        raise EnvelopeError("no envelope magic bytes")
    if version != VERSION:
        raise EnvelopeError(f"unsupported envelope version {version}")
    if (
        flags & ~(_KEY | _VALUE | _BATCH | _PRODUCER | _TARGET | _MESSAGE_ID | _TYPED)
        or reserved
        or (flags & _VALUE and flags & _BATCH)
        or (flags & _TYPED and not flags & _BATCH)
        or (flags & _MESSAGE_ID and flags & (_BATCH | _PRODUCER))
    ):
        raise EnvelopeError(f"invalid envelope flags {flags:#04x}")
    if policy >= len(_POLICIES):
        raise EnvelopeError(f"invalid ack policy {policy}")
    # Parsed inline rather than through helper objects: this runs once per message.
    try:
        pos = _HEADER.size
        n = _U16.unpack_from(payload, pos)[0]
        ack_inbox = payload[pos + 2 : pos + 2 + n].decode() or None
        pos += 2 + n
        n = _U16.unpack_from(payload, pos)[0]
        correlation_id = payload[pos + 2 : pos + 2 + n].decode()
        pos += 2 + n
        stream = partition = None
        if flags & _TARGET:
            n = _U16.unpack_from(payload, pos)[0]
            stream = payload[pos + 2 : pos + 2 + n].decode()
            pos += 2 + n
            partition = _U32.unpack_from(payload, pos)[0]
            pos += 4
        producer_id = sequence = None
        epoch = 0
        if flags & _PRODUCER:
            n = _U16.unpack_from(payload, pos)[0]
            producer_id = payload[pos + 2 : pos + 2 + n].decode()
            pos += 2 + n
            epoch, sequence = _EPOCH_SEQUENCE.unpack_from(payload, pos)
            pos += 8
            if epoch > MAX_EPOCH:
                raise EnvelopeError(f"producer epoch {epoch} is over {MAX_EPOCH}")
        message_id = None
        if flags & _MESSAGE_ID:
            # Decoded as it comes: the broker refuses a bad id with an ack naming it.
            n = _U16.unpack_from(payload, pos)[0]
            message_id = payload[pos + 2 : pos + 2 + n].decode()
            pos += 2 + n
        key = None
        if flags & _KEY:
            n = _U32.unpack_from(payload, pos)[0]
            key = payload[pos + 4 : pos + 4 + n]
            pos += 4 + n
        count = _U16.unpack_from(payload, pos)[0]
        pos += 2
        headers = []
        for _ in range(count):
            n = _U16.unpack_from(payload, pos)[0]
            name = payload[pos + 2 : pos + 2 + n].decode()
            pos += 2 + n
            n = _U32.unpack_from(payload, pos)[0]
            headers.append((name, payload[pos + 4 : pos + 4 + n]))
            pos += 4 + n
        value = None
        batch = None
        if flags & (_VALUE | _BATCH):
            n = _U32.unpack_from(payload, pos)[0]
            body = payload[pos + 4 : pos + 4 + n]
            pos += 4 + n
            if flags & _VALUE:
                value = body
            else:
                decoded = _batch_size(body)
                if max_batch_bytes is not None and decoded > max_batch_bytes:
                    header = Envelope(
                        ack_inbox=ack_inbox,
                        correlation_id=correlation_id,
                        ack_policy=_POLICIES[policy],
                        stream=stream,
                        partition=partition,
                    )
                    raise BatchTooLargeError(decoded, max_batch_bytes, header)
                batch = _parse_batch(body, typed=bool(flags & _TYPED))
    except struct.error:
        raise EnvelopeError(f"envelope ends early: {size} bytes") from None
    except UnicodeDecodeError:
        raise EnvelopeError("a text field is not valid UTF-8") from None
    if pos != size:
        # Slices past the end come back short rather than failing: this catches them too.
        raise EnvelopeError(f"envelope length mismatch: fields need {pos} bytes, payload has {size}")
    return Envelope(
        value=value,
        key=key,
        headers=tuple(headers),
        ack_inbox=ack_inbox,
        correlation_id=correlation_id,
        ack_policy=_POLICIES[policy],
        producer_id=producer_id,
        sequence=sequence,
        batch=batch,
        stream=stream,
        partition=partition,
        producer_epoch=epoch,
        message_id=message_id,
    )


def _bounded(what: str, value: int | None, limit: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= limit:
        raise EnvelopeError(f"{what} must be an integer from 0 to {limit}, got {value!r}")
    return value


def _str16(text: str, what: str) -> bytes:
    raw = text.encode()
    if len(raw) > 0xFFFF:
        raise EnvelopeError(f"{what} is {len(raw)} bytes; at most 65535")
    return _U16.pack(len(raw)) + raw


def _bytes32(data: bytes) -> bytes:
    if len(data) > 0xFFFFFFFF:
        raise EnvelopeError(f"a field of {len(data)} bytes is over 4 GiB")
    return _U32.pack(len(data)) + data


def _ipc_buffer(batch: pa.RecordBatch) -> pa.Buffer:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue()


def _batch_size(data: bytes) -> int:
    try:
        return decoded_size(data)
    except ValueError as exc:
        raise EnvelopeError(f"the batch is not a valid Arrow IPC stream: {exc}") from None


def typed_batch(typed: pa.RecordBatch, version: int, others: pa.RecordBatch | None = None) -> pa.RecordBatch:
    """The envelope batch of typed rows: ``typed`` (the columns of version ``version``'s fields)
    as its ``typed`` column, beside the ``key`` and ``headers`` columns of ``others``."""
    metadata = {SCHEMA_VERSION_KEY: str(version).encode()}
    column = pa.StructArray.from_arrays(typed.columns, fields=list(typed.schema))
    arrays = [] if others is None else [others.column(n) for n in others.schema.names]
    fields = [] if others is None else list(others.schema)
    field = pa.field(TYPED_COLUMN, column.type, nullable=False, metadata=metadata)
    return pa.RecordBatch.from_arrays([*arrays, column], schema=pa.schema([*fields, field]))


def typed_fields_apart(batch: pa.RecordBatch) -> tuple[pa.RecordBatch, pa.RecordBatch | None]:
    """Typed rows (a schema's fields, maybe beside ``key`` and ``headers``) split into the fields and
    the columns that travel beside them (``None`` if none do), as :func:`typed_batch` takes them."""
    carried = [n for n in batch.schema.names if n in _CARRIED]
    return batch.drop_columns(carried), (batch.select(carried) if carried else None)


def typed_version(batch: pa.RecordBatch | pa.Table) -> int | None:
    """The schema version a typed batch's ``typed`` column says it holds; ``None`` if it has no such
    column, or it says none (or not a positive number)."""
    index = batch.schema.get_field_index(TYPED_COLUMN)
    if index < 0:
        return None
    metadata = batch.schema.field(index).metadata or {}
    text = metadata.get(SCHEMA_VERSION_KEY, b"")
    return int(text) if text.isdigit() and int(text) > 0 else None


def _parse_batch(data: bytes, *, typed: bool = False) -> pa.RecordBatch:
    # Arrow reports malformed input in several ways; all of them mean "not an envelope".
    try:
        table = pa.ipc.open_stream(data).read_all()
        table.validate(full=True)
    except Exception as exc:  # noqa: BLE001
        raise EnvelopeError(f"the batch is not a valid Arrow IPC stream: {exc}") from None
    names = table.schema.names
    if typed:
        unknown = sorted(set(names) - _TYPED_COLUMNS)
        struct = TYPED_COLUMN in names and pa.types.is_struct(table.schema.field(TYPED_COLUMN).type)
        if unknown or not struct:
            raise EnvelopeError(
                f"a typed batch needs a struct column 'typed' and only key/typed/headers, got {names}"
            )
        if typed_version(table) is None:
            raise EnvelopeError("a typed batch's 'typed' column does not say its schema version")
    elif set(names) - _BATCH_COLUMNS or "value" not in names:
        raise EnvelopeError(f"a batch needs a 'value' column and only key/value/headers, got {names}")
    if table.num_rows == 0:
        raise EnvelopeError("the batch has no rows")
    return table.combine_chunks().to_batches()[0]
