"""Sending pyspark-jetstream from the driver to executors that do not have it installed.

Executors read and write with the package's code, so every executor's
Python must import ``pyspark_jetstream`` (and its dependencies, pyarrow and
nats-py).  Where it is not installed there, the driver can ship it: a zip
of the installed package, added to the session as a Python file, which
Spark copies to every executor and puts on its Python path.  Over Spark
Connect the same zip goes to the server as a session artifact
(``spark.addArtifacts(..., pyfile=True)``), which reaches that session's
Python workers.
"""

from __future__ import annotations

import getpass
import hashlib
import logging
import os
import tempfile
import zipfile
from pathlib import Path

from pyspark.sql import SparkSession

logger = logging.getLogger(__name__)

PACKAGE_ROOT = Path(__file__).resolve().parent.parent
"""The installed ``pyspark_jetstream`` directory (this file is ``pyspark_jetstream/spark/shipping.py``)."""
_EPOCH = (1980, 1, 1, 0, 0, 0)
"""Every entry's time in the zip: the same sources give the same bytes."""


def package_zip(directory: Path | None = None) -> Path:
    """A zip of the installed ``pyspark_jetstream`` package (its ``.py`` files), for ``pyFiles``.

    Its name carries a digest of the sources (``pyspark_jetstream-<digest>.zip``),
    so a changed package never reuses an older zip; an existing zip of the
    same sources is returned as it is.  ``directory`` defaults to
    ``<temp dir>/pyspark-jetstream-<user>``, readable by its user only (a zip
    found there is shipped as it is, so nobody else may put one there).
    """
    root = PACKAGE_ROOT
    files = sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.relative_to(root.parent).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    directory = directory or Path(tempfile.gettempdir()) / f"pyspark-jetstream-{getpass.getuser()}"
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    if hasattr(os, "getuid") and directory.stat().st_uid != os.getuid():
        raise PermissionError(f"{directory} belongs to another user: pass package_zip(directory=...)")
    target = directory / f"{root.name}-{digest.hexdigest()[:16]}.zip"
    if target.exists():
        return target
    fd, partial = tempfile.mkstemp(dir=directory, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
            for path in files:
                entry = zipfile.ZipInfo(path.relative_to(root.parent).as_posix(), _EPOCH)
                entry.compress_type = zipfile.ZIP_DEFLATED
                archive.writestr(entry, path.read_bytes())
        os.replace(partial, target)  # whole or absent, also when two drivers build it at once
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise
    return target


def ship_to_executors(spark: SparkSession) -> Path:
    """Make ``pyspark_jetstream`` importable on the session's executors; returns the zip shipped.

    For a session made elsewhere (``spark-submit``, a notebook, a job
    cluster), call it once after the session exists and before the first
    query.  The executors still need pyspark-jetstream's dependencies
    (pyarrow and nats-py) installed.  Calling it again for the same package
    adds nothing.  On a Spark Connect session the zip is added as the
    session's artifact, for its queries only.

    The source is then registered with the session (over the one Spark
    finds by itself, which logs that it replaced it): Spark runs a source it
    found by itself without the session's Python files, so the zip would
    not reach the executors of its queries.
    """
    from .source import JetStreamDataSource

    path = package_zip()
    if is_connect(spark):  # the server keeps an artifact once: adding the same zip again is harmless
        spark.addArtifacts(str(path), pyfile=True)
        logger.info("pyspark_jetstream shipped to the Spark Connect session as %s", path)
    else:
        context = spark.sparkContext
        if not any(added.endswith("/" + path.name) for added in context.listFiles):
            context.addPyFile(str(path))
            logger.info("pyspark_jetstream shipped to the executors of %s as %s", context.master, path)
    # After addPyFile: a registration takes the session's Python files as they are then.
    spark.dataSource.register(JetStreamDataSource)
    return path


def is_connect(spark: SparkSession) -> bool:
    """Whether ``spark`` is a Spark Connect session (a client of a remote server; no JVM here)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def ships_by_default(master: str) -> bool:
    """Whether :func:`~pyspark_jetstream.spark.jetstream_session` ships the package to ``master``:
    not to ``local``, ``local[N]`` or ``local-cluster[...]``, whose executors run on this machine
    with this Python."""
    return not master.startswith("local")
