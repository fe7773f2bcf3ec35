"""Partitions on this broker: high watermark, ISR and (next) follower replication."""
