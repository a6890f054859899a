"""Shared fixtures (helpers live in tests/support/)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.postgres import postgres_server, postgres_url  # noqa: F401  (fixtures)
from tests.support.servers import REPO_DEFINITIONS, corral_server


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def default_server(tmp_path: Path) -> Iterator[str]:
    """Corral serving the repository's own definitions/ on a fresh state directory."""
    with corral_server(REPO_DEFINITIONS, tmp_path / "state") as base_url:
        yield base_url
