"""Lost single-broker metadata written again from what the data directory holds.

Every partition directory keeps a ``partition.json`` record (its stream, the
stream's id and configuration, rewritten whenever the configuration changes:
see ``broker_node.replication.partition_record``), and a typed stream's
batches carry the schema version they were parsed with and its fields (see
``broker_node.log.typed_frames``).  :func:`rebuild_metadata` takes both: the
newest record of each stream gives its configuration, and schema versions its
batches were stored with that no record knows (a record written by a broker
that kept only the version a partition was opened with) are added from the
batches, so a rebuild never rolls a stream's data contract back.  Pure but for
reading and writing the metadata file.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa

from pyspark_jetstream.protocol.errors import InvalidArgumentError
from pyspark_jetstream.protocol.streams import StreamConfig
from pyspark_jetstream.protocol.value_schema import StreamSchema

from .base import PartitionState, StreamMetadata
from .errors import MetadataError
from .local import METADATA_FILE, load_metadata, write_metadata

__all__ = ["RecoveredSchema", "rebuild_metadata", "recover_versions"]


@dataclasses.dataclass(frozen=True)
class RecoveredSchema:
    """A stream's configuration with the schema versions read back from its batches, and what
    was read back: ``from_batches`` the versions taken from batches, ``filled`` those found in
    neither a record nor a batch (given the fields of the next version that was found)."""

    config: StreamConfig
    from_batches: tuple[int, ...] = ()
    filled: tuple[int, ...] = ()


def recover_versions(config: StreamConfig, stored: Mapping[int, pa.Schema]) -> RecoveredSchema:
    """``config`` with every schema version in ``stored`` (version -> fields, read from the log's
    batches) that its schema does not have yet.  ``MetadataError`` when the versions found do not
    follow one another compatibly (the data is then not what the record says it is)."""
    schema = config.schema
    if schema is None or not stored or max(stored) <= schema.version:
        return RecoveredSchema(config)
    versions, taken, filled = list(schema.versions), [], []
    for number in range(schema.version + 1, max(stored) + 1):
        if number in stored:
            taken.append(number)
            versions.append(stored[number])
        else:
            filled.append(number)
            versions.append(stored[min(n for n in stored if n > number)])
    try:
        recovered = StreamSchema(schema.format, tuple(versions), schema.on_invalid, schema.dead_letter)
    except InvalidArgumentError as exc:
        raise MetadataError(
            f"stream {config.name!r}: the schema versions its batches were stored with do not follow "
            f"its record's version {schema.version}: {exc}"
        ) from None
    return RecoveredSchema(dataclasses.replace(config, schema=recovered), tuple(taken), tuple(filled))


def rebuild_metadata(
    data_dir: Path,
    records: list[dict[str, Any]],
    broker_id: str,
    stored: Mapping[str, Mapping[int, pa.Schema]] | None = None,
) -> list[str]:
    """Write ``<data_dir>/metadata.json`` from partition records; return what it says, line by line.

    ``records`` are the ``partition.json`` contents of every partition
    directory; ``stored``, by stream id, the schema versions found in the
    stream's batches (see :func:`recover_versions`).  The file must not
    exist or must be unreadable; a readable one is never overwritten.
    """
    path = Path(data_dir) / METADATA_FILE
    if path.exists():
        try:
            load_metadata(path)
        except MetadataError:
            pass
        else:
            raise MetadataError(f"{path} is readable; it is not rebuilt (move it away to rebuild it)")
    by_stream: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        by_stream.setdefault(record["stream_id"], []).append(record)
    streams: dict[str, StreamMetadata] = {}
    report = []
    for stream_id, parts in sorted(by_stream.items()):
        # A stream that grew, or whose schema changed: a record holds the config its partition was
        # last opened or changed with, so the one naming the most partitions and versions is the newest.
        newest = max((StreamConfig.from_json(p["config"]) for p in parts), key=_newness)
        recovered = recover_versions(newest, (stored or {}).get(stream_id, {}))
        config = recovered.config
        if config.name in streams:
            raise MetadataError(
                f"two streams named {config.name!r} ({streams[config.name].stream_id} and {stream_id}) "
                "are on disk; move one away and rebuild again"
            )
        found = sorted(p["partition"] for p in parts)
        me = broker_id
        streams[config.name] = StreamMetadata(
            config, tuple(PartitionState(me, (me,), (me,)) for _ in range(config.partitions)), stream_id
        )
        missing = sorted(set(range(config.partitions)) - set(found))
        report.append(
            f"stream {config.name!r} on {config.subject!r}: {config.partitions} partition(s)"
            + _schema_note(recovered)
            + (f", partitions {missing} had no data and start empty" if missing else "")
        )
        report.extend(
            f"stream {config.name!r}: schema version {n} is in no record and no batch: rebuilt with "
            f"version {n + 1 + _run_after(recovered.filled, n)}'s fields"
            for n in recovered.filled
        )
    if path.exists():
        path.replace(path.with_name(path.name + ".unreadable"))
        report.append(f"the unreadable file was kept as {path.name}.unreadable")
    write_metadata(path, streams, set())
    return report


def _newness(config: StreamConfig) -> tuple[int, int]:
    return config.partitions, config.schema.version if config.schema is not None else 0


def _schema_note(recovered: RecoveredSchema) -> str:
    schema = recovered.config.schema
    if schema is None:
        return ""
    note = f", schema version {schema.version}"
    if recovered.from_batches:
        first, last = recovered.from_batches[0], recovered.from_batches[-1]
        numbers = f"versions {first}-{last}" if first != last else f"version {first}"
        if len(recovered.from_batches) != last - first + 1:
            numbers = "versions " + ", ".join(map(str, recovered.from_batches))
        note += f" ({numbers} read back from the log's batches)"
    return note


def _run_after(filled: tuple[int, ...], number: int) -> int:
    """How many versions right after ``number`` were filled too (their fields come from after them)."""
    run = 0
    while number + run + 1 in filled:
        run += 1
    return run
