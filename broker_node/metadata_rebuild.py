"""``--rebuild-metadata``: a single broker's lost ``metadata.json`` written again from its data.

Reads every partition directory's ``partition.json`` record and, for a typed
stream, the schema versions its batches were stored with (see
:mod:`broker_node.coordination.rebuild`, which writes the file).
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from broker_node.config import BrokerConfig, ConfigError
from broker_node.coordination.errors import MetadataError
from broker_node.coordination.rebuild import rebuild_metadata
from broker_node.log import Log, LogConfig, stored_versions
from broker_node.replication.partition_record import partition_directories, read_record

__all__ = ["rebuild"]


def rebuild(config: BrokerConfig) -> list[str]:
    """Rebuild the single-broker metadata from the partitions' records; what it found, line by line."""
    if config.zookeeper.hosts:
        raise ConfigError(
            "--rebuild-metadata rebuilds a single broker's metadata.json; in a cluster the metadata "
            f"lives in ZooKeeper ({config.zookeeper.hosts})"
        )
    data_dir = Path(config.data_dir).resolve()
    records = []
    stored: dict[str, dict[int, pa.Schema]] = {}
    for directory in partition_directories(data_dir / "streams"):
        record = read_record(directory)
        if record is None:
            continue
        records.append(record)
        if record["config"].get("schema") is not None:  # a typed stream: its batches name their versions
            log = Log.open(directory, LogConfig())
            try:
                for version, fields in stored_versions(log).items():
                    stored.setdefault(record["stream_id"], {}).setdefault(version, fields)
            finally:
                log.close()
    if not records:
        raise MetadataError(f"no partition under {data_dir / 'streams'} has a partition.json to rebuild from")
    return rebuild_metadata(data_dir, records, config.broker_id, stored)
