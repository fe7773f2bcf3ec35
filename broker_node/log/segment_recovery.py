"""Opening a segment from disk: what a crash may have left behind, found and repaired.

The active (last) segment is verified against its checksums and cut back to its
longest valid prefix; a closed one is checked for structure only and re-indexed
from its frames when its index disagrees with it; a segment whose data file is
lost, or cut short of its header, reads as damaged until a repair rewrites it
(the rules: :mod:`.segment`'s docstring, "Integrity").  A rewrite interrupted
after renaming its data file is completed here.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from .frames import add_damaged, decode, mismatch, scan
from .index import OFFSET_ENTRY, TIME_ENTRY, SegmentIndex, crc32, decode_index
from .logging_labels import NO_LABELS, Labels
from .segment import Segment, header_bytes


def missing_segment(
    directory: Path, base_offset: int, end_offset: int, labels: Labels = NO_LABELS
) -> Segment:
    """A closed segment whose file is lost: offsets ``base_offset`` to ``end_offset - 1`` read as
    damaged until :meth:`Segment.rewrite` (a repair) brings the file back."""
    segment = Segment(directory, base_offset, SegmentIndex(base_offset), 0, labels)
    index = SegmentIndex(base_offset)
    damage: dict[int, str] = {}
    position = len(header_bytes(base_offset))
    detail = f"the segment file {segment.path.name} is missing"
    add_damaged(index, damage, base_offset, end_offset - 1, position=position, size=0, detail=detail)
    segment._set_index(index, 0, damage=damage)
    return segment


def open_segment(
    directory: Path,
    base_offset: int,
    *,
    active: bool,
    limit: int | None = None,
    labels: Labels = NO_LABELS,
) -> Segment:
    """Open an existing segment, repairing what a crash may have left behind.

    ``active`` marks the last segment of the log: it is verified frame by
    frame and cut back to its longest valid prefix, and left writable.
    A closed segment is checked for structure only (see
    :mod:`.segment`); ``limit`` is the offset its offsets must stay below (the
    next segment's base).
    """
    header = header_bytes(base_offset)
    segment = Segment(directory, base_offset, SegmentIndex(base_offset), len(header), labels)
    if not active:
        if limit is None:
            raise ValueError(f"closed segment {base_offset} needs the offset its offsets stay below")
        if segment.path.stat().st_size < len(header):
            # Cut short of its header: the data is lost.  Left as found (the evidence,
            # for the next open too) and read as damaged until a repair rewrites it.
            _lost_whole(segment, limit, _read_claims(segment))
            return segment
    _repair_header(segment, header)
    file_size = segment.path.stat().st_size
    _adopt_pending_index(segment, len(header), file_size)
    index, consistent, whole = _read_index(segment)
    index_end = index.end(len(header))
    if active or limit is None:  # (a closed segment without a limit was refused above)
        _recover_active(segment, index, consistent, whole, file_size)
        segment.open_for_append()
    elif consistent and index_end == file_size and segment.next_offset_of(index) <= limit:
        segment._set_index(index, file_size)
    else:
        segment._log.warning("index of closed segment %s disagrees with it; re-indexing it", segment.path)
        _rebuild_closed(segment, file_size, limit, index if consistent and whole else None)
    return segment


def _read_index(segment: Segment) -> tuple[SegmentIndex, bool, bool]:
    """The index files' longest consistent prefix, whether they are consistent (see
    :func:`decode_index`), and whether they hold exactly that prefix."""
    if not (segment.offset_index_path.exists() and segment.time_index_path.exists()):
        return SegmentIndex(segment.base_offset), False, False  # lost: rebuild from the data
    offset_bytes = segment.offset_index_path.read_bytes()
    time_bytes = segment.time_index_path.read_bytes()
    index, consistent = decode_index(segment.base_offset, offset_bytes, time_bytes, segment.size)
    # Entries beyond the decoded ones (torn, or one file ahead) must go from the files.
    whole = (len(offset_bytes), len(time_bytes)) == (
        len(index) * OFFSET_ENTRY.size,
        len(index) * TIME_ENTRY.size,
    )
    return index, consistent, whole


def _read_claims(segment: Segment) -> SegmentIndex | None:
    """The index, if it is whole and consistent: what the segment should hold."""
    index, consistent, whole = _read_index(segment)
    return index if consistent and whole and len(index) else None


def _lost_whole(segment: Segment, limit: int, claims: SegmentIndex | None) -> None:
    """Mark every offset the segment held (by its index, else up to ``limit``) as lost."""
    index = SegmentIndex(segment.base_offset)
    damage: dict[int, str] = {}
    last = min(claims.lasts[-1], limit - 1) if claims is not None else limit - 1
    detail = f"{segment.path.name} is cut short of its header: its data is lost"
    add_damaged(index, damage, segment.base_offset, last, position=segment.size, size=0, detail=detail)
    segment._set_index(index, 0, damage=damage)
    segment._log.error(
        "closed segment %s: offsets %d to %d cannot be read: %s",
        segment.path,
        segment.base_offset,
        last,
        detail,
    )


def _repair_header(segment: Segment, header: bytes) -> None:
    with open(segment.path, "r+b") as f:
        found = f.read(len(header))
        if found == header:
            return
        segment._log.warning("segment %s has a damaged header; rewriting it", segment.path)
        if len(found) < len(header):
            f.truncate(0)
        f.seek(0)
        f.write(header)


def _recover_active(
    segment: Segment, index: SegmentIndex, consistent: bool, whole: bool, file_size: int
) -> None:
    """Cut the segment back to its longest valid prefix; write only what that changes.

    ``whole``: the index files hold exactly the decoded entries.  A segment
    and index already whole are left untouched, so a clean log opens on a
    full disk.
    """
    if not consistent:
        segment._log.warning("index of active segment %s is damaged; rebuilding", segment.path)
        index, _ = scan(segment._buffer(file_size), segment.size, file_size, segment.base_offset)
    else:
        # Keep the prefix of batches that lie wholly in the file and pass their checksum.
        view = segment._buffer(file_size)
        good = 0
        for i in range(len(index)):
            end = index.positions[i] + index.sizes[i]
            if end > file_size:
                break
            if crc32(view.slice(index.positions[i], index.sizes[i])) != index.crcs[i]:
                break
            good += 1
        whole = whole and good == len(index)
        index.truncate(good)
        if good and _last_frame_disagrees(view, index):
            segment._log.warning(
                "index of active segment %s misstates its last batch; rebuilding", segment.path
            )
            index, _ = scan(view, segment.size, file_size, segment.base_offset)
            consistent = False
    end = index.end(segment.size)
    if end != file_size:
        segment._log.warning(
            "truncating active segment %s from %d to %d bytes (%d bytes of torn or unacknowledged tail)",
            segment.path,
            file_size,
            end,
            file_size - end,
        )
        segment._drop_map()
        with open(segment.path, "r+b") as f:
            f.truncate(end)
    segment._set_index(index, end, verified=True)
    if not (consistent and whole):
        segment._write_index_files()


def _last_frame_disagrees(view: pa.Buffer, index: SegmentIndex) -> bool:
    """Whether the last batch's decoded offsets differ from its entry (it sets the log end)."""
    i = len(index) - 1
    try:
        batch = decode(view.slice(index.positions[i], index.sizes[i]))
    except (pa.ArrowException, ValueError):
        return True
    return mismatch(batch, index.bases[i], index.lasts[i], index.counts[i]) is not None


def _rebuild_closed(segment: Segment, file_size: int, limit: int, claims: SegmentIndex | None) -> None:
    """Re-index a closed segment from its frames, recording what cannot be read.

    ``claims``: the old index, if it is segment-consistent.  Offsets after
    the last frame found are a compaction gap, unless the file is known
    to have lost its end: the frames found are exactly the first ones the
    old index lists, and it lists more.  (A header-only file with an old
    index that lists batches is taken as compacted to nothing, as left
    by a crash in the middle of a compaction's rewrite.)
    """
    view = segment._buffer(file_size)
    index, damage = scan(view, segment.size, file_size, segment.base_offset, limit=limit)
    lost_until = None
    if claims is not None and 0 < len(index) < len(claims) and not damage:
        prefix = all(
            (index.positions[i], index.sizes[i], index.crcs[i])
            == (claims.positions[i], claims.sizes[i], claims.crcs[i])
            for i in range(len(index))
        )
        lost_until = claims.lasts[-1] if prefix else None
    first_lost = segment.next_offset_of(index)
    if lost_until is not None and lost_until >= first_lost:
        detail = f"the file ends at byte {file_size}, before offsets its index listed (up to {lost_until})"
        last = min(lost_until, limit - 1)
        add_damaged(index, damage, first_lost, last, position=file_size, size=0, detail=detail)
    segment._set_index(index, file_size, verified=True, damage=damage)
    for i, detail in damage.items():
        segment._log.error(
            "closed segment %s: offsets %d to %d cannot be read: %s",
            segment.path,
            index.bases[i],
            index.lasts[i],
            detail,
        )
    if not damage:
        segment._write_index_files()


def _adopt_pending_index(segment: Segment, header_size: int, file_size: int) -> None:
    """Finish a rewrite that crashed after renaming its data file, or discard its leftovers."""
    offset_tmp, time_tmp = segment._index_temps()
    if not (offset_tmp.exists() and time_tmp.exists()):
        offset_tmp.unlink(missing_ok=True)
        time_tmp.unlink(missing_ok=True)
        return
    index, consistent = decode_index(
        segment.base_offset, offset_tmp.read_bytes(), time_tmp.read_bytes(), header_size
    )
    end = index.end(header_size)
    view = segment._buffer(file_size) if file_size > header_size else None
    matches = (
        consistent
        and end == file_size
        and all(
            view is not None and crc32(view.slice(index.positions[i], index.sizes[i])) == index.crcs[i]
            for i in range(len(index))
        )
    )
    segment._drop_map()
    if matches:
        segment._log.warning("completing an interrupted rewrite of %s", segment.path)
        segment._install_index_temps()
    else:
        offset_tmp.unlink()
        time_tmp.unlink()
