"""PublishOptions: what the publish calls share, checked once (no servers needed)."""

from __future__ import annotations

import dataclasses

import pytest

from pyspark_jetstream.client.partitioners import key_hash
from pyspark_jetstream.client.publish_options import (
    DEFAULT_OPTIONS,
    PublishOptions,
    check_typed_batches,
    options_of,
)
from pyspark_jetstream.protocol.envelope import AckPolicy
from pyspark_jetstream.protocol.errors import InvalidArgumentError


def test_the_defaults_are_those_of_the_publish_calls():
    options = PublishOptions()
    assert options == DEFAULT_OPTIONS
    assert (options.partition, options.subject, options.timeout) == (None, None, None)
    assert options.partitioner is key_hash and options.ack_policy is AckPolicy.LEADER
    assert (options.producer_id, options.producer_epoch, options.sequence) == (None, 0, None)
    assert options.wants_ack and not PublishOptions(ack_policy=AckPolicy.NONE).wants_ack


def test_options_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        DEFAULT_OPTIONS.partition = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"producer_id": "orders"}, "got producer_id 'orders' without a sequence"),
        ({"sequence": 7}, "got sequence 7 without a producer_id"),
        ({"sequence": 0, "producer_epoch": 2}, "got sequence 0 without a producer_id"),
    ],
)
def test_a_producer_needs_both_its_id_and_its_sequence(arguments, named):
    with pytest.raises(InvalidArgumentError, match="producer_id and sequence go together") as refused:
        PublishOptions(**arguments)
    assert named in str(refused.value)


def test_the_publish_calls_share_one_options_object_at_the_defaults():
    defaults = {
        "partition": None,
        "partitioner": key_hash,
        "subject": None,
        "ack_policy": AckPolicy.LEADER,
        "producer_id": None,
        "producer_epoch": 0,
        "sequence": None,
        "timeout": None,
    }
    assert options_of(defaults) is DEFAULT_OPTIONS
    assert options_of({**defaults, "ack_policy": AckPolicy.ALL}) == PublishOptions(ack_policy=AckPolicy.ALL)
    with pytest.raises(InvalidArgumentError, match="got sequence 1 without a producer_id"):
        options_of({**defaults, "sequence": 1})


def test_typed_batches_are_refused_while_a_broker_does_not_register_them():
    new = {"broker_id": "b1", "flight": "grpc://a", "features": ["schema", "typed-batches"]}
    check_typed_batches([new, {**new, "broker_id": "b2"}])
    older = {"broker_id": "b3", "flight": "grpc://c", "features": ["reassign", "schema"]}
    oldest = {"broker_id": "b2", "flight": "grpc://b"}  # from before features were listed
    with pytest.raises(InvalidArgumentError) as refused:
        check_typed_batches([new, older, oldest])
    assert str(refused.value) == (
        "broker(s) b2, b3 run a version that cannot store typed rows sent as columns: upgrade every "
        "broker first, or publish JSON values (a 'value' column)"
    )
