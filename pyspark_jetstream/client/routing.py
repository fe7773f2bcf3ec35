"""Where a publish goes: the NATS subject, the stream and the partition.

A stream's partitions listen on ``subject`` (partition 0) and ``subject.N``;
a publish names a partition, or its key picks one through a partitioner, or
it names a subject of the stream (needed for streams on wildcard subjects)
and the partition is the one whose subject it matches.  The configurations
of the streams published to are described once (over Flight) and kept.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import NamedTuple

from pyspark_jetstream.protocol.errors import InvalidArgumentError, PermissionDeniedError
from pyspark_jetstream.protocol.flight import StreamInfo
from pyspark_jetstream.protocol.streams import StreamConfig, partition_subject
from pyspark_jetstream.protocol.subjects import subject_matches

from .partitioners import Partitioner


class Target(NamedTuple):
    """Where a publish goes: the subject, and the stream partition it targets (if named)."""

    subject: str
    stream: str | None
    partition: int | None


class Routes:
    """The configurations of the streams a client publishes to, and the targets they give.

    Used from the event loop's thread only.
    """

    def __init__(
        self,
        describe: Callable[[str], Awaitable[StreamInfo]],
        learned: Callable[[StreamInfo], None],
        user: str | None,
    ) -> None:
        """``describe(stream)`` reads a stream's configuration and partitions; ``learned(info)``
        hears of each stream described for a publish; ``user`` is named when one is refused."""
        self.streams: dict[str, StreamConfig] = {}
        self._describe = describe
        self._learned = learned
        self._user = user

    async def target(
        self,
        stream: str | None,
        key: bytes | None,
        partition: int | None,
        partitioner: Partitioner,
        subject: str | None,
    ) -> Target:
        """The target of a publish, describing ``stream`` first if it is not known yet."""
        if stream is None:
            if subject is None:
                raise InvalidArgumentError("publish needs a stream, or a subject to publish on")
            return Target(subject, None, None)
        config = self.streams.get(stream)
        if config is None:
            try:
                info = await self._describe(stream)
            except PermissionDeniedError as exc:  # no grant on the stream at all
                who = exc.fields.get("principal", self._user)
                raise PermissionDeniedError(
                    f"principal {who!r} may not write stream {stream!r} (nor read or administer it)",
                    principal=who,
                    stream=stream,
                ) from None
            config = StreamConfig.from_json(info.config)
            self.streams[stream] = config
            self._learned(info)
        if subject is not None:
            matching = [
                p
                for p, pattern in enumerate(config.partition_subjects())
                if subject_matches(pattern, subject)
            ]
            if not matching or (partition is not None and partition not in matching):
                raise InvalidArgumentError(
                    f"subject {subject!r} is not a subject of stream {stream!r}"
                    + (f" partition {partition}" if partition is not None else "")
                    + f" (its partitions' subjects: {', '.join(config.partition_subjects())})"
                )
            return Target(subject, stream, matching[0] if partition is None else partition)
        number = partitioner(key, config.partitions) if partition is None else partition
        if not 0 <= number < config.partitions:
            raise InvalidArgumentError(
                f"stream {stream!r} has partitions 0 to {config.partitions - 1}, not {number}"
            )
        target = partition_subject(config.subject, number)
        if "*" in target.split(".") or target.endswith(">"):
            raise InvalidArgumentError(
                f"stream {stream!r} listens on the wildcard subject {config.subject!r}: "
                "pass subject= with a concrete subject it matches"
            )
        return Target(target, stream, number)

    def stream_of(self, subject: str) -> str | None:
        """The known stream one of whose partitions listens on ``subject`` (compared lower-cased:
        nats-py lower-cases the server's errors, subjects included)."""
        return next(
            (
                name
                for name, config in self.streams.items()
                if subject in (s.lower() for s in config.partition_subjects())
            ),
            None,
        )
