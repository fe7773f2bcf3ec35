"""Execute the notebooks in place, so their committed outputs show a real run (``make notebooks``).

Each notebook starts its own broker unless ``JETSTREAM_NATS`` is set.  A
notebook that fails is left unchanged and the script exits 1 naming it.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


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
        nbformat.write(notebook, path)
    return not failed


def main(names: list[str]) -> int:
    """Run the named notebooks (all of them by default)."""
    os.environ.pop("JETSTREAM_NATS", None)
    paths = [NOTEBOOKS / n for n in names] if names else sorted(NOTEBOOKS.glob("*.ipynb"))
    return 0 if all([run(p) for p in paths]) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
