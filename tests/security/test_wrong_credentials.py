"""A wrong token is told the same way every time, at once, and prints nothing else.

nats-server answers a refused login with ``-ERR 'Authorization Violation'`` and
closes the connection; the client's next write, or its next attempt, may see
only a reset.  Whatever the timing, the error must name the credentials, never
advise another server address, and nothing besides the error reaches stderr.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from pyspark_jetstream.protocol.errors import UnauthenticatedError
from pyspark_jetstream.spark.options import parse_source_options
from pyspark_jetstream.spark.planning import resolve_broker

ATTEMPTS = 12

CONNECT_WRONGLY = textwrap.dedent(
    """
    import sys, time
    from pyspark_jetstream.client import Credentials, SyncClient
    nats, ca, attempts = sys.argv[1], sys.argv[2], int(sys.argv[3])
    for _ in range(attempts):
        started = time.monotonic()
        try:
            SyncClient(nats_urls=nats, credentials=Credentials(user="alice", token="guessed", tls_ca=ca))
        except Exception as exc:
            print(f"{type(exc).__name__}\\t{exc}\\t{time.monotonic() - started:.2f}")
        else:
            print("connected")
    """
)


def test_a_wrong_token_gets_one_answer_at_once_and_no_noise(secured):
    result = subprocess.run(
        [sys.executable, "-c", CONNECT_WRONGLY, secured.broker.nats_url, secured.pki.ca, str(ATTEMPTS)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    lines = [line.split("\t") for line in result.stdout.splitlines()]
    assert len(lines) == ATTEMPTS, result.stdout
    refused = "refused user 'alice': wrong user or token (Authorization Violation)"
    expected = f"NATS at {secured.broker.nats_url} {refused}"
    assert {(kind, message) for kind, message, _ in lines} == {("UnauthenticatedError", expected)}
    # Refused at the first answer, not after nats-py's four attempts two seconds apart.
    assert max(float(seconds) for *_, seconds in lines) < 2.0, lines
    # Neither nats-py's errors nor asyncio's TLS end-of-file warning reach stderr.
    assert result.stderr == ""


def test_spark_options_with_a_wrong_token_do_not_advise_another_address(secured):
    options = {
        "nats": secured.broker.nats_url,
        "user": "alice",
        "token": "guessed",
        "tls.ca": secured.pki.ca,
        "timeout": "5",
    }
    parsed = parse_source_options({**options, "stream": "orders"}, streaming=True)  # asks no one
    with pytest.raises(UnauthenticatedError) as caught:
        resolve_broker(parsed.addresses, parsed.credentials)
    assert "refused user 'alice': wrong user or token" in str(caught.value)
    assert "servers" not in str(caught.value) and "running there" not in str(caught.value)
    options["tls.ca"] = secured.pki.issue("elsewhere", "127.0.0.1", "other").cert  # not a CA of it
    parsed = parse_source_options({**options, "stream": "orders"}, streaming=True)
    with pytest.raises(Exception) as caught:
        resolve_broker(parsed.addresses, parsed.credentials)
    assert "TLS problem" in str(caught.value) and "'servers'" not in str(caught.value)
