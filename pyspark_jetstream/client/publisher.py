"""Publishing over NATS: envelopes out, acks back on one inbox, matched by correlation id.

A stream is attached to NATS subjects, so a publish is a NATS publish of an
envelope (:mod:`pyspark_jetstream.protocol.envelope`) to the target
partition's subject (see :mod:`.routing`).  A publish that wants an ack takes
a slot of the ack window (``max_pending`` acks outstanding; past it,
publishing waits for the oldest) and a deadline; its ack arrives on the
client's inbox, alone or batched with others (one NATS message, many acks),
and ends its future.  A sweeper fails each future still waiting at its
deadline, soonest first.

Plain messages (no message id, producer or headers; a value of at most
:data:`GATHER_MESSAGE_BYTES`; a stream without a schema) published while the
event loop is busy leave together: those waiting for the same partition and
ack policy when the loop next turns go as one envelope batch, as Kafka's
producer sends its batches, and the batch's ack is split into each message's
own.  Nothing waits for more to come: a message published alone leaves at
the loop's next turn, as a single envelope, and a full ack window sends what
waits before it blocks.  A publish the broker de-duplicates (see
:func:`.publish_options.deduplicated`) is kept until its ack and resent to a
new leader after a leadership change (:mod:`.resend`).

Everything here runs on the client's event loop.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import heapq
import itertools
import logging
import re
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import pyarrow as pa
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.errors import Error as NatsError

from pyspark_jetstream.protocol.ack import Ack, decode_acks
from pyspark_jetstream.protocol.envelope import (
    AckPolicy,
    Envelope,
    EnvelopeError,
    encode,
    typed_batch,
    typed_fields_apart,
)
from pyspark_jetstream.protocol.errors import (
    ErrorCode,
    InvalidArgumentError,
    JetStreamError,
    MessageTooLargeError,
    PermissionDeniedError,
    RequestTimeoutError,
    UnavailableError,
    error_from_code,
)
from pyspark_jetstream.protocol.flight import StreamInfo
from pyspark_jetstream.protocol.streams import StreamConfig
from pyspark_jetstream.protocol.typed_rows import conform

from .partitioners import key_hash
from .publish_options import (
    PublishOptions,
    as_batch,
    check_message_id,
    check_typed_batches,
    deduplicated,
    with_ids,
)
from .resend import Resender
from .routing import METADATA_MAX_AGE, Routes, Target

logger = logging.getLogger(__name__)

GATHER_MESSAGE_BYTES = 16 * 1024
"""A plain message whose key and value are at most this many bytes may leave in a batch with others."""

GATHER_BATCH_BYTES = 256 * 1024
"""A batch of gathered messages leaves once its keys and values reach this many bytes."""


class _Waiting(NamedTuple):
    """A gathered message not yet sent: its own correlation id, key, value and ack deadline."""

    correlation_id: str
    key: bytes | None
    value: bytes
    deadline: float


_Group = tuple[str, str, int, AckPolicy]
"""Gathered messages leave together when they share the subject, stream, partition and ack policy."""

PUBLISH_REFUSED = re.compile(r'permissions violation for publish to "([^"]+)"', re.IGNORECASE)
"""nats-server's error for a publish the user's permissions refuse (nats-py reports it lower-cased)."""


class Deadlines:
    """The deadlines of the acks awaited, soonest first: a heap of ``(deadline, correlation id,
    subject, seconds)``.  An answered ack's deadline stays in the heap until it passes or the
    heap is rebuilt from the deadlines still awaited, which :meth:`drop_settled` does once the
    heap holds more than twice those: it holds about the acks in flight, not a timeout's worth
    of publishes, which the garbage collector walked again and again."""

    SLACK = 1024
    """Settled deadlines kept beyond twice the awaited ones before the heap is rebuilt."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, str, str, float]] = []

    def add(self, seconds: float, deadline: float, correlation_id: str, subject: str) -> bool:
        """Keep a deadline; whether it is now the soonest."""
        heapq.heappush(self._heap, (deadline, correlation_id, subject, seconds))
        return self._heap[0][1] == correlation_id

    def soonest(self) -> tuple[float, str, str, float] | None:
        """``(deadline, correlation id, subject, seconds)`` of the soonest, or ``None``."""
        return self._heap[0] if self._heap else None

    def pop(self) -> None:
        """Drop the soonest."""
        heapq.heappop(self._heap)

    def drop_settled(self, awaited: Callable[[str], bool], count: int) -> None:
        """Rebuild the heap from the deadlines still ``awaited`` (``count`` of them) once it holds
        more than twice those."""
        if len(self._heap) > 2 * count + self.SLACK:
            self._heap = [entry for entry in self._heap if awaited(entry[1])]
            heapq.heapify(self._heap)

    def entries(self) -> Iterator[tuple[str, str]]:
        """``(correlation id, subject)`` of every deadline kept."""
        for _, correlation_id, subject, _ in self._heap:
            yield correlation_id, subject


class AckWindow:
    """At most ``size`` acks outstanding: :meth:`acquire` takes a slot, waiting first come first
    served when none is free; :meth:`release` hands its slot to the longest waiting, if any.

    ``asyncio.Semaphore`` does the same, but its every acquire scans its waiters (a generator
    per publish, a fifth of a pipelined publisher's CPU).
    """

    def __init__(self, size: int) -> None:
        self.free = size
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    @property
    def full(self) -> bool:
        """Whether an acquire would wait."""
        return self.free <= 0 or bool(self._waiters)

    def take(self) -> bool:
        """Take a free slot at once, if there is one."""
        if self.free > 0 and not self._waiters:
            self.free -= 1
            return True
        return False

    async def acquire(self) -> None:
        if self.take():
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter  # a release handed its slot over
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():  # handed a slot, then cancelled: pass it on
                self.release()
            else:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
            raise

    def release(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.free += 1


class Publisher:
    """A client's publishes and their acks (see the module docstring); the event loop's thread only."""

    def __init__(
        self,
        nc: NatsClient,
        *,
        timeout: float,
        max_pending: int,
        user: str | None,
        describe: Callable[[str], Awaitable[StreamInfo]],
        leadership: Callable[[str], Awaitable[StreamInfo]],
        metadata_max_age: float = METADATA_MAX_AGE,
        metadata: Callable[[], Awaitable[dict[str, Any]]] | None = None,
    ) -> None:
        """``describe(stream)`` reads a stream before its first publish; ``leadership(stream)``
        reads its leaders when the resender checks for a change, and its configuration again
        after ``metadata_max_age`` seconds; ``metadata()`` reads the cluster's brokers (and their
        features) before a typed batch; ``user`` is named in refusals."""
        self.nc = nc
        self.timeout = timeout
        self._user = user
        self._window = AckWindow(max_pending)
        self._publishing = asyncio.Lock()
        """Held by a publish from its call until NATS has its payload, so publishes leave in the
        order they were called: a stream's first publish awaits its description, and one called
        meanwhile must not overtake it (an idempotent producer's sequences must arrive in order,
        or the broker refuses them).  The lock is FIFO; uncontended, it costs no switch."""
        self._deadlines = Deadlines()
        self._sweeper: asyncio.Future[None] | None = None
        self._sooner = asyncio.Event()  # a deadline before the one the sweeper sleeps for
        self._acks: dict[str, asyncio.Future[Ack]] = {}
        self._gathered: dict[_Group, list[_Waiting]] = {}
        """Plain messages waiting for the loop's next turn, in the order they were published."""
        self._gathered_bytes: dict[_Group, int] = {}
        self._gathering: asyncio.Task[None] | None = None
        self._batches: dict[str, list[str]] = {}
        """The messages' correlation ids of each gathered batch in flight, by the batch's."""
        self._sending = asyncio.Lock()
        """Held while gathered messages are handed to NATS, by anything sending after them:
        every publish reaches NATS in the order it was called."""
        self._ids = itertools.count()
        self._inbox = nc.new_inbox()
        self._ack_sub: Any = None
        self.resender = Resender(leadership, nc.publish)
        self.routes = Routes(describe, self.resender.learn, user, reread=leadership, max_age=metadata_max_age)
        self._metadata = metadata
        self._typed_checked: float | None = None
        """``loop.time()`` when every broker was last seen to take typed batches."""

    async def start(self) -> None:
        """Subscribe to the ack inbox."""
        self._ack_sub = await self.nc.subscribe(self._inbox, cb=self._on_ack)

    async def send_waiting(self) -> None:
        """Hand NATS the gathered messages still waiting (before NATS closes)."""
        async with self._sending:
            await self._send_gathered()

    def close(self) -> None:
        """Stop resending and sweeping; fail the acks still pending (before NATS closes)."""
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._gathering is not None:
            self._gathering.cancel()
        self.resender.close()
        self.routes.close()
        for future in self._acks.values():
            if not future.done():
                future.set_exception(UnavailableError("client closed before the ack arrived"))
        self._acks.clear()

    def learn(self, info: StreamInfo, config: StreamConfig) -> None:
        """Take a stream just created: its configuration and leader epochs."""
        self.routes.remember(config)
        self.resender.learn(info)

    def forget(self, stream: str) -> None:
        """Drop a deleted stream's configuration."""
        self.routes.streams.pop(stream, None)

    async def publish(
        self,
        stream: str | None,
        value: bytes | None,
        *,
        key: bytes | None,
        headers: tuple[tuple[str, bytes], ...],
        message_id: str | None,
        options: PublishOptions,
    ) -> asyncio.Future[Ack] | None:
        """Send one message; a future for its ack, or ``None`` (see :meth:`.Client.publish_async`)."""
        if message_id is not None:
            check_message_id(message_id, headers, options.producer_id)
        async with self._publishing:
            target = await self.routes.target(
                stream, key, options.partition, options.partitioner, options.subject
            )
            if message_id is None and not headers and self._gatherable(target, options, key, value):
                assert target.stream is not None and target.partition is not None and value is not None
                group = (target.subject, target.stream, target.partition, options.ack_policy)
                return await self._gather(group, options, key, value)
            fields = {
                "value": value,
                "key": key,
                "headers": headers,
                "message_id": message_id,
                "producer_id": options.producer_id,
                "producer_epoch": options.producer_epoch,
                "sequence": options.sequence,
            }
            return await self._send(target, options, fields)

    async def publish_batch(
        self,
        stream: str | None,
        data: pa.Table | pa.RecordBatch | Sequence[Mapping[str, Any]],
        *,
        message_ids: Sequence[str] | pa.Array | str | None,
        options: PublishOptions,
    ) -> asyncio.Future[Ack] | None:
        """Send one Arrow batch; a future for its ack, or ``None`` (see :meth:`.Client.publish_batch`).

        A batch without a ``value`` column to a typed stream is a typed batch: its columns but
        ``key`` and ``headers`` are the stream's fields (see :meth:`_typed`)."""
        batch = as_batch(data)
        if message_ids is not None:
            if options.producer_id is not None:
                raise InvalidArgumentError(
                    f"message_ids and producer_id {options.producer_id!r} are not combined: a producer's "
                    "sequence already de-duplicates its batches"
                )
            batch = with_ids(batch, message_ids)  # every row with its id: resending it is safe
        partition = options.partition
        if partition is None and options.subject is None:
            partition = 0
        async with self._publishing:
            target = await self.routes.target(stream, None, partition, key_hash, options.subject)
            if stream is not None and "value" not in batch.schema.names:
                batch = await self._typed(stream, batch)
            fields = {
                "batch": batch,
                "producer_id": options.producer_id,
                "producer_epoch": options.producer_epoch,
                "sequence": options.sequence,
            }
            resendable = True if message_ids is not None else None  # None: read from the batch
            return await self._send(target, options, fields, resendable=resendable)

    async def _typed(self, stream: str, batch: pa.RecordBatch) -> pa.RecordBatch:
        """``batch`` (the stream's fields, and maybe ``key`` and ``headers``) as a typed envelope
        batch of the stream's current schema version, its columns cast as
        :func:`~pyspark_jetstream.protocol.typed_rows.conform` says; ``InvalidArgumentError``
        naming the column, or the brokers that cannot store typed batches."""
        config = self.routes.streams[stream]
        if config.schema is None:
            raise InvalidArgumentError(
                f"the batch has no 'value' column, and stream {stream!r} is not typed (it has no "
                f"schema whose fields the columns could be): its columns are {', '.join(batch.schema.names)}"
            )
        await self._check_typed_batches()
        schema = config.schema
        columns, others = typed_fields_apart(batch)
        return typed_batch(conform(columns, schema.current, schema.version), schema.version, others)

    async def _check_typed_batches(self) -> None:
        """Refuse a typed batch while a broker cannot store it (a broker of an older version takes
        it for a plain message, which a typed stream refuses); read again after the metadata's
        ``max_age``."""
        loop = asyncio.get_running_loop()
        if self._typed_checked is not None and loop.time() - self._typed_checked < self.routes.max_age:
            return
        if self._metadata is None:
            raise InvalidArgumentError("this publisher cannot learn the brokers' features: send JSON values")
        check_typed_batches((await self._metadata())["brokers"])
        self._typed_checked = loop.time()

    async def partitions_for(self, stream: str, keys: Sequence[bytes | None]) -> list[int]:
        """The partition a publish of each of ``keys`` to ``stream`` goes to (the default
        partitioner), the stream looked up once."""
        await self.routes.target(stream, None, None, key_hash, None)  # learned, or refused as a publish is
        partitions = self.routes.streams[stream].partitions
        return [key_hash(key, partitions) for key in keys]

    def _gatherable(
        self, target: Target, options: PublishOptions, key: bytes | None, value: bytes | None
    ) -> bool:
        """Whether a message without message id or headers may leave in a batch with others:
        ``bytes``, acked, no producer, a small value to one partition of a stream without a
        schema (a typed stream refuses an invalid value alone, not the batch around it)."""
        if type(value) is not bytes or (key is not None and type(key) is not bytes):
            return False  # alone, a value of another type fails as it always did, at the call
        if options.producer_id is not None or not options.wants_ack:
            return False
        if target.stream is None or target.partition is None:
            return False
        size = len(value) + (0 if key is None else len(key))
        config = self.routes.streams.get(target.stream)
        return (
            config is not None
            and config.schema is None
            and size <= min(GATHER_MESSAGE_BYTES, config.max_message_bytes)
        )

    async def _gather(
        self, group: _Group, options: PublishOptions, key: bytes | None, value: bytes
    ) -> asyncio.Future[Ack]:
        """Keep a plain message for the loop's next turn; a future for its own ack."""
        if self._window.full:  # what waits leaves now, so acks can free a slot
            await self.send_waiting()
        correlation_id = str(next(self._ids))
        if self._window.take():  # no coroutine to wait in: the common case, on the hot path
            future, deadline = self._ack_future(correlation_id, group[0], options)
        else:
            future, deadline = await self._awaiting(correlation_id, group[0], options)
        self._gathered.setdefault(group, []).append(_Waiting(correlation_id, key, value, deadline))
        size = self._gathered_bytes.get(group, 0) + len(value) + (0 if key is None else len(key))
        self._gathered_bytes[group] = size
        if size >= GATHER_BATCH_BYTES:
            await self.send_waiting()
        elif self._gathering is None:
            self._gathering = asyncio.ensure_future(self._next_turn())
        return future

    async def _next_turn(self) -> None:
        self._gathering = None
        await self.send_waiting()

    async def _send_gathered(self) -> None:
        """Hand NATS every gathered message, each group's as one envelope (``_sending`` held)."""
        gathered, self._gathered, self._gathered_bytes = self._gathered, {}, {}
        for (subject, stream, partition, ack_policy), waiting in gathered.items():
            if len(waiting) == 1:  # alone: the single message's envelope, as if never gathered
                correlation_id, key, value, _ = waiting[0]
                fields: dict[str, Any] = {"value": value, "key": key}
            else:
                correlation_id = str(next(self._ids))
                self._batches[correlation_id] = [w.correlation_id for w in waiting]
                # Forgotten by the sweeper in the same pass as its last message's deadline.
                last = max(w.deadline for w in waiting)
                self._deadlines.add(0.0, last, correlation_id, "")
                values = pa.array([w.value for w in waiting], pa.binary())
                if any(w.key is not None for w in waiting):
                    keys = pa.array([w.key for w in waiting], pa.binary())
                    fields = {"batch": pa.record_batch({"key": keys, "value": values})}
                else:
                    fields = {"batch": pa.record_batch({"value": values})}
            payload = encode(
                Envelope(
                    ack_inbox=self._inbox,
                    correlation_id=correlation_id,
                    ack_policy=ack_policy,
                    stream=stream,
                    partition=partition,
                    **fields,
                )
            )
            try:
                await self.nc.publish(subject, payload)
            except NatsError as exc:
                self._batches.pop(correlation_id, None)
                failure = UnavailableError(f"publish to {subject!r} failed: {exc}")
                for member in waiting:
                    future = self._acks.pop(member.correlation_id, None)
                    if future is not None and not future.done():
                        future.set_exception(failure)

    async def _in_order(self, subject: str, payload: bytes) -> None:
        """Publish ``payload`` after every gathered message (published before it)."""
        async with self._sending:
            if self._gathered:
                await self._send_gathered()
            await self.nc.publish(subject, payload)

    async def _awaiting(
        self, correlation_id: str, subject: str, options: PublishOptions
    ) -> tuple[asyncio.Future[Ack], float]:
        """A slot of the ack window (waiting for one), a future for the ack of ``correlation_id``
        that ends with the ack or at its deadline, and that deadline (``loop.time()``)."""
        await self._window.acquire()
        return self._ack_future(correlation_id, subject, options)

    def _ack_future(
        self, correlation_id: str, subject: str, options: PublishOptions
    ) -> tuple[asyncio.Future[Ack], float]:
        """:meth:`_awaiting` once the slot is taken."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Ack] = loop.create_future()
        future.add_done_callback(self._release_window)
        self._acks[correlation_id] = future
        seconds = options.timeout or self.timeout
        deadline = loop.time() + seconds
        front = self._deadlines.add(seconds, deadline, correlation_id, subject)
        if self._sweeper is None:
            self._sweeper = asyncio.ensure_future(self._sweep())
        elif front:
            self._sooner.set()
        return future, deadline

    async def _send(
        self,
        target: Target,
        options: PublishOptions,
        fields: dict[str, Any],
        *,
        resendable: bool | None = None,
    ) -> asyncio.Future[Ack] | None:
        """Send an envelope of ``fields``; ``resendable``: whether the broker de-duplicates it, if the
        caller knows (``None``: :func:`deduplicated` reads it from the fields)."""
        subject = target.subject
        ack_policy = options.ack_policy
        wants_ack = options.wants_ack
        correlation_id = str(next(self._ids)) if wants_ack else ""
        try:
            payload = encode(
                Envelope(
                    ack_inbox=self._inbox if wants_ack else None,
                    correlation_id=correlation_id,
                    ack_policy=ack_policy,
                    stream=target.stream,
                    partition=target.partition,
                    **fields,
                )
            )
        except EnvelopeError as exc:
            raise InvalidArgumentError(str(exc)) from None
        if len(payload) > self.nc.max_payload:
            raise MessageTooLargeError(
                f"the message is {len(payload)} bytes, over the NATS server's max_payload of "
                f"{self.nc.max_payload}: publish smaller batches or raise max_payload in nats-server"
            )
        if not wants_ack:
            await self._in_order(subject, payload)
            return None
        if self._window.full and self._gathered:  # what waits leaves first, so acks can free a slot
            await self.send_waiting()
        # Every ack future ends: with the ack, or when the sweeper finds it overdue.
        future, _ = await self._awaiting(correlation_id, subject, options)
        if resendable is None:
            resendable = deduplicated(fields)
        if target.stream is not None and target.partition is not None and resendable:
            producer_id = options.producer_id
            self.resender.track(
                correlation_id,
                subject,
                payload,
                stream=target.stream,
                partition=target.partition,
                producer=None if producer_id is None else (producer_id, options.producer_epoch),
                sequence=options.sequence or 0,
            )
            future.add_done_callback(lambda _: self.resender.done(correlation_id))
        try:
            await self._in_order(subject, payload)
        except NatsError as exc:
            future.cancel()
            raise UnavailableError(f"publish to {subject!r} failed: {exc}") from None
        return future

    def _release_window(self, _: asyncio.Future[Ack]) -> None:
        self._window.release()

    def on_nats_error(self, error: Exception) -> None:
        """NATS refused a publish (no write permission): fail its pending acks at once, rather
        than let each wait out its timeout."""
        refused = PUBLISH_REFUSED.search(str(error))
        if refused is None:
            return
        subject = refused.group(1)  # nats-py lower-cases the server's error, subject included
        stream = self.routes.stream_of(subject)
        what = f"stream {stream!r}" if stream is not None else f"subject {subject!r}"
        who = f"principal {self._user!r}" if self._user else "this client"
        for correlation_id, pending_subject in self._deadlines.entries():
            future = self._acks.get(correlation_id) if pending_subject.lower() == subject else None
            if future is not None and not future.done():
                future.set_exception(
                    PermissionDeniedError(
                        f"{who} may not write {what} (NATS refused the publish to {subject!r})",
                        stream=stream,
                    )
                )

    async def _sweep(self) -> None:
        """Fail acks that are overdue, soonest deadline first."""
        loop = asyncio.get_running_loop()
        while (soonest := self._deadlines.soonest()) is not None:
            deadline, correlation_id, subject, seconds = soonest
            if deadline > loop.time():
                self._sooner.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._sooner.wait(), deadline - loop.time())
                continue
            self._deadlines.pop()
            self._batches.pop(correlation_id, None)  # a gathered batch: its messages have their own
            future = self._acks.pop(correlation_id, None)
            if future is None or future.done():
                continue
            refusal = self.resender.refusal(correlation_id)
            if refusal is not None:  # held for in-sync replicas that did not come back in time
                future.set_result(refusal)
            else:
                future.set_exception(
                    RequestTimeoutError(
                        f"no ack for message {correlation_id} on {subject!r} within {seconds:g}s: "
                        "is a broker leading that partition? (A message with a producer id and "
                        "sequence, or a message id, is resent after a leader change; others are not.)"
                    )
                )
        self._sweeper = None

    async def _on_ack(self, msg: Msg) -> None:
        try:
            acks = decode_acks(msg.data)
        except JetStreamError:
            logger.warning("ignoring a malformed ack: %r", msg.data[:200])
            return
        for ack in acks:
            members = self._batches.pop(ack.correlation_id, None)
            if members is not None:
                self._split(ack, members)
                continue
            if self.resender.holds(ack):
                continue  # refused behind a lost message: answered after its resend
            future = self._acks.pop(ack.correlation_id, None)
            if future is not None and not future.done():
                future.set_result(ack)
        self._deadlines.drop_settled(self._awaited, len(self._acks) + len(self._batches))

    def _awaited(self, correlation_id: str) -> bool:
        return correlation_id in self._acks or correlation_id in self._batches

    def _split(self, batch: Ack, members: list[str]) -> None:
        """End each gathered message's future with its own ack out of its batch's ``batch``."""
        if batch.ok:
            try:
                offsets: list[int] | None = batch.row_offsets(len(members))
            except ValueError as exc:
                logger.warning("an ack of a gathered batch does not fit it: %s", exc)
                batch = batch._replace(error=ErrorCode.UNAVAILABLE, message=f"the broker's ack: {exc}")
                offsets = None
        else:
            offsets = None
        repeated = dict(batch.duplicates)
        every_repeated = batch.duplicate
        for row, correlation_id in enumerate(members):
            future = self._acks.pop(correlation_id, None)
            if future is None or future.done():
                continue
            if offsets is None:
                ack = batch._replace(first_offset=-1, last_offset=-1, correlation_id=correlation_id)
            else:
                error = ErrorCode.DUPLICATE if every_repeated or row in repeated else ErrorCode.OK
                offset = offsets[row]
                ack = Ack(batch.stream, batch.partition, offset, offset, correlation_id, error, batch.message)
            future.set_result(ack)


async def await_ack(future: asyncio.Future[Ack]) -> Ack:
    """The ack, or the error it carries (the sweeper fails the future on timeout)."""
    ack = await future
    if not ack.ok:
        raise error_from_code(ack.error.value, f"{ack.stream}/{ack.partition}: {ack.message}")
    return ack
