"""Which refusals the client holds for a resend instead of answering (no servers needed)."""

from __future__ import annotations

import asyncio

import pyarrow as pa

from pyspark_jetstream.client.publish_options import deduplicated, with_ids
from pyspark_jetstream.client.resend import Resender
from pyspark_jetstream.protocol.ack import Ack
from pyspark_jetstream.protocol.errors import ErrorCode, UnavailableError
from pyspark_jetstream.protocol.schema import HEADER_TYPE


def _refusal(correlation_id: str, error: ErrorCode) -> Ack:
    return Ack("s", 0, -1, -1, correlation_id, error, "refused")


async def _never(*_: object) -> None:
    raise AssertionError("nothing is resent in these checks")


def test_an_out_of_order_refusal_behind_a_pending_sequence_waits_for_the_resend():
    async def main() -> None:
        resender = Resender(_never, _never, check=60)
        for n in range(3):
            resender.track(str(n), "s", b"x", stream="s", partition=0, producer=("p", 0), sequence=n)
        resender.track("9", "s", b"x", stream="s", partition=0, producer=("q", 0), sequence=5)
        assert resender.holds(_refusal("2", ErrorCode.OUT_OF_ORDER_SEQUENCE))  # 0 and 1 pending
        assert not resender.holds(_refusal("0", ErrorCode.OUT_OF_ORDER_SEQUENCE))  # nothing before it
        assert not resender.holds(_refusal("9", ErrorCode.OUT_OF_ORDER_SEQUENCE))  # another producer
        resender.done("0")
        resender.done("1")
        assert not resender.holds(_refusal("2", ErrorCode.OUT_OF_ORDER_SEQUENCE))  # a real gap now
        assert resender.holds(_refusal("2", ErrorCode.NOT_LEADER))  # the leadership moves: resent
        assert not resender.holds(_refusal("2", ErrorCode.TOO_LARGE))  # a final answer
        assert not resender.holds(_refusal("77", ErrorCode.NOT_LEADER))  # not tracked
        resender.close()

    asyncio.run(main())


def test_a_refusal_for_want_of_in_sync_replicas_waits_for_the_resend_and_is_the_answer_at_the_timeout():
    async def main() -> None:
        resender = Resender(_never, _never, check=60)
        resender.track("0", "s", b"x", stream="s", partition=0, producer=("p", 0), sequence=0)
        resender.track("1", "s", b"x", stream="s", partition=0, producer=None, sequence=0)  # a message id
        assert resender.refusal("0") is None
        for correlation_id in ("0", "1"):
            refused = _refusal(correlation_id, ErrorCode.NOT_ENOUGH_REPLICAS)
            assert resender.holds(refused)  # a follower may be back before the timeout: resent
            assert resender.refusal(correlation_id) is refused  # the answer if it is not
        assert not resender.holds(_refusal("5", ErrorCode.NOT_ENOUGH_REPLICAS))  # not tracked: answered
        resender.done("0")
        assert resender.refusal("0") is None
        resender.close()

    asyncio.run(main())


def test_only_what_the_broker_deduplicates_is_resendable():
    ids = pa.record_batch({"value": [b"a", b"b"]})
    all_ids = with_ids(ids, ["o-1", "o-2"])
    one_id = ids.append_column(
        "headers", pa.array([[{"key": "Nats-Msg-Id", "value": b"o-1"}], None], HEADER_TYPE)
    )
    assert deduplicated({"batch": all_ids})  # every row carries an id
    assert not deduplicated({"batch": one_id})  # a row without one would be stored twice
    assert not deduplicated({"batch": ids})
    assert deduplicated({"batch": ids, "producer_id": "p"})
    assert deduplicated({"value": b"v", "message_id": "m"})
    assert deduplicated({"value": b"v", "headers": (("Nats-Msg-Id", b"m"),)})
    assert not deduplicated({"value": b"v", "headers": (("other", b"m"),)})


def test_messages_acked_while_the_leadership_is_read_leave_nothing_to_resend():
    """The resender reads a stalled partition's leaders (a network call); the acks that arrive
    meanwhile end every pending message, and the resend that follows finds none."""

    async def main() -> None:
        sent: list[bytes] = []

        async def publish(_subject: str, payload: bytes) -> None:
            sent.append(payload)

        async def describe(_stream: str):
            for correlation_id in ("0", "1"):
                resender.done(correlation_id)  # their acks came in meanwhile
            raise UnavailableError("no broker answers")

        resender = Resender(describe, publish, check=0.01)
        for n in range(2):
            resender.track(str(n), "s", b"x%d" % n, stream="s", partition=0, producer=("p", 0), sequence=n)
            resender.holds(_refusal(str(n), ErrorCode.NOT_LEADER))
        await resender._resend_due(asyncio.get_running_loop().time() + 1)
        assert sent == []
        resender.close()

    asyncio.run(main())
