"""Stream subjects follow NATS's rules and stay clear of NATS's, JetStream's and the broker's own.

Pure: no server (tests/broker/test_nats_limits.py checks the length limit
against a real nats-server).
"""

from __future__ import annotations

import pytest

from pyspark_jetstream.protocol.errors import InvalidArgumentError
from pyspark_jetstream.protocol.streams import StreamConfig, validate_subject


@pytest.mark.parametrize(
    ("subject", "rule"),
    [
        ("a." * 600 + "a", "at most 1024 bytes"),
        ("é" * 513, "at most 1024 bytes"),  # 513 characters, 1026 bytes: NATS counts bytes
        ("a.b\x00c", "control"),
        ("a.b\x7f", "control"),
        ("a.\x1bb", "control"),
        ("a.\u200bb", "control"),  # zero-width space: invisible, NATS would see two subjects as one
        ("a.b c", "whitespace"),
        ("a.\u00a0", "whitespace"),
        ("a\n", "whitespace"),
        ("a..b", "empty token"),
        (".a", "empty token"),
        ("a.", "empty token"),
        ("a.>.b", "'>' only as the last token"),
        ("a*", "'*' and '>' only as whole tokens"),
        ("a.b>", "'*' and '>' only as whole tokens"),
        ("a.*b.c", "'*' and '>' only as whole tokens"),
    ],
)
def test_invalid_subjects_name_the_subject_and_the_rule(subject, rule):
    with pytest.raises(InvalidArgumentError, match="subject") as info:
        validate_subject(subject)
    message = str(info.value)
    assert rule in message
    assert repr(subject)[:30] in message
    assert "\n" not in message  # one line, even for a subject with a newline in it


def test_subject_length_limit_is_in_bytes_and_inclusive():
    assert validate_subject("a" * 1024) == "a" * 1024
    assert validate_subject("é" * 512) == "é" * 512
    with pytest.raises(InvalidArgumentError, match="1025 bytes"):
        validate_subject("a" * 1025)


@pytest.mark.parametrize(
    "subject",
    [
        ">",
        "*.>",
        "*.*",
        "*.*.>",
        "_PJS.discover",
        "_PJS.>",
        "_PJS.cursors",
        "_PJS.anything.else",
        "_INBOX.>",
        "_INBOX.abc",
        "_INBOX.abc.def",
        "$JS.API.>",
        "$JS.ACK.orders.>",
        "$SYS.>",
        "$SYS.REQ.SERVER.PING",
        "$KV.bucket.key",
        "$O.store.>",
        "$JSC.>",
        "$NRG.>",
        "$MQTT.sess.x",
        "$GR.x",
        "$LDS.x",
        "$anything",
        "_R_.abc",
        "_GR_.abc",
    ],
)
def test_streams_refuse_subjects_of_nats_jetstream_and_the_broker(subject):
    with pytest.raises(InvalidArgumentError, match="reserved|matches") as info:
        StreamConfig(name="s", subject=subject)
    assert repr(subject) in str(info.value)


@pytest.mark.parametrize(
    "subject",
    ["orders", "*", "*.orders", "events.>", "events.*.eu", "_private.x", "a.$b", "INBOX.x", "a._INBOX.b"],
)
def test_streams_accept_ordinary_subjects(subject):
    assert StreamConfig(name="s", subject=subject).subject == subject


def test_the_cursor_stream_alone_may_use_the_broker_prefix():
    assert StreamConfig(name="__cursors", subject="_PJS.cursors").subject == "_PJS.cursors"
    with pytest.raises(InvalidArgumentError, match="reserved"):
        StreamConfig(name="cursors", subject="_PJS.cursors")
    for subject in ("_PJS.discover", "_PJS.>", "_INBOX.x", "$JS.API.x"):
        with pytest.raises(InvalidArgumentError, match="reserved|matches"):
            StreamConfig(name="__cursors", subject=subject)


@pytest.mark.parametrize(
    ("group", "message"),
    [
        ("g" * 201, "invalid group"),
        ("bad group", "invalid group 'bad group'"),
        ("", "invalid group"),
        ("-g", "invalid group"),
        (7, "invalid group"),
    ],
)
def test_the_queue_group_is_bounded(group, message):
    with pytest.raises(InvalidArgumentError, match=message):
        StreamConfig(name="s", subject="s", group=group)
    assert StreamConfig(name="s", subject="s", group="g" * 200).group == "g" * 200
