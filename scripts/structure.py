"""The figures of the code's structure, as the structural issue asks for them (`make structure`).

Modules and lines per package of `server/`, the longest module and function, the methods of each
store port, and the SQL statements written once for both dialects against those written per
dialect. Counted from the source with `ast`, so anyone can rerun it and compare two commits.
"""

from __future__ import annotations

import ast
import re
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "server"
SQL = re.compile(r"^\s*(SELECT|INSERT|UPDATE|DELETE|WITH)\b", re.I)  # statements, not migrations


def _modules() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.py") if "__pycache__" not in p.parts)


def _functions(tree: ast.AST) -> list[tuple[int, str]]:
    return [((node.end_lineno or node.lineno) - node.lineno + 1, node.name) for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)]


def _ports(path: Path) -> dict[str, tuple[int, list[str]]]:
    """Each Protocol class of a store module: its own method count, and the ports it extends."""
    tree = ast.parse(path.read_text())
    found: dict[str, tuple[int, list[str]]] = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        bases = [getattr(b, "id", getattr(b, "attr", "")) for b in node.bases]
        if "Protocol" in bases:
            own = sum(isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) for n in node.body)
            found[node.name] = (own, [b for b in bases if b != "Protocol"])
    return found


def _all_methods(name: str, ports: dict[str, tuple[int, list[str]]]) -> int:
    """The methods of a port and of every port it extends, each port counted once."""
    seen, todo = set(), [name]
    while todo:
        port = todo.pop()
        if port in ports and port not in seen:
            seen.add(port)
            todo.extend(ports[port][1])
    return sum(ports[port][0] for port in seen)


def _sql(path: Path) -> int:
    """String literals that are statements: an f-string counts once, by its first part."""
    tree = ast.parse(path.read_text())
    parts = {id(value) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for value in node.values}
    count = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr) and node.values:
            node = node.values[0]
        elif id(node) in parts:
            continue
        count += isinstance(node, ast.Constant) and isinstance(node.value, str) \
            and bool(SQL.match(node.value))
    return count


def main() -> None:
    lines: Counter[str] = Counter()
    count: Counter[str] = Counter()
    longest_module = (0, "")
    longest_function = (0, "")
    for path in _modules():
        rel = path.relative_to(ROOT.parent)
        n = len(path.read_text().splitlines())
        package = str(rel.parent)
        lines[package] += n
        count[package] += 1
        longest_module = max(longest_module, (n, str(rel)))
        for size, name in _functions(ast.parse(path.read_text())):
            longest_function = max(longest_function, (size, f"{rel}:{name}"))
    print(f"{'package':32} modules  lines")
    for package in sorted(lines):
        print(f"{package:32} {count[package]:7} {lines[package]:6}")
    print(f"{'total':32} {sum(count.values()):7} {sum(lines.values()):6}")
    print(f"longest module:   {longest_module[1]} ({longest_module[0]} lines)")
    print(f"longest function: {longest_function[1]} ({longest_function[0]} lines)")
    store = ROOT / "store"
    for path in sorted(store.rglob("*.py")):
        ports = _ports(path)
        for name, (methods, bases) in ports.items():
            composed = [b for b in bases if b in ports]
            if methods or not composed:
                print(f"store port {name} ({path.relative_to(ROOT.parent)}): {methods} methods")
            else:  # a composition of ports (`Store`): all of theirs
                print(f"store port {name} ({path.relative_to(ROOT.parent)}): the composition of"
                      f" {', '.join(composed)}: {_all_methods(name, ports)} methods")
    # per dialect: what the sqlite/ and postgres/ packages hold (sqlite*.py and postgres*.py modules before
    # they were packages); written once: every other module of the store (its shared statements)
    once = per_dialect = 0
    for path in sorted(store.rglob("*.py")):
        top = path.relative_to(store).parts[0]
        n = _sql(path)
        if top.startswith(("sqlite", "postgres")):
            per_dialect += n
        else:
            once += n
    print(f"SQL statements: {once} written once for both dialects, {per_dialect} per dialect")


if __name__ == "__main__":
    sys.exit(main())
