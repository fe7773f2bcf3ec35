"""Errors of the coordination layer.

One root, :class:`CoordinationError`.  A write that lost a race
(:class:`ConflictError`: re-read and decide again) is kept apart from a write
whose outcome is unknown (:class:`CommitStateUnknownError`: the connection was
lost mid-write; read the state before doing anything else, never blindly
retry), as pyiceberg keeps "commit failed" apart from "commit state unknown".
"""

from __future__ import annotations

from pyspark_jetstream.protocol.errors import ErrorCode, JetStreamError


class CoordinationError(JetStreamError):
    """Root of every error the coordinators raise."""

    code = ErrorCode.UNAVAILABLE


class ConflictError(CoordinationError):
    """A compare-and-set lost: the metadata changed since it was read."""

    retriable = True


class CommitStateUnknownError(CoordinationError):
    """The connection was lost during a write: it may or may not have been applied.

    Not retriable as such: read the state first, then decide.
    """


class MetadataError(CoordinationError):
    """Stored metadata is missing, unreadable or contradicts the data on disk; nothing was deleted."""

    code = ErrorCode.STORAGE


class NotControllerError(CoordinationError):
    """Only the controller may do this; the ``controller`` field names it (absent while there is none).

    On the wire it is an ``unavailable`` error with the field ``not_controller``.
    """

    retriable = True

    def __init__(self, message: str, controller: str | None = None) -> None:
        super().__init__(message, controller=controller, not_controller=True)
        self.controller = controller
