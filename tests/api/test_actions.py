"""The Flight admin actions' table, without a server: every action has a handler, and each
handler refuses before it asks the broker (pure, fakes only)."""

from __future__ import annotations

from typing import Any

import pytest

from broker_node.api.actions import ACTION_DESCRIPTIONS, HANDLERS, Actions
from broker_node.log import EpochEndOffset
from pyspark_jetstream.protocol.errors import InvalidArgumentError, LimitExceededError, PermissionDeniedError
from pyspark_jetstream.protocol.flight import ActionType, StreamInfo, encode_json


class _Broker:
    """Records what it was asked; answers as little as the handlers need."""

    def __init__(self, streams: tuple[str, ...] = ()) -> None:
        self.asked: list[str] = []
        self.streams = streams

    def __getattr__(self, name: str) -> Any:
        def answer(*args: Any) -> Any:
            self.asked.append(name)
            if name == "list_streams":
                return [StreamInfo({"name": s}, ()) for s in self.streams]
            if name in ("create_stream", "describe_stream"):
                return StreamInfo({"name": "s"}, ())
            return {}

        return answer


class _Deny:
    """An ACL that grants nothing."""

    def check(
        self, principal: str, action: str, *, stream: str | None = None, consumer: str | None = None
    ) -> None:
        raise PermissionDeniedError(f"{principal} may not {action}", principal=principal, action=action)

    def allows(self, principal: str, action: str, *, stream: str) -> bool:
        return False

    def check_cluster(self, principal: str, what: str) -> None:
        raise PermissionDeniedError(f"{principal} is not a broker", principal=principal, action=what)


def test_every_action_has_a_handler_and_a_description():
    assert set(HANDLERS) == set(ActionType) == set(ACTION_DESCRIPTIONS)


BODIES = {
    ActionType.CREATE_STREAM: {"name": "s", "subject": "s"},
    ActionType.DELETE_STREAM: {"name": "s"},
    ActionType.ADD_PARTITIONS: {"name": "s", "partitions": 2},
    ActionType.UPDATE_SCHEMA: {"name": "s", "schema": {"fields": [{"name": "n", "type": "int32"}]}},
    ActionType.DESCRIBE_STREAM: {"name": "s"},
    ActionType.STATUS: {},
    ActionType.ELECT_PREFERRED_LEADERS: {},
    ActionType.REASSIGN_PARTITIONS: {"op": "list"},
    ActionType.CONTROLLER_CALL: {"action": "delete_stream", "body": {"name": "s"}},
    ActionType.OFFSETS_FOR_LEADER_EPOCH: {"stream": "s", "partition": 0, "epoch": 1},
    ActionType.SET_CURSOR: {"consumer": "c", "stream": "s", "partition": 0, "offset": 1},
    ActionType.DELETE_CURSOR: {"consumer": "c", "stream": "s", "partition": 0},
    ActionType.FETCH_CURSOR: {"consumer": "c", "stream": "s", "partition": 0},
}


@pytest.mark.parametrize("kind", sorted(BODIES, key=lambda k: k.value), ids=lambda k: k.value)
def test_a_refused_principal_reaches_nothing_of_the_broker(kind):
    broker = _Broker()
    with pytest.raises(PermissionDeniedError):
        Actions(broker, _Deny(), None).run(kind, "mallory", BODIES[kind])
    assert broker.asked == []


def test_open_actions_need_no_grant_and_list_streams_hides_what_is_not_granted():
    broker = _Broker(streams=("a", "b"))
    actions = Actions(broker, _Deny(), None)
    assert actions.run(ActionType.HEALTH, "anyone", {}) == {}
    assert actions.run(ActionType.METADATA, "anyone", {}) == {}
    assert actions.run(ActionType.IDENTIFY, "anyone", {}) == {}
    assert actions.run(ActionType.LIST_STREAMS, "anyone", {}) == []


def test_a_cursor_action_names_a_bad_argument_before_checking_rights():
    with pytest.raises(InvalidArgumentError, match="'partition' must be a int"):
        Actions(_Broker(), _Deny(), None).run(
            ActionType.FETCH_CURSOR, "mallory", {"consumer": "c", "stream": "s", "partition": "0"}
        )


class _Allow(_Deny):
    def check(
        self, principal: str, action: str, *, stream: str | None = None, consumer: str | None = None
    ) -> None:
        return None


def test_the_stream_cap_refuses_a_new_stream_only():
    broker = _Broker(streams=("s", "t"))
    actions = Actions(broker, _Allow(), 2)
    assert actions.run(ActionType.CREATE_STREAM, "admin", {"name": "s", "subject": "s"})["config"] == {
        "name": "s"
    }
    with pytest.raises(LimitExceededError, match="limit"):
        actions.run(ActionType.CREATE_STREAM, "admin", {"name": "u", "subject": "u"})


class _Peer(_Deny):
    """A broker's own principal: cluster actions allowed."""

    def check_cluster(self, principal: str, what: str) -> None:
        return None


class _Leader(_Broker):
    def offsets_for_leader_epoch(self, stream: str, partition: int, epoch: int) -> EpochEndOffset:
        return EpochEndOffset(epoch=epoch - 1, end_offset=1234)


def test_where_an_epoch_ends_is_answered_as_the_replication_wire_says():
    """``{"epoch", "end_offset"}``, in that order (see pyspark_jetstream.protocol.replication)."""
    answer = Actions(_Leader(), _Peer(), None).run(
        ActionType.OFFSETS_FOR_LEADER_EPOCH, "broker-2", {"stream": "s", "partition": 0, "epoch": 7}
    )
    assert encode_json(answer) == b'{"epoch":6,"end_offset":1234}'
