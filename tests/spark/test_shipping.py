"""Shipping the package to executors: the zip, when it is shipped, and the executors' one line.

Without Spark's cluster (``test_standalone.py`` runs one): the zip is
checked as a file, and an object of the source is unpickled by a Python
that cannot import the package, as an executor without it does.
"""

from __future__ import annotations

import getpass
import os
import stat
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from pyspark import cloudpickle

from pyspark_jetstream.spark import package_zip
from pyspark_jetstream.spark.shipping import ships_by_default
from pyspark_jetstream.spark.source import JetStreamDataSource
from pyspark_jetstream.spark.unpickle import dependency_message, missing_message, rebuild


def test_the_zip_holds_the_package_sources_only_and_depends_only_on_them(tmp_path):
    first = package_zip(tmp_path / "a")
    names = zipfile.ZipFile(first).namelist()
    assert "pyspark_jetstream/__init__.py" in names
    assert {"pyspark_jetstream/spark/source.py", "pyspark_jetstream/spark/unpickle.py"} <= set(names)
    assert all(n.startswith("pyspark_jetstream/") and n.endswith(".py") for n in names)
    assert not any("__pycache__" in n for n in names)
    # Built again elsewhere: the same name and bytes; asked again: the same file.
    second = package_zip(tmp_path / "b")
    assert second.name == first.name and second.read_bytes() == first.read_bytes()
    assert package_zip(tmp_path / "a") == first


def test_the_default_zip_is_in_a_directory_of_the_users_own():
    """A zip found there is shipped as it is: nobody else may write there."""
    directory = package_zip().parent
    assert directory.name == f"pyspark-jetstream-{getpass.getuser()}"
    assert directory.stat().st_uid == os.getuid() and stat.S_IMODE(directory.stat().st_mode) == 0o700


@pytest.mark.parametrize(
    ("master", "ships"),
    [
        ("local", False),
        ("local[2]", False),
        ("local-cluster[2,1,1024]", False),
        ("spark://10.0.0.1:7077", True),
        ("yarn", True),
        ("k8s://https://10.0.0.1:6443", True),
    ],
)
def test_jetstream_session_ships_to_every_master_but_a_local_one(master, ships):
    assert ships_by_default(master) is ships


def unpickle_elsewhere(python_path: str) -> str:
    """Unpickle a data source in a Python without ``site`` (so without the editable install) whose
    path is ``python_path`` only: what it wrote to stderr (it must fail)."""
    pickled = cloudpickle.dumps(JetStreamDataSource({"stream": "s", "servers": "grpc://127.0.0.1:1"}))
    bare = subprocess.run(
        [sys.executable, "-S", "-c", "import pickle, sys; pickle.loads(sys.stdin.buffer.read())"],
        input=pickled,
        env={"PYTHONPATH": python_path},
        cwd="/",
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert bare.returncode == 1
    return bare.stderr.decode()


def test_an_executor_without_the_package_fails_unpickling_with_the_one_line():
    error = unpickle_elsewhere(sysconfig.get_paths()["purelib"])
    assert error.strip().splitlines()[-1] == f"ModuleNotFoundError: {missing_message()}"
    assert "No module named" not in error


def test_an_executor_with_the_package_but_without_pyarrow_names_the_dependency(tmp_path):
    """The shipped zip, pyspark and py4j (linked from this environment), no pyarrow."""
    site = Path(sysconfig.get_paths()["purelib"])
    for name in ("pyspark", "py4j"):
        (tmp_path / name).symlink_to(site / name)
    error = unpickle_elsewhere(f"{package_zip(tmp_path / 'zip')}:{tmp_path}")
    assert error.strip().splitlines()[-1] == f"ModuleNotFoundError: {dependency_message('pyarrow')}"


def test_other_missing_modules_are_raised_as_they_are():
    with pytest.raises(ModuleNotFoundError, match="No module named 'no_such_module'"):
        rebuild("no_such_module", "Anything")
