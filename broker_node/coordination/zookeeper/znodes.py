"""Where a cluster's metadata lives in ZooKeeper, and how the coordinator reads it.

Znode layout (under the cluster's chroot, e.g. ``/pyspark-jetstream``;
values are JSON with a ``version`` field, see :mod:`..wire`)::

    /brokers/<broker id>      ephemeral   {"broker_id", "flight", "nats": [...]}
    /controller               ephemeral   {"broker_id", "epoch"}: the elected controller
    /controller_epoch         persistent  {"epoch"}: bumped by every new controller; every
                                          controller write checks this znode's version, so a
                                          replaced controller's writes fail (fencing)
    /streams/<name>           persistent  {"id", "config": {...StreamConfig...}}
    /streams/<name>/<n>       persistent  {"leader", "replicas", "isr", "leader_epoch"}; the
                                          znode version is the state's version, and every
                                          change is a compare-and-set on it
    /deleted_streams/<id>     persistent  {"name"}: tombstones of deleted streams
    /admin/shutdown/<id>      ephemeral   a broker asking to be relieved of leadership
    /acl                      persistent  the cluster's ACL text (TOML, UTF-8, opaque here)

A stream and its partition znodes are created, and deleted with its
tombstone, in one ZooKeeper transaction.  A stream grows in one transaction
too: its new partition znodes are created and its config (with the new
count) written, the latter a compare-and-set on the stream znode's version;
a reader reads the stream znode before its partitions, so it never finds a
count without every partition of it (:func:`read_streams`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import (
    ConnectionLoss,
    KazooException,
    NoNodeError,
    OperationTimeoutError,
    SessionExpiredError,
)

from .. import wire
from ..base import BrokerInfo, StreamMetadata

logger = logging.getLogger(__name__)

BROKERS = "/brokers"
CONTROLLER = "/controller"
CONTROLLER_EPOCH = "/controller_epoch"
STREAMS = "/streams"
DELETED = "/deleted_streams"
SHUTDOWN = "/admin/shutdown"
ACL_TEXT = "/acl"
PERSISTENT = (BROKERS, STREAMS, DELETED, SHUTDOWN)
"""The folders a coordinator makes (if missing) when it starts."""

OUTCOME_UNKNOWN = (ConnectionLoss, OperationTimeoutError, SessionExpiredError)
"""kazoo's errors after which a write may or may not have happened."""

Watch = Callable[[Any], None] | None
"""A kazoo watch (called once, on kazoo's event thread, when the znode changes), or none."""


def why(exc: KazooException) -> str:
    """What went wrong; kazoo gives some errors no message (``ConnectionLoss``, say): their name."""
    return str(exc) or type(exc).__name__


def read_brokers(client: KazooClient, watch: Watch) -> tuple[dict[str, BrokerInfo], dict[str, int]]:
    """The registered brokers, and each broker znode's creation id (a broker that restarted
    differs there alone); a znode that does not parse is logged and left out."""
    brokers = {}
    registrations = {}
    for broker_id in client.get_children(BROKERS, watch=watch):
        try:
            raw, stat = client.get(f"{BROKERS}/{broker_id}")
            registrations[broker_id] = stat.czxid
            brokers[broker_id] = wire.broker_from_bytes(raw, f"broker znode {broker_id}")
        except NoNodeError:
            continue
        except wire.WireError as exc:
            logger.error("%s", exc)
    return brokers, registrations


def read_controller(client: KazooClient, watch: Watch) -> str | None:
    """The controller's broker id; ``None`` while there is none, or while the broker that won
    the election has not taken the role up yet (its znode's epoch is -1)."""
    try:
        raw, _ = client.get(CONTROLLER, watch=watch)
    except NoNodeError:
        client.exists(CONTROLLER, watch=watch)
        return None
    registered = wire.controller_from_bytes(raw)
    return registered.broker_id if registered.epoch >= 0 else None


def read_streams(client: KazooClient, watch: Watch) -> dict[str, StreamMetadata]:
    """Every stream by name, each read stream znode first (watched: a stream that grows changes
    it), then its partitions; a stream being created or deleted, or one that does not parse (logged),
    is left out."""
    streams = {}
    for name in client.get_children(STREAMS, watch=watch):
        path = f"{STREAMS}/{name}"
        try:
            raw, _ = client.get(path, watch=watch)
            config, stream_id = wire.stream_from_bytes(raw, f"stream znode {name}")
            states = []
            for number in range(config.partitions):
                raw, stat = client.get(f"{path}/{number}", watch=watch)
                states.append(wire.partition_from_bytes(raw, stat.version, f"partition {name}/{number}"))
        except NoNodeError:
            continue  # being created or deleted: the next reload sees it whole
        except wire.WireError as exc:
            logger.error("skipping stream %s: %s", name, exc)
            continue
        streams[name] = StreamMetadata(config, tuple(states), stream_id)
    return streams
