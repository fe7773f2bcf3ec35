"""A streaming query's cursors, stored in the background: off the path of every micro-batch.

The stream reader stores the query's position as cursors in the log (one
``set_cursor`` call per partition) when Spark commits a micro-batch and when
it asks for the next one.  Made there and waited for, those calls are part of
every micro-batch; :class:`CursorWriter` makes them in a thread of its own
instead.  Cursors are a report (for ``jetstream status`` and
``startingOffsets=cursor``), never what the query resumes from -- Spark's
checkpoint is -- so a position is stored shortly after Spark reached it,
only the newest one waiting is stored (an older one not yet stored is
skipped), and each at most once.  The reader's ``stop()`` waits for the last
one (:meth:`CursorWriter.close`).

With a ``consumerId`` given (``sole_writer``), each store first checks that
the cursors are still where this query last stored them
(:func:`.consumers.check_sole_writer`); if another query moved them, the
writer stops and keeps the error in :attr:`CursorWriter.failure`, which the
reader raises at its next call, failing the query.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from pyspark_jetstream.client.cluster import ClusterConnection
from pyspark_jetstream.protocol.errors import InvalidArgumentError, JetStreamError, PermissionDeniedError
from pyspark_jetstream.protocol.flight import ActionType

from .consumers import check_sole_writer
from .options import Offsets

logger = logging.getLogger(__name__)


class CursorWriter:
    """Stores positions of consumer ``consumer`` as cursors, in a thread started on first use.

    :meth:`store`, :meth:`flush` and :meth:`close` may be called from any thread.
    """

    def __init__(
        self, connect: Callable[[], ClusterConnection], consumer: str, *, sole_writer: bool = False
    ) -> None:
        """``connect`` gives the connection to store through (called in the writer's thread);
        ``sole_writer``: check before each store that no other query moved the cursors."""
        self._connect = connect
        self.consumer = consumer
        self.sole_writer = sole_writer
        self._written: Offsets | None = None
        """The position last stored in full (``None``: none, or where a failed store left the
        cursors is not known), for the sole-writer check."""
        self.failure: InvalidArgumentError | None = None
        """Why the writer stopped: another query stores this consumer's cursors too."""
        self._changed = threading.Condition()
        self._wanted: Offsets | None = None
        """The newest position asked for."""
        self._stored: Offsets | None = None
        """The last position stored, or given up on (a failed store is not retried: the next
        micro-batch's position comes soon)."""
        self.refused = False
        """The principal may not store this consumer's cursors: nothing more is asked."""
        self._thread: threading.Thread | None = None
        self._closed = False

    def store(self, position: Offsets) -> None:
        """Have ``position`` stored; returns at once."""
        wanted = {stream: dict(parts) for stream, parts in position.items()}
        with self._changed:
            if self._closed or self.refused or self.failure is not None or wanted == self._wanted:
                return
            self._wanted = wanted
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="jetstream-cursors", daemon=True)
                self._thread.start()
            self._changed.notify_all()

    def flush(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the newest position asked for to be stored (or given
        up on); whether it was."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not self._done():
                left = deadline - time.monotonic()
                if left <= 0 or self._thread is None or not self._thread.is_alive():
                    return self._done()
                self._changed.wait(left)
            return True

    def close(self, timeout: float) -> None:
        """Store the newest position (waiting up to ``timeout`` seconds), then stop the thread."""
        if not self.flush(timeout):
            logger.warning(
                "cursors of %s: the last position (%s) was not stored within %g s",
                self.consumer,
                self._wanted,
                timeout,
            )
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def _done(self) -> bool:
        return (
            self.refused or self.failure is not None or self._wanted is None or self._wanted == self._stored
        )

    def _run(self) -> None:
        while True:
            with self._changed:
                while self._done() and not self._closed:
                    self._changed.wait()
                if self._done():  # closed, with nothing left to store
                    return
                position = self._wanted
            assert position is not None
            try:
                self._write(position)
            except Exception:  # the thread must not die: the next position may store
                logger.exception("cursors of %s not stored at %s", self.consumer, position)
            with self._changed:
                self._stored = position
                self._changed.notify_all()

    def _write(self, position: Offsets) -> None:
        connection = self._connect()
        if self.sole_writer and self._written is not None:
            try:
                check_sole_writer(
                    self.consumer,
                    self._written,
                    lambda s, p: _cursor_or_none(connection, self.consumer, s, p),
                )
            except InvalidArgumentError as exc:
                self.failure = exc
                logger.error("cursors of %s: %s", self.consumer, exc)
                return
        self._written = None  # until all of position is stored
        try:
            for stream, partitions in position.items():
                for partition, offset in partitions.items():
                    connection.action(
                        ActionType.SET_CURSOR,
                        {
                            "consumer": self.consumer,
                            "stream": stream,
                            "partition": int(partition),
                            "offset": offset,
                        },
                    )
        except PermissionDeniedError as exc:
            self.refused = True
            logger.warning(
                "cursors of %s are not stored (%s); set the option 'consumerId' to a consumer name "
                "the principal may store cursors of",
                self.consumer,
                exc,
            )
        except JetStreamError as exc:
            logger.warning("cursors of %s not stored at %s: %s", self.consumer, position, exc)
            return
        self._written = position


def _cursor_or_none(conn: ClusterConnection, consumer: str, stream: str, partition: int) -> int | None:
    """``consumer``'s cursor of a partition; ``None`` when it has none or it cannot be read."""
    try:
        offset = conn.action(
            ActionType.FETCH_CURSOR, {"consumer": consumer, "stream": stream, "partition": partition}
        )["offset"]
    except JetStreamError:
        return None
    return offset if isinstance(offset, int) else None
