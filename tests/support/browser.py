"""A real headless Chromium for a test: Debian's `/usr/bin/chromium`, driven by Playwright's Python package.

    need_chromium()                               # skip (fail under CI=true) without one
    async with chromium(tmp_path) as browser:     # a fresh profile, loopback only
        page = await browser.new_page()
        seen = Watch(page)                        # every request, console error and page error
        ...
        assert seen.errors == [] and seen.hosts() == {"127.0.0.1:PORT"}

Playwright never downloads a browser here (downloads are impossible): it is
pointed at the system's. The flags keep Chromium off the network it would
otherwise try at start (component updates, sync, background fetches).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

CHROMIUM = Path(os.environ.get("CORRAL_TEST_CHROMIUM", "/usr/bin/chromium"))
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
VIEWPORT = {"width": 1440, "height": 900}


def need_chromium() -> None:
    """Skip the test without Playwright's package or the browser; under CI, fail instead."""
    reason = None
    try:
        import playwright.async_api  # noqa: F401
    except ImportError:
        reason = "the playwright package is not installed (pip install -e '.[test]')"
    if reason is None and not (CHROMIUM.exists() or shutil.which(str(CHROMIUM))):
        reason = f"no Chromium at {CHROMIUM} (Debian's chromium package)"
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI needs a browser for the console tests: {reason}")
        pytest.skip(reason)


@asynccontextmanager
async def chromium(tmp_path: Path) -> AsyncIterator[Any]:
    """A browser context on a fresh profile under `tmp_path`, closed when the block ends."""
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        context = await playwright.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"), executable_path=str(CHROMIUM), headless=True, args=FLAGS,
            viewport=VIEWPORT, service_workers="block")
        try:
            yield context
        finally:
            await context.close()


class Watch:
    """What a page did: every request (URL and headers), every console error and uncaught exception."""

    def __init__(self, page: Any):
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.errors: list[str] = []
        page.on("request", lambda r: self.requests.append((r.url, dict(r.headers))))
        page.on("console", lambda m: self.errors.append(f"console: {m.text}") if m.type == "error" else None)
        page.on("pageerror", lambda e: self.errors.append(f"page: {e}"))

    def hosts(self) -> set[str]:
        """Every host:port the page sent a request to (data: URLs have none)."""
        return {urlsplit(url).netloc for url, _ in self.requests if not url.startswith("data:")}

    def api_requests(self) -> list[tuple[str, dict[str, str]]]:
        return [(url, headers) for url, headers in self.requests if urlsplit(url).path.startswith("/v1/")]
