"""The fix an unknown stream's message ends with, where the broker's own error names none.

Spark shows a data source's error last, under its own wrapping, and the
``jetstream`` command prints one line: either way the line has to say what
to do, not only what is wrong.  The Spark source and sink and the CLI share
this one wording.
"""

from __future__ import annotations

import contextlib
import difflib
from collections.abc import Callable, Iterable

from pyspark_jetstream.protocol.errors import JetStreamError, UnknownStreamError
from pyspark_jetstream.protocol.flight import ActionType
from pyspark_jetstream.protocol.streams import INTERNAL_PREFIX

from .cluster import ClusterConnection

SHOWN_STREAMS = 10
"""Stream names a message lists before it says how many more there are."""


def listed_streams(connection: ClusterConnection) -> list[str]:
    """Every stream's name, as the cluster lists them to this principal."""
    return [info["config"]["name"] for info in connection.action(ActionType.LIST_STREAMS, {})]


def unknown_stream(
    error: UnknownStreamError,
    stream: str,
    names: Callable[[], Iterable[str]],
    *,
    writing: bool = False,
) -> UnknownStreamError:
    """``error`` (no stream named ``stream``) with the closest stream name, the streams there
    are, and the ``jetstream`` commands that list and create streams.

    ``names`` lists the streams; it is called once, best effort: a principal
    that may not list streams gets the commands alone.
    """
    listed: list[str] | None = None
    with contextlib.suppress(JetStreamError):
        listed = sorted(name for name in names() if not name.startswith(INTERNAL_PREFIX))
    close = difflib.get_close_matches(stream, listed or [], n=1, cutoff=0.6)
    create = f"`jetstream stream create {stream} --subject <subject>`"
    listing = "list them with `jetstream stream list`"
    if listed is None:
        there = "list the streams with `jetstream stream list`"
    elif not listed:
        there = "there are no streams yet"
    else:
        shown = ", ".join(listed[:SHOWN_STREAMS])
        more = f" and {len(listed) - SHOWN_STREAMS} more" if len(listed) > SHOWN_STREAMS else ""
        there = f"streams: {shown}{more}; {listing}"
    if writing:
        message, advice = f"no stream named {stream!r} to write to", f"create it with {create} first"
    else:
        message, advice = f"no stream named {stream!r}", f"create one with {create}"
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return UnknownStreamError(f"{message}{hint} ({there}; {advice})", **{"stream": stream, **error.fields})
