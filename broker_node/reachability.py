"""Whether every broker of the cluster answers at the Flight address it advertises.

Clients, followers and the controller reach a broker only at the address it
advertises (``[flight] advertised_host`` and its port; a follower may be told
otherwise by ``[replication] peer_addresses``).  A broker that advertises an
address nobody can reach -- a name that does not resolve, a host it does not
listen on, a port behind a firewall -- starts and registers as usual, and
the cluster only fails around it.  So each broker of a cluster probes every
registered broker's advertised address, its own included, in the
background: one ``identify`` action with a short deadline
(:data:`PROBE_TIMEOUT`), which must be answered by the broker that
advertises it.  What failed is a problem of the prober's ``health`` (``jetstream
health``) and a line of its ``status`` (``jetstream cluster status``).

Probes never run on a request's path: a loop on the broker's event loop
starts them in worker threads, all at once, each bounded by its deadline.
A broker is probed again :data:`PROBE_INTERVAL` seconds after an answer,
:data:`RETRY_INTERVAL` after a failure, and at once when it registers or
changes its address.  Results are kept only for brokers still registered at
the same address, so a broker that stops is forgotten with its registration.

Threads: :meth:`Reachability.run` runs on the event loop, each probe in a
worker thread; :meth:`~Reachability.results` and :meth:`~Reachability.problems`
are called from Flight threads.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from pyarrow import flight

from broker_node.coordination.base import BrokerInfo
from pyspark_jetstream.protocol.flight import ActionType, encode_json, error_from_message

logger = logging.getLogger(__name__)

PROBE_TIMEOUT = 2.0
"""Seconds one probe may take, connecting included: an address that does not answer by then is
reported as unreachable (a broker on the same network answers in milliseconds)."""
PROBE_INTERVAL = 10.0
"""Seconds between probes of a broker that answered."""
RETRY_INTERVAL = 3.0
"""Seconds between probes of a broker that did not."""
TICK = 0.5
"""How often the loop looks for brokers that are due (new ones are probed within this)."""


@dataclass(frozen=True, slots=True)
class Probe:
    """One probe of a broker's advertised Flight address, by this broker."""

    broker_id: str
    address: str
    error: str | None
    """Why the address did not answer as ``broker_id``; ``None``: it did."""
    at: float
    """When (``time.monotonic()``) the probe ended."""

    def to_json(self) -> dict[str, object]:
        """As ``status`` reports it."""
        return {"broker_id": self.broker_id, "flight": self.address, "error": self.error}


class Reachability:
    """This broker's probes of every registered broker's advertised address (see the module docstring)."""

    def __init__(
        self,
        broker_id: str,
        brokers: Callable[[], list[BrokerInfo]],
        connect: Callable[[str], flight.FlightClient],
        *,
        timeout: float = PROBE_TIMEOUT,
    ) -> None:
        """``brokers``: the registered brokers now; ``connect``: a Flight client to an address, with
        this broker's TLS trust and credentials (as a follower connects)."""
        self.broker_id = broker_id
        self._brokers = brokers
        self._connect = connect
        self.timeout = timeout
        self._results: dict[str, Probe] = {}
        self._lock = threading.Lock()

    def probe(self, broker: BrokerInfo) -> Probe:
        """Probe ``broker``'s advertised address once (blocking, at most about ``timeout`` seconds)."""
        address = broker.flight_address
        error: str | None
        try:
            client = self._connect(address)
        except Exception as exc:  # noqa: BLE001 - a malformed address: reported as the reason
            return Probe(broker.broker_id, address, f"cannot connect: {exc}", time.monotonic())
        try:
            results = list(
                client.do_action(
                    flight.Action(ActionType.IDENTIFY.value, encode_json({})),
                    flight.FlightCallOptions(timeout=self.timeout),
                )
            )
            answer = json.loads(results[0].body.to_pybytes()) if results else None
            who = answer.get("broker_id") if isinstance(answer, dict) else None
            error = None if who == broker.broker_id else f"it is answered by {who or 'something else'}"
        except flight.FlightTimedOutError:
            error = f"no answer within {self.timeout:g}s"
        except flight.FlightError as exc:
            known = error_from_message(str(exc), getattr(exc, "extra_info", None))
            error = str(known) if known is not None else _flight_reason(exc)
        except Exception as exc:  # noqa: BLE001 - whatever answered is not a broker
            error = f"it does not answer as a broker: {exc}"
        finally:
            client.close()
        return Probe(broker.broker_id, address, error, time.monotonic())

    async def run(self) -> None:
        """Probe brokers as they fall due, until cancelled (a background task on the event loop)."""
        while True:
            try:
                due = self._due()
                if due:
                    probes = await asyncio.gather(*(asyncio.to_thread(self.probe, b) for b in due))
                    self._record(probes)
            except Exception:
                logger.exception("probing the brokers' advertised addresses failed")
            await asyncio.sleep(TICK)

    def _due(self) -> list[BrokerInfo]:
        now = time.monotonic()
        with self._lock:
            results = dict(self._results)
        return [broker for broker in self._brokers() if _due(results.get(broker.broker_id), broker, now)]

    def _record(self, probes: list[Probe]) -> None:
        with self._lock:
            before = {p.broker_id: self._results.get(p.broker_id) for p in probes}
            self._results.update((p.broker_id, p) for p in probes)
        for probe in probes:  # logged when it changes, not at every probe
            last = before[probe.broker_id]
            if probe.error is not None and (
                last is None or (last.address, last.error) != (probe.address, probe.error)
            ):
                logger.warning(
                    "broker %s advertises Flight at %s, which is unreachable from %s: %s",
                    probe.broker_id,
                    probe.address,
                    self.broker_id,
                    probe.error,
                )
            elif probe.error is None and last is not None and last.error is not None:
                logger.info("broker %s answers at %s again", probe.broker_id, probe.address)

    def results(self) -> list[Probe]:
        """The last probe of each broker still registered at the address probed, by broker id."""
        registered = {b.broker_id: b.flight_address for b in self._brokers()}
        with self._lock:
            results = list(self._results.values())
        return sorted(
            (p for p in results if registered.get(p.broker_id) == p.address), key=lambda p: p.broker_id
        )

    def problems(self) -> list[str]:
        """One line per broker whose advertised address did not answer at its last probe."""
        return [
            f"advertised address {p.address} of {p.broker_id} is unreachable from {self.broker_id}: {p.error}"
            for p in self.results()
            if p.error is not None
        ]


def _due(last: Probe | None, broker: BrokerInfo, now: float) -> bool:
    """Whether ``broker`` should be probed now, its last probe being ``last``."""
    if last is None or last.address != broker.flight_address:
        return True
    return now - last.at >= (PROBE_INTERVAL if last.error is None else RETRY_INTERVAL)


def _flight_reason(exc: flight.FlightError) -> str:
    """The gRPC reason of a Flight error, without the wrapping (``Flight returned ... message:``)."""
    text = str(exc)
    marker = "with message: "
    return text.split(marker, 1)[1] if marker in text else text
