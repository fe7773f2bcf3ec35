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


def test_project_respects_boundaries():
    assert check_imports.violations() == []


def test_checker_reads_the_documented_table():
    rules = check_imports.read_rules()
    assert rules["broker_node/coordination/zookeeper.py"] == (
        "broker_node.coordination",
        "pyspark_jetstream.protocol",
        "kazoo",
    )
    assert rules["broker_node/coordination"] == ("pyspark_jetstream.protocol", "broker_node.durable")
    assert "pyspark" in rules["pyspark_jetstream/spark"] and "kazoo" not in rules["broker_node"]


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
        ("pyspark_jetstream/spark/x.py", "import nats\n", "must not import nats"),
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
        ("broker_node/coordination/zookeeper.py", "import kazoo\nfrom .base import Coordinator\n"),
        ("broker_node/ingest/sub.py", "import nats\n"),
        ("broker_node/replication/x.py", "from pyarrow import flight\nfrom broker_node.log import Log\n"),
    ]:
        target = tmp_path / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(source)
    assert check_imports.violations(tmp_path) == []
