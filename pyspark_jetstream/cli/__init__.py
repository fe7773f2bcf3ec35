"""``jetstream``: run a broker, manage streams, publish, tail, cursors, status.

Client commands find the deployment through ``--nats`` (default
``$JETSTREAM_NATS`` or ``nats://127.0.0.1:4222``) and ask a broker there for
its Flight address, unless ``--broker`` (or ``$JETSTREAM_BROKER``) gives it.
Every failure prints one line on stderr: errors exit 1, usage errors 2.  What
the library logs on the way (a failed connect attempt, ...) shows only with
``--verbose``: the line names the error that ended the command.

A secured deployment takes ``--credentials FILE`` (or
``$JETSTREAM_CREDENTIALS``: TOML with ``user``, ``token``, ``tls_ca``,
``tls_cert``, ``tls_key``), or ``--user`` with ``--token`` (better
``$JETSTREAM_TOKEN``: a command line is visible to every user of the machine)
and ``--tls-ca``, ``--tls-cert``, ``--tls-key``; options given override the
file's.  The token is never printed, not even in an error.  ``jetstream acl
hash-token`` makes the bcrypt hash an ACL file stores for a token.
"""

from pyspark_jetstream.cli.command import main

__all__ = ["main"]
