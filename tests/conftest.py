"""Shared fixtures: definition trees on disk and a real Corral server on loopback."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from server.http import create_app
from server.settings import Settings
from tests.fakes.uvicorn_thread import serve


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


def write_tree(root: Path, files: dict[str, str]) -> Path:
    """Write `files` (relative path -> text, dedented) under `root`; returns root."""
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"), "utf-8")
    return root


@contextmanager
def corral_server(definitions: Path, state_dir: Path, **settings: Any) -> Iterator[str]:
    """A real Corral (uvicorn on 127.0.0.1, free port); yields its base URL."""
    config = Settings(definitions=definitions, state_dir=state_dir, **({"watch": False} | settings))
    with serve(create_app(config), graceful_s=5.0) as base_url:
        yield base_url


@pytest.fixture
def default_server(tmp_path: Path) -> Iterator[str]:
    """Corral serving the repository's own definitions/ on a fresh state directory."""
    root = Path(__file__).resolve().parent.parent / "definitions"
    with corral_server(root, tmp_path / "state") as base_url:
        yield base_url
