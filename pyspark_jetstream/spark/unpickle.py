"""How executors load the source's readers and writers: by name, with one clear line if they cannot.

Spark pickles a reader or writer on the driver and unpickles it on an
executor.  Pickled as usual, the object names its class's module, and an
executor without pyspark-jetstream fails inside pickle with "No module named
'pyspark_jetstream'", deep in a traceback.  Objects of :class:`ByName` pickle
as a call of :func:`rebuild` instead, and this module is pickled *by value*
(the driver registers it with Spark's cloudpickle), so the executor runs
``rebuild`` without the package and it can say what to do.

This module must stay importable on its own: it imports nothing of the
project, and its functions reach only the standard library.
"""

from __future__ import annotations

import importlib
import socket
import sys
from typing import Any

PACKAGE = "pyspark_jetstream"


def missing_message() -> str:
    """The one line an executor without the package fails with."""
    return (
        f"{PACKAGE} is not installed on this Spark executor (Python {sys.executable} on "
        f"{socket.gethostname()}): install pyspark-jetstream there, or ship it from the driver with "
        f"jetstream_session() or pyspark_jetstream.spark.ship_to_executors(spark)"
    )


def dependency_message(name: str) -> str:
    """The one line an executor that has the package but not its dependency ``name`` fails with."""
    return (
        f"{PACKAGE} on this Spark executor (Python {sys.executable} on {socket.gethostname()}) "
        f"cannot import {name}: install pyspark-jetstream's dependencies there (pyarrow, nats-py)"
    )


def rebuild(module: str, qualname: str) -> Any:
    """An uninitialised instance of ``module.qualname`` (pickle then restores its state).

    Raises ``ModuleNotFoundError`` with :func:`missing_message` if the
    package cannot be imported here, or :func:`dependency_message` if a
    module it imports cannot.
    """
    try:
        cls = getattr(importlib.import_module(module), qualname)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing == PACKAGE or missing.startswith(PACKAGE + "."):
            raise ModuleNotFoundError(missing_message(), name=PACKAGE) from None
        if module.startswith(PACKAGE + ".") and missing and missing != module:
            raise ModuleNotFoundError(dependency_message(missing), name=missing) from None
        raise
    return cls.__new__(cls)


class ByName:
    """Pickles as ``rebuild(module, qualname)`` plus the instance's attributes, but those named in
    ``_transient`` (things of the process that made it: threads, locks)."""

    _transient: tuple[str, ...] = ()

    def __reduce__(self) -> tuple[Any, ...]:
        cls = type(self)
        state = {k: v for k, v in self.__dict__.items() if k not in self._transient}
        return (rebuild, (cls.__module__, cls.__qualname__), state)
