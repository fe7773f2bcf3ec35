"""NATS ingestion: subscriptions per partition leader, envelopes, coalescing, acks.

The only package of the broker that imports nats.
"""
