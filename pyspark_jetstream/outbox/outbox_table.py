"""The outbox table and its queries, for SQLite (the embedded default) and PostgreSQL.

The table (``jetstream outbox init`` creates it; ``{t}`` is its name)::

    id          database-generated, increasing (INTEGER PRIMARY KEY AUTOINCREMENT / BIGSERIAL)
    stream      the stream to publish to (or NULL with a subject)
    subject     a NATS subject to publish on instead (for streams on wildcard subjects)
    key         bytes or NULL: the message key; rows of one key are published in id order
    value       bytes: the message value
    headers     JSON object of string to string, or NULL
    created_at  when the row was written
    leader_id   NULL, or the harvester term that marked the row as in flight
    attempts    publishes the broker refused for this row (not counting timeouts)
    last_error  the last refusal

and ``{t}_dead_letters`` holds rows given up on, with their error and attempts.

Mark-purge/reset: :meth:`Store.mark` takes the first rows by id (above an
id the caller gives, or all) whose ``leader_id`` is NULL or another term's,
sets it to the caller's term and returns them, in one statement (``UPDATE ...
RETURNING``; on PostgreSQL with ``FOR UPDATE SKIP LOCKED``); :meth:`Store.purge` deletes published rows;
:meth:`Store.reset` clears a row's ``leader_id`` so that it is marked again.

Rows of one key are marked in id order only if no row is marked while a lower
id may still be committed.  On SQLite that is given: a writer holds the
database's write lock from its first insert until it commits, so ids are
taken in commit order.  On PostgreSQL, concurrent transactions commit in any
order: one that took id 319 may commit after one that took 320, and a mark
between the two commits would publish 320 first.  So a PostgreSQL mark only
takes rows up to a *horizon* below which every id is decided (committed, or
rolled back for good); see ``PostgresStore._horizon``.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlparse

from pyspark_jetstream.protocol.errors import InvalidArgumentError, JetStreamError, UnavailableError

TABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,50}")


class UnavailableDatabaseError(UnavailableError):
    """The database cannot be reached (down, restarting, busy, connection lost): retried, not a bad row."""


@dataclass(frozen=True, slots=True)
class Record:
    """One outbox row, as marked."""

    id: int
    stream: str | None
    subject: str | None
    key: bytes | None
    value: bytes
    headers: dict[str, str]
    attempts: int


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A row given up on."""

    id: int
    original_id: int
    stream: str | None
    subject: str | None
    key: bytes | None
    value: bytes
    error: str
    attempts: int
    failed_at: float


class Store(Protocol):
    """The queries of mark-purge/reset, on one database connection (not thread-safe)."""

    table: str
    address: str

    def init(self) -> None: ...
    def mark(self, leader_id: str, limit: int, after: int = 0) -> list[Record]: ...
    def purge(self, ids: Sequence[int]) -> None: ...
    def reset(self, record_id: int, error: str | None) -> int: ...
    def dead_letter(self, record_id: int, error: str) -> None: ...
    def dead_letters(self) -> list[DeadLetter]: ...
    def requeue(self, ids: Sequence[int]) -> int: ...
    def backlog(self) -> int: ...
    def insert(
        self,
        rows: Iterable[Mapping[str, Any]],
    ) -> None: ...
    def close(self) -> None: ...


def checked_table(name: str) -> str:
    """``name`` if it is a plain SQL identifier (it is put into queries), else ``InvalidArgumentError``."""
    if not TABLE_NAME.fullmatch(name):
        raise InvalidArgumentError(
            f"outbox table name {name!r} must be letters, digits and '_' (not starting with a digit), "
            "at most 51 characters"
        )
    return name


def open_store(database: str, table: str = "outbox", *, timeout: float = 30.0) -> Store:
    """A store for ``database``: ``sqlite:///path/to/file.db`` or ``postgresql://...``."""
    checked_table(table)
    scheme = urlparse(database).scheme
    if scheme == "sqlite":
        return SQLiteStore(sqlite_path(database), table, timeout=timeout)
    if scheme in ("postgresql", "postgres"):
        return PostgresStore(database, table, timeout=timeout)
    raise InvalidArgumentError(
        f"database {database!r}: use sqlite:///path/to/outbox.db or postgresql://user@host:port/dbname"
    )


def sqlite_path(database: str) -> str:
    """The file of a ``sqlite:///path`` URL (``sqlite:////abs/path`` or ``sqlite:///rel/path``)."""
    path = database.removeprefix("sqlite://")
    path = path[1:] if path.startswith("/") and not path.startswith("//") else path
    if not path:
        raise InvalidArgumentError(f"database {database!r}: use sqlite:///path/to/outbox.db")
    return path


def _headers(raw: str | None, where: str) -> dict[str, str]:
    if raw is None or raw == "":
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise InvalidArgumentError(f"{where}: headers must be a JSON object of strings, got {raw[:200]!r}")
    return value


def _row(row: Sequence[Any], table: str) -> Record:
    record_id, stream, subject, key, value, headers, attempts = row
    return Record(
        id=int(record_id),
        stream=stream,
        subject=subject,
        key=None if key is None else bytes(key),
        value=b"" if value is None else bytes(value),
        headers=_headers(headers, f"{table} row {record_id}"),
        attempts=int(attempts),
    )


def _dead_letter(r: Sequence[Any]) -> DeadLetter:
    return DeadLetter(
        id=int(r[0]),
        original_id=int(r[1]),
        stream=r[2],
        subject=r[3],
        key=None if r[4] is None else bytes(r[4]),
        value=bytes(r[5]),
        error=r[6],
        attempts=int(r[7]),
        failed_at=float(r[8]),
    )


def _insert_values(row: Mapping[str, Any]) -> tuple[Any, ...]:
    value = row.get("value", b"")
    key = row.get("key")
    headers = row.get("headers")
    return (
        row.get("stream"),
        row.get("subject"),
        key.encode() if isinstance(key, str) else key,
        value.encode() if isinstance(value, str) else value,
        None if headers is None else json.dumps(dict(headers)),
    )


class _TableStore:
    """What both databases' stores do alike, written once over each one's ``_query``."""

    table: str
    _db: Any
    _FAILED_AT = "failed_at"
    """The dead-letter time as seconds since the epoch, in this database's SQL."""

    def _query(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        raise NotImplementedError

    def dead_letters(self) -> list[DeadLetter]:
        """The rows given up on, oldest first."""
        rows = self._query(
            "SELECT id, original_id, stream, subject, key, value, error, attempts, "
            f"{self._FAILED_AT} FROM {self.table}_dead_letters ORDER BY id",
            (),
        )
        return [_dead_letter(r) for r in rows]

    def backlog(self) -> int:
        """Rows waiting to be published (marked or not)."""
        return int(self._query(f"SELECT count(*) FROM {self.table}", ())[0][0])

    def close(self) -> None:
        """Close the connection."""
        self._db.close()


class SQLiteStore(_TableStore):
    """The outbox in a SQLite file (one connection; SQLite's own lock serialises writers)."""

    def __init__(self, path: str, table: str, *, timeout: float = 30.0) -> None:
        self.table = checked_table(table)
        self.address = f"sqlite:///{path}"
        self.path = path
        try:
            self._db = sqlite3.connect(path, timeout=timeout, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise InvalidArgumentError(f"cannot open the outbox database {self.address}: {exc}") from None
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")

    def init(self) -> None:
        """Create the outbox and dead-letter tables if missing."""
        t = self.table
        self._db.executescript(
            f"""
            CREATE TABLE IF NOT EXISTS {t} (
                id INTEGER PRIMARY KEY AUTOINCREMENT,
                stream TEXT,
                subject TEXT,
                key BLOB,
                value BLOB NOT NULL,
                headers TEXT,
                created_at REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0),
                leader_id TEXT,
                attempts INTEGER NOT NULL DEFAULT 0,
                last_error TEXT,
                CHECK (stream IS NOT NULL OR subject IS NOT NULL)
            );
            CREATE TABLE IF NOT EXISTS {t}_dead_letters (
                id INTEGER PRIMARY KEY AUTOINCREMENT,
                original_id INTEGER NOT NULL,
                stream TEXT,
                subject TEXT,
                key BLOB,
                value BLOB NOT NULL,
                headers TEXT,
                created_at REAL NOT NULL,
                error TEXT NOT NULL,
                attempts INTEGER NOT NULL,
                failed_at REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0)
            );
            """
        )

    def mark(self, leader_id: str, limit: int, after: int = 0) -> list[Record]:
        """Mark up to ``limit`` rows (the first by id above ``after`` not marked by ``leader_id``) for
        ``leader_id``."""
        t = self.table
        rows = self._query(
            f"UPDATE {t} SET leader_id = ? WHERE id IN ("
            f"SELECT id FROM {t} WHERE (leader_id IS NULL OR leader_id <> ?) AND id > ? "
            "ORDER BY id LIMIT ?) "
            "RETURNING id, stream, subject, key, value, headers, attempts",
            (leader_id, leader_id, after, limit),
        )
        return sorted((_row(r, t) for r in rows), key=lambda r: r.id)

    def purge(self, ids: Sequence[int]) -> None:
        """Delete published rows."""
        if ids:
            marks = ",".join("?" * len(ids))
            self._query(f"DELETE FROM {self.table} WHERE id IN ({marks})", tuple(ids))

    def reset(self, record_id: int, error: str | None) -> int:
        """Unmark a row (``error``: a refusal, counted in ``attempts``); returns its attempts."""
        counted = 0 if error is None else 1
        rows = self._query(
            f"UPDATE {self.table} SET leader_id = NULL, attempts = attempts + ?, "
            "last_error = coalesce(?, last_error) WHERE id = ? RETURNING attempts",
            (counted, error, record_id),
        )
        return int(rows[0][0]) if rows else 0

    def dead_letter(self, record_id: int, error: str) -> None:
        """Move a row to the dead-letter table, in one transaction."""
        t = self.table
        with self._transaction():
            self._db.execute(
                f"INSERT INTO {t}_dead_letters "
                "(original_id, stream, subject, key, value, headers, created_at, error, attempts) "
                "SELECT id, stream, subject, key, value, headers, created_at, ?, attempts "
                f"FROM {t} WHERE id = ?",
                (error, record_id),
            )
            self._db.execute(f"DELETE FROM {t} WHERE id = ?", (record_id,))

    def requeue(self, ids: Sequence[int]) -> int:
        """Put dead letters back into the outbox (as new rows, after those there now); returns how many."""
        if not ids:
            return 0
        t = self.table
        marks = ",".join("?" * len(ids))
        with self._transaction():
            moved = self._db.execute(
                f"INSERT INTO {t} (stream, subject, key, value, headers) "
                f"SELECT stream, subject, key, value, headers FROM {t}_dead_letters "
                f"WHERE id IN ({marks}) ORDER BY id",
                tuple(ids),
            ).rowcount
            self._db.execute(f"DELETE FROM {t}_dead_letters WHERE id IN ({marks})", tuple(ids))
        return int(moved)

    def insert(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Write rows in one transaction (applications write theirs with their own transaction)."""
        with self._transaction():
            self._db.executemany(
                f"INSERT INTO {self.table} (stream, subject, key, value, headers) VALUES (?, ?, ?, ?, ?)",
                [_insert_values(r) for r in rows],
            )

    def _query(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        try:
            return self._db.execute(sql, params).fetchall()
        except sqlite3.OperationalError as exc:
            raise _named(exc, self) from None

    def _transaction(self) -> _SQLiteTransaction:
        return _SQLiteTransaction(self)


class _SQLiteTransaction:
    def __init__(self, store: SQLiteStore) -> None:
        self.store = store

    def __enter__(self) -> None:
        self.store._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, kind: object, *rest: object) -> None:
        self.store._db.execute("ROLLBACK" if kind else "COMMIT")


def _named(exc: Exception, store: Store) -> JetStreamError:
    """A database error as a missing table (``InvalidArgumentError``) or an unreachable database."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if "no such table" in text or "does not exist" in text:
        return InvalidArgumentError(
            f"outbox {store.address}: {text} (run 'jetstream outbox init' to create table {store.table})"
        )
    return UnavailableDatabaseError(f"outbox database {store.address}: {text}")


class PostgresStore(_TableStore):
    """The outbox in PostgreSQL, through psycopg 3 (autocommit; each query is its own transaction)."""

    _FAILED_AT = "extract(epoch FROM failed_at)"

    def __init__(self, dsn: str, table: str, *, timeout: float = 30.0) -> None:
        import psycopg

        self.table = checked_table(table)
        parsed = urlparse(dsn)
        self.address = f"postgresql://{parsed.hostname}:{parsed.port or 5432}{parsed.path}"  # no password
        try:
            self._db = psycopg.connect(dsn, autocommit=True, connect_timeout=max(1, int(timeout)))
        except psycopg.Error as exc:
            raise UnavailableDatabaseError(
                f"cannot connect to the outbox database {self.address}: {exc}"
            ) from None
        self._top = 0
        """The highest id seen at the last :meth:`_horizon` (0: none yet)."""
        self._writers: dict[str, int] = {}
        """Transactions writing the table at the last :meth:`_horizon` (by virtual transaction id),
        each with an id that every id it inserts is above."""

    def init(self) -> None:
        """Create the outbox and dead-letter tables if missing."""
        t = self.table
        with self._db.transaction():
            self._db.execute(
                f"""
                CREATE TABLE IF NOT EXISTS {t} (
                    id BIGSERIAL PRIMARY KEY,
                    stream TEXT,
                    subject TEXT,
                    key BYTEA,
                    value BYTEA NOT NULL,
                    headers TEXT,
                    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
                    leader_id TEXT,
                    attempts INTEGER NOT NULL DEFAULT 0,
                    last_error TEXT,
                    CHECK (stream IS NOT NULL OR subject IS NOT NULL)
                )"""
            )
            self._db.execute(
                f"""
                CREATE TABLE IF NOT EXISTS {t}_dead_letters (
                    id BIGSERIAL PRIMARY KEY,
                    original_id BIGINT NOT NULL,
                    stream TEXT,
                    subject TEXT,
                    key BYTEA,
                    value BYTEA NOT NULL,
                    headers TEXT,
                    created_at TIMESTAMPTZ NOT NULL,
                    error TEXT NOT NULL,
                    attempts INTEGER NOT NULL,
                    failed_at TIMESTAMPTZ NOT NULL DEFAULT now()
                )"""
            )

    def mark(self, leader_id: str, limit: int, after: int = 0) -> list[Record]:
        """Mark up to ``limit`` rows (the first by id above ``after`` not marked by ``leader_id``) for
        ``leader_id``; none above an id that a transaction still running may hold (see the module
        docstring)."""
        t = self.table
        horizon = self._horizon()
        rows = self._query(
            f"UPDATE {t} SET leader_id = %s WHERE id IN ("
            f"SELECT id FROM {t} WHERE (leader_id IS NULL OR leader_id <> %s) AND id > %s AND id <= %s "
            "ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED) "
            "RETURNING id, stream, subject, key, value, headers, attempts",
            (leader_id, leader_id, after, horizon, limit),
        )
        return sorted((_row(r, t) for r in rows), key=lambda r: r.id)

    def _horizon(self) -> int:
        """An id up to which every id is decided: no transaction still running holds one.

        A row is inserted under the table's ``RowExclusiveLock``, taken before its id is drawn
        from the sequence and held until its transaction ends.  Each call reads the highest id
        committed (``top``), then the transactions holding that lock, in one statement: ``top``
        comes from the snapshot taken before the statement runs, ``pg_locks`` shows the locks
        held when it is read, later.  A transaction not among those of the previous call took
        the lock after that call's ``top`` was read, so its ids are above that ``top``: its
        *floor*.  The horizon is ``top`` or the lowest floor of the transactions
        writing now, if lower.  An id up to it was drawn before ``top`` was read, so a transaction
        still running that holds it is among those writing now, with a floor below the id: there
        is none.  A statement run afterwards sees every committed row up to the horizon.  (A writer
        already running at a connection's first call has floor 0.)

        The cost of id order: rows above the floor of a transaction that stays open wait for it
        to end, whatever their key.  The sequence must hand out ids in the order drawn (the
        default ``CACHE 1``), and ids must come from the column's default.
        """
        t = self.table
        ((top, writing),) = self._query(
            f"SELECT (SELECT coalesce(max(id), 0) FROM {t}), ARRAY("
            "SELECT DISTINCT virtualtransaction FROM pg_locks WHERE locktype = 'relation' "
            "AND relation = %s::regclass AND mode = 'RowExclusiveLock' AND granted "
            "AND pid IS DISTINCT FROM pg_backend_pid())",  # a prepared transaction has no pid
            (t,),
        )
        self._writers = {w: self._writers.get(w, self._top) for w in writing}
        self._top = int(top)
        return min([self._top, *self._writers.values()])

    def purge(self, ids: Sequence[int]) -> None:
        """Delete published rows."""
        if ids:
            self._query(f"DELETE FROM {self.table} WHERE id = ANY(%s)", (list(ids),), fetch=False)

    def reset(self, record_id: int, error: str | None) -> int:
        """Unmark a row (``error``: a refusal, counted in ``attempts``); returns its attempts."""
        rows = self._query(
            f"UPDATE {self.table} SET leader_id = NULL, attempts = attempts + %s, "
            "last_error = coalesce(%s, last_error) WHERE id = %s RETURNING attempts",
            (0 if error is None else 1, error, record_id),
        )
        return int(rows[0][0]) if rows else 0

    def dead_letter(self, record_id: int, error: str) -> None:
        """Move a row to the dead-letter table, in one transaction."""
        t = self.table
        self._query(
            f"WITH moved AS (DELETE FROM {t} WHERE id = %s RETURNING *) "
            f"INSERT INTO {t}_dead_letters "
            "(original_id, stream, subject, key, value, headers, created_at, error, attempts) "
            "SELECT id, stream, subject, key, value, headers, created_at, %s, attempts FROM moved",
            (record_id, error),
            fetch=False,
        )

    def requeue(self, ids: Sequence[int]) -> int:
        """Put dead letters back into the outbox (as new rows, after those there now); returns how many."""
        if not ids:
            return 0
        t = self.table
        rows = self._query(
            f"WITH moved AS (DELETE FROM {t}_dead_letters WHERE id = ANY(%s) RETURNING *) "
            f"INSERT INTO {t} (stream, subject, key, value, headers) "
            "SELECT stream, subject, key, value, headers FROM moved ORDER BY id RETURNING id",
            (list(ids),),
        )
        return len(rows)

    def insert(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Write rows in one transaction (applications write theirs with their own transaction)."""
        with self._db.transaction(), self._db.cursor() as cursor:
            cursor.executemany(
                f"INSERT INTO {self.table} (stream, subject, key, value, headers) "
                "VALUES (%s, %s, %s, %s, %s)",
                [_insert_values(r) for r in rows],
            )

    def _query(self, sql: str, params: tuple[Any, ...], *, fetch: bool = True) -> list[Any]:
        import psycopg

        try:
            cursor = self._db.execute(sql, params)
            return cursor.fetchall() if fetch else []
        except (psycopg.errors.UndefinedTable, psycopg.OperationalError) as exc:
            raise _named(exc, self) from None
