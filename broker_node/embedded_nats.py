"""The broker's embedded nats-server: its configuration, its start, its restarts, its reloads.

Used when ``[nats] servers`` is empty.  The configuration holds the TLS of
``[security]`` and, with an ACL, one user per principal with the NATS
permissions the ACL implies for the streams' subjects; it is reloaded (not
restarted) when the streams or the ACL change.  A server that dies is
restarted on its port, with a growing wait between failed attempts; the
broker's NATS client reconnects by itself.

Threads: :meth:`EmbeddedNats.start`, :meth:`~EmbeddedNats.supervise` and
:meth:`~EmbeddedNats.stop` run on the broker's event loop; :meth:`reconfigure`
in a worker thread, one at a time (the broker's sync); :attr:`running` is read
from any thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from broker_node.config import NatsConfig, SecurityConfig
from broker_node.nats_server import NatsServer
from broker_node.security import AccessControl

logger = logging.getLogger(__name__)

NATS_PID_FILE = "nats-server.pid"
"""The embedded nats-server's pid, so a next start can stop one that outlived its broker."""
NATS_RESTART_BACKOFF = (0.5, 30.0)
"""First and longest wait (seconds) before restarting an embedded nats-server that died."""


class EmbeddedNats:
    """A nats-server process run by the broker, for as long as the broker runs."""

    def __init__(
        self,
        nats: NatsConfig,
        security: SecurityConfig,
        access: AccessControl,
        data_dir: Path,
        stream_subjects: Callable[[], Mapping[str, Sequence[str]]],
    ) -> None:
        """``stream_subjects``: each user-visible stream's partition subjects (the coordinator's),
        which the ACL's permissions are written for."""
        self._security = security
        self._access = access
        self._stream_subjects = stream_subjects
        self.server = NatsServer(
            host=nats.embedded_host,
            port=nats.embedded_port,
            pid_file=data_dir / NATS_PID_FILE,
            config=self.render_config(),
        )
        self.server.always_config = access.enabled

    @property
    def url(self) -> str:
        """Where clients reach it."""
        return self.server.url

    @property
    def running(self) -> bool:
        """Whether the process is up (any thread)."""
        return self.server.running

    async def start(self) -> None:
        """Launch the server and wait until it accepts connections."""
        # Launched from the loop's thread, which lives as long as the broker:
        # the server is killed when the thread that started it ends.
        self.server.launch()
        await asyncio.to_thread(self.server.wait_ready)

    async def supervise(self) -> None:
        """Restart the server on its port whenever it dies (a background task, until cancelled)."""
        server = self.server
        wait, longest = NATS_RESTART_BACKOFF
        while True:
            await asyncio.sleep(0.2 if server.running else wait)
            if server.running:
                wait = NATS_RESTART_BACKOFF[0]
                continue
            port = server.port or server.requested_port
            logger.error("the embedded nats-server died; restarting it on port %s", port)
            server.stop()  # reap it, remove its files
            server.requested_port = port
            try:
                server.launch()
                await asyncio.to_thread(server.wait_ready)
            except Exception:
                logger.exception("cannot restart the embedded nats-server; retrying in %gs", wait)
                wait = min(wait * 2, longest)

    def render_config(self) -> str:
        """The server's configuration: TLS, and users with the ACL's permissions."""
        security = self._security
        tls: dict[str, object] | None = None
        if security.tls:
            tls = {"cert_file": security.tls_cert, "key_file": security.tls_key, "timeout": 5}
            if security.tls_ca:
                tls["ca_file"] = security.tls_ca
            if security.verify_clients:
                tls["verify"] = True
        subjects: Mapping[str, Sequence[str]] = {}
        with contextlib.suppress(Exception):  # before the coordinator starts: no streams yet
            subjects = self._stream_subjects()
        return self._access.nats_config(subjects, tls)

    def reconfigure(self) -> None:
        """Reload the server if its permissions changed (streams, ACL); a worker thread."""
        if not self._access.enabled:
            return
        config = self.render_config()
        if config != self.server.config:
            self.server.reload(config)
            logger.info("reloaded the embedded nats-server's permissions")

    def stop(self) -> None:
        """Stop the server (blocking: call it in a worker thread)."""
        self.server.stop()
