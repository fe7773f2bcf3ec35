"""A mirror's wire forms (pure): its source in a stream config, the create request, the status."""

from __future__ import annotations

import pytest

from pyspark_jetstream.protocol.errors import InvalidArgumentError
from pyspark_jetstream.protocol.mirror import (
    MirrorRequest,
    MirrorSource,
    MirrorStatus,
    promoted,
    publish_refusal,
    refuse_mirror_change,
)
from pyspark_jetstream.protocol.streams import StreamConfig

SOURCE = MirrorSource(stream="orders", servers=("grpc://a:1", "grpc+tls://b:2"))


def test_a_stream_config_keeps_its_mirror_through_json_and_leaves_it_out_when_none():
    config = StreamConfig(name="orders", subject="orders", mirror=SOURCE)
    assert StreamConfig.from_json(config.to_json()) == config
    assert config.to_json()["mirror"] == {
        "stream": "orders",
        "servers": ["grpc://a:1", "grpc+tls://b:2"],
        "credentials": None,
        "promoted": False,
    }
    assert "mirror" not in StreamConfig(name="plain", subject="plain").to_json()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"stream": "o", "servers": ["http://a:1"]}, "source server 'http://a:1' is not a Flight address"),
        ({"stream": "o", "servers": []}, "source servers must be one or more Flight addresses"),
        ({"stream": "o", "servers": ["grpc://a"]}, "source server 'grpc://a' is not a Flight address"),
        ({"stream": "o", "servers": ["grpc://a:1"], "extra": 1}, "unknown mirror field"),
        ({"servers": ["grpc://a:1"]}, "a mirror needs its source 'stream' and 'servers'"),
        (
            {"stream": "o", "servers": ["grpc://a:1"], "promoted": "yes"},
            "mirror promoted must be true or false",
        ),
    ],
)
def test_bad_mirror_sources_are_refused_naming_the_value(data, message):
    with pytest.raises(InvalidArgumentError, match=message):
        MirrorSource.from_json(data)


def test_bad_names_and_internal_mirrors_are_refused():
    with pytest.raises(InvalidArgumentError, match="invalid stream name 'bad name'"):
        StreamConfig(name="m", subject="m", mirror=MirrorSource(stream="bad name", servers=("grpc://a:1",)))
    with pytest.raises(InvalidArgumentError, match="internal stream '__x' cannot be a mirror"):
        StreamConfig(name="__x", subject="_PJS.x", mirror=SOURCE)


def test_the_create_request_round_trips_and_checks_its_fields():
    request = MirrorRequest(
        name="copy", source=SOURCE, replication_factor=3, min_insync_replicas=2, partitions=4
    )
    assert MirrorRequest.from_json(request.to_json()) == request
    with pytest.raises(InvalidArgumentError, match="replication_factor must be a positive integer up to 16"):
        MirrorRequest(name="copy", source=SOURCE, replication_factor=0)
    with pytest.raises(InvalidArgumentError, match="unknown create_mirror field"):
        MirrorRequest.from_json({**request.to_json(), "retention_age": 5})
    with pytest.raises(InvalidArgumentError, match="a new mirror cannot be created promoted"):
        MirrorRequest(name="copy", source=MirrorSource(stream="o", servers=("grpc://a:1",), promoted=True))


def test_promotion_marks_the_mirror_once_and_only_a_mirror():
    config = StreamConfig(name="orders", subject="orders", mirror=SOURCE)
    done = promoted(config)
    assert done is not None and done.mirror is not None and done.mirror.promoted and not done.mirror.active
    assert promoted(done) is None
    with pytest.raises(InvalidArgumentError, match="stream 'plain' is not a mirror"):
        promoted(StreamConfig(name="plain", subject="plain"))
    refuse_mirror_change(done, "add partitions")  # a promoted mirror is an ordinary stream
    with pytest.raises(
        InvalidArgumentError, match="stream 'orders' mirrors 'orders' on .*: add partitions on the source"
    ):
        refuse_mirror_change(config, "add partitions")


def test_the_refusal_and_the_status_wire():
    assert publish_refusal("copy", SOURCE) == (
        "stream 'copy' mirrors 'orders' on grpc://a:1,grpc+tls://b:2: publish to the source "
        "(or promote the mirror)"
    )
    status = MirrorStatus("copy", 0, SOURCE.where(), None, "copying", 5, 7, 2, 0.5, None)
    assert MirrorStatus.from_json(status.to_json()) == status
    with pytest.raises(InvalidArgumentError, match="not a mirror status"):
        MirrorStatus.from_json({"stream": "copy"})
