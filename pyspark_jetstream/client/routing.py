"""Where a publish goes: the NATS subject, the stream and the partition.

A stream's partitions listen on ``subject`` (partition 0) and ``subject.N``;
a publish names a partition, or its key picks one through a partitioner, or
it names a subject of the stream (needed for streams on wildcard subjects)
and the partition is the one whose subject it matches.  The configurations
of the streams published to are described (over Flight) and kept: a kept one
older than ``max_age`` seconds is described again in the background (the
publish in hand routes by what is known), and one that lacks a partition or
subject a publish names is described again before the publish is refused.
So a stream that grows (``add_partitions``) is routed over its new count
within ``max_age``: keyed messages then hash over more partitions.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import NamedTuple

from pyspark_jetstream.protocol.errors import InvalidArgumentError, JetStreamError, PermissionDeniedError
from pyspark_jetstream.protocol.flight import StreamInfo
from pyspark_jetstream.protocol.streams import StreamConfig, partition_subject
from pyspark_jetstream.protocol.subjects import subject_matches

from .partitioners import Partitioner

logger = logging.getLogger(__name__)

METADATA_MAX_AGE = 30.0
"""Seconds a stream's configuration is used before it is described again (new partitions show
up within this time; Kafka's producer has ``metadata.max.age.ms`` for the same)."""

MAX_KNOWN_SUBJECTS = 65_536
"""Partition subjects kept checked; past this many (streams come and go), the cache starts over."""


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
        *,
        reread: Callable[[str], Awaitable[StreamInfo]] | None = None,
        max_age: float = METADATA_MAX_AGE,
    ) -> None:
        """``describe(stream)`` reads a stream's configuration and partitions; ``learned(info)``
        hears of each stream described for a publish; ``user`` is named when one is refused;
        ``max_age``: seconds before a kept configuration is read again in the background, by
        ``reread(stream)`` (a cheaper ``describe`` that may leave offsets out; by default ``describe``)."""
        self.streams: dict[str, StreamConfig] = {}
        self._describe = describe
        self._reread = reread or describe
        self._learned = learned
        self._user = user
        self.max_age = max_age
        self._described: dict[str, float] = {}
        """``loop.time()`` when each kept configuration was described."""
        self._refreshing: dict[str, asyncio.Task[None]] = {}
        self._subjects: dict[tuple[str, int], str] = {}
        """Each checked partition subject by the stream's subject and the partition number."""

    def remember(self, config: StreamConfig) -> None:
        """Keep ``config`` as its stream's, described just now."""
        self.streams[config.name] = config
        self._described[config.name] = asyncio.get_running_loop().time()

    def close(self) -> None:
        """Stop the descriptions under way."""
        for task in self._refreshing.values():
            task.cancel()
        self._refreshing.clear()

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
            config = await self._learn(stream)
        elif self._stale(stream):
            self._refresh_soon(stream)
        if subject is not None:
            matching = self._matching(config, subject)
            if not matching or (partition is not None and partition not in matching):
                config = await self._learn(stream)  # the stream may have grown meanwhile
                matching = self._matching(config, subject)
            if not matching or (partition is not None and partition not in matching):
                raise InvalidArgumentError(
                    f"subject {subject!r} is not a subject of stream {stream!r}"
                    + (f" partition {partition}" if partition is not None else "")
                    + f" (its partitions' subjects: {', '.join(config.partition_subjects())})"
                )
            return Target(subject, stream, matching[0] if partition is None else partition)
        if partition is not None and partition >= config.partitions:
            config = await self._learn(stream)  # the stream may have grown meanwhile
        number = partitioner(key, config.partitions) if partition is None else partition
        if not 0 <= number < config.partitions:
            raise InvalidArgumentError(
                f"stream {stream!r} has partitions 0 to {config.partitions - 1}, not {number}"
            )
        target = self._subjects.get((config.subject, number))
        if target is None:
            target = partition_subject(config.subject, number)
            if "*" in target.split(".") or target.endswith(">"):
                raise InvalidArgumentError(
                    f"stream {stream!r} listens on the wildcard subject {config.subject!r}: "
                    "pass subject= with a concrete subject it matches"
                )
            if len(self._subjects) >= MAX_KNOWN_SUBJECTS:
                self._subjects.clear()
            self._subjects[(config.subject, number)] = target
        return Target(target, stream, number)

    @staticmethod
    def _matching(config: StreamConfig, subject: str) -> list[int]:
        subjects = config.partition_subjects()
        return [p for p, pattern in enumerate(subjects) if subject_matches(pattern, subject)]

    async def _learn(self, stream: str) -> StreamConfig:
        """Describe ``stream`` now and keep its configuration."""
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
        self.remember(config)
        self._learned(info)
        return config

    def _stale(self, stream: str) -> bool:
        now = asyncio.get_running_loop().time()
        return now - self._described.setdefault(stream, now) > self.max_age

    def _refresh_soon(self, stream: str) -> None:
        """Describe ``stream`` again in the background (once at a time; a failure waits ``max_age``)."""
        if stream in self._refreshing:
            return
        self._described[stream] = asyncio.get_running_loop().time()
        task = asyncio.ensure_future(self._refresh(stream))
        self._refreshing[stream] = task
        task.add_done_callback(lambda _: self._refreshing.pop(stream, None))

    async def _refresh(self, stream: str) -> None:
        try:
            info = await self._reread(stream)
        except JetStreamError as exc:  # kept as it was; asked again after max_age
            logger.debug("describing stream %s again failed: %s", stream, exc)
            return
        config = StreamConfig.from_json(info.config)
        if config != self.streams.get(stream):
            logger.info(
                "stream %s now has %d partition(s)", stream, config.partitions, extra={"stream": stream}
            )
        self.remember(config)
        self._learned(info)

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
