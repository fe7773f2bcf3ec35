"""LocalPostgres runs a real PostgreSQL server: it serves, crashes, pauses, restarts and cleans up.

These tests fail (they do not skip) where PostgreSQL cannot start: the outbox's
tests need it, and a silent skip would hide that.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path

import psycopg
import pytest

from pyspark_jetstream import local_postgres
from pyspark_jetstream.local_postgres import LocalPostgres, LocalPostgresError


def _gone(pids: list[int]) -> bool:
    return not any(local_postgres._alive(pid) for pid in pids)


def test_it_serves_a_database_that_keeps_rows():
    with LocalPostgres() as pg:
        assert pg.dsn == f"postgresql://postgres@127.0.0.1:{pg.port}/outbox"
        assert pg.running and pg.pid is not None
        with psycopg.connect(pg.dsn) as conn:
            conn.execute("create table events (id bigint primary key, body text not null)")
            conn.execute("insert into events values (1, 'a'), (2, 'b')")
            conn.commit()
            assert conn.execute("select id, body from events order by id").fetchall() == [(1, "a"), (2, "b")]
            assert conn.execute("show fsync").fetchone() == ("on",)
            assert conn.execute("show server_encoding").fetchone() == ("UTF8",)
            # Root starts it as the postgres system user; anyone else as themselves.
            server_uid = os.stat(f"/proc/{pg.pid}").st_uid
            assert server_uid != 0 if os.geteuid() == 0 else server_uid == os.geteuid()


def test_kill_drops_connections_and_start_recovers_the_committed_rows():
    with LocalPostgres() as pg:
        port = pg.port
        conn = psycopg.connect(pg.dsn)
        conn.execute("create table t (x int)")
        conn.execute("insert into t values (1)")
        conn.commit()
        pids = pg._server_pids()
        pg.kill()
        assert not pg.running and pg.pid is None and _gone(pids)
        with pytest.raises(psycopg.OperationalError):
            conn.execute("select 1")
        conn.close()
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(pg.dsn, connect_timeout=2)

        pg.start()  # crash recovery, same port and data
        assert pg.port == port
        with psycopg.connect(pg.dsn) as conn:
            assert conn.execute("select x from t").fetchall() == [(1,)]


def test_two_servers_run_at_once_apart():
    with LocalPostgres() as one, LocalPostgres() as two:
        assert one.port != two.port
        with psycopg.connect(one.dsn) as a, psycopg.connect(two.dsn) as b:
            a.execute("create table only_here (x int)")
            a.commit()
            assert b.execute("select to_regclass('only_here')").fetchone() == (None,)


def test_stop_leaves_no_process_and_no_directory():
    pg = LocalPostgres().start()
    with psycopg.connect(pg.dsn):  # an open client does not hold up the (fast) shutdown
        pids = pg._server_pids()
        run_dir = pg.data_dir.parent
        assert len(pids) > 1 and run_dir.exists()
        pg.stop()
    assert _gone(pids) and not run_dir.exists()
    assert not pg.running and pg.pid is None
    pg.stop()  # twice is harmless


def test_pause_freezes_the_server_and_resume_thaws_it():
    with (
        LocalPostgres() as pg,
        psycopg.connect(pg.dsn, autocommit=True) as conn,
        ThreadPoolExecutor(2) as pool,
    ):
        pg.pause()
        try:
            query = pool.submit(lambda: conn.execute("select 42").fetchone())
            connecting = pool.submit(lambda: psycopg.connect(pg.dsn, connect_timeout=10))
            # A client timeout (libpq's connect_timeout cannot go below 2 s; waiting here is quicker).
            with pytest.raises(FutureTimeout):
                query.result(timeout=0.3)
            assert not connecting.done()
        finally:
            pg.resume()
        assert query.result(timeout=10) == (42,)
        with connecting.result(timeout=10) as fresh:
            assert fresh.execute("select 1").fetchone() == (1,)


@pytest.fixture
def reachable_dir():
    """A directory the server can enter when root runs it as postgres (pytest's tmp_path is 0700)."""
    path = Path(tempfile.mkdtemp(prefix="local-postgres-test-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_given_data_dir_is_kept_and_reused(reachable_dir: Path):
    data = reachable_dir / "pgdata"
    with LocalPostgres(data_dir=data, database="kept") as pg, psycopg.connect(pg.dsn) as conn:
        conn.execute("create table t (x int)")
        conn.execute("insert into t values (7)")
        conn.commit()
    assert (data / "PG_VERSION").exists()
    with LocalPostgres(data_dir=data, database="kept") as pg, psycopg.connect(pg.dsn) as conn:
        assert conn.execute("select x from t").fetchall() == [(7,)]


@pytest.mark.skipif(os.geteuid() != 0, reason="only root runs the server as another user")
def test_root_is_told_when_the_server_user_cannot_reach_the_data_dir(tmp_path: Path):
    tmp_path.chmod(0o700)
    with pytest.raises(LocalPostgresError, match=r"out of reach of the postgres user.*mode 700"):
        LocalPostgres(data_dir=tmp_path / "pgdata").start()


def test_a_server_that_cannot_start_says_why():
    pg = LocalPostgres(settings={"shared_buffers": "lots"})
    with pytest.raises(LocalPostgresError, match=r"exited with code .*shared_buffers"):
        pg.start()
    pg.stop()


def test_missing_binaries_say_how_to_install_them(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setattr(local_postgres, "DEBIAN_ROOT", tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(LocalPostgresError, match=r"apt-get install postgresql"):
        LocalPostgres().start()
