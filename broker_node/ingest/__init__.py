"""NATS ingestion: subscriptions per partition leader; each message decoded, coalesced, stored, acked.

With the live tail (:mod:`broker_node.tail`), the only package of the broker that imports nats.
"""
