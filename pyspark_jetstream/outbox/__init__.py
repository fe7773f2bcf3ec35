"""The transactional outbox: a harvester that publishes a database table's rows into streams.

See :mod:`.harvester` for the algorithm (mark-purge/reset), :mod:`.store` for
the table, and :mod:`.election` for how one harvester leads.
"""

from .harvester import Harvester, HarvesterConfig, HarvesterStatus, init_outbox
from .store import DeadLetter, Record, open_store

__all__ = [
    "DeadLetter",
    "Harvester",
    "HarvesterConfig",
    "HarvesterStatus",
    "Record",
    "init_outbox",
    "open_store",
]
