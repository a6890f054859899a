"""A real PostgreSQL for tests and benchmarks, from Debian's binaries, on loopback.

    server = PostgresServer()      # finds the binaries; `PostgresUnavailable` says why it cannot
    server.start()                 # initdb in a temporary directory, a free 127.0.0.1 port
    url = server.create_database() # postgresql://postgres@127.0.0.1:PORT/corral_...
    server.drop_database(url)
    server.halt(); server.resume() # a restart: connections cut, data kept, the same port
    server.stop()                  # fast shutdown, directory removed

    def test_something(postgres_url): ...   # a fresh database per test, one server per session

The server binaries refuse to run as root: as root (CI, containers) they run
as the `postgres` user (`runuser`), which owns the temporary directory; as
anyone else, directly. Authentication is `trust`, for loopback only (the
server listens on 127.0.0.1 and a Unix socket inside its directory), and
durability is off (`fsync`, `synchronous_commit`, `full_page_writes`): a
test database that a crash loses costs nothing.

Missing binaries skip the tests that need them, except under `CI=true`,
where they fail: a green CI must mean PostgreSQL was tested.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

PREFERRED_VERSION = "15"
SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_connections": "300",
    "shared_buffers": "32MB",
    "log_min_messages": "warning",
}


class PostgresUnavailable(Exception):
    """No PostgreSQL server binaries here (or no user to run them as)."""


def find_binaries() -> Path:
    """The directory of initdb/pg_ctl: PostgreSQL 15 preferred, else the newest installed."""
    root = Path("/usr/lib/postgresql")
    preferred = root / PREFERRED_VERSION / "bin"
    if (preferred / "pg_ctl").exists():
        return preferred
    found = sorted((p for p in root.glob("*/bin") if (p / "pg_ctl").exists()),
                   key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0)
    if not found:
        raise PostgresUnavailable(f"no PostgreSQL server binaries under {root} (apt-get install postgresql)")
    return found[-1]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    def __init__(self, binaries: Path | None = None):
        self.binaries = binaries or find_binaries()
        self.as_root = os.geteuid() == 0
        if self.as_root and shutil.which("runuser") is None:
            raise PostgresUnavailable("running as root, and no runuser to run PostgreSQL as postgres")
        if self.as_root:
            try:
                import pwd

                self._owner = pwd.getpwnam("postgres")
            except KeyError:
                raise PostgresUnavailable("running as root, and there is no postgres user") from None
        self.root: Path | None = None
        self.port: int | None = None

    @property
    def data(self) -> Path:
        assert self.root is not None, "the server is not started"
        return self.root / "data"

    def _run(self, *argv: str, server: bool = False, timeout: float = 60) -> subprocess.CompletedProcess:
        """A client or (`server`) server binary; the server ones as postgres when we are root."""
        command = [str(self.binaries / argv[0]), *argv[1:]]
        if server and self.as_root:
            command = ["runuser", "-u", "postgres", "--", *command]
        return subprocess.run(command, cwd=self.root, capture_output=True, text=True, timeout=timeout,
                              check=False)

    def _check(self, result: subprocess.CompletedProcess, what: str) -> None:
        if result.returncode != 0:
            log = self.root / "server.log" if self.root else None
            tail = log.read_text()[-2000:] if log is not None and log.exists() else ""
            raise RuntimeError(f"{what} failed ({result.returncode}): {result.stderr.strip()}\n{tail}")

    def start(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="corral-pg-"))
        (self.root / "sock").mkdir()
        if self.as_root:
            for path in (self.root, self.root / "sock"):
                os.chown(path, self._owner.pw_uid, self._owner.pw_gid)
        try:
            self._check(self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust",
                                  "-E", "UTF8", "--locale=C", "--no-sync", server=True), "initdb")
            (self.data / "pg_hba.conf").write_text(
                "local all all trust\nhost all all 127.0.0.1/32 trust\n")
            self._listen_and_start()
        except BaseException:
            self._remove()
            raise

    def _listen_and_start(self) -> None:
        """Start on a free port; another process may take it first, so try a few."""
        for attempt in range(5):
            self.port = _free_port()
            settings = {**SETTINGS, "port": str(self.port), "unix_socket_directories": f"'{self.root}/sock'"}
            conf = "".join(f"{key} = {value}\n" for key, value in settings.items())
            (self.data / "postgresql.auto.conf").write_text(conf)
            result = self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"),
                               "-w", "-t", "60", "start", server=True, timeout=90)
            if result.returncode == 0:
                return
            if attempt == 4:
                self._check(result, "pg_ctl start")

    def halt(self) -> None:
        """Stop the server (fast shutdown: connections are cut), keeping its data, as a restart does."""
        self._check(self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "-t", "30", "stop",
                              server=True), "pg_ctl stop")

    def resume(self) -> None:
        """Start a halted server again, on the same port."""
        self._check(self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"),
                              "-w", "-t", "60", "start", server=True, timeout=90), "pg_ctl start")

    def stop(self) -> None:
        if self.root is None:
            return
        if (self.data / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "-t", "30", "stop", server=True)
        self._remove()

    def _remove(self) -> None:
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None

    def url(self, database: str = "postgres") -> str:
        assert self.port is not None, "the server is not started"
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def sql(self, statement: str, database: str = "postgres") -> str:
        """Run one statement with psql; its output (unaligned, tuples only)."""
        result = self._run("psql", "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d", self.url(database),
                           "-c", statement)
        self._check(result, f"psql {statement!r}")
        return result.stdout.strip()

    def create_database(self) -> str:
        """A new, empty database; its URL."""
        name = f"corral_{uuid.uuid4().hex[:12]}"
        self.sql(f"CREATE DATABASE {name}")
        return self.url(name)

    def drop_database(self, url: str) -> None:
        name = url.rsplit("/", 1)[-1]
        self.sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    def __enter__(self) -> PostgresServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def unavailable(reason: str) -> None:
    """Skip, or under CI fail: there a skipped PostgreSQL test would pass for a tested one."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"PostgreSQL is required under CI: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One PostgreSQL server for the whole session, started the first time a test asks."""
    try:
        server = PostgresServer()
    except PostgresUnavailable as exc:
        unavailable(str(exc))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> Iterator[str]:
    """A fresh database on the session's server, dropped afterwards (connections left are cut)."""
    url = postgres_server.create_database()
    try:
        yield url
    finally:
        with contextlib.suppress(RuntimeError):
            postgres_server.drop_database(url)
