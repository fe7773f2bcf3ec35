"""The pyspark-jetstream client: streams, publishing over NATS, reading over Arrow Flight.

``Client`` is asynchronous; ``SyncClient`` offers the same calls for scripts
and notebooks.
"""

from pyspark_jetstream.protocol.ack import Ack
from pyspark_jetstream.protocol.envelope import AckPolicy
from pyspark_jetstream.protocol.errors import JetStreamError

from .client import Client, Message
from .cluster import ClusterConnection
from .connection import BrokerConnection, FetchResult
from .credentials import Credentials
from .partitioners import RoundRobin, key_hash
from .sync import SyncClient

__all__ = [
    "Ack",
    "AckPolicy",
    "BrokerConnection",
    "Client",
    "ClusterConnection",
    "Credentials",
    "FetchResult",
    "JetStreamError",
    "Message",
    "RoundRobin",
    "SyncClient",
    "key_hash",
]
