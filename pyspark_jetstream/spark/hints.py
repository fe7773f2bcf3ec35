"""The fix a failed query's message ends with, where the broker's own error names none.

Spark shows a data source's error last, under its own wrapping: the line
there has to say what to do, not only what is wrong.
"""

from __future__ import annotations

import contextlib
import difflib

from pyspark_jetstream.client.cluster import ClusterConnection
from pyspark_jetstream.protocol.errors import JetStreamError, UnknownStreamError
from pyspark_jetstream.protocol.flight import ActionType
from pyspark_jetstream.protocol.streams import INTERNAL_PREFIX

SHOWN_STREAMS = 10
"""Stream names a message lists before it says how many more there are."""


def unknown_stream(
    connection: ClusterConnection, error: UnknownStreamError, stream: str, *, writing: bool = False
) -> UnknownStreamError:
    """``error`` (no stream named ``stream``) with the closest stream name, the streams there
    are, and the ``jetstream`` commands that list and create streams.

    The listing is best effort: a principal that may not list streams gets
    the commands alone.
    """
    names: list[str] | None = None
    with contextlib.suppress(JetStreamError):
        listed = connection.action(ActionType.LIST_STREAMS, {})
        names = sorted(
            info["config"]["name"]
            for info in listed
            if not info["config"]["name"].startswith(INTERNAL_PREFIX)
        )
    close = difflib.get_close_matches(stream, names or [], n=1, cutoff=0.6)
    create = f"`jetstream stream create {stream} --subject <subject>`"
    listing = "list them with `jetstream stream list`"
    if names is None:
        there = "list the streams with `jetstream stream list`"
    elif not names:
        there = "there are no streams yet"
    else:
        shown = ", ".join(names[:SHOWN_STREAMS])
        more = f" and {len(names) - SHOWN_STREAMS} more" if len(names) > SHOWN_STREAMS else ""
        there = f"streams: {shown}{more}; {listing}"
    if writing:
        message, advice = f"no stream named {stream!r} to write to", f"create it with {create} first"
    else:
        message, advice = f"no stream named {stream!r}", f"create one with {create}"
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return UnknownStreamError(f"{message}{hint} ({there}; {advice})", **{"stream": stream, **error.fields})
