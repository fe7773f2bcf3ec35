"""format("jetstream") against a secured broker: credentials as options or a file, the ACL enforced.

One secured broker (TLS, the ACL of ``conftest.acl_text``) and one local
Spark session for the module.  Alice owns ``orders*``, bob may read
``orders`` and store cursors named ``bob-*``, mallory may do nothing.  The
token never shows: not in a plan, a query's progress or status, nor in an
error.
"""

from __future__ import annotations

import contextlib
import io
import pickle
import time
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession

from pyspark_jetstream.protocol.errors import InvalidArgumentError
from pyspark_jetstream.spark.options import parse_sink_options, parse_source_options

from .conftest import TOKENS, Secured


@pytest.fixture(scope="module")
def orders(secured: Secured) -> list[bytes]:
    """Stream ``orders`` (alice's) with three messages; returns their values."""
    values = [b"o0", b"o1", b"o2"]
    with secured.client("alice") as alice:
        alice.create_stream("orders", "orders")
        for value in values:
            alice.publish("orders", value)
    return values


def credentials_file(secured: Secured, directory: Path, user: str) -> str:
    """A credentials file of ``user`` (its token, the test CA), as a client would keep it."""
    path = directory / f"{user}.toml"
    path.write_text(f'user = "{user}"\ntoken = "{TOKENS[user]}"\ntls_ca = "{secured.pki.ca}"\n')
    path.chmod(0o600)
    return str(path)


def with_token(secured: Secured, user: str) -> dict[str, str]:
    """The options that give ``user``'s token directly (the worst case for leaking it)."""
    return {"user": user, "token": TOKENS[user], "tls.ca": secured.pki.ca}


def read_stream(spark: SparkSession, secured: Secured, **options: str) -> DataFrame:
    return (
        spark.readStream.format("jetstream")
        .option("servers", secured.broker.flight)
        .option("stream", "orders")
        .option("startingOffsets", "earliest")
        .options(**options)
        .load()
    )


def read_batch(spark: SparkSession, secured: Secured, user: str) -> DataFrame:
    """A batch read of ``orders`` as ``user``, with the user's token in the options."""
    return (
        spark.read.format("jetstream")
        .option("servers", secured.broker.flight)
        .option("stream", "orders")
        .options(**with_token(secured, user))
        .load()
    )


def explained(show: object) -> str:
    """What ``show()`` (an ``explain``) prints."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert callable(show)
        show(True)
    return out.getvalue()


def test_bob_reads_orders_with_a_credentials_file(spark, secured, orders, tmp_path):
    frame = read_stream(
        spark, secured, credentialsFile=credentials_file(secured, tmp_path, "bob"), consumerId="bob-spark"
    )
    query = frame.writeStream.format("memory").queryName("bob_orders").trigger(availableNow=True).start()
    assert query.awaitTermination(60)
    assert query.exception() is None
    assert [r.value for r in spark.sql("SELECT value FROM bob_orders ORDER BY offset").collect()] == orders
    with secured.client("bob") as bob:  # the query's position, stored as bob's cursor
        assert bob.fetch_cursor("bob-spark", "orders", 0) == len(orders)


def test_a_token_in_the_options_shows_in_no_plan_progress_or_status(spark, secured, orders, tmp_path):
    token = TOKENS["bob"]
    frame = read_stream(spark, secured, consumerId="bob-plans", **with_token(secured, "bob"))
    plan = explained(frame.explain)
    assert "user=bob" in plan and token not in plan  # Spark shows the options, redacting 'token'
    query = (
        frame.writeStream.format("memory")
        .queryName("bob_plans")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(60)
    assert spark.sql("SELECT count(*) AS n FROM bob_plans").first().n == len(orders)
    shown = [explained(query.explain), str(query.status), str(query.lastProgress), str(query.recentProgress)]
    assert all(token not in text for text in shown)
    batch = read_batch(spark, secured, "bob")
    assert token not in explained(batch.explain)
    assert [r.value for r in batch.orderBy("offset").collect()] == orders


def test_mallory_is_denied_naming_her_and_never_her_token(spark, secured, orders):
    token = TOKENS["mallory"]
    # The source describes the stream when the query is planned (its schema may be typed), so
    # both a stream and a batch read are refused there, before any query runs.
    denied = "principal 'mallory' may not read stream 'orders'"
    with pytest.raises(Exception, match=denied) as streaming:
        read_stream(spark, secured, **with_token(secured, "mallory")).writeStream.format("noop").start()
    assert token not in str(streaming.value)
    with pytest.raises(Exception, match=denied) as batch:
        read_batch(spark, secured, "mallory").collect()
    assert token not in str(batch.value)


def test_the_sink_writes_as_alice(spark, secured, orders, tmp_path):
    with secured.client("alice") as alice:
        alice.create_stream("orders-copy", "orders-copy")
    alice_file = credentials_file(secured, tmp_path, "alice")
    query = (
        read_stream(spark, secured, credentialsFile=alice_file, consumerId="alice-copy")
        .select("key", "value")
        .writeStream.format("jetstream")
        .option("servers", secured.broker.flight)
        .option("stream", "orders-copy")
        .options(**with_token(secured, "alice"))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(60)
    assert query.exception() is None
    assert TOKENS["alice"] not in explained(query.explain) + str(query.lastProgress)
    (
        spark.createDataFrame([("b0",), ("b1",)], "value string")
        .coalesce(1)
        .write.format("jetstream")
        .mode("append")
        .option("servers", secured.broker.flight)
        .option("stream", "orders-copy")
        .option("credentialsFile", alice_file)
        .save()
    )
    with secured.client("alice") as alice:
        stored = alice.fetch("orders-copy").to_table().column("value").to_pylist()
    assert stored == [*orders, b"b0", b"b1"]


def test_the_sink_refuses_bob_at_once_naming_him(spark, secured, orders):
    frame = spark.createDataFrame([("not bob's to write",)], "value string").coalesce(1)
    started = time.monotonic()
    with pytest.raises(Exception, match="principal 'bob' may not write stream 'orders'") as refused:
        (
            frame.write.format("jetstream")
            .mode("append")
            .option("servers", secured.broker.flight)
            .option("stream", "orders")
            .option("timeout", "30")  # five attempts of 30 s each, were the refusal waited out
            .options(**with_token(secured, "bob"))
            .save()
        )
    assert time.monotonic() - started < 15
    assert TOKENS["bob"] not in str(refused.value)
    with secured.client("alice") as alice:
        assert alice.fetch("orders").to_table().column("value").to_pylist() == orders


def test_credential_options_are_parsed_once_and_kept_apart(secured, tmp_path):
    bob_file = credentials_file(secured, tmp_path, "bob")
    given = {"servers": secured.broker.flight, "stream": "orders", "credentialsFile": bob_file}
    parsed = parse_source_options({**given, "USER": "alice", "Token": TOKENS["alice"]}, streaming=True)
    assert parsed.credentials == secured.credentials("alice")  # the options override the file
    assert pickle.loads(pickle.dumps(parsed)).credentials == parsed.credentials  # for executors
    assert TOKENS["alice"] not in repr(parsed) and "Token" not in parsed.options
    sink = parse_sink_options({**given, "nats": secured.broker.nats_url})
    assert sink.credentials == secured.credentials("bob")
    for bad, error in (
        ({"tls.ca": ""}, "option 'tls.ca' is empty"),
        ({"tls.ca": str(tmp_path / "none.pem")}, "tls.ca '.*none.pem' is not a readable file"),
        ({"user": "bob"}, "give user and token together"),
        ({"credentialsFile": str(tmp_path / "none.toml")}, "cannot read credentials file"),
        ({"tls.kee": "x"}, "unknown option 'tls.kee'; did you mean 'tls.key'"),
    ):
        with pytest.raises(InvalidArgumentError, match=error):
            parse_source_options(
                {"servers": secured.broker.flight, "stream": "orders", **bad}, streaming=True
            )


def test_a_query_restarted_with_a_rotated_token_reads_and_the_old_token_is_refused(
    spark, secured, orders, monkeypatch
):
    """Connections kept by the driver and the Python workers between queries (issue 40) are found
    by the credentials too: the rotated token gets a connection of its own, the old one no longer
    reads through a connection kept from before."""
    from pyspark_jetstream.client import Credentials
    from pyspark_jetstream.client.cluster import ClusterConnection
    from pyspark_jetstream.protocol.errors import JetStreamError
    from pyspark_jetstream.protocol.flight import ReadRequest

    from .conftest import acl_text

    def values(token: str) -> list[bytes]:
        options = {"user": "bob", "token": token, "tls.ca": secured.pki.ca}
        frame = spark.read.format("jetstream").options(
            servers=secured.broker.flight, stream="orders", **options
        )
        return [r.value for r in frame.load().orderBy("offset").collect()]

    def old_token_reads() -> bool:
        credentials = Credentials(user="bob", token=old, tls_ca=secured.pki.ca)
        connection = ClusterConnection(secured.broker.flight, timeout=5, credentials=credentials)
        try:
            connection.read(ReadRequest("orders", 0))
            return True
        except JetStreamError:
            return False
        finally:
            connection.close()

    def wait_for(reads: bool) -> None:
        deadline = time.monotonic() + 15
        while old_token_reads() != reads:
            assert time.monotonic() < deadline, "the ACL was not reloaded within 15 s"
            time.sleep(0.1)

    old, rotated = TOKENS["bob"], "bob-token-rotated"
    assert values(old) == orders  # the driver and the workers now keep a connection with the old token
    monkeypatch.setitem(TOKENS, "bob", rotated)
    secured.acl_file.write_text(acl_text())
    monkeypatch.undo()
    try:
        wait_for(reads=False)
        assert values(rotated) == orders
        with pytest.raises(Exception, match="bob") as refused:
            values(old)
        assert old not in str(refused.value) and rotated not in str(refused.value)
    finally:
        secured.acl_file.write_text(acl_text())
        wait_for(reads=True)
