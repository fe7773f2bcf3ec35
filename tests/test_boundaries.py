"""The import boundaries of docs/ARCHITECTURE.md hold, and the checker really catches breaches."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("check_imports", ROOT / "scripts" / "check_imports.py")
assert _spec and _spec.loader
check_imports = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_imports)


def write(root: Path, files: dict[str, str]) -> Path:
    for path, source in files.items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(source)
    return root


def test_project_respects_boundaries():
    assert check_imports.violations() == []


def test_the_table_allows_nothing_the_code_does_not_use():
    assert check_imports.slack() == []


def test_project_has_no_import_circles_but_the_known_ones():
    assert check_imports.circles() == []


def test_checker_reads_the_documented_table():
    rules = check_imports.read_rules()
    assert rules["broker_node/coordination/zookeeper"] == (
        "broker_node.coordination",
        "pyspark_jetstream.protocol",
        "kazoo",
    )
    assert rules["broker_node/coordination"] == ("pyspark_jetstream.protocol", "broker_node.durable")
    assert rules["broker_node/durable.py"] == ()
    assert rules["broker_node/metrics.py"] == ("prometheus_client",)
    assert "psycopg" in rules["pyspark_jetstream/outbox"] and rules[
        "pyspark_jetstream/local_postgres.py"
    ] == ("psycopg", "pyspark_jetstream.lifecycle")
    assert "pyspark" in rules["pyspark_jetstream/spark"] and "kazoo" not in rules["broker_node"]


def test_checker_reads_the_documented_known_circles():
    """The circles the document still lists: none (broker <-> service and client <-> live are gone)."""
    assert sorted(sorted(c) for c in check_imports.read_known_circles()) == []


@pytest.mark.parametrize(
    ("path", "source", "needle"),
    [
        ("broker_node/log/x.py", "import nats\n", "must not import nats"),
        ("broker_node/log/x.py", "from pyarrow import flight\n", "must not import pyarrow.flight"),
        ("broker_node/log/x.py", "import pyarrow.flight\n", "pyarrow.flight"),
        ("broker_node/log/x.py", "from ..ingest import sub\n", "broker_node.ingest"),
        ("broker_node/api/x.py", "from kazoo.client import KazooClient\n", "must not import kazoo.client"),
        ("broker_node/api/x.py", "import pyspark.sql\n", "pyspark.sql"),
        ("pyspark_jetstream/protocol/x.py", "from ..client import c\n", "pyspark_jetstream.client"),
        ("broker_node/coordination/local.py", "import kazoo\n", "must not import kazoo"),
        ("broker_node/coordination/x.py", "from broker_node.log.segment import Segment\n", "log.segment"),
        ("broker_node/ingest/x.py", "from broker_node.replication.partition import P\n", "replication"),
        ("broker_node/api/x.py", "import nats\n", "must not import nats"),
        ("broker_node/broker.py", "import kazoo\n", "must not import kazoo"),
        ("pyspark_jetstream/client/x.py", "import broker_node\n", "must not import broker_node"),
        (
            "broker_node/x.py",
            "from pyspark_jetstream.client.credentials import C\n",
            "pyspark_jetstream.client",
        ),
        ("pyspark_jetstream/spark/x.py", "import nats\n", "must not import nats"),
        ("broker_node/coordination/x.py", "from broker_node.log.checkpoint import w\n", "log.checkpoint"),
        ("broker_node/durable.py", "from broker_node.log import Log\n", "must not import broker_node.log"),
        ("broker_node/metrics.py", "from .broker import Broker\n", "must not import broker_node.broker"),
        ("broker_node/coordination/zookeeper/x.py", "from broker_node.log import Log\n", "must not import"),
        ("broker_node/coordination/zookeeper_config.py", "import kazoo\n", "must not import kazoo"),
        ("broker_node/api/x.py", "import psycopg\n", "must not import psycopg"),
        ("broker_node/broker.py", "from prometheus_client import Counter\n", "prometheus_client"),
        ("broker_node/ingest/x.py", "import prometheus_client\n", "must not import prometheus_client"),
        (
            "broker_node/ingest/x.py",
            "from broker_node.log import Record\n",
            "must not import broker_node.log",
        ),
        ("broker_node/ingest/x.py", "from broker_node.config import IngestConfig\n", "broker_node.config"),
        ("broker_node/ingest/x.py", "from broker_node.tail.tail_publisher import P\n", "broker_node.tail"),
        ("broker_node/tail/x.py", "from broker_node.ingest.ingestor import Ingestor\n", "broker_node.ingest"),
        ("pyspark_jetstream/client/x.py", "def f():\n    import psycopg\n", "must not import psycopg"),
        ("pyspark_jetstream/client/x.py", "from py4j.protocol import Py4JError\n", "must not import py4j"),
        (
            "broker_node/log/x.py",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import nats\n",
            "nats",
        ),
    ],
)
def test_checker_catches_violations(tmp_path, path, source, needle):
    target = tmp_path / path
    target.parent.mkdir(parents=True)
    target.write_text(source)
    found = check_imports.violations(tmp_path)
    assert any(needle in v for v in found), found


def test_owners_may_import_their_library(tmp_path):
    for path, source in [
        ("broker_node/coordination/zookeeper/x.py", "import kazoo\nfrom ..base import Coordinator\n"),
        ("broker_node/ingest/sub.py", "import nats\n"),
        ("broker_node/tail/x.py", "import nats\nfrom broker_node.log import ReplicaFrame\n"),
        ("broker_node/replication/x.py", "from pyarrow import flight\nfrom broker_node.log import Log\n"),
        ("broker_node/coordination/local.py", "from broker_node.durable import atomic_write\n"),
        ("broker_node/log/checkpoint.py", "from broker_node.durable import atomic_write\n"),
        ("broker_node/metrics.py", "from prometheus_client import CollectorRegistry\n"),
        ("pyspark_jetstream/outbox/outbox_table.py", "import psycopg\n"),
        ("pyspark_jetstream/local_postgres.py", "import psycopg\n"),
    ]:
        target = tmp_path / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(source)
    assert check_imports.violations(tmp_path) == []


def test_an_allowance_nothing_uses_or_the_checker_does_not_track_is_reported(tmp_path):
    write(tmp_path, {"broker_node/log/x.py": "import zlib_ng\n"})
    rules = {"broker_node/log": ("zlib_ng", "pyspark_jetstream.protocol", "numpy"), "broker_node": ()}
    found = check_imports.slack(tmp_path, rules)
    assert found == [
        "broker_node/log: allows pyspark_jetstream.protocol but nothing there imports it: "
        "drop it from the table",
        "broker_node/log: allows numpy, which the checker does not track: add it to TRACKED",
    ]


CIRCLE = {
    "pyspark_jetstream/client/a.py": "from . import b\n",
    "pyspark_jetstream/client/b.py": "from pyspark_jetstream.client.a import thing\n",
    "pyspark_jetstream/client/c.py": "from .a import thing\n",  # depends on the circle, not in it
}


def test_a_new_circle_is_reported_with_its_imports(tmp_path):
    write(tmp_path, CIRCLE)
    found = check_imports.circles(tmp_path, known=[])
    assert found == [
        "import circle among pyspark_jetstream.client.a, pyspark_jetstream.client.b "
        "(pyspark_jetstream/client/a.py:1 imports pyspark_jetstream.client.b; "
        "pyspark_jetstream/client/b.py:1 imports pyspark_jetstream.client.a)"
    ]


def test_a_known_circle_passes_only_exactly_as_listed(tmp_path):
    write(tmp_path, CIRCLE)
    known = frozenset({"pyspark_jetstream.client.a", "pyspark_jetstream.client.b"})
    assert check_imports.circles(tmp_path, known=[known]) == []
    write(
        tmp_path,
        {
            "pyspark_jetstream/client/c.py": "from .a import thing\nfrom typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from .b import Other\n",
            "pyspark_jetstream/client/a.py": "from . import b, c\n",
        },
    )
    grown = check_imports.circles(tmp_path, known=[known])
    assert any(
        "import circle among pyspark_jetstream.client.a, pyspark_jetstream.client.b, "
        "pyspark_jetstream.client.c" in f
        for f in grown
    ), grown
    assert any(
        "known import circle pyspark_jetstream.client.a <-> pyspark_jetstream.client.b is gone" in f
        for f in grown
    ), grown


def test_a_known_circle_that_is_gone_must_leave_the_list(tmp_path):
    write(tmp_path, {"broker_node/x.py": "import broker_node.y\n", "broker_node/y.py": ""})
    found = check_imports.circles(tmp_path, known=[frozenset({"broker_node.x", "broker_node.y"})])
    assert found and "is gone or has changed" in found[0]


@pytest.mark.parametrize(
    ("files", "members"),
    [
        (  # type-only imports make a circle too
            {
                "broker_node/broker.py": "from broker_node.service import Service\n",
                "broker_node/service.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                "    from .broker import Broker\n",
            },
            "broker_node.broker, broker_node.service",
        ),
        (  # and so do imports inside a function
            {
                "broker_node/log/a.py": "def f():\n    from ..log import b\n",
                "broker_node/log/b.py": "import broker_node.log.a\n",
            },
            "broker_node.log.a, broker_node.log.b",
        ),
        (  # a name from a package's __init__ is an import of the package
            {
                "broker_node/api/__init__.py": "from .server import Server\n",
                "broker_node/api/server.py": "from broker_node.api import Server as _S\n",
            },
            "broker_node.api, broker_node.api.server",
        ),
        (  # across three modules and two packages
            {
                "broker_node/a.py": "import pyspark_jetstream.protocol.x\n",
                "pyspark_jetstream/protocol/x.py": "from ..client import y\n",
                "pyspark_jetstream/client/y.py": "from broker_node import a\n",
            },
            "broker_node.a, pyspark_jetstream.client.y, pyspark_jetstream.protocol.x",
        ),
    ],
)
def test_circles_are_found_however_they_are_imported(tmp_path, files, members):
    write(tmp_path, files)
    found = check_imports.circles(tmp_path, known=[])
    assert len(found) == 1 and found[0].startswith(f"import circle among {members} ("), found
