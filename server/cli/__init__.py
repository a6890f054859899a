"""The `corral` command line.

Every verb prints errors to stderr (one `error: message` line, or every
definition error) and exits with the status `errors.ERRORS` gives the code:
1 when the definitions or the lock are wrong or the work failed, 2 for a
usage mistake, 3 when a server cannot be reached or is busy, 4 when refused,
130 on Ctrl-C. None prints a traceback for an author or usage mistake.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from ..compiler import kinds
from ..compiler.compiler import Compiler
from ..compiler.definitions import DefinitionSet
from ..compiler.lockfile import (
    LOCK_FILE,
    Lock,
    LockError,
    card_drift,
    catalog_drift,
    drift,
    missing_evals,
    read_lock,
    write_lock,
)
from ..errors import CorralError, DefinitionsInvalid, forms
from .a2a_lock import a2a_cards

DEFAULT_DIR = "definitions"
DRIFT = forms("lock_mismatch").exit  # `lock --check`: no lock, an unreadable one, or drift


def _default_dir() -> str:
    return os.environ.get("CORRAL_DEFINITIONS", DEFAULT_DIR)


def _compile(directory: str) -> DefinitionSet:
    return Compiler(directory).compile()


def _check_dir(args: argparse.Namespace) -> None:
    """A definition directory that is not there is a usage mistake, said as one: not a document error."""
    directory = getattr(args, "dir", None)
    if not directory or getattr(args, "url", None) or Path(directory).is_dir():
        return
    where = Path(directory).resolve()
    what = "is not a directory" if where.exists() else "does not exist"
    raise CorralError(f"the definition directory {directory} ({where}) {what}: pass DIR, set "
                      "CORRAL_DEFINITIONS, or run corral where that directory is", code="invalid_request")


def _print_errors(exc: DefinitionsInvalid) -> None:
    for error in exc.errors:
        print(error, file=sys.stderr)
    print(f"{len(exc.errors)} error(s)", file=sys.stderr)


def cmd_validate(args: argparse.Namespace) -> int:
    definitions = _compile(args.dir)
    print(f"ok: {len(definitions)} definitions, set {definitions.digest}")
    return 0


def cmd_digest(args: argparse.Namespace) -> int:
    definitions = _compile(args.dir)
    if args.json:
        print(json.dumps(definitions.listing(), indent=2))
        return 0
    print(f"set {definitions.digest}")
    for d in definitions:
        print(f"{d.ref:40} {d.digest}")
    return 0


def cmd_lock(args: argparse.Namespace) -> int:
    root = Path(args.dir)
    definitions = _compile(args.dir)
    try:
        locked = read_lock(root)
    except LockError as exc:
        if args.check:
            print(f"error: {exc}", file=sys.stderr)
            return DRIFT
        locked = None
    if args.check and locked is None:
        print(f"error: no {LOCK_FILE} in {root}; run `corral lock {args.dir}` first", file=sys.stderr)
        return DRIFT
    catalogs = _mcp_catalogs(definitions, locked, args)
    cards = a2a_cards(definitions, locked, args.check) if catalogs is not None else None
    if catalogs is None or cards is None:
        return forms("unreachable").exit
    evals = _evals_to_lock(definitions, locked, args)
    if evals is None:
        print(f"error: an eval did not pass: {LOCK_FILE} not written", file=sys.stderr)
        return forms("lock_mismatch").exit
    current = Lock.of(definitions, catalogs, evals, a2a_cards=cards)
    if not args.check:
        path = write_lock(root, current)
        print(f"wrote {path} ({len(current.definitions)} definitions, {len(current.mcp_catalogs)} MCP "
              f"catalogs{_cards_written(current)}, set {current.digest})")
        return 0
    assert locked is not None
    changes = drift(locked, current) + catalog_drift(locked, current) + card_drift(locked, current)
    if not changes and locked.digest == current.digest:
        return _check_evals(locked, definitions, args)
    if locked.digest == current.digest:
        print(f"{LOCK_FILE} drift: MCP catalogs or A2A cards (set {current.digest} unchanged)")
    else:
        print(f"{LOCK_FILE} drift: set {locked.digest} -> {current.digest}")
    for change in changes:
        print(f"  {change}")
    return DRIFT


def _evals_to_lock(definitions: DefinitionSet, locked: Lock | None, args: argparse.Namespace) -> dict | None:
    """With `--evals`, each agent's passing eval runs (run now if missing; None if one failed); else
    those the lock recorded that still hold (same agent digest, same eval digest)."""
    if args.evals and not args.check:
        from .evaluating import lock_evals

        return lock_evals(args, definitions)
    return locked.evals_still_valid(definitions) if locked else {}


def _check_evals(locked: Lock, definitions: DefinitionSet, args: argparse.Namespace) -> int:
    """`lock --check` of a set that matches the lock: with `--require-evals`, the lock must also record
    a passing run of each Eval of each agent (§12)."""
    from_env = os.environ.get("CORRAL_REQUIRE_EVALS", "").lower() in ("1", "true", "yes")
    required = args.require_evals or from_env
    gaps = missing_evals(locked, definitions) if required else []
    if not gaps:
        print(f"ok: matches {LOCK_FILE} (set {definitions.digest})")
        return 0
    print(f"{LOCK_FILE} lacks passing evals (run `corral lock --evals`):")
    for gap in gaps:
        print(f"  {gap['message']}")
    return DRIFT


def _cards_written(lock: Lock) -> str:
    return f", {len(lock.a2a_cards)} A2A cards" if lock.a2a_cards else ""


def _mcp_catalogs(definitions: DefinitionSet, locked: Lock | None, args: argparse.Namespace) -> dict | None:
    """The catalog digests to lock (or check): observed from each MCP server, else the locked ones.

    `--check` observes only when the lock has catalogs; `--skip-mcp` never
    observes and keeps the locked digests of servers still defined. None when
    a server could not be reached (the errors are printed).
    """
    old = dict(locked.mcp_catalogs) if locked else {}
    servers = definitions.of_kind("MCPServer")
    if args.skip_mcp or not servers or (args.check and not old):
        return old if args.check else {s.name: old[s.name] for s in servers if s.name in old}
    import anyio

    from ..tools.mcp.connections import CatalogsUnavailable, observe_catalogs

    try:
        return anyio.run(observe_catalogs, definitions)
    except CatalogsUnavailable as exc:
        for name, error in sorted(exc.failures.items()):
            print(f"error: mcp/{name}: {error}", file=sys.stderr)
        print("(pass --skip-mcp to lock without asking the MCP servers for their catalogs)", file=sys.stderr)
        return None


def cmd_schema(args: argparse.Namespace) -> int:
    print(json.dumps(kinds.json_schema(), indent=2))
    return 0


def _add_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", nargs="?", default=None, metavar="DIR",
                   help="definition directory (default: $CORRAL_DEFINITIONS or ./definitions)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="corral", description="A declarative agent server.")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="COMMAND")
    commands: dict[str, tuple[str, Callable[[argparse.Namespace], int]]] = {
        "validate": ("compile DIR and print every error", cmd_validate),
        "digest": ("print the set digest and every definition's digest", cmd_digest),
        "lock": ("write DIR/corral.lock, or --check it", cmd_lock),
        "schema": ("print the JSON Schema of a definition document", cmd_schema),
    }
    for name, (help_text, func) in commands.items():
        p = verbs.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(func=func)
        if name != "schema":
            _add_dir(p)
    verbs.choices["digest"].add_argument("--json", action="store_true", help="print JSON")
    verbs.choices["lock"].add_argument(
        "--check", action="store_true", help="exit 1 and print a diff when the set drifts from the lock"
    )
    verbs.choices["lock"].add_argument(
        "--skip-mcp", action="store_true",
        help="do not connect to MCP servers: keep the catalog digests already locked",
    )
    verbs.choices["lock"].add_argument(
        "--evals", action="store_true",
        help="record the passing run of each agent's Evals (run now what is missing; exit 1 if one fails)",
    )
    verbs.choices["lock"].add_argument(
        "--require-evals", action="store_true",
        help="with --check: also fail when an agent's Evals have no passing run recorded "
             "(or set CORRAL_REQUIRE_EVALS=1)",
    )
    _add_runtime_verbs(verbs)
    return parser


def _add_runtime_verbs(verbs: argparse._SubParsersAction) -> None:
    try:  # the runtime's verbs need the server's dependencies, which a bare compiler install lacks
        from .chat import add_verb as add_chat
        from .evaluating import add_eval_verb
        from .running import add_mcp_verb, add_serve_verb
    except ImportError:
        return
    add_serve_verb(verbs, _add_dir)  # in the order `corral --help` lists them
    add_chat(verbs)
    add_mcp_verb(verbs, _add_dir)
    add_eval_verb(verbs, _add_dir)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "dir", "") is None:
        args.dir = _default_dir()
    try:
        _check_dir(args)
        return int(args.func(args) or 0)
    except DefinitionsInvalid as exc:
        _print_errors(exc)
        return exc.exit_status
    except CorralError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return exc.exit_status
    except KeyboardInterrupt:
        return forms("cancelled").exit


