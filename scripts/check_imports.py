"""Check the import boundaries written down in DESIGN.md; exit 1 naming each violation.

Each rule names a part of the code and the modules it must not import.
Relative imports are resolved, so ``from ..ingest import x`` is caught too.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# (part, forbidden module prefixes, allowed exceptions)
RULES: list[tuple[str, tuple[str, ...], tuple[str, ...]]] = [
    (
        "broker_node/log",
        ("nats", "kazoo", "pyarrow.flight", "pyspark", "broker_node", "pyspark_jetstream"),
        ("broker_node.log", "pyspark_jetstream.protocol"),
    ),
    (
        "pyspark_jetstream/protocol",
        ("nats", "kazoo", "pyarrow.flight", "pyspark", "broker_node", "pyspark_jetstream"),
        ("pyspark_jetstream.protocol",),
    ),
    ("broker_node", ("pyspark", "pyspark_jetstream.client", "pyspark_jetstream.spark"), ()),
    ("broker_node", ("kazoo",), ()),  # only coordination/, exempted below
    ("broker_node", ("nats",), ()),  # only ingest/, exempted below
    ("pyspark_jetstream", ("kazoo", "broker_node"), ()),
    ("pyspark_jetstream/client", ("pyspark",), ("pyspark_jetstream",)),
]
# Parts that are the one sanctioned importer of a library.
OWNERS = {"kazoo": "broker_node/coordination", "nats": "broker_node/ingest"}


def imported_modules(path: Path, root: Path = ROOT) -> list[tuple[int, str]]:
    """``(line, absolute module name)`` for every import in ``path``."""
    package = ".".join(path.relative_to(root).with_suffix("").parts[:-1])
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            # `from pyarrow import flight` imports the module pyarrow.flight.
            found += [
                (node.lineno, f"{module}.{alias.name}" if module else alias.name) for alias in node.names
            ]
    return found


def _matches(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def violations(root: Path = ROOT) -> list[str]:
    """Every import under ``root`` that breaks a rule, as ``file:line: message``."""
    out = []
    for part, forbidden, allowed in RULES:
        for path in sorted((root / part).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            for line, module in imported_modules(path, root):
                if any(_matches(module, a) for a in allowed):
                    continue
                for prefix in forbidden:
                    owner = OWNERS.get(prefix)
                    if owner and rel.startswith(owner + "/"):
                        continue
                    if _matches(module, prefix):
                        out.append(f"{rel}:{line}: {part} must not import {module}")
    return out


def main() -> int:
    """Print violations and return the exit status."""
    found = violations()
    for v in found:
        print(v)
    print(f"import boundaries: {len(found)} violation(s)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
