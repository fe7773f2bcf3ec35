"""Checks of the arguments every log implementation takes, so both refuse the same values alike."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def check_offset_arg(name: str, value: object, *, allow_negative: bool = False) -> None:
    """``TypeError`` unless ``value`` is an int (not a bool); ``ValueError`` if negative and not allowed."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    if value < 0 and not allow_negative:
        raise ValueError(f"{name} must not be negative, got {value}")


def check_offset(name: str, value: object) -> None:
    """``ValueError`` unless ``value`` is a non-negative int (the replica-facing methods' check)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")


def check_limit(name: str, value: object) -> None:
    """``ValueError`` unless ``value`` is ``None`` or a positive int (``max_records``, ``max_bytes``)."""
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
        raise ValueError(f"{name} must be a positive integer or None, got {value!r}")


def to_micros(timestamp: datetime | float) -> int:
    """``timestamp`` (an aware datetime, or seconds since the epoch) in microseconds since the epoch."""
    if isinstance(timestamp, datetime):
        if timestamp.tzinfo is None:
            raise ValueError(f"timestamp {timestamp.isoformat()} has no time zone; pass an aware datetime")
        return (timestamp - _EPOCH) // timedelta(microseconds=1)
    if isinstance(timestamp, int | float) and not isinstance(timestamp, bool):
        return int(timestamp * 1_000_000)
    raise TypeError(f"timestamp must be a datetime or seconds since the epoch, got {timestamp!r}")
