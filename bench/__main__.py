"""`python -m bench`: run every benchmark module of this package.

A benchmark module has `main(argv) -> int`; the exit status is the worst of
theirs (non-zero when a target is missed and `--check` is given).
`python -m bench compile` runs only the named modules; other arguments
(`--check`, `--profile`, ...) are passed to each.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys

import bench


def main(argv: list[str]) -> int:
    names = sorted(m.name for m in pkgutil.iter_modules(bench.__path__) if not m.name.startswith("_"))
    chosen = [a for a in argv if a in names] or names
    options = [a for a in argv if a not in names]
    status = 0
    for name in chosen:
        module = importlib.import_module(f"bench.{name}")
        status = max(status, module.main(options) or 0)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
