"""Execute the notebooks in place, so their committed outputs show a real run (``make notebooks``).

Each notebook starts its own broker unless ``JETSTREAM_NATS`` is set.  A
notebook that fails is left unchanged and the script exits 1 naming it.
What Spark's JVM writes to stderr while it starts and plans (log4j's
banner, ``WARN`` lines about the host name, native libraries, AQE) is left
out of the outputs kept: it says nothing about the notebook, and differs
from one machine to the next.  ``--strip`` does only that, to the notebooks
as they are, without running them.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
SPARK_NOISE = re.compile(
    r"^(\d\d/\d\d/\d\d \d\d:\d\d:\d\d WARN |WARNING: Using incubator modules|Using Spark's default log4j"
    r"|Setting default log level to|To adjust logging level use)"
)
"""The start of a line Spark's JVM writes to stderr on every run (see the module's docstring)."""


def without_spark_noise(notebook: nbformat.NotebookNode) -> int:
    """Drop Spark's noise lines (:data:`SPARK_NOISE`) from ``notebook``'s stderr outputs, and the
    outputs left empty; the number of lines dropped."""
    dropped = 0
    for cell in notebook.cells:
        kept = []
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream" and output.get("name") == "stderr":
                lines = output["text"].splitlines(keepends=True)
                quiet = [line for line in lines if not SPARK_NOISE.match(line)]
                dropped += len(lines) - len(quiet)
                if not quiet:
                    continue
                output["text"] = "".join(quiet)
            kept.append(output)
        if "outputs" in cell:
            cell["outputs"] = kept
    return dropped


def run(path: Path) -> bool:
    """Execute ``path`` top to bottom; write it back with its outputs if no cell failed."""
    notebook = nbformat.read(path, as_version=4)
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as workdir:
        NotebookClient(
            notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": workdir}}
        ).execute()
    failed = [
        o for cell in notebook.cells for o in cell.get("outputs", []) if o.get("output_type") == "error"
    ]
    print(f"{path.name}: {'failed' if failed else 'ok'} in {time.monotonic() - started:.0f} s")
    if not failed:
        without_spark_noise(notebook)
        nbformat.write(notebook, path)
    return not failed


def strip(path: Path) -> None:
    """Drop Spark's noise from ``path``'s outputs as they are, without running it."""
    notebook = nbformat.read(path, as_version=4)
    print(f"{path.name}: {without_spark_noise(notebook)} lines of Spark's noise dropped")
    nbformat.write(notebook, path)


def main(args: list[str]) -> int:
    """Run the named notebooks (all of them by default); with ``--strip``, only strip them."""
    names = [a for a in args if a != "--strip"]
    paths = [NOTEBOOKS / n for n in names] if names else sorted(NOTEBOOKS.glob("*.ipynb"))
    if "--strip" in args:
        for path in paths:
            strip(path)
        return 0
    os.environ.pop("JETSTREAM_NATS", None)
    return 0 if all([run(p) for p in paths]) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
