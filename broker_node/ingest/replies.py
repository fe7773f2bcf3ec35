"""Where acks go and how they travel: one NATS message per ack inbox per flush, or one per plain request.

An envelope's ack goes to its ack inbox in the project's ack format; the
acks of one flush for one inbox travel together as a JSON array.  A plain
NATS request (a message with a reply subject, not an envelope) is answered
alone, in JetStream's publish-ack format, so that JetStream clients read it
(see :mod:`pyspark_jetstream.protocol.ack`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from pyspark_jetstream.protocol.ack import Ack, encode_ack, encode_acks, encode_pub_ack
from pyspark_jetstream.protocol.errors import JetStreamError


class AckTarget(NamedTuple):
    """Where one message's ack goes."""

    subject: str
    correlation_id: str
    committed: bool
    """Ack once committed (``ALL``) rather than once stored (``LEADER``)."""
    received: float
    """When the message reached the broker (``perf_counter``), for the ack latency."""
    plain: bool = False
    """A plain NATS request: answered alone, in JetStream's publish-ack format."""


class Outgoing(NamedTuple):
    """Acks that travel as one NATS message, and when each acked message was received."""

    subject: str
    plain: bool
    acks: list[Ack]
    received: list[float]

    def payload(self, error: JetStreamError | None = None) -> bytes:
        """The message to send; with ``error``, every ack turned into a refusal carrying it."""
        acks = failed(self.acks, error)
        return encode_pub_ack(acks[0]) if self.plain else encode_acks(acks)


def single(target: AckTarget, ack: Ack, jetstream_error: tuple[int, int] | None = None) -> bytes:
    """The payload of one ack to ``target`` (``jetstream_error`` as for ``encode_pub_ack``)."""
    return encode_pub_ack(ack, jetstream_error) if target.plain else encode_ack(ack)


def grouped(replies: Iterable[tuple[AckTarget, Ack]]) -> list[Outgoing]:
    """The NATS messages for ``replies``: an inbox's acks together, each plain request alone."""
    out: list[Outgoing] = []
    inboxes: dict[str, Outgoing] = {}
    for target, ack in replies:
        if target.plain:
            out.append(Outgoing(target.subject, True, [ack], [target.received]))
            continue
        group = inboxes.get(target.subject)
        if group is None:
            group = inboxes[target.subject] = Outgoing(target.subject, False, [], [])
            out.append(group)
        group.acks.append(ack)
        group.received.append(target.received)
    return out


def failed(acks: list[Ack], error: JetStreamError | None) -> list[Ack]:
    """``acks`` as they are (``error`` is ``None``), or turned into refusals carrying ``error``."""
    if error is None:
        return acks
    return [
        a._replace(first_offset=-1, last_offset=-1, error=error.code, message=str(error), duplicates=())
        for a in acks
    ]
