"""A mirror of a secured source: over TLS, as a principal of its own; refusals in its status."""

from __future__ import annotations

import pytest

from pyspark_jetstream.client import SyncClient
from pyspark_jetstream.local import LocalBroker
from pyspark_jetstream.protocol.errors import UnauthenticatedError

from ..broker.harness import wait_until
from ..broker.mirror_harness import partition_table
from .conftest import TOKENS


def credentials_file(path, user: str, token: str, ca: str) -> str:
    path.write_text(f'user = "{user}"\ntoken = "{token}"\ntls_ca = "{ca}"\n')
    return str(path)


def test_a_mirror_reads_a_tls_source_as_its_principal_and_reports_refusals(secured, tmp_path):
    alice = secured.client("alice")
    alice.create_stream("orders-mirrored", "orders-mirrored", partitions=1)
    for i in range(5):
        alice.publish("orders-mirrored", b"%d" % i, key=b"k")
    source = secured.broker.flight
    assert source.startswith("grpc+tls://")
    good = credentials_file(tmp_path / "alice.toml", "alice", TOKENS["alice"], secured.pki.ca)
    nobody = credentials_file(tmp_path / "mallory.toml", "mallory", TOKENS["mallory"], secured.pki.ca)
    wrong = credentials_file(tmp_path / "wrong.toml", "alice", "not-the-token", secured.pki.ca)
    with (
        LocalBroker(tmp_path / "destination") as destination,
        SyncClient(nats_urls=destination.nats_url, broker=destination.flight, timeout=20) as dst,
    ):
        dst.create_mirror("copy", "orders-mirrored", source, source_credentials=good)

        def copied():
            (status,) = dst.mirror_status("copy")
            return status.lag_messages == 0 and status.mirror_end == 5 and status

        status = wait_until(copied, timeout=30, message="the mirror to copy the secured source")
        rows = partition_table(destination.flight, "copy", 0)
        assert rows.column("value").to_pylist() == [b"0", b"1", b"2", b"3", b"4"]
        # alice may not read the source's __cursors: the data is copied, the status says why cursors are not.
        status = wait_until(
            lambda: dst.mirror_status("copy")[0].last_error, timeout=30, message="the cursor error"
        )
        assert status.startswith("cursors: ") and "alice" in status
        # A principal without the right to read: the mirror is made, its status names the refusal.
        dst.create_mirror("copy-denied", "orders-mirrored", source, source_credentials=nobody)
        refused = wait_until(
            lambda: dst.mirror_status("copy-denied")[0].last_error,
            timeout=30,
            message="the refusal in the status",
        )
        assert "mallory" in refused and dst.mirror_status("copy-denied")[0].state == "waiting"
        # Credentials the source does not accept: refused when the mirror is created, in one line.
        with pytest.raises(UnauthenticatedError):
            dst.create_mirror("copy-wrong", "orders-mirrored", source, source_credentials=wrong)
