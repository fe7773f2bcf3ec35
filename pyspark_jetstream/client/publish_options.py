"""What a publish carries besides its message: :class:`PublishOptions`, and the checks of a message.

The four publish calls of :class:`~.client.Client` (``publish``,
``publish_async``, ``publish_batch``, ``publish_batch_async``) take the same
keyword arguments for where a message goes, how it is acknowledged and which
producer sends it, declared once (:class:`SendOptions`; a message's own in
:class:`MessageOptions`, a batch's in :class:`BatchOptions`); each call gathers
them into a frozen :class:`PublishOptions` and hands that on.  The functions
below check and shape the message itself (its id, its batch) and decide
whether the broker de-duplicates it, which makes resending it safe.  All pure:
no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

import pyarrow as pa

from pyspark_jetstream.protocol.envelope import AckPolicy
from pyspark_jetstream.protocol.errors import InvalidArgumentError
from pyspark_jetstream.protocol.headers import (
    MSG_ID_HEADER,
    checked_message_ids,
    message_ids_in,
    validate_message_id,
    with_message_ids,
)

from .partitioners import Partitioner, key_hash


@dataclass(frozen=True, slots=True)
class PublishOptions:
    """Where a publish goes, how it is acknowledged and who sends it (see :meth:`.Client.publish`).

    Raises ``InvalidArgumentError`` naming the value when ``producer_id`` and
    ``sequence`` are not given together.
    """

    partition: int | None = None
    """The partition; ``None``: ``partitioner(key, partitions)`` (a batch: partition 0)."""
    partitioner: Partitioner = key_hash
    subject: str | None = None
    """Overrides the partition's subject (then the partition is the one whose subject it matches)."""
    ack_policy: AckPolicy = AckPolicy.LEADER
    producer_id: str | None = None
    producer_epoch: int = 0
    sequence: int | None = None
    timeout: float | None = None
    """Seconds to wait for the ack; ``None`` (or 0): the client's timeout."""

    def __post_init__(self) -> None:
        if (self.producer_id is None) != (self.sequence is None):
            given = (
                f"producer_id {self.producer_id!r} without a sequence"
                if self.sequence is None
                else f"sequence {self.sequence!r} without a producer_id"
            )
            raise InvalidArgumentError(f"producer_id and sequence go together: got {given}")

    @property
    def wants_ack(self) -> bool:
        """Whether the broker acknowledges (any policy but ``NONE``)."""
        return self.ack_policy is not AckPolicy.NONE


DEFAULT_OPTIONS = PublishOptions()
"""Every keyword argument at its default (a plain publish to a stream)."""


class SendOptions(TypedDict, total=False):
    """The keyword arguments every publish call takes: :class:`PublishOptions`' fields but
    ``partitioner`` (see :meth:`.Client.publish`)."""

    partition: int | None
    subject: str | None
    ack_policy: AckPolicy
    producer_id: str | None
    producer_epoch: int
    sequence: int | None
    timeout: float | None


class MessageOptions(SendOptions, total=False):
    """The keyword arguments of ``publish`` and ``publish_async``: :class:`SendOptions`, the
    message's key, headers and id, and the partitioner."""

    key: bytes | None
    headers: Mapping[str, bytes] | Iterable[tuple[str, bytes]]
    partitioner: Partitioner
    message_id: str | None


class BatchOptions(SendOptions, total=False):
    """The keyword arguments of ``publish_batch`` and ``publish_batch_async``: :class:`SendOptions`
    and the rows' message ids."""

    message_ids: Sequence[str] | pa.Array | str | None


_SEND_KEYS = frozenset(SendOptions.__annotations__)
_MESSAGE_KEYS = _SEND_KEYS | {"partitioner"}
_OWN_KEYS = frozenset(("key", "headers", "message_id"))


def options_of(given: Mapping[str, Any]) -> PublishOptions:
    """The publish's options from its :class:`SendOptions` (and ``partitioner``); the shared
    default instance when every one is at its default (the common case, on the hot path: no
    new object per message)."""
    if not given:
        return DEFAULT_OPTIONS
    options = PublishOptions(**given)
    return DEFAULT_OPTIONS if options == DEFAULT_OPTIONS else options


def message_options(given: MessageOptions) -> PublishOptions:
    """``publish``'s options from its keyword arguments (the message's own -- ``key``,
    ``headers``, ``message_id`` -- left out); ``TypeError`` naming one it does not take.  On the
    hot path: a message with no options but its own makes no options object and copies nothing."""
    if len(given) == ("key" in given) + ("headers" in given) + ("message_id" in given):
        return DEFAULT_OPTIONS
    rest = {name: value for name, value in given.items() if name not in _OWN_KEYS}
    _refuse_unknown(rest, _MESSAGE_KEYS, "publish")
    return options_of(rest)


def header_pairs(headers: Mapping[str, bytes] | Iterable[tuple[str, bytes]]) -> tuple[tuple[str, bytes], ...]:
    """A message's headers as ``(name, value)`` pairs."""
    return tuple(headers.items()) if isinstance(headers, Mapping) else tuple(headers)


def batch_options(given: BatchOptions) -> PublishOptions:
    """``publish_batch``'s :class:`SendOptions` as options (its ``message_ids`` apart);
    ``TypeError`` naming an argument it does not take."""
    rest = {name: value for name, value in given.items() if name != "message_ids"}
    _refuse_unknown(rest, _SEND_KEYS, "publish_batch")
    return options_of(rest)


def _refuse_unknown(given: Mapping[str, Any], known: frozenset[str], call: str) -> None:
    if not given.keys() <= known:
        unknown = sorted(set(given) - known)[0]
        raise TypeError(f"{call}() got an unexpected keyword argument {unknown!r}")


def deduplicated(fields: Mapping[str, Any]) -> bool:
    """Whether the broker de-duplicates a message of these envelope fields (resending is safe):
    a producer's sequence, a message id, or a batch whose every row carries one."""
    if fields.get("producer_id") is not None or fields.get("message_id") is not None:
        return True
    batch = fields.get("batch")
    if batch is None:
        return any(name == MSG_ID_HEADER for name, _ in fields.get("headers", ()))
    if "headers" not in batch.schema.names:
        return False
    rows, _ = message_ids_in(batch.column("headers"))
    return len(rows) == batch.num_rows


TYPED_BATCHES = "typed-batches"
"""The feature a broker registers when it stores a typed stream's rows sent as typed columns."""


def check_typed_batches(brokers: Sequence[Mapping[str, Any]]) -> None:
    """Refuse a typed batch while a broker of the cluster's metadata (``brokers``, each with its
    ``features``) does not register :data:`TYPED_BATCHES`: one of an older version would take it
    for a plain message, which a typed stream refuses without an ack to the publisher."""
    older = sorted(str(b["broker_id"]) for b in brokers if TYPED_BATCHES not in b.get("features", ()))
    if older:
        raise InvalidArgumentError(
            f"broker(s) {', '.join(older)} run a version that cannot store typed rows sent as "
            "columns: upgrade every broker first, or publish JSON values (a 'value' column)"
        )


def check_message_id(
    message_id: object, headers: tuple[tuple[str, bytes], ...], producer_id: str | None
) -> None:
    """Refuse a bad ``message_id``, naming it, and one that contradicts the other arguments."""
    validate_message_id(message_id)
    if producer_id is not None:
        raise InvalidArgumentError(
            f"message_id {message_id!r} and producer_id {producer_id!r} cannot be combined: an "
            "idempotent producer's sequences already de-duplicate its retries; use one or the other"
        )
    for name, value in headers:
        if name == MSG_ID_HEADER and value != str(message_id).encode():
            raise InvalidArgumentError(
                f"message_id {message_id!r} contradicts the {MSG_ID_HEADER} header {value!r}: "
                "message_id is stored as that header; pass one of them"
            )


def with_ids(batch: pa.RecordBatch, message_ids: Sequence[str] | pa.Array | str) -> pa.RecordBatch:
    """``batch`` with each row's message id in its headers (see :meth:`Client.publish_batch`)."""
    what = "message_ids"
    if isinstance(message_ids, str):
        if message_ids not in batch.schema.names:
            raise InvalidArgumentError(
                f"message_ids names the column {message_ids!r}, which the batch does not have "
                f"(its columns: {', '.join(batch.schema.names)})"
            )
        what = f"message_ids column {message_ids!r}"
        column = batch.column(message_ids)
        batch = batch.drop_columns([message_ids])
        message_ids = column
    ids = checked_message_ids(message_ids, batch.num_rows, what)
    headers = batch.column("headers") if "headers" in batch.schema.names else None
    merged = with_message_ids(headers, ids)
    if headers is None:
        return batch.append_column("headers", merged)
    return batch.set_column(batch.schema.get_field_index("headers"), "headers", merged)


def as_batch(data: pa.Table | pa.RecordBatch | Sequence[Mapping[str, Any]]) -> pa.RecordBatch:
    """``data`` as one record batch (a table's chunks combined; rows as dicts converted)."""
    if isinstance(data, pa.Table):
        batches = data.combine_chunks().to_batches()
        if not batches:
            raise InvalidArgumentError("publish_batch needs at least one row")
        return batches[0]
    if isinstance(data, pa.RecordBatch):
        return data
    rows = list(data)
    if not rows:
        raise InvalidArgumentError("publish_batch needs at least one row")
    try:
        return pa.RecordBatch.from_pylist(rows)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise InvalidArgumentError(f"rows do not form an Arrow batch: {exc}") from None
