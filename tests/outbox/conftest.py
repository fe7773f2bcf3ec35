"""A harvester run in a thread of its own; reading a stream back (the module's broker,
``deployment``, is the suite's: tests/conftest.py)."""

from __future__ import annotations

import asyncio
import itertools
import threading
from dataclasses import replace

import pytest

from pyspark_jetstream.client import SyncClient
from pyspark_jetstream.outbox import Harvester, HarvesterConfig, open_store

from ..broker.harness import wait_until

_names = itertools.count()


@pytest.fixture
def name():
    return f"o{next(_names)}"


class Running:
    """A :class:`Harvester` on its own event loop in a thread, stopped by ``stop()``."""

    def __init__(self, config: HarvesterConfig, identifier: str | None = None) -> None:
        self.harvester = Harvester(config, identifier=identifier)
        self.error: BaseException | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, daemon=True)
        self._thread.start()

    def _main(self) -> None:
        try:
            self._loop.run_until_complete(self.harvester.run())
        except BaseException as exc:  # reported by stop()
            self.error = exc

    def wait_published(self, count: int, timeout: float = 60) -> None:
        """Poll until the harvester has published ``count`` rows (fail after ``timeout`` s, or if it died)."""
        wait_until(lambda: self.alive() and self.harvester.status.published >= count, timeout, 0.005, "rows")

    def alive(self) -> bool:
        """True while the harvester runs; raises what ended it."""
        if self.error is not None:
            raise self.error
        return True

    def stop(self, timeout: float = 60) -> None:
        self._loop.call_soon_threadsafe(self.harvester.stop)
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the harvester did not stop"
        self._loop.close()
        if self.error is not None:
            raise self.error


def config_for(deployment, database: str, **options) -> HarvesterConfig:
    base = HarvesterConfig(
        database=database, nats=deployment.nats_url, deadline=0.3, poll=0.02, backoff=0.05, report_every=1.0
    )
    return replace(base, **options)


def wait_for_empty(config: HarvesterConfig, timeout: float = 60, running: Running | None = None) -> None:
    """Poll the outbox until no row waits (fail after ``timeout`` s, or if the harvester died)."""
    store = open_store(config.database, config.table)
    try:
        wait_until(
            lambda: (running is None or running.alive()) and not store.backlog(),
            timeout,
            0.05,
            "an empty outbox",
        )
    finally:
        store.close()


def harvest_while_writing(config: HarvesterConfig, writers: list[threading.Thread]) -> Running:
    """Run a harvester while ``writers`` run, until they are done and the outbox is empty; return it
    (stopped)."""
    running = Running(config)
    try:
        for writer in writers:
            writer.start()
        for writer in writers:
            writer.join(120)
        wait_for_empty(config, running=running)
    finally:
        running.stop()
    return running


def read_all(client: SyncClient, stream: str) -> list[dict]:
    """Every message of ``stream``, partition by partition in offset order."""
    rows = []
    for info in client.describe_stream(stream).partitions:
        offset = 0
        while True:
            result = client.fetch(stream, info.partition, start=offset)
            if not result.num_rows:
                break
            for row in result.to_table().to_pylist():
                rows.append({**row, "partition": info.partition})
            offset = result.next_offset
    return rows
