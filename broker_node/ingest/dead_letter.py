"""Dead letters: a typed stream's messages whose values do not match, stored in another stream.

A typed stream whose schema says ``on_invalid = "dead-letter"`` (see
:mod:`pyspark_jetstream.protocol.value_schema`) does not refuse such a
message: its partition leader publishes it, as it arrived, to the stream named
in ``dead_letter`` and acks the publisher once that stream stored it.  The
dead-letter stream is an ordinary untyped stream (checked when the typed one
is created), led by any broker; the message reaches it the way any client's
does, as an envelope (:mod:`pyspark_jetstream.protocol.envelope`) on the
subject of its partition ``n mod P`` (``n`` the source partition, ``P`` the
dead-letter stream's partition count, so one source partition's dead letters
keep their order), acked ``ALL`` (once committed there) on an inbox of this
broker's connection.

What is stored there: the value, key and headers as they arrived, and these
headers after them::

    Jetstream-Invalid-Reason    why the value does not match (naming the field)
    Jetstream-Invalid-Stream    the typed stream and partition, "orders/0"
    Jetstream-Invalid-Subject   the subject the message arrived on

What the publisher's ack says: stored, with the dead-letter stream's name,
partition and offset in place of its own (a JetStream publisher's
``PubAck.stream`` is the dead-letter stream) and, in the project's ack
format, the reason as its ``message``.  If the dead-letter stream does not
store it within :data:`DEAD_LETTER_TIMEOUT` (or does not exist any more), the
publisher is refused with why, so nothing is dropped silently.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

from nats.aio.client import Client as NatsClient
from nats.errors import Error as NatsError

from pyspark_jetstream.protocol.ack import Ack, decode_acks
from pyspark_jetstream.protocol.envelope import AckPolicy, Envelope, encode
from pyspark_jetstream.protocol.errors import ErrorCode, InvalidArgumentError
from pyspark_jetstream.protocol.streams import partition_subject

from .port import Refusal, StreamLookup

logger = logging.getLogger(__name__)

DEAD_LETTER_TIMEOUT = 5.0
"""Seconds the dead-letter stream has to ack a dead letter before its publisher is refused."""
REASON_HEADER = "Jetstream-Invalid-Reason"
STREAM_HEADER = "Jetstream-Invalid-Stream"
SUBJECT_HEADER = "Jetstream-Invalid-Subject"


class DeadLetters:
    """One typed partition's dead letters, sent on the broker's connection."""

    def __init__(
        self,
        connection: Callable[[], NatsClient],
        streams: StreamLookup,
        stream: str,
        number: int,
        *,
        timeout: float = DEAD_LETTER_TIMEOUT,
    ) -> None:
        """``connection``: the broker's current NATS connection; ``streams``: every stream's
        configuration by name."""
        self._connection = connection
        self._streams = streams
        self._source = f"{stream}/{number}"
        self._number = number
        self.timeout = timeout

    async def store(self, target: str, letters: Sequence[tuple[Any, str]]) -> list[Ack | Refusal]:
        """Store each ``(record, reason)`` in stream ``target``; per letter, the dead-letter
        stream's ack or why it was not stored there."""
        config = self._streams(target)
        if config is None:
            problem = f"its dead-letter stream {target!r} does not exist"
            return [(ErrorCode.UNKNOWN_STREAM, f"{reason}; {problem}") for _, reason in letters]
        partition = self._number % config.partitions
        subject = partition_subject(config.subject, partition)
        nc = self._connection()
        inbox = nc.new_inbox()
        answers: dict[str, Ack] = {}
        everything = asyncio.get_running_loop().create_future()

        async def answered(msg: Any) -> None:
            try:
                acks = decode_acks(msg.data)
            except InvalidArgumentError as exc:
                logger.warning("%s: a dead-letter ack does not decode: %s", self._source, exc)
                return
            for ack in acks:
                answers[ack.correlation_id] = ack
            if len(answers) >= len(letters) and not everything.done():
                everything.set_result(None)

        subscription = None
        try:
            subscription = await nc.subscribe(inbox, cb=answered)
            for number, (record, reason) in enumerate(letters):
                headers = (
                    *record.headers,
                    (REASON_HEADER, reason.encode()),
                    (STREAM_HEADER, self._source.encode()),
                    (SUBJECT_HEADER, (record.subject or "").encode()),
                )
                envelope = Envelope(
                    value=record.value,
                    key=record.key,
                    headers=headers,
                    ack_inbox=inbox,
                    correlation_id=str(number),
                    ack_policy=AckPolicy.ALL,
                    stream=target,
                    partition=partition,
                )
                await nc.publish(subject, encode(envelope))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(everything, self.timeout)
        except NatsError as exc:
            logger.warning("%s: cannot send dead letters to %s: %s", self._source, target, exc)
        finally:
            if subscription is not None:
                with contextlib.suppress(NatsError):
                    await subscription.unsubscribe()
        out: list[Ack | Refusal] = []
        for number, (_, reason) in enumerate(letters):
            ack = answers.get(str(number))
            if ack is None:
                out.append(
                    (
                        ErrorCode.TIMEOUT,
                        f"{reason}; its dead-letter stream {target!r} did not store it within "
                        f"{self.timeout} s",
                    )
                )
            elif not ack.ok:
                out.append(
                    (ack.error, f"{reason}; its dead-letter stream {target!r} refused it: {ack.message}")
                )
            else:
                out.append(ack._replace(message=f"invalid, stored in dead-letter stream {target}: {reason}"))
        return out
