"""The transactional outbox: a harvester that publishes a database table's rows into streams.

See :mod:`.harvester` for the algorithm (mark-purge/reset) and a leader's term,
:mod:`.marks` for how it takes rows, :mod:`.in_flight` for how it publishes
and settles them, :mod:`.outbox_table` for the table (each connection on a thread of
its own, :mod:`.store_thread`), :mod:`.harvester_config` for its settings, and
:mod:`.election` for how one harvester leads.
"""

from .harvester import Harvester, init_outbox
from .harvester_config import HarvesterConfig, HarvesterStatus
from .outbox_table import DeadLetter, Record, open_store

__all__ = [
    "DeadLetter",
    "Harvester",
    "HarvesterConfig",
    "HarvesterStatus",
    "Record",
    "init_outbox",
    "open_store",
]
