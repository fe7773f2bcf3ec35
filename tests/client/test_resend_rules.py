"""Which refusals the client holds for a resend instead of answering (no servers needed)."""

from __future__ import annotations

import asyncio
import logging

import pyarrow as pa

from pyspark_jetstream.client.publish_options import deduplicated, with_ids
from pyspark_jetstream.client.resend import Resender
from pyspark_jetstream.protocol.ack import Ack
from pyspark_jetstream.protocol.errors import ErrorCode, UnavailableError
from pyspark_jetstream.protocol.flight import PartitionInfo, StreamInfo
from pyspark_jetstream.protocol.schema import HEADER_TYPE


def _refusal(correlation_id: str, error: ErrorCode) -> Ack:
    return Ack("s", 0, -1, -1, correlation_id, error, "refused")


async def _never(*_: object) -> None:
    raise AssertionError("nothing is resent in these checks")


async def _no_leaders(_stream: str) -> StreamInfo:
    raise UnavailableError("no broker answers")


def _clocked_resender(now: list[float], describe=_no_leaders) -> tuple[Resender, list[bytes]]:
    """A resender on the clock ``now[0]`` that reads leaderships with ``describe`` (by default the
    reads fail, so the epochs stay as they are), and the payloads it publishes."""
    sent: list[bytes] = []

    async def publish(_subject: str, payload: bytes) -> None:
        sent.append(payload)

    return Resender(describe, publish, check=0.25, clock=lambda: now[0]), sent


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


def test_a_resend_goes_again_only_once_its_sender_has_had_no_answer_for_the_pause(caplog):
    """After a resend, the leader works through it: while its sender's messages on the partition
    are answered, nothing is sent again (a second copy of everything would bury an overloaded
    leader); once they go unanswered for the pause, what is still pending is resent."""
    caplog.set_level(logging.INFO, logger="pyspark_jetstream.client.resend")

    async def main() -> None:
        now = [100.0]
        resender, sent = _clocked_resender(now)
        for n in range(3):
            resender.track(str(n), "s", b"x%d" % n, stream="s", partition=0, producer=("p", 0), sequence=n)
            assert resender.holds(_refusal(str(n), ErrorCode.NOT_LEADER))
        resender.track("9", "s", b"y", stream="s", partition=0, producer=("q", 0), sequence=0)
        assert resender.holds(_refusal("9", ErrorCode.NOT_LEADER))
        now[0] = 100.3
        await resender._resend_due(now[0])  # held: all four go again, in the order first sent
        assert sent == [b"x0", b"x1", b"x2", b"y"]

        now[0] = 100.6  # the pause (0.5 s) has not passed since the resend
        await resender._resend_due(now[0])
        assert len(sent) == 4
        for correlation_id in ("0", "9"):  # p's first message and q's are answered: at work
            assert not resender.holds(Ack("s", 0, 0, 0, correlation_id, ErrorCode.OK, ""))
            resender.done(correlation_id)
        now[0] = 101.0  # 0.7 s since the resend, 0.4 s since p's last answer
        await resender._resend_due(now[0])
        assert len(sent) == 4, "resent while the leader was answering its sender"

        now[0] = 101.2  # p's 1 and 2 have had no answer for the pause
        await resender._resend_due(now[0])
        assert sent[4:] == [b"x1", b"x2"]
        resender.close()
        # The leadership was never seen to move (its reads failed): the log says why instead.
        reasons = [r.getMessage() for r in caplog.records if "resending" in r.getMessage()]
        assert len(reasons) == 2 and all("unanswered for their pause" in m for m in reasons), reasons

    asyncio.run(main())


def test_a_sender_due_for_a_resend_does_not_take_another_senders_messages_with_it():
    async def main() -> None:
        now = [100.0]
        resender, sent = _clocked_resender(now)
        resender.track("0", "s", b"p0", stream="s", partition=0, producer=("p", 0), sequence=0)
        resender.track("1", "s", b"q0", stream="s", partition=0, producer=("q", 0), sequence=0)
        resender.track("2", "s", b"q1", stream="s", partition=0, producer=("q", 0), sequence=1)
        assert resender.holds(_refusal("0", ErrorCode.NOT_ENOUGH_REPLICAS))
        assert not resender.holds(Ack("s", 0, 0, 0, "1", ErrorCode.OK, ""))  # q is answered
        resender.done("1")
        now[0] = 100.3
        await resender._resend_due(now[0])
        assert sent == [b"p0"]  # q's second message waits for its own answer, not p's resend
        resender.close()

    asyncio.run(main())


def test_a_moved_leadership_resends_every_pending_message_and_the_log_says_so(caplog):
    caplog.set_level(logging.INFO, logger="pyspark_jetstream.client.resend")

    async def epoch_3(stream: str) -> StreamInfo:
        return StreamInfo({"name": stream}, (PartitionInfo(0, "b2", ("b2",), ("b2",), 3, 0, 0, 0),))

    async def main() -> None:
        now = [100.0]
        resender, sent = _clocked_resender(now, epoch_3)
        resender.track("0", "s", b"p0", stream="s", partition=0, producer=("p", 0), sequence=0)
        resender.track("1", "s", b"q0", stream="s", partition=0, producer=("q", 0), sequence=0)
        now[0] = 100.3
        await resender._resend_due(now[0])  # both were sent in epoch -1
        assert sent == [b"p0", b"q0"]
        resender.close()

    asyncio.run(main())
    reasons = [r.getMessage() for r in caplog.records if "resending" in r.getMessage()]
    assert reasons == ["s/0: resending 2 unacknowledged message(s) after a leadership change (epoch 3) 0-1"]
