"""What a broker's start-up has made so far: its addresses and the parts that run.

One :class:`Runtime` per broker, filled in by the start-up steps on the event
loop (before clients can find the broker) and read by the service, the
metrics and the shutdown from any thread.  The parts are ``None`` until
started (and stay ``None`` when not used: no embedded nats-server with
``[nats] servers``).
"""

from __future__ import annotations

import dataclasses

from broker_node.api.server import FlightApi
from broker_node.embedded_nats import EmbeddedNats
from broker_node.free_memory import FreeMemory
from broker_node.ingest.ingestor import Ingestor
from broker_node.replication.replica_server import ReplicaServer
from broker_node.tail.publishers import LiveTails


@dataclasses.dataclass
class Runtime:
    """One broker's addresses and running parts (see the module docstring)."""

    broker_id: str
    flight_address: str = ""
    """Where this broker serves Flight, as clients reach it."""
    nats_urls: list[str] = dataclasses.field(default_factory=list)
    """The NATS servers it ingests from, as it connects to them."""
    advertised_nats: list[str] = dataclasses.field(default_factory=list)
    """The NATS servers clients are told of: the configured ones, or the embedded server at an
    address clients reach (not the loopback address the broker itself may use)."""
    event_loop: str = ""
    """Whose event loop the broker runs on: ``uvloop`` or ``asyncio``."""
    nats: EmbeddedNats | None = None
    ingestor: Ingestor | None = None
    tails: LiveTails | None = None
    """The live tail's publishers (``None`` with ``[ingest] live_tail`` off)."""
    flight: FlightApi | None = None
    replication: ReplicaServer | None = None
    """The replication listener its followers connect to."""
    free_memory: FreeMemory = dataclasses.field(default_factory=FreeMemory)
    """Free memory handed back to the system now and then (a background task of the broker's)."""

    def ingest_failures(self) -> dict[tuple[str, int], str]:
        """Partitions led here whose ingest failed (a subscription NATS refused), with why."""
        return self.ingestor.failures if self.ingestor is not None else {}
