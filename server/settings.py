"""Server settings: `CORRAL_*` environment variables, overridden by CLI flags."""

from __future__ import annotations

import functools
import ipaddress
import os
import socket
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CORRAL_", extra="ignore")

    definitions: Path = Path("definitions")
    host: str = "127.0.0.1"
    port: int = Field(default=8420, ge=0, le=65535)
    state_dir: Path = Path(".corral")
    database_url: str | None = None
    locked: bool = False
    api_keys: str = ""  # comma-separated; kept as text so the env var needs no JSON
    allowed_hosts: str = ""  # comma-separated Host names accepted besides loopback ones
    cors_origins: str = ""  # comma-separated origins a browser may call from (CORS)
    log_level: Literal["debug", "info", "warning", "error", "critical"] = "info"
    log_format: Literal["text", "json"] = "text"
    watch: bool = True
    max_body_bytes: int = Field(default=4 * 1024 * 1024, gt=0)
    body_timeout_s: float = Field(default=30.0, gt=0)
    shutdown_grace_s: float = Field(default=30.0, ge=0)
    idempotency_ttl_s: float = Field(default=24 * 3600, gt=0)
    max_concurrent_turns: int = Field(default=1000, gt=0)
    permission_timeout_s: float = Field(default=300.0, gt=0)
    # a running turn retries a write the store could not be reached for this long (a PostgreSQL
    # restart or fail-over fails nothing); a store failing writes this long is dead
    storage_grace_s: float = Field(default=30.0, gt=0)
    lease_s: float = Field(default=10.0, gt=0)  # a replica silent this long loses its turns' leases
    replica_id: str = ""  # empty: host name and pid
    max_attempts: int = Field(default=3, ge=1)  # a turn cut off this many times fails with `interrupted`
    # the console links each turn to its trace in the user's tracing UI: `{trace_id}` is filled in
    trace_url: str = Field(default="", pattern=r"^$|^https?://\S*\{trace_id\}\S*$")
    # evals (§12): case runs at once across every eval run of this process, apart from serving turns
    eval_max_concurrency: int = Field(default=4, gt=0)
    eval_on_swap: bool = False  # run the affected evals after each applied swap, in the background
    require_evals: bool = False  # `--locked` also needs a passing run of each eval in corral.lock
    a2a_public_cards: bool = False  # A2A agent cards without a key (they hold no conversation data)

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower(cls, v: object) -> object:
        return v.lower() if isinstance(v, str) else v

    @property
    def keys(self) -> tuple[str, ...]:
        return _items(self.api_keys)

    @property
    def hosts(self) -> tuple[str, ...]:
        return _items(self.allowed_hosts)

    @property
    def origins(self) -> tuple[str, ...]:
        return _items(self.cors_origins)

    @property
    def database_path(self) -> Path:
        return self.state_dir / "corral.db"

    @property
    def replicated(self) -> bool:
        """A shared store (PostgreSQL): other replicas may serve the same state."""
        url = (self.database_url or "").lower()
        return url.startswith(("postgresql://", "postgres://"))

    @property
    def replica(self) -> str:
        return self.replica_id or f"{socket.gethostname()}-{os.getpid()}"


def _items(text: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in text.split(",") if item.strip())


@functools.lru_cache(maxsize=256)  # asked of every request's Host; bounded: a client picks the names
def is_loopback(host: str) -> bool:
    """A bind address (or Host name) only this machine can reach: `localhost` or any loopback IP."""
    host = host.strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
