"""The broker's Arrow Flight server: reads with long-polling, metadata, admin actions, cursors."""
