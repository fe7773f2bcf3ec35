"""Check the import boundaries of docs/ARCHITECTURE.md; exit 1 naming each violation.

Three checks, all read from the document itself so that it states exactly
what the code does:

- *boundaries*: every tracked import is one its part's row allows (the
  table's rows, ``| `part` | holds | may import |``);
- *slack*: every module a row allows is imported by some file of that part
  (an allowance nothing uses is drift: the table would promise a boundary
  the code does not have), and names a tracked module;
- *circles*: no import circle between the project's modules, counting every
  import (``TYPE_CHECKING``-guarded and function-level ones included), but
  those listed under "Known import circles", each exactly as listed.

Relative imports are resolved, so ``from ..ingest import x`` is caught too.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "docs" / "ARCHITECTURE.md"
PROJECT = ("broker_node", "pyspark_jetstream")
TRACKED = (
    *PROJECT,
    "nats",
    "kazoo",
    "pyarrow.flight",
    "pyspark",
    "py4j",
    "delta",
    "zlib_ng",
    "psycopg",
    "prometheus_client",
)
"""Modules whose use the table governs; everything else (stdlib, pyarrow) is free."""
_ROW = re.compile(r"^\|\s*`([^`]+)`\s*\|[^|]*\|([^|]*)\|\s*$")
_KNOWN_HEADING = "## Known import circles"

Rules = dict[str, tuple[str, ...]]
Circle = frozenset[str]


def read_rules(table: Path = TABLE) -> Rules:
    """``{part path: allowed module prefixes}`` from the document's table."""
    rules = {}
    for line in table.read_text().splitlines():
        match = _ROW.match(line.strip())
        if match:
            rules[match.group(1)] = tuple(re.findall(r"`([^`]+)`", match.group(2)))
    if not rules:
        raise SystemExit(f"no parts table found in {table}")
    return rules


def read_known_circles(table: Path = TABLE) -> list[Circle]:
    """The circles the document lists under "Known import circles": one bullet each, its modules
    in backquotes (other names in backquotes, not the project's modules, are commentary)."""
    circles: list[Circle] = []
    inside = False
    for line in table.read_text().splitlines():
        if line.startswith("#"):
            inside = line.strip() == _KNOWN_HEADING
        elif inside and line.lstrip().startswith("- "):
            names = re.findall(r"`([^`]+)`", line)
            circles.append(frozenset(n for n in names if any(_within(n, top) for top in PROJECT)))
    return circles


def imported_modules(path: Path, root: Path = ROOT) -> list[tuple[int, str]]:
    """``(line, absolute module name)`` for every import in ``path``, wherever it stands."""
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


def _part_of(rel: str, rules: Rules) -> str | None:
    matches = [part for part in rules if rel == part or rel.startswith(part.rstrip("/") + "/")]
    return max(matches, key=len) if matches else None


def _own(part: str) -> str:
    """The module a part may always import: itself (a file's row: that file alone, so its package
    is an entry of its own when it uses it)."""
    return part.removesuffix(".py").replace("/", ".")


def _sources(root: Path) -> Iterable[tuple[str, Path]]:
    for top in PROJECT:
        for path in sorted((root / top).rglob("*.py")):
            yield path.relative_to(root).as_posix(), path


def violations(root: Path = ROOT, rules: Rules | None = None) -> list[str]:
    """Every tracked import under ``root`` that its part may not make, as ``file:line: message``."""
    rules = read_rules() if rules is None else rules
    out = []
    for rel, path in _sources(root):
        part = _part_of(rel, rules)
        if part is None:
            out.append(f"{rel}: belongs to no part of the table")
            continue
        allowed = (_own(part), *rules[part])
        for line, module in imported_modules(path, root):
            if not any(_within(module, t) for t in TRACKED):
                continue
            if not any(_within(module, a) for a in allowed):
                out.append(f"{rel}:{line}: {part} must not import {module}")
    return out


def slack(root: Path = ROOT, rules: Rules | None = None) -> list[str]:
    """Every allowance of the table that is not a tracked module or that no file of its part uses."""
    rules = read_rules() if rules is None else rules
    used: dict[str, set[str]] = {part: set() for part in rules}
    for rel, path in _sources(root):
        part = _part_of(rel, rules)
        if part is None:
            continue
        for _, module in imported_modules(path, root):
            used[part].update(a for a in rules[part] if _within(module, a))
    out = []
    for part, allowed in rules.items():
        for entry in allowed:
            if not any(_within(entry, t) for t in TRACKED):
                out.append(f"{part}: allows {entry}, which the checker does not track: add it to TRACKED")
            elif entry not in used[part]:
                out.append(f"{part}: allows {entry} but nothing there imports it: drop it from the table")
    return out


def module_graph(root: Path = ROOT) -> dict[str, dict[str, tuple[str, int]]]:
    """``{module: {imported project module: (file, line) of the first such import}}``.

    ``from package import name`` depends on the module ``package.name`` if
    there is one, else on ``package`` itself.
    """
    modules = {}
    for rel, path in _sources(root):
        parts = Path(rel).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = (rel, path)
    graph: dict[str, dict[str, tuple[str, int]]] = {name: {} for name in modules}
    for name, (rel, path) in modules.items():
        for line, module in imported_modules(path, root):
            target = module
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                graph[name].setdefault(target, (rel, line))
    return graph


def strongly_connected(graph: dict[str, dict[str, tuple[str, int]]]) -> list[Circle]:
    """The import circles of ``graph``: its strongly connected components of two or more modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[Circle] = []

    def visit(node: str) -> None:  # Tarjan's algorithm; the graph is a few hundred modules deep at most
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def circles(root: Path = ROOT, known: list[Circle] | None = None) -> list[str]:
    """Every import circle under ``root`` but the ``known`` ones, and every known one that is gone
    or has changed (the list is kept exact, so a fixed circle cannot come back unnoticed)."""
    known = read_known_circles() if known is None else known
    graph = module_graph(root)
    out = []
    present = strongly_connected(graph)
    for circle in present:
        if circle in known:
            continue
        edges = "; ".join(
            f"{file}:{line} imports {target}"
            for member in sorted(circle)
            for target, (file, line) in sorted(graph[member].items())
            if target in circle
        )
        out.append(f"import circle among {', '.join(sorted(circle))} ({edges})")
    for circle in known:
        if circle not in present:
            out.append(
                f"known import circle {' <-> '.join(sorted(circle))} is gone or has changed: "
                "update the list under 'Known import circles' in docs/ARCHITECTURE.md"
            )
    return out


def main() -> int:
    """Print violations and return the exit status."""
    found = [*violations(), *slack(), *circles()]
    for v in found:
        print(v)
    print(f"import boundaries: {len(found)} violation(s)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
