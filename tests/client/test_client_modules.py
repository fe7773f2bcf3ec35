"""The client's split into modules keeps every name users import (no servers needed)."""

from __future__ import annotations

import importlib

import pyspark_jetstream.client as package


def test_the_client_module_keeps_its_public_names():
    module = importlib.import_module("pyspark_jetstream.client.client")
    for name in (
        "Client",
        "Message",
        "Start",
        "FetchResult",
        "start_position",
        "discover_broker",
        "FOLLOW_BUFFER",
        "LEADERSHIP_TIMEOUT",
        "PUBLISH_REFUSED",
    ):
        assert hasattr(module, name), name
    assert module.Message is package.Message and module.Client is package.Client


def test_the_package_exports_load():
    for name in package.__all__:
        assert getattr(package, name) is not None, name
