"""One broker's probe of an advertised Flight address, against a real broker and real sockets:
the right broker answers, another broker answers, nothing listens, something listens and never
answers (bounded by the probe's timeout), and which results are kept."""

from __future__ import annotations

import asyncio
import socket
import time

from pyarrow import flight

from broker_node.coordination.base import BrokerInfo
from broker_node.reachability import Reachability


def reachability(brokers: list[BrokerInfo], timeout: float = 0.5) -> Reachability:
    return Reachability("prober", lambda: brokers, flight.connect, timeout=timeout)


def test_a_probe_names_who_answers_and_why_nothing_did(broker):
    probes = reachability([])
    assert probes.probe(BrokerInfo("broker-1", broker.flight)).error is None
    # Another broker answers there: the address a broker advertises is not its own.
    assert probes.probe(BrokerInfo("broker-2", broker.flight)).error == "it is answered by broker-1"
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    refused = probes.probe(BrokerInfo("broker-3", f"grpc://127.0.0.1:{port}")).error
    assert refused is not None and "Connection refused" in refused


def test_a_silent_address_costs_one_timeout():
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # connections complete, nothing ever answers
        address = f"grpc://127.0.0.1:{silent.getsockname()[1]}"
        started = time.monotonic()
        probe = reachability([], timeout=0.5).probe(BrokerInfo("broker-1", address))
        took = time.monotonic() - started
    assert probe.error == "no answer within 0.5s"
    assert 0.4 < took < 3


def test_results_and_problems_are_of_registered_brokers_at_the_address_probed(broker):
    registered = [BrokerInfo("broker-1", broker.flight), BrokerInfo("broker-2", broker.flight)]
    probes = reachability(registered)

    async def first_round() -> None:
        task = asyncio.ensure_future(probes.run())
        while len(probes.results()) < 2:
            await asyncio.sleep(0.02)
        task.cancel()

    asyncio.run(asyncio.wait_for(first_round(), 30))
    assert [(p.broker_id, p.error) for p in probes.results()] == [
        ("broker-1", None),
        ("broker-2", "it is answered by broker-1"),
    ]
    assert probes.problems() == [
        f"advertised address {broker.flight} of broker-2 is unreachable from prober: "
        "it is answered by broker-1"
    ]
    # broker-2 re-registers elsewhere: its old result is not reported until it is probed there.
    registered[1] = BrokerInfo("broker-2", "grpc://127.0.0.1:1")
    assert [p.broker_id for p in probes.results()] == ["broker-1"] and probes.problems() == []
    registered.pop()
    assert [p.broker_id for p in probes.results()] == ["broker-1"]
