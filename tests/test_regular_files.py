"""Only regular files are read from a definition directory: a FIFO, socket or device is an error.

Opening a FIFO for reading waits for a writer, forever. Planted where a definition file is
expected (in a skill folder, as a file named by a command's argv, as an `instructions_file`), it
must be a compile error naming it, from `corral validate`, from `POST /v1/definitions/reload` and
from the watcher, and the server must go on: the next reload applies once the FIFO is gone, and
SIGTERM still stops it. At run time, `read_skill_resource` on a FIFO is a tool error.

Every wait here is bounded, and `unwedge` releases a reader stuck on a FIFO, so code that does hang
fails these tests rather than the whole run.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.client import talk
from tests.support.servers import REPO, ServerProcess, clean_environ, corral_server
from tests.support.trees import write_tree

TREE = {
    "agent.yaml": r"""
        kind: Model
        name: bot
        provider: scripted
        script:
          - when: "^read (?P<path>.+)$"
            tool_call: { name: read_skill_resource, arguments: { skill: notes, path: "{path}" } }
        ---
        kind: Tool
        name: reader
        input_schema: { type: object }
        command:
          argv: [cat, data.txt]
        ---
        kind: Agent
        name: helper
        model: bot
        tools: [reader]
        skills: [notes]
        instructions_file: prompt.md
    """,
    "prompt.md": "Be helpful.\n",
    "skills/notes/SKILL.md": "---\nname: notes\ndescription: Notes.\n---\nRead the notes.\n",
    "skills/notes/todo.txt": "as compiled\n",
}
FIFO_MESSAGE = "is a FIFO, not a regular file"


@dataclass(frozen=True)
class Placement:
    """Where a FIFO is planted, and the error line that must name it."""

    id: str
    path: str  # relative to the definition directory
    error: str  # FILE:LINE:COL: kind/name: field: message, as `corral validate` prints it

    def plant(self, root: Path) -> Path:
        fifo = root / self.path
        with contextlib.suppress(FileNotFoundError):
            fifo.unlink()  # a FIFO where a regular file was (the instructions file)
        os.mkfifo(fifo)
        return fifo


PLACEMENTS = [
    Placement("skill-folder", "skills/notes/pipe.txt",
              f"skills/notes/SKILL.md:2:1: Skill/notes: (document): skills/notes/pipe.txt {FIFO_MESSAGE}"),
    Placement("argv-element", "data.txt",
              f"agent.yaml:12:15: Tool/reader: command.argv[1]: data.txt {FIFO_MESSAGE}"),
    Placement("instructions-file", "prompt.md",
              f"agent.yaml:19:1: Agent/helper: instructions_file: prompt.md {FIFO_MESSAGE}"),
]


def unwedge(fifo: Path) -> None:
    """Release a reader blocked opening `fifo` (code that hangs): it sees a writer come and go, then EOF."""
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:  # ENXIO: nobody is waiting on it; ENOENT: it is gone
        if exc.errno not in (errno.ENXIO, errno.ENOENT):
            raise
        return
    os.close(fd)


@contextlib.contextmanager
def planted(placement: Placement, root: Path) -> Iterator[Path]:
    fifo = placement.plant(root)
    try:
        yield fifo
    finally:
        unwedge(fifo)


def validate(root: Path) -> subprocess.CompletedProcess[str]:
    """`corral validate ROOT`, bounded: a hang is a TimeoutExpired, not a stuck test run."""
    return subprocess.run([sys.executable, "-m", "server.cli", "validate", str(root)], cwd=REPO,
                          env=clean_environ(), capture_output=True, text=True, timeout=30)


def error_line(error: dict[str, Any]) -> str:
    return (f"{error['file']}:{error['line']}:{error['column']}: {error['kind']}/{error['name']}: "
            f"{error['field'] or '(document)'}: {error['message']}")


@pytest.fixture
def defs(tmp_path: Path) -> Path:
    root = write_tree(tmp_path / "defs", TREE)
    assert validate(root).returncode == 0
    return root


# --- corral validate ---------------------------------------------------------------------------


@pytest.mark.parametrize("placement", PLACEMENTS, ids=lambda p: p.id)
def test_validate_names_a_fifo_and_exits_promptly(defs: Path, placement: Placement) -> None:
    with planted(placement, defs):
        started = time.monotonic()
        done = validate(defs)
    assert done.returncode == 1, done.stdout + done.stderr
    assert placement.error in done.stderr.splitlines(), done.stderr
    assert time.monotonic() - started < 20


def test_a_unix_socket_in_a_skill_folder_is_an_error(defs: Path) -> None:
    # Bound from inside the folder: a socket's path is limited to ~107 bytes, tmp_path can be longer.
    bind = "import socket; socket.socket(socket.AF_UNIX).bind('sock')"
    subprocess.run([sys.executable, "-c", bind], cwd=defs / "skills" / "notes", check=True, timeout=30)
    assert (defs / "skills/notes/sock").is_socket()
    done = validate(defs)
    assert done.returncode == 1
    expected = ("skills/notes/SKILL.md:2:1: Skill/notes: (document): "
                "skills/notes/sock is a socket, not a regular file")
    assert expected in done.stderr.splitlines(), done.stderr


def test_a_fifo_named_like_a_definition_file_is_an_error(defs: Path) -> None:
    fifo = defs / "more.yaml"
    os.mkfifo(fifo)
    try:
        done = validate(defs)
    finally:
        unwedge(fifo)
    assert done.returncode == 1
    assert f"more.yaml:1:1: document: (document): {FIFO_MESSAGE}" in done.stderr.splitlines(), done.stderr


# --- a real server: reload ---------------------------------------------------------------------


@pytest.mark.parametrize("placement", PLACEMENTS, ids=lambda p: p.id)
def test_reload_rejects_a_fifo_and_applies_once_it_is_gone(defs: Path, tmp_path: Path,
                                                          placement: Placement) -> None:
    with corral_server(defs, tmp_path / "state") as url, \
            httpx.Client(base_url=url, timeout=15, trust_env=False) as client:
        before = client.get("/v1/definitions").json()["digest"]
        (defs / "extra.yaml").write_text("kind: Model\nname: extra\nprovider: scripted\n")
        with planted(placement, defs) as fifo:
            rejected = client.post("/v1/definitions/reload")
        assert rejected.status_code == 200
        report = rejected.json()
        assert report["status"] == "rejected" and report["current"] == before, report
        assert placement.error in [error_line(e) for e in report["errors"]], report["errors"]

        fifo.unlink()
        if placement.path == "prompt.md":
            (defs / "prompt.md").write_text("Be helpful again.\n")
        applied = client.post("/v1/definitions/reload").json()
        assert applied["status"] == "applied", applied
        changes = [(c["kind"], c["name"], c["change"]) for c in applied["changes"]]
        assert ("Model", "extra", "added") in changes
        assert client.get("/healthz").status_code == 200


@pytest.mark.anyio
async def test_read_skill_resource_on_a_fifo_is_a_tool_error(defs: Path, tmp_path: Path) -> None:
    state = tmp_path / "state"
    with corral_server(defs, state) as url:
        async with httpx.AsyncClient(base_url=url, timeout=15, trust_env=False) as client:
            todo = defs / "skills/notes/todo.txt"
            with planted(Placement("resource", "skills/notes/todo.txt", ""), defs):
                # The compiled content was kept (server/deployment/vault.py): that is what the model reads.
                as_compiled = await tool_result(client, "read todo.txt")
                assert not as_compiled["is_error"] and as_compiled["content"] == "as compiled\n"
                kept = list((state / "files").glob("*/todo.txt"))
                assert kept
                for copy in kept:
                    copy.unlink()
                refused = await tool_result(client, "read todo.txt")
            assert todo.is_fifo()
            assert refused["is_error"]
            assert refused["content"].startswith("todo.txt changed since this definition was compiled")


async def tool_result(client: httpx.AsyncClient, content: str) -> dict[str, Any]:
    _, answer = await talk(client, "helper", content)
    assert answer["status"] == "completed", answer
    [result] = [m for m in answer["messages"] if m["role"] == "tool"]
    return result


# --- the watcher, and SIGTERM ------------------------------------------------------------------


def wait_for(server: ServerProcess, match: Callable[[str], bool], poke: Path, timeout_s: float) -> str | None:
    """The first log line `match` accepts, touching `poke` now and then: the watcher may have started
    after the change it should have seen (any new file makes it compile the whole directory again)."""
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        line = server.wait_for_line(match, min(left, 3.0))
        if line is not None:
            return line
        poke.write_text(str(time.monotonic()))
    return None


def test_sigterm_stops_a_watching_server_after_a_fifo_appeared(defs: Path, tmp_path: Path) -> None:
    with ServerProcess(defs, tmp_path / "state", args=()) as server, planted(PLACEMENTS[0], defs):
        line = wait_for(server, lambda text: "swap rejected (watch)" in text, defs / "poke.txt", 30)
        assert line is not None and "skills/notes/SKILL.md:2: " in line, server.stderr
        assert FIFO_MESSAGE in line
        # the swapper is free: a reload answers, and is rejected for the same reason
        report = httpx.post(server.url + "/v1/definitions/reload", timeout=10, trust_env=False).json()
        assert report["status"] == "rejected"
        started = time.monotonic()
        try:
            code = server.terminate(timeout_s=15)
        except subprocess.TimeoutExpired:
            pytest.fail(f"SIGTERM did not stop the server within 15 s:\n{server.stderr}")
    assert code in (0, -15), server.stderr
    assert time.monotonic() - started < 15


STUCK = textwrap.dedent("""
    import threading, time, types
    import anyio
    from server.deployment.swaps import Swapper

    class Stuck:
        def compile(self, changed):
            threading.Event().wait()  # a compile that never ends

    registry = types.SimpleNamespace(current=types.SimpleNamespace(digest="sha256:0"))
    swapper = Swapper(Stuck(), registry, None, None, None, None, locked=False)

    async def main():
        for attempt in ("first", "second"):  # the second waits for the first, and is cancellable too
            started = time.monotonic()
            with anyio.move_on_after(0.5) as scope:
                await swapper.reload("test")
            assert scope.cancelled_caught and time.monotonic() - started < 5
            print(attempt, "reload cancelled", flush=True)

    anyio.run(main)
    print("exiting", flush=True)
""")


def test_a_stuck_compile_holds_up_neither_a_cancelled_reload_nor_the_exit() -> None:
    try:
        done = subprocess.run([sys.executable, "-c", STUCK], cwd=REPO, env=clean_environ(),
                              capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"a stuck compile kept the process alive: {exc.stdout!r} {exc.stderr!r}")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n") == ["first reload cancelled", "second reload cancelled", "exiting", ""]
