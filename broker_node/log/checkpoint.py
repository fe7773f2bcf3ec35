"""Small checkpoint files, written atomically.

Layout (text, ASCII, one value per line)::

    <format version>            currently 1
    <payload lines...>

A checkpoint is written with :func:`broker_node.durable.atomic_write` (to
``<name>.tmp``, fsynced, renamed over ``<name>``, the directory fsynced), so a
crash leaves either the old or the new file, never a torn one.  A file that
does not parse reads as missing: every checkpoint can be rebuilt or
conservatively defaulted.
"""

from __future__ import annotations

import logging
from pathlib import Path

from broker_node.durable import atomic_write

logger = logging.getLogger(__name__)

CHECKPOINT_VERSION = 1


def write_checkpoint(path: Path, lines: list[str], *, sync: bool = True) -> None:
    """Atomically replace ``path`` with the version line followed by ``lines`` (``sync``: see
    :func:`broker_node.durable.atomic_write`)."""
    atomic_write(path, ("\n".join([str(CHECKPOINT_VERSION), *lines]) + "\n").encode("ascii"), sync=sync)


def read_checkpoint(path: Path) -> list[str] | None:
    """Return the payload lines of a checkpoint, or ``None`` if missing or unreadable."""
    try:
        text = path.read_text(encoding="ascii")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        logger.warning("ignoring unreadable checkpoint %s: %s", path, exc)
        return None
    lines = text.splitlines()
    if not lines or lines[0].strip() != str(CHECKPOINT_VERSION):
        logger.warning("ignoring checkpoint %s with unknown version", path)
        return None
    return lines[1:]


def read_int_pairs(path: Path) -> list[tuple[int, int]] | None:
    """Read a checkpoint whose payload is ``count`` then ``count`` lines of two integers."""
    lines = read_checkpoint(path)
    if lines is None:
        return None
    try:
        count = int(lines[0])
        pairs = [(int(a), int(b)) for a, b in (line.split() for line in lines[1 : 1 + count])]
    except (IndexError, ValueError):
        logger.warning("ignoring malformed checkpoint %s", path)
        return None
    if len(pairs) != count:
        logger.warning("ignoring truncated checkpoint %s", path)
        return None
    return pairs


def write_int_pairs(path: Path, pairs: list[tuple[int, int]], *, sync: bool = True) -> None:
    """Atomically write ``pairs`` in the layout :func:`read_int_pairs` reads."""
    write_checkpoint(path, [str(len(pairs)), *(f"{a} {b}" for a, b in pairs)], sync=sync)
