"""The JSON the coordinators store (znodes, ``metadata.json``) and how it is read.

Every stored object carries ``"version": 1``.  Reading is *tolerant* by
default: fields this broker does not know (written by a newer broker during a
rolling upgrade) are ignored with a warning, and a newer version is read as
far as its known fields go.  With the environment variable
``JETSTREAM_STRICT_WIRE=1`` (the test suite sets it) unknown fields and
versions are errors instead, so a field that one writer adds and no reader
knows cannot slip through unnoticed.  A missing or ill-typed known field is
always an error (:class:`WireError`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from typing import Any, NamedTuple

from pyspark_jetstream.protocol.errors import InvalidArgumentError
from pyspark_jetstream.protocol.streams import StreamConfig

from .base import BrokerInfo, PartitionState
from .errors import MetadataError

logger = logging.getLogger(__name__)

WIRE_VERSION = 1
STRICT_ENV = "JETSTREAM_STRICT_WIRE"


class WireError(MetadataError):
    """Stored metadata that cannot be read; the message names the object and the field."""


def strict() -> bool:
    """Whether unknown fields and versions are errors (tests) or ignored (production)."""
    return os.environ.get(STRICT_ENV, "") not in ("", "0")


def dumps(fields: dict[str, Any]) -> bytes:
    """Stored bytes of an object: its fields plus the wire version."""
    return json.dumps({"version": WIRE_VERSION, **fields}, separators=(",", ":"), sort_keys=True).encode()


def loads(raw: bytes, what: str, known: set[str], optional: frozenset[str] = frozenset()) -> dict[str, Any]:
    """Parse stored bytes of ``what`` whose fields are ``known`` (``version`` implied), and may be
    ``optional`` ones."""
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise WireError(f"{what} is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise WireError(f"{what} is not a JSON object: {raw[:80]!r}")
    version = data.pop("version", None)
    if not isinstance(version, int) or version < 1:
        raise WireError(f"{what} has no valid version field: {version!r}")
    unknown = sorted(set(data) - known - optional)
    if version > WIRE_VERSION or unknown:
        message = (
            f"{what} has version {version} and unknown field(s) {unknown} (this broker knows {WIRE_VERSION})"
        )
        if strict():
            raise WireError(message)
        logger.warning("%s: reading the fields it knows", message)
        for name in unknown:
            del data[name]
    missing = sorted(known - set(data))
    if missing:
        raise WireError(f"{what} lacks field(s) {', '.join(missing)}")
    return data


def _typed(what: str, data: dict[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    value = data[name]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise WireError(f"{what}: field {name!r} has the wrong type: {value!r}")
    return value


def _names(what: str, data: dict[str, Any], name: str) -> tuple[str, ...]:
    value = _typed(what, data, name, list)
    if not all(isinstance(v, str) for v in value):
        raise WireError(f"{what}: field {name!r} must be a list of broker ids: {value!r}")
    return tuple(value)


# ---- brokers -------------------------------------------------------------------------


def broker_to_bytes(broker: BrokerInfo) -> bytes:
    """A live broker's registration."""
    stored = {"broker_id": broker.broker_id, "flight": broker.flight_address, "nats": list(broker.nats_urls)}
    if broker.rack:
        stored["rack"] = broker.rack
    if broker.features:
        stored["features"] = list(broker.features)
    if broker.replication_address:
        stored["replication"] = broker.replication_address
    return dumps(stored)


def broker_from_bytes(raw: bytes, what: str = "a broker registration") -> BrokerInfo:
    """Parse a broker registration."""
    data = loads(raw, what, {"broker_id", "flight", "nats"}, frozenset({"rack", "features", "replication"}))
    return BrokerInfo(
        _typed(what, data, "broker_id", str),
        _typed(what, data, "flight", str),
        _names(what, data, "nats"),
        _typed(what, data, "rack", str) if "rack" in data else "",
        _names(what, data, "features") if "features" in data else (),
        _typed(what, data, "replication", str) if "replication" in data else "",
    )


# ---- partitions ----------------------------------------------------------------------


REASSIGNMENT_FIELDS = frozenset({"adding", "removing", "throttle", "previous"})
"""Stored only while a reassignment moves the partition."""


def partition_to_bytes(state: PartitionState) -> bytes:
    """A partition's leadership (and reassignment, if any); its ``version`` is the znode's, not stored."""
    stored = state.to_json()
    del stored["version"]
    return dumps(stored)


def partition_from_bytes(raw: bytes, version: int, what: str = "a partition state") -> PartitionState:
    """Parse a partition's leadership stored at znode version ``version``."""
    data = loads(raw, what, {"leader", "replicas", "isr", "leader_epoch"}, REASSIGNMENT_FIELDS)
    moving = REASSIGNMENT_FIELDS & set(data)
    if moving and moving != REASSIGNMENT_FIELDS:
        raise WireError(f"{what} has {sorted(moving)} but not all of {sorted(REASSIGNMENT_FIELDS)}")
    return PartitionState(
        leader=_typed(what, data, "leader", str),
        replicas=_names(what, data, "replicas"),
        isr=_names(what, data, "isr"),
        leader_epoch=_typed(what, data, "leader_epoch", int),
        version=version,
        adding=_names(what, data, "adding") if moving else (),
        removing=_names(what, data, "removing") if moving else (),
        throttle=_typed(what, data, "throttle", int) if moving else 0,
        previous=_names(what, data, "previous") if moving else (),
    )


# ---- streams ---------------------------------------------------------------------------


def stream_to_bytes(config: StreamConfig, stream_id: str) -> bytes:
    """A stream's configuration and incarnation id."""
    return dumps({"id": stream_id, "config": config.to_json()})


class StoredStream(NamedTuple):
    """A stream as stored: its configuration and the id of its incarnation."""

    config: StreamConfig
    stream_id: str


def stream_from_bytes(raw: bytes, what: str = "a stream") -> StoredStream:
    """Parse a stream's configuration and id (unknown config options are treated like unknown fields)."""
    data = loads(raw, what, {"id", "config"})
    config = dict(_typed(what, data, "config", dict))
    known = {f.name for f in dataclasses.fields(StreamConfig)}
    unknown = sorted(set(config) - known)
    if unknown:
        if strict():
            raise WireError(f"{what} has unknown stream option(s) {unknown}")
        logger.warning("%s has stream option(s) %s this broker does not know; ignoring them", what, unknown)
        for name in unknown:
            del config[name]
    try:
        return StoredStream(StreamConfig.from_json(config), _typed(what, data, "id", str))
    except InvalidArgumentError as exc:
        raise WireError(f"{what}: {exc}") from None


# ---- the controller ----------------------------------------------------------------------


def controller_to_bytes(broker_id: str, epoch: int) -> bytes:
    """Who the controller is, and its epoch."""
    return dumps({"broker_id": broker_id, "epoch": epoch})


class ControllerRegistration(NamedTuple):
    """Who registered as the controller, in which controller epoch (-1: not taken up yet)."""

    broker_id: str
    epoch: int


def controller_from_bytes(raw: bytes, what: str = "the controller") -> ControllerRegistration:
    """Parse the controller's registration."""
    data = loads(raw, what, {"broker_id", "epoch"})
    return ControllerRegistration(_typed(what, data, "broker_id", str), _typed(what, data, "epoch", int))


def epoch_to_bytes(epoch: int) -> bytes:
    """The controller epoch counter."""
    return dumps({"epoch": epoch})


def epoch_from_bytes(raw: bytes, what: str = "the controller epoch") -> int:
    """Parse the controller epoch counter."""
    return int(_typed(what, loads(raw, what, {"epoch"}), "epoch", int))
