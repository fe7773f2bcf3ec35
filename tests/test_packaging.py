"""The wheel and its extras: each installs into a fresh virtual environment and brings what it promises.

The base install is the client and the CLI and must not install PySpark (a
Databricks runtime keeps its own); ``[broker]`` runs a broker; ``[spark]`` is
the data source on PySpark 4.2.0 with delta-spark 4.4.0.  The wheel is built
from a copy of the sources, since setuptools writes ``build/`` and an
``.egg-info`` next to what it builds.  This interpreter's pip installs into
environments created without pip of their own, so every install shares its
cache.  Checks run with ``python -I`` from inside the environment, so nothing
of the checkout or of this venv can stand in for the installed wheel.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # started first when the suite runs in parallel (tests/conftest.py)

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("pyproject.toml", "README.md", "pyspark_jetstream", "broker_node")
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
SPARK_ONLY = ("pyspark", "py4j", "delta")
BROKER_ONLY = ("kazoo", "prometheus_client", "zlib_ng")


def _run(*argv: str | Path, cwd: Path) -> str:
    """Run ``argv`` without this session's Python settings; its stdout, or fail showing its output."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON") and k != "VIRTUAL_ENV"}
    done = subprocess.run(
        [str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=400, check=False
    )
    if done.returncode != 0:
        pytest.fail(f"{' '.join(map(str, argv))} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return done.stdout


def build_wheel(root: Path, work: Path) -> Path:
    """The project's wheel, built from a copy of ``root``'s sources in ``work``."""
    src, out = work / "src", work / "dist"
    src.mkdir()
    for name in SOURCES:
        if (root / name).is_dir():
            shutil.copytree(root / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(root / name, src / name)
    _run(sys.executable, "-m", "pip", "wheel", src, "--no-deps", "--quiet", "-w", out, cwd=work)
    (wheel,) = out.glob("*.whl")
    return wheel


def readme_installs() -> dict[str | None, str]:
    """The README's install block, checked line by line: ``{extra: requirement as written}``.

    Its first line builds the wheel into ``dist/`` as :func:`build_wheel` does; each
    other line installs that file with an extra (or none), and :func:`install` installs
    exactly that requirement, so a line that would fail as written fails here.
    """
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## Installing", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    lines = [shlex.split(line, comments=True) for line in block.strip().splitlines()]
    assert lines[0] == ["pip", "wheel", ".", "--no-deps", "-w", "dist"], lines[0]
    installs: dict[str | None, str] = {}
    for line in lines[1:]:
        assert line[:2] == ["pip", "install"] and len(line) == 3, line
        match = re.fullmatch(r"dist/pyspark_jetstream-(.+)-py3-none-any\.whl(?:\[(\w+)\])?", line[2])
        assert match and match[1] == VERSION, f"{line[2]!r} is not the wheel of version {VERSION}"
        installs[match[2]] = line[2]
    return installs


README_INSTALLS = readme_installs()


def test_the_readme_installs_each_extra_that_is_tested():
    assert set(README_INSTALLS) == {None, "spark", "broker", "outbox"}


def install(wheel: Path, extra: str | None, venv: Path) -> Path:
    """A new virtual environment at ``venv`` with ``wheel`` (and ``extra``) installed in it, by the
    README's line for ``extra`` (its ``dist/`` is the directory :func:`build_wheel` built into)."""
    _run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=venv.parent)
    written = README_INSTALLS[extra]
    assert written.split("[")[0] == f"dist/{wheel.name}", (written, wheel.name)
    requirement = str(wheel.parent.parent / written)
    pip = (sys.executable, "-m", "pip", "--python", venv / "bin" / "python")
    _run(*pip, "install", "--quiet", requirement, cwd=venv.parent)
    return venv


def probe(venv: Path, code: str) -> dict:
    """Run ``code`` in ``venv`` isolated (``-I``, from inside it); the JSON object it prints last."""
    out = _run(venv / "bin" / "python", "-I", "-c", textwrap.dedent(code), cwd=venv)
    return json.loads(out.strip().splitlines()[-1])


_INSTALLED = "sorted(m for m in {modules!r} if importlib.util.find_spec(m))"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(ROOT, tmp_path_factory.mktemp("wheel"))


def test_base_install_is_the_client_without_spark_or_broker(wheel, tmp_path):
    venv = install(wheel, None, tmp_path / "venv")
    facts = probe(
        venv,
        f"""
        import importlib.util, json, sys
        import pyspark_jetstream, pyspark_jetstream.cli, pyspark_jetstream.local
        from pyspark_jetstream.client import Client, SyncClient, JetStreamError
        print(json.dumps({{
            "file": pyspark_jetstream.__file__,
            "loaded": sorted({{m.split(".")[0] for m in sys.modules}}),
            "installed": {_INSTALLED.format(modules=SPARK_ONLY + BROKER_ONLY)},
        }}))
        """,
    )
    assert Path(facts["file"]).resolve().is_relative_to(venv.resolve())
    # Installing the client on Databricks must leave the runtime's PySpark alone.
    assert facts["installed"] == []
    assert not set(facts["loaded"]) & {*SPARK_ONLY, *BROKER_ONLY, "broker_node"}
    assert _run(venv / "bin" / "jetstream", "--version", cwd=venv).strip() == f"jetstream {VERSION}"
    refused = subprocess.run(
        [str(venv / "bin" / "jetstream"), "broker", "start"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert refused.returncode == 2
    assert "needs the [broker] extra" in refused.stderr and "Traceback" not in refused.stderr
    # The outbox on SQLite (the embedded default) needs no extra.
    made = _run(
        venv / "bin" / "jetstream", "outbox", "init", "--database", f"sqlite:///{venv}/app.db", cwd=venv
    )
    assert "outbox table outbox and outbox_dead_letters ready" in made


def test_outbox_extra_brings_postgresql_and_zookeeper_clients(wheel, tmp_path):
    venv = install(wheel, "outbox", tmp_path / "venv")
    facts = probe(
        venv,
        f"""
        import importlib.util, json
        import psycopg, kazoo.client, pyspark_jetstream.outbox
        print(json.dumps({{"installed": {_INSTALLED.format(modules=SPARK_ONLY)}}}))
        """,
    )
    assert facts["installed"] == []


def test_broker_extra_runs_a_broker(wheel, tmp_path):
    venv = install(wheel, "broker", tmp_path / "venv")
    facts = probe(
        venv,
        f"""
        import importlib.util, json
        import kazoo.client, prometheus_client, zlib_ng
        import broker_node.broker, broker_node.coordination.zookeeper, broker_node.metrics
        from broker_node.nats_server import nats_server_binary
        print(json.dumps({{
            "nats_server": nats_server_binary(),
            "installed": {_INSTALLED.format(modules=SPARK_ONLY)},
        }}))
        """,
    )
    assert facts["installed"] == []
    assert Path(facts["nats_server"]).resolve().is_relative_to(venv.resolve())
    assert "nats-server" in _run(facts["nats_server"], "--version", cwd=venv)
    # The console script hands `broker start` to `python -m broker_node`, whose imports all load.
    assert "usage: python -m broker_node" in _run(
        venv / "bin" / "jetstream", "broker", "start", "--help", cwd=venv
    )


def test_spark_extra_is_the_data_source_on_pyspark_4_2(wheel, tmp_path):
    venv = install(wheel, "spark", tmp_path / "venv")
    facts = probe(
        venv,
        f"""
        import importlib.metadata, importlib.util, json
        import delta, pyspark
        import pyspark_jetstream
        from pyspark_jetstream.spark import JetStreamDataSource, jetstream_session, register
        # What Spark's Python workers load to plan, read and write a Python data source.
        import pyspark.sql.worker.create_data_source, pyspark.sql.worker.plan_data_source_read
        import pyspark.sql.worker.write_into_data_source, pyspark.sql.worker.commit_data_source_write
        import pyspark.sql.streaming.python_streaming_source_runner
        import pyspark.sql.worker.python_streaming_sink_runner
        print(json.dumps({{
            "pyspark": pyspark.__version__,
            "delta": importlib.metadata.version("delta-spark"),
            "default_source": pyspark_jetstream.DefaultSource is JetStreamDataSource,
            "installed": {_INSTALLED.format(modules=BROKER_ONLY)},
        }}))
        """,
    )
    # Pinned together: delta-spark 4.4.0 requires pyspark<=4.2.0, and its jar is built for Spark 4.2.
    assert (facts["pyspark"], facts["delta"]) == ("4.2.0", "4.4.0")
    assert facts["default_source"]
    assert facts["installed"] == []
