"""A real nginx (Debian's) as a plain round-robin reverse proxy in front of Corral replicas.

    with NginxProxy(["http://127.0.0.1:8431", "http://127.0.0.1:8432"]) as proxy:
        httpx.get(proxy.url + "/healthz")     # served by one replica, the next request by the other
    proxy.access_log()                        # one line a request, each naming the replica (upstream=)

The configuration is `examples/nginx/corral.conf`, the one the README quotes,
with only its ports replaced (the listen port by a free one, the two example
upstream servers by the given ones): what the README shows is what is tested.
nginx runs in the foreground (`daemon off`) under a prefix of its own in a
temporary directory, which holds its pid file, logs and temporary files.

nginx missing: the test is skipped with the reason, or fails when `CI=true`
(CI installs it, so a green run means it was tested).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.support.servers import REPO

TEMPLATE = REPO / "examples" / "nginx" / "corral.conf"
CANDIDATES = ("/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/local/nginx/sbin/nginx")
LISTEN = re.compile(r"^(\s*listen\s+)127\.0\.0\.1:8430(;)", re.MULTILINE)
UPSTREAM_SERVER = re.compile(r"^(\s*)server\s+127\.0\.0\.1:843[12]\b([^;]*);\n", re.MULTILINE)


def nginx_binary() -> str:
    """The nginx executable; skips the test when there is none (fails when CI=true)."""
    found = shutil.which("nginx") or next((c for c in CANDIDATES if os.access(c, os.X_OK)), None)
    if found is None:
        reason = "nginx is not installed (Debian: apt-get install nginx)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason}; CI must run the load-balancer tests")
        pytest.skip(reason)
    return found


def render(template: str, port: int, upstreams: Sequence[str]) -> str:
    """`template` with `port` as the listen port and `upstreams` (`http://HOST:PORT`) as its servers."""
    if not upstreams:
        raise ValueError("an upstream needs at least one server")
    text, listens = LISTEN.subn(rf"\g<1>127.0.0.1:{port}\g<2>", template)
    servers = list(UPSTREAM_SERVER.finditer(text))
    if listens != 1 or len(servers) != 2:
        raise ValueError(f"{TEMPLATE} no longer has one `listen 127.0.0.1:8430;` and two upstream servers")
    indent, options = servers[0].group(1), servers[0].group(2)
    lines = "".join(f"{indent}server {_address(u)}{options};\n" for u in upstreams)
    return text[:servers[0].start()] + lines + text[servers[-1].end():]


def _address(upstream: str) -> str:
    match = re.fullmatch(r"http://([0-9.]+:\d+)/?", upstream)
    if match is None:
        raise ValueError(f"not an http://IP:PORT address: {upstream!r}")
    return match.group(1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


class NginxProxy:
    """nginx in the foreground on a free loopback port, proxying round-robin to `upstreams`."""

    def __init__(self, upstreams: Sequence[str], *, template: Path = TEMPLATE):
        self.upstreams = list(upstreams)
        self.template = template
        self.prefix = Path(tempfile.mkdtemp(prefix="corral-nginx-"))
        self.conf = self.prefix / "nginx.conf"
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.url = ""

    def start(self, timeout_s: float = 15.0) -> NginxProxy:
        binary = nginx_binary()
        directives = "daemon off;"
        if os.geteuid() == 0:  # the workers run as this user: the temporary prefix is root's alone
            directives += " user root;"
        for _ in range(3):  # the free port may be taken between the probe and nginx's bind
            self.port = free_port()
            self.conf.write_text(render(self.template.read_text("utf-8"), self.port, self.upstreams))
            self.proc = subprocess.Popen(
                [binary, "-p", f"{self.prefix}/", "-e", str(self.prefix / "startup.log"),
                 "-c", str(self.conf), "-g", directives],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline and self.proc.poll() is None and not accepts(self.port):
                time.sleep(0.02)
            if self.proc.poll() is None and accepts(self.port):
                self.url = f"http://127.0.0.1:{self.port}"
                return self
            self.stop()
            if "Address already in use" not in self.error_log():
                break
        raise RuntimeError(f"nginx did not start within {timeout_s}s:\n{self.error_log()}")

    def stop(self) -> None:
        """Stop nginx (SIGTERM, its fast shutdown, which also ends open streams; killed if it lingers)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)

    def error_log(self) -> str:
        return "".join(_read(self.prefix / name) for name in ("startup.log", "error.log"))

    def access_log(self) -> list[str]:
        """One line per request nginx has logged (it logs each once its response is done)."""
        return _read(self.prefix / "access.log").splitlines()

    def served_by(self) -> dict[str, int]:
        """How many logged requests each upstream (`IP:PORT`) served."""
        counts: dict[str, int] = {}
        for line in self.access_log():
            match = re.search(r"upstream=(.*?) upstream_status=", line)
            if match:
                for address in match.group(1).split(", "):  # a retried request names every upstream
                    counts[address] = counts.get(address, 0) + 1
        return counts

    def __enter__(self) -> NginxProxy:
        return self if self.url else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        shutil.rmtree(self.prefix, ignore_errors=True)


def _read(path: Path) -> str:
    try:
        return path.read_text("utf-8", errors="replace")
    except FileNotFoundError:
        return ""
