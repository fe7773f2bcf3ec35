"""``partition.json``: what a partition directory holds, written beside its log.

Every partition directory records which stream incarnation it belongs to, so
that data on disk is never mistaken for a namesake's and is deleted only when
the metadata says that very stream was deleted, and so that lost metadata can
be rebuilt from the data itself.  Layout (JSON, written atomically), format
version 1::

    {"version": 1, "stream": "<name>", "stream_id": "<id>", "partition": <n>,
     "config": {...StreamConfig...}}

Directories written before this file existed have none; the broker writes it
when it opens them under the metadata's stream.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from broker_node.coordination.base import StreamMetadata
from broker_node.durable import atomic_write

logger = logging.getLogger(__name__)

PARTITION_RECORD = "partition.json"
RECORD_VERSION = 1


def partition_record(metadata: StreamMetadata, number: int) -> dict[str, Any]:
    """The record of partition ``number`` of ``metadata``'s stream."""
    return {
        "version": RECORD_VERSION,
        "stream": metadata.config.name,
        "stream_id": metadata.stream_id,
        "partition": number,
        "config": metadata.config.to_json(),
    }


def write_record(directory: Path, record: dict[str, Any]) -> None:
    """Write ``record`` into ``directory`` unless it is already there."""
    if read_record(directory) != record:
        atomic_write(directory / PARTITION_RECORD, json.dumps(record, indent=1).encode())


def read_record(directory: Path) -> dict[str, Any] | None:
    """The directory's record; ``None`` if it has none or it cannot be read (logged)."""
    path = directory / PARTITION_RECORD
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        logger.warning("cannot read %s: %s", path, exc)
        return None
    fields = {"version", "stream", "stream_id", "partition", "config"}
    if not isinstance(record, dict) or not fields <= set(record):
        logger.warning("%s is not a partition record", path)
        return None
    return record


def partition_directories(streams_dir: Path) -> list[Path]:
    """Every ``<stream>/<partition>`` directory under ``streams_dir``, sorted."""
    if not streams_dir.is_dir():
        return []
    return sorted(
        p for stream in streams_dir.iterdir() if stream.is_dir() for p in stream.iterdir() if p.is_dir()
    )
