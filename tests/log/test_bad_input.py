"""Bad input gets a clear error naming the bad value, and the log stays usable."""

from __future__ import annotations

from datetime import datetime

import pyarrow as pa
import pytest

from broker_node.log import (
    InvalidRecordsError,
    Log,
    LogClosedError,
    LogConfig,
    LogError,
    OffsetOutOfRangeError,
    Record,
    RecordTooLargeError,
)

from .helpers import rows, values


@pytest.fixture
def log(tmp_path):
    log = Log.open(tmp_path, LogConfig(max_message_bytes=1000, max_batch_bytes=50_000))
    log.append(values(10))
    yield log
    log.close()


def _still_usable(log: Log) -> None:
    end = log.log_end_offset
    assert log.append(values(1, start=99)) == range(end, end + 1)
    assert rows(log)[-1][0] == end


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda log: log.read(-1), OffsetOutOfRangeError, "offset -1 is out of range: .* 0 to 10"),
        (lambda log: log.read(11), OffsetOutOfRangeError, "offset 11 is out of range"),
        (lambda log: log.read(0, max_records=0), ValueError, "max_records must be a positive"),
        (lambda log: log.read(0, max_bytes=-5), ValueError, "max_bytes must be a positive"),
        (lambda log: log.read(0, upper_bound=-1), ValueError, "upper_bound must not be negative"),
        (lambda log: log.read("3"), TypeError, "start_offset must be an integer"),
        (lambda log: log.append([]), InvalidRecordsError, "at least one"),
        (
            lambda log: log.append(pa.table({"value": pa.array([], pa.binary())})),
            InvalidRecordsError,
            "no rows",
        ),
        (lambda log: log.append(pa.table({"key": [b"k"]})), InvalidRecordsError, "'value' column"),
        (lambda log: log.append(pa.table({"value": [b"v"], "colour": [1]})), InvalidRecordsError, "colour"),
        (lambda log: log.append(pa.table({"value": [b"v"], "offset": [1]})), InvalidRecordsError, "offset"),
        (
            lambda log: log.append(pa.table({"value": [b"v"], "sequence": ["x"]})),
            InvalidRecordsError,
            "sequence",
        ),
        (lambda log: log.append([b"raw bytes"]), InvalidRecordsError, "record 0 is a bytes"),
        (
            lambda log: log.append([Record(b"x" * 1001)]),
            RecordTooLargeError,
            "1001 bytes, over max_message_bytes=1000",
        ),
        (
            lambda log: log.append([Record(b"x" * 10, headers=[("h", b"y" * 1000)])]),
            RecordTooLargeError,
            "message 0 .* over max_message_bytes",
        ),
        (lambda log: log.append(values(100, size=900)), RecordTooLargeError, "over max_batch_bytes=50000"),
        (lambda log: log.truncate_to(-2), ValueError, "offset must not be negative"),
        (lambda log: log.offset_for_timestamp(datetime(2024, 1, 1)), ValueError, "no time zone"),
        (lambda log: log.offset_for_timestamp("yesterday"), TypeError, "timestamp must be"),
        (lambda log: setattr(log, "high_watermark", 11), ValueError, "past the log end offset 10"),
        (lambda log: log.assign_leader_epoch(-1), ValueError, "epoch must not be negative"),
    ],
)
def test_bad_input_is_refused_clearly(log, call, error, message):
    with pytest.raises(error, match=message):
        call(log)
    assert log.log_end_offset == 10
    _still_usable(log)


def test_oversized_message_is_located_in_an_arrow_batch(log):
    table = pa.table({"value": [b"ok", b"x" * 2000, b"ok"]})
    with pytest.raises(RecordTooLargeError, match="message 1 of the batch is 2000 bytes") as info:
        log.append(table)
    assert (info.value.size, info.value.limit) == (2000, 1000)
    _still_usable(log)


def test_errors_share_one_root_with_a_retriable_flag():
    assert issubclass(OffsetOutOfRangeError, LogError) and OffsetOutOfRangeError.retriable
    assert issubclass(RecordTooLargeError, LogError) and not RecordTooLargeError.retriable


def test_closed_log_refuses_use(tmp_path):
    log = Log.open(tmp_path)
    log.close()
    log.close()  # idempotent
    with pytest.raises(LogClosedError, match="is closed"):
        log.append(values(1))
    with pytest.raises(LogClosedError):
        log.read(0)


@pytest.mark.parametrize(
    ("option", "value"),
    [("segment_bytes", 0), ("max_message_bytes", -1), ("retention_bytes", -1), ("fsync", "sometimes")],
)
def test_bad_config_names_the_option(option, value):
    with pytest.raises(ValueError, match=option if option != "fsync" else "fsync must be one of"):
        LogConfig(**{option: value})
