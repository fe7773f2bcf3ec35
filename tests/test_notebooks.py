"""The notebooks run top to bottom against a real broker, so they cannot rot."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = pytest.mark.slow  # started first when the suite runs in parallel (tests/conftest.py)

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))


def test_the_notebooks_exist():
    assert [p.stem for p in NOTEBOOKS] == [
        "01_quickstart",
        "02_exactly_once_pipeline",
        "03_replay_from_a_timestamp",
        "04_outbox_to_spark",
        "05_delta_lake",
        "06_typed_streams",
        "07_mirror_failover",
    ]


LONGER = {"05_delta_lake": 270, "01_quickstart": 70, "02_exactly_once_pipeline": 60}
"""Seconds a notebook took in a clean-clone run, where it was a minute or more: the longest start first."""


@pytest.mark.parametrize(
    "path",
    [pytest.param(p, marks=pytest.mark.slow(seconds=LONGER.get(p.stem, 50))) for p in NOTEBOOKS],
    ids=lambda p: p.stem,
)
def test_notebook_runs(path, tmp_path, monkeypatch):
    monkeypatch.delenv("JETSTREAM_NATS", raising=False)  # each starts its own broker
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    errors = [
        o for cell in notebook.cells for o in cell.get("outputs", []) if o.get("output_type") == "error"
    ]
    assert not errors
