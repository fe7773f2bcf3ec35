"""Which segment files make up a log: the segment manifest, and what opening does with it.

Why a manifest
==============
Segment files alone cannot tell a lost segment from a compaction gap: key
compaction removes messages, including the last ones of a segment, so the
offsets between one segment's last message and the next segment's base may be
a gap that compaction left or the range of a segment file that was deleted.
Nor can they tell a stray file (copied in, or left behind) from the newest
segment.  The manifest lists the segments the log itself created, so both are
decided by the list rather than guessed from the files.

Layout, ``segments.checkpoint`` (a checkpoint, see :mod:`.checkpoint`: version
line first, written to a temporary file, fsynced and renamed)::

    1                       format version
    <count>                 segments, oldest first, the active one last
    <base> <end>            one line per segment: its base offset and the
                            offset its offsets stay below (the next segment's
                            base); ``-1`` for the active segment, which grows

Compaction and repair rewrite segments in place and keep their ranges, so the
manifest changes only when segments come and go.  It is written:

* on a roll, after the new segment's file is created and before anything is
  appended to it (a roll that cannot write it is undone and fails); unless
  every append is synced, its fsyncs are paid on a background thread before
  any of the new segment's data is synced (see :mod:`.deferred_sync`), so an
  append on an event loop never waits for a disk flush;
* after retention deleted segments, and after truncation deleted them;
* on open, when what is on disk differed from it, or it did not exist yet (a
  failure there is only logged: the next change writes it, and until then
  the next open reaches the same conclusions).

Opening with a manifest
-----------------------
* A listed segment whose file exists is opened; a closed one must keep its
  offsets below its end (see :mod:`.segment` for what else is checked).
* A listed segment whose file is missing: at the head of the log, retention
  was interrupted between deleting files and writing the manifest, and the
  log starts after it; at the tail, truncation was, and the log ends before
  it (it may also have been lost, which nothing can tell: logged as a
  warning).  In the middle, its data is lost: it is kept as a placeholder
  whose whole range reads as damaged (``CorruptSegmentError`` naming the
  range), listed in ``Log.damaged``, until ``Log.repair`` brings it back.
* A segment file the manifest does not list is adopted only if it is empty
  and starts exactly at the end of the active segment: a roll that crashed
  before recording it.  Any other is a stray: it is never served nor written
  after, but renamed to ``<name>.stray`` (with its index files, never
  deleted) and logged as an error.  If it cannot be renamed, opening fails
  with a ``LogError`` that names it.
* If no listed segment exists, opening fails with a ``LogError``: the data is
  gone, and starting over must be the operator's decision.

Logs written before the manifest existed
----------------------------------------
They have no ``segments.checkpoint`` (nor has a log whose manifest does not
parse).  Every segment file is then taken as part of the log, in base-offset
order, the last one active, as before; each closed segment is still checked
against the next one's base and re-indexed if it overlaps it.  Gaps between
segments are taken as compaction gaps, and a stray file with the highest base
becomes the active segment: those two checks start once the manifest has been
written, which the first open does.
"""

from __future__ import annotations

import logging
from pathlib import Path

from .checkpoint import read_int_pairs, write_int_pairs
from .errors import LogError, LogStorageError
from .logging_labels import NO_LABELS, Labels
from .segment import (
    OFFSET_INDEX_SUFFIX,
    SEGMENT_SUFFIX,
    TIME_INDEX_SUFFIX,
    Segment,
    header_bytes,
    segment_name,
)
from .segment_recovery import missing_segment, open_segment

logger = logging.getLogger(__name__)

MANIFEST = "segments.checkpoint"
STRAY_SUFFIX = ".stray"
_GROWING = -1


def write_manifest(directory: Path, bases: list[int], *, sync: bool = True) -> None:
    """Record that the log is the segments starting at ``bases`` (ascending, the last active);
    without ``sync``, the caller owes the file's and the directory's fsyncs."""
    ends = [*bases[1:], _GROWING]
    write_int_pairs(directory / MANIFEST, list(zip(bases, ends, strict=True)), sync=sync)


def start_segment(
    directory: Path, bases: list[int], active: Segment, base_offset: int, *, sync: bool, labels: Labels
) -> Segment:
    """A roll's new segment at ``base_offset``, created and listed after ``bases`` (the log's, the
    last ``active``'s); with ``sync``, it, the manifest and ``active`` are on disk when this returns.

    The active segment stays writable (the caller seals it): when the new one cannot be made or
    listed, ``LogStorageError`` is raised and nothing changed."""
    try:
        # The new segment first: if it cannot be made, the old one stays writable.
        segment = Segment.create(directory, base_offset, sync=sync)
        segment.labels = labels
    except OSError as exc:
        raise LogStorageError(f"cannot start a new segment in {directory}: {exc}") from exc
    try:
        # Listed before anything is appended to it: an unlisted segment with data is a stray.
        write_manifest(directory, [*bases, segment.base_offset], sync=sync)
        if sync:
            active.fsync()
    except OSError as exc:
        try:
            segment.delete()
        except OSError:
            labels.bind(logger).exception("cannot remove %s after a failed roll", segment.path)
        raise LogStorageError(f"cannot start a new segment in {directory}: {exc}") from exc
    return segment


def record_segments(directory: Path, bases: list[int], *, required: bool, labels: Labels) -> None:
    """Write the manifest of the segments starting at ``bases``; unless ``required``, a failure is
    only logged.

    Not required after segments went away: until the next change writes
    it, opening takes segments missing at either end of the log for the
    deletions they were (see the module docstring).
    """
    try:
        write_manifest(directory, bases)
    except OSError as exc:
        if required:
            raise LogStorageError(f"could not record the segments of {directory}: {exc}") from exc
        labels.bind(logger).warning(
            "could not record the segments of %s: %s (the next change will)", directory, exc
        )


def read_manifest(directory: Path, labels: Labels = NO_LABELS) -> list[int] | None:
    """The listed segments' bases, or ``None`` if there is no manifest or it does not hold together."""
    pairs = read_int_pairs(directory / MANIFEST)
    if pairs is None:
        return None
    bases = [base for base, _ in pairs]
    expected_ends = [*bases[1:], _GROWING]
    if not pairs or any(end != expected for (_, end), expected in zip(pairs, expected_ends, strict=True)):
        labels.bind(logger).warning(
            "ignoring %s in %s: its segments do not follow each other", MANIFEST, directory
        )
        return None
    return bases


def segment_files(directory: Path) -> list[int]:
    """Base offsets of the segment data files in ``directory``, ascending."""
    return sorted(
        int(p.stem) for p in directory.glob("*" + SEGMENT_SUFFIX) if len(p.stem) == 20 and p.stem.isdigit()
    )


def open_segments(directory: Path, labels: Labels = NO_LABELS) -> tuple[list[Segment], bool]:
    """Open the segments that make up the log in ``directory`` (see the module docstring).

    Returns them, oldest first and the last one writable (none for a new
    log), and whether the manifest should be written to match them.
    ``labels`` name the log in what opening logs, and stay with its segments.
    """
    log = labels.bind(logger)
    files = segment_files(directory)
    present = set(files)
    listed = read_manifest(directory, labels)
    if listed is None:
        return _open(directory, files, present, labels), True
    existing = [i for i, base in enumerate(listed) if base in present]
    if not existing:
        raise LogError(
            f"none of the {len(listed)} segments that {directory / MANIFEST} lists exist in {directory}: "
            f"restore them, or move {MANIFEST} aside to open what is there as a log"
        )
    kept = listed[existing[0] : existing[-1] + 1]
    if existing[0] > 0:
        log.info(
            "segments %s of %s were deleted by retention before a crash", listed[: existing[0]], directory
        )
    if existing[-1] < len(listed) - 1:
        log.warning(
            "segments %s of %s are missing at the end of the log: a truncation was interrupted, or they "
            "were lost; the log ends at the end of segment %d",
            listed[existing[-1] + 1 :],
            directory,
            kept[-1],
        )
    segments = _open(directory, kept, present, labels)
    changed = kept != listed
    for base in sorted(present - set(listed)):
        if _completes_a_roll(directory, base, segments[-1]):
            log.warning(
                "adopting segment %d of %s, created by a roll interrupted by a crash", base, directory
            )
            segments[-1].seal()
            segments.append(open_segment(directory, base, active=True, labels=labels))
        else:
            _set_aside(directory, base, log)
        changed = True
    return segments, changed


def _open(directory: Path, bases: list[int], present: set[int], labels: Labels) -> list[Segment]:
    """Open ``bases`` (the last one exists); a missing one becomes a placeholder."""
    segments = []
    for i, base in enumerate(bases):
        if base in present:
            limit = bases[i + 1] if i + 1 < len(bases) else None
            segments.append(open_segment(directory, base, active=limit is None, limit=limit, labels=labels))
        else:
            end = bases[i + 1]
            labels.bind(logger).error(
                "segment %d of %s is missing: offsets %d to %d are lost", base, directory, base, end - 1
            )
            segments.append(missing_segment(directory, base, end, labels))
    return segments


def _completes_a_roll(directory: Path, base: int, active: Segment) -> bool:
    """Whether segment ``base`` is the empty segment of a roll that crashed before recording it."""
    size = (directory / (segment_name(base) + SEGMENT_SUFFIX)).stat().st_size
    return base == active.next_offset and base > active.base_offset and size <= len(header_bytes(base))


def _set_aside(directory: Path, base: int, log: logging.LoggerAdapter[logging.Logger]) -> None:
    """Rename a stray segment's files so that no open takes them for part of the log again."""
    data = directory / (segment_name(base) + SEGMENT_SUFFIX)
    log.error(
        "%s is not one of the segments %s lists: it is not part of the log and is renamed to %s%s; "
        "if it holds data you need, copy it out (it is an Arrow IPC stream)",
        data,
        MANIFEST,
        data.name,
        STRAY_SUFFIX,
    )
    for suffix in (SEGMENT_SUFFIX, OFFSET_INDEX_SUFFIX, TIME_INDEX_SUFFIX):
        path = data.with_suffix(suffix)
        if not path.exists():
            continue
        target = path.with_name(path.name + STRAY_SUFFIX)
        n = 1
        while target.exists():
            target = path.with_name(f"{path.name}{STRAY_SUFFIX}.{n}")
            n += 1
        try:
            path.rename(target)
        except OSError as exc:
            raise LogError(
                f"{path} is not one of the segments {directory / MANIFEST} lists, and renaming it aside "
                f"failed ({exc}): move it out of {directory}, then open the log again"
            ) from exc
