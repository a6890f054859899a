"""The composition root: one running Corral, whatever surface serves it.

`open_service(settings)` owns the embedded store (`store.ownership`: a second
process on it is refused), compiles the definitions, opens the store (SQLite,
or PostgreSQL for several replicas; see `stores`), recovers the turns its
previous run left, joins the replicas (`replicas.Replica`: heartbeat, leases,
notices), and opens the outbound HTTP client and the task group turns run
in; it yields a `Service` and closes all of it on exit. The HTTP app,
`corral chat` and `corral mcp` are thin surfaces over this object.

A store that cannot be written at all (`StoreHealth`) makes the service
`failed`: health checks fail, new turns are refused, running ones get the
shutdown grace, and then `exit_code` is the exit status of its error
(`storage_error`: 1) so the process exits and a supervisor restarts it.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import anyio
import httpx

from .. import tracing
from ..compiler.compiler import Compiler
from ..compiler.definitions import DefinitionSet
from ..compiler.lockfile import LockError, read_lock
from ..deployment.registry import Registry
from ..deployment.reports import SwapReport
from ..deployment.swaps import Swapper, check_locked
from ..deployment.vault import FileVault
from ..deployment.watcher import watch
from ..errors import CorralError
from ..evals.on_swap import eval_on_swap
from ..evals.runs import EvalRuns
from ..metrics import Metrics
from ..providers.transport import ModelHTTP
from ..runtime.admission import Admission
from ..runtime.budgets import Spending
from ..runtime.context import Contexts
from ..runtime.conversations import Conversations
from ..runtime.elsewhere import TurnsElsewhere
from ..runtime.events import EventHub
from ..runtime.idempotency import IdempotencyKeys
from ..runtime.patience import PatientStore
from ..runtime.permissions import PermissionBroker
from ..runtime.plans import Runtime
from ..runtime.records import Records
from ..runtime.steering import Steering
from ..runtime.streams import EventStreams
from ..runtime.transcripts import Transcripts
from ..runtime.turn_lifecycle import TurnLifecycle
from ..runtime.turn_results import TurnResults
from ..runtime.turn_runner import TurnRunner
from ..settings import Settings
from ..store.base import Store
from ..store.health import StoreHealth
from ..store.ownership import claim
from ..tools.confinement import Secrets
from ..tools.mcp.connections import MCPConnections
from .replicas import Replica
from .stores import open_store

log = logging.getLogger("corral")


@dataclass
class Service:
    settings: Settings
    compiler: Compiler
    registry: Registry
    store: Store
    runtime: Runtime
    hub: EventHub
    metrics: Metrics
    conversations: Conversations
    records: Records  # what the surfaces read of conversations (never the store itself)
    swapper: Swapper
    permissions: PermissionBroker
    replica: Replica
    health: StoreHealth | None = None
    evals: EvalRuns | None = None
    ready: bool = False
    stopping: anyio.Event = field(default_factory=anyio.Event)
    exit_code: int | None = None  # set when the process should exit on its own (a dead store)

    @property
    def failed(self) -> CorralError | None:
        """Why this service can no longer work (its store cannot be written), if it cannot."""
        return self.health.error if self.health is not None else None

    def begin_shutdown(self) -> None:
        """SIGTERM: refuse new turns now; running ones get the grace period (see `_drain_on_stop`)."""
        self.conversations.accepting = False
        self.ready = False
        self.stopping.set()


@asynccontextmanager
async def open_service(settings: Settings) -> AsyncIterator[Service]:
    claimed = claim(settings, "")  # before the store opens: its recovery is the owner's alone
    try:
        async with _opened(settings) as service:
            yield service
    finally:
        if claimed is not None:
            claimed.release()


@asynccontextmanager
async def _opened(settings: Settings) -> AsyncIterator[Service]:
    compiler = Compiler(settings.definitions)
    definitions = compiler.compile()  # DefinitionsInvalid propagates: refuse to start
    if settings.locked:
        check_locked(definitions, settings.require_evals)
    store = open_store(settings)
    await store.open()  # a schema newer than this server knows refuses to start
    health = StoreHealth(store, settings.storage_grace_s)
    store.on_failure = health.suspect
    try:
        files = FileVault(settings.state_dir / "files")
        registry = Registry(definitions, store, files)
        await registry.persist(definitions)
        timeout = httpx.Timeout(60.0, connect=10.0)
        limits = httpx.Limits(max_connections=1000, max_keepalive_connections=100)
        tracing.configure()  # from OTEL_* variables; without them nothing is built
        # every outbound request of a turn names the span it was made in (`traceparent`)
        async with httpx.AsyncClient(timeout=timeout, limits=limits,
                                     event_hooks={"request": [tracing.inject_httpx]}) as client, \
                ModelHTTP() as models:
            service, mcp = _assemble(settings, compiler, definitions, store, health, registry, files, client,
                                     models)
            conversations, replica = service.conversations, service.replica
            async with anyio.create_task_group() as tg:
                await tg.start(health.run)
                tg.start_soon(_stop_when_the_store_dies, service)
                await tg.start(mcp.run)
                await tg.start(conversations.run)
                assert service.evals is not None
                await tg.start(service.evals.run)
                await replica.recover_at_start()  # resumed turns run in the conversations' task group
                await tg.start(replica.run)
                if settings.watch:
                    tg.start_soon(watch, compiler.root, service.swapper.reload)
                if threading.current_thread() is threading.main_thread():
                    await tg.start(_reload_on_sighup, replica)
                tg.start_soon(_drain_on_stop, service)
                service.ready = True
                try:
                    yield service
                finally:
                    service.ready = False
                    with anyio.CancelScope(shield=True):
                        await conversations.drain(settings.shutdown_grace_s, hand_off=not store.embedded)
                    service.hub.close_all()
                    await replica.leave()
                    tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await store.close()
            await anyio.to_thread.run_sync(tracing.shutdown)  # the spans still queued are sent


def _assemble(settings: Settings, compiler: Compiler, definitions: DefinitionSet, store: Store,
              health: StoreHealth, registry: Registry, files: FileVault,
              client: httpx.AsyncClient, models: ModelHTTP) -> tuple[Service, MCPConnections]:
    """Every component of a running Corral, wired together (nothing started yet); and its MCP
    connections, which the caller runs."""
    hub, metrics = EventHub(), Metrics()
    permissions = PermissionBroker(store, settings.permission_timeout_s)
    mcp = _mcp_connections(definitions.root, settings.locked, hub, files)
    secrets = Secrets(os.environ, settings.keys)
    secrets.learn(d.spec for d in definitions)
    runtime = Runtime(client, mcp=mcp, permissions=permissions, metrics=metrics, files=files, secrets=secrets,
                      transcripts=settings.state_dir / "transcripts",
                      a2a=_a2a_cards(definitions.root, settings.locked, hub), models=models)
    conversations = _conversations(settings, store, registry, runtime, hub, metrics)
    # a swap report's busy turns are every replica's: the store knows them all
    swapper = Swapper(compiler, registry, store.running_turns, store, hub.publish_global, metrics,
                      locked=settings.locked, replica=store.replica, require_evals=settings.require_evals)
    replica = Replica(store, lease_s=settings.lease_s, max_attempts=settings.max_attempts, hub=hub,
                      conversations=conversations, permissions=permissions, swapper=swapper,
                      set_digest=lambda: registry.current.digest, metrics=metrics)
    swapper.listeners.append(_mcp_follows_swaps(mcp, registry))
    swapper.listeners.append(_secrets_follow_swaps(secrets, registry))
    swapper.listeners.append(_a2a_follows_swaps(runtime, registry))
    health.on_recovered.append(conversations.turns.record_unrecorded)
    evals = EvalRuns(store, registry, conversations, runtime, hub.publish_global,
                     max_concurrency=settings.eval_max_concurrency)
    if settings.eval_on_swap:
        swapper.listeners.append(eval_on_swap(evals))
    return Service(settings, compiler, registry, store, runtime, hub, metrics, conversations, Records(store),
                   swapper, permissions, replica, health, evals), mcp


def _conversations(settings: Settings, store: Store, registry: Registry, runtime: Runtime, hub: EventHub,
                   metrics: Metrics) -> Conversations:
    """The run stage's parts, each built once and handed to those that use it."""
    # what a turn writes outlasts a short outage of the store (§7): it retries for the storage grace
    turn_store = cast(Store, PatientStore(store, settings.storage_grace_s))
    ttl_s = settings.idempotency_ttl_s
    transcripts = Transcripts(store)
    contexts = Contexts(store, runtime, transcripts, hub)
    admission = Admission(store, lease_s=settings.lease_s, max_turns=settings.max_concurrent_turns)
    keys = IdempotencyKeys(store, ttl_s)
    streams = EventStreams(store, hub)
    elsewhere = TurnsElsewhere(store, admission, streams)
    steering = Steering(store, registry, runtime, admission, hub, turn_store=turn_store, ttl_s=ttl_s)
    runner = TurnRunner(turn_store, runtime, hub, metrics, transcripts=transcripts, spending=Spending(store),
                        contexts=contexts, steering=steering)
    turns = TurnLifecycle(store, registry, runner, admission, keys, steering, elsewhere, hub, metrics,
                          turn_store=turn_store)
    return Conversations(store=store, registry=registry, runtime=runtime, admission=admission, keys=keys,
                         steering=steering, turns=turns, elsewhere=elsewhere, streams=streams,
                         results=TurnResults(store, registry, elsewhere), contexts=contexts)


def _mcp_connections(root: Path, locked: bool, hub: EventHub, files: FileVault) -> MCPConnections:
    """Connections to MCP servers, checked against the catalogs in corral.lock."""
    try:
        lock = read_lock(root)
    except LockError:  # locked mode has refused it already; unlocked, it only loses the drift report
        lock = None

    def on_drift(server: str, expected: str, observed: str) -> None:
        log.warning("MCP server %s: tool catalog drifted from corral.lock (%s -> %s)%s",
                    server, expected, observed, "; its tools are refused" if locked else "")
        hub.publish_global("mcp.catalog_drift", {"server": server, "expected": expected,
                                                 "observed": observed, "refused": locked})

    return MCPConnections(expected=lock.mcp_catalogs if lock else None, locked=locked, on_drift=on_drift,
                          files=files)


def _a2a_cards(root: Path, locked: bool, hub: EventHub):
    """The A2A tools' card digests in corral.lock, and how a drift is reported (as MCP catalogs')."""
    from ..tools.a2a import A2ACards

    try:
        lock = read_lock(root)
    except LockError:
        lock = None

    def on_drift(tool: str, expected: str, observed: str) -> None:
        log.warning("A2A tool %s: agent card drifted from corral.lock (%s -> %s)%s",
                    tool, expected, observed, "; its calls are refused" if locked else "")
        hub.publish_global("a2a.card_drift", {"tool": tool, "expected": expected, "observed": observed,
                                              "refused": locked})

    return A2ACards(lock.a2a_cards if lock else None, locked=locked, on_drift=on_drift)


def _a2a_follows_swaps(runtime: Runtime, registry: Registry):
    """After a swap: the lock's new card digests."""

    async def on_swap(report: SwapReport) -> None:
        try:
            lock = read_lock(registry.current.root)
        except LockError:
            return
        if runtime.a2a is not None:
            runtime.a2a.expected = dict(lock.a2a_cards) if lock else {}

    return on_swap


def _mcp_follows_swaps(mcp: MCPConnections, registry: Registry):
    """After a swap: close connections to servers no longer defined; take the lock's new catalogs."""

    async def on_swap(report: SwapReport) -> None:
        current = registry.current
        mcp.retain({d.digest for d in current.of_kind("MCPServer")})
        try:
            lock = read_lock(current.root)
        except LockError:
            return
        mcp.expected = dict(lock.mcp_catalogs) if lock else {}

    return on_swap


def _secrets_follow_swaps(secrets: Secrets, registry: Registry):
    """After a swap: the new set's `${VAR}` values are redacted too (the old ones stay redacted)."""

    async def on_swap(report: SwapReport) -> None:
        secrets.learn(d.spec for d in registry.current)

    return on_swap


async def _reload_on_sighup(replica: Replica, task_status=anyio.TASK_STATUS_IGNORED) -> None:
    with anyio.open_signal_receiver(signal.SIGHUP) as signals:
        task_status.started()  # handled from here: a SIGHUP once the server is ready never kills it
        async for _ in signals:
            await replica.reload_everywhere("sighup")


async def _stop_when_the_store_dies(service: Service) -> None:
    assert service.health is not None
    await service.health.dead.wait()
    service.begin_shutdown()  # /healthz fails from now on; running turns get the grace
    await service.conversations.drain(service.settings.shutdown_grace_s)
    service.hub.close_all()
    assert service.failed is not None  # the health check sets its error before `dead`
    service.exit_code = service.failed.exit_status


async def _drain_on_stop(service: Service) -> None:
    await service.stopping.wait()
    await service.conversations.drain(service.settings.shutdown_grace_s, hand_off=not service.store.embedded)
    service.hub.close_all()  # SSE streams end, so the HTTP server's own graceful wait can finish
