"""Per-key order in interleavings forced step by step: a scripted client instead of a broker."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

from pyspark_jetstream.outbox import Harvester, HarvesterConfig, init_outbox, open_store
from pyspark_jetstream.outbox import in_flight as in_flight_module
from pyspark_jetstream.protocol.ack import Ack
from pyspark_jetstream.protocol.errors import InvalidArgumentError


class ScriptedClient:
    """Refuses the first ``refusals`` publishes that carry ``refused``; acks every other at once."""

    def __init__(self, refused: str, refusals: int) -> None:
        self.refused = refused
        self.refusals = refusals
        self.stored: list[str] = []
        self.changed = asyncio.Event()

    async def partitions_for(self, stream: str, keys: list[bytes | None]) -> list[int]:
        return [0] * len(keys)

    async def publish_async(self, stream, value, *, message_id, **options) -> asyncio.Future[Ack]:
        return self._answer([message_id])

    async def publish_batch_async(self, stream, batch, *, message_ids, **options) -> asyncio.Future[Ack]:
        return self._answer(list(message_ids))

    def _answer(self, ids: list[str]) -> asyncio.Future[Ack]:
        if self.refused in ids and self.refusals:
            self.refusals -= 1
            raise InvalidArgumentError(f"{self.refused} refused")
        self.stored.extend(ids)
        self.changed.set()
        future = asyncio.get_running_loop().create_future()
        future.set_result(Ack("s", 0, 0, len(ids) - 1))
        return future

    async def wait_for(self, message_id: str) -> None:
        async with asyncio.timeout(30):
            while message_id not in self.stored:
                self.changed.clear()
                await self.changed.wait()


def test_later_rows_of_a_key_wait_for_its_refused_row_after_its_retry_is_due(tmp_path, monkeypatch):
    """Row 1 of k0 is refused and waits for its retry; rows 2 (k0) and 3 (k1) are marked with it.
    Row 4 of k0 comes in a later mark of the same term, after the retry came due but before the
    timer that marks row 1 again has run: it must wait for rows 1 and 2, not overtake them."""
    database = f"sqlite:///{tmp_path / 'app.db'}"
    init_outbox(database)
    store = open_store(database)
    store.insert({"stream": "s", "key": key, "value": b"v"} for key in (b"k0", b"k0", b"k1"))
    # The harvester's clock apart from the event loop's: moving it makes row 1's retry due while
    # the loop's timer for the remark is still far off (the race, made to happen every time).
    now = [time.monotonic()]
    monkeypatch.setattr(in_flight_module, "time", SimpleNamespace(monotonic=lambda: now[0]))
    config = HarvesterConfig(
        database=database, nats="nats://unused:4222", deadline=0.0, poll=0.01, backoff=60.0, batch_size=3
    )
    harvester = Harvester(config)
    # Refused as a batch (taken apart), then alone (a retry in 60 s), then stored.
    client = harvester._in_flight.client = ScriptedClient("outbox:1", refusals=2)

    async def scenario() -> None:
        await harvester._leadership.acquire()
        term = asyncio.create_task(harvester._term())
        try:
            await client.wait_for("outbox:3")  # rows 1 and 2 wait for row 1's retry
            assert client.stored == ["outbox:3"]
            store.insert([{"stream": "s", "key": b"k0", "value": b"v"}])
            now[0] += 61.0  # row 1's retry is due; the remark's timer (60 s on the loop's clock) is not
            await client.wait_for("outbox:4")
        finally:
            harvester.stop()
            await term
            await harvester._leadership.release()
            await harvester._marker.close()
            await harvester._purger.close()

    asyncio.run(scenario())
    store.close()
    assert client.stored == ["outbox:3", "outbox:1", "outbox:2", "outbox:4"]
