"""Check the import boundaries of docs/ARCHITECTURE.md; exit 1 naming each violation.

The table's rows (``| `part` | holds | may import |``) are read from the
document itself, so the checker enforces exactly what it says.  Relative
imports are resolved, so ``from ..ingest import x`` is caught too.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "docs" / "ARCHITECTURE.md"
TRACKED = (
    "broker_node",
    "pyspark_jetstream",
    "nats",
    "kazoo",
    "pyarrow.flight",
    "pyspark",
    "delta",
    "zlib_ng",
)
"""Modules whose use the table governs; everything else (stdlib, pyarrow) is free."""
_ROW = re.compile(r"^\|\s*`([^`]+)`\s*\|[^|]*\|([^|]*)\|\s*$")


def read_rules(table: Path = TABLE) -> dict[str, tuple[str, ...]]:
    """``{part path: allowed module prefixes}`` from the document's table."""
    rules = {}
    for line in table.read_text().splitlines():
        match = _ROW.match(line.strip())
        if match:
            rules[match.group(1)] = tuple(re.findall(r"`([^`]+)`", match.group(2)))
    if not rules:
        raise SystemExit(f"no parts table found in {table}")
    return rules


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


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _part_of(rel: str, rules: dict[str, tuple[str, ...]]) -> str | None:
    matches = [part for part in rules if rel == part or rel.startswith(part.rstrip("/") + "/")]
    return max(matches, key=len) if matches else None


def violations(root: Path = ROOT, rules: dict[str, tuple[str, ...]] | None = None) -> list[str]:
    """Every tracked import under ``root`` that its part may not make, as ``file:line: message``."""
    rules = read_rules() if rules is None else rules
    out = []
    for top in ("broker_node", "pyspark_jetstream"):
        for path in sorted((root / top).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            part = _part_of(rel, rules)
            if part is None:
                out.append(f"{rel}: belongs to no part of the table")
                continue
            # A part may import itself; a file's row belongs to its package.
            own = (part.rsplit("/", 1)[0] if part.endswith(".py") else part).replace("/", ".")
            allowed = (own, *rules[part])
            for line, module in imported_modules(path, root):
                if not any(_within(module, t) for t in TRACKED):
                    continue
                if not any(_within(module, a) for a in allowed):
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
