"""The store's ports and its two stores agree: every method a port names, each store has, alike.

Nothing type-checks the build, so a port and a store could drift apart (a
parameter renamed on one side, a method left out) and only the caller that
needs it would find out. Methods only tests use are in no port.
"""

from __future__ import annotations

import inspect

import pytest

from server.store import base
from server.store.postgres import PostgresStore
from server.store.sqlite import SQLiteStore
from tests.support.stores import StoreForTests

PORTS = (base.Notices, base.Lifecycle, base.ConversationStore, base.TurnJournal, base.Coordination,
         base.DefinitionStore, base.PermissionStore, base.ContextStore, base.EvalStore)


def _methods(port: type) -> dict[str, object]:
    return {name: value for name, value in vars(port).items()
            if inspect.isfunction(value) and not name.startswith("_")}


STORES = {  # neither opened: nothing is connected to
    "sqlite": lambda tmp_path: SQLiteStore(tmp_path / "corral.db", replica="r1"),
    "postgres": lambda tmp_path: PostgresStore("postgresql://127.0.0.1:1/nowhere", replica="r1"),
}


@pytest.mark.parametrize("backend", STORES)
@pytest.mark.parametrize("port", PORTS, ids=[p.__name__ for p in PORTS])
def test_each_store_has_every_method_of_each_port_with_its_signature(port: type, backend: str,
                                                                     tmp_path) -> None:
    store = STORES[backend](tmp_path)
    for name, method in _methods(port).items():
        implemented = getattr(store, name, None)
        assert implemented is not None, f"{backend} has no {name}"
        assert str(inspect.signature(implemented)) == str(inspect.signature(method).replace(
            parameters=list(inspect.signature(method).parameters.values())[1:])), name  # bound: no self
        assert inspect.iscoroutinefunction(implemented) == inspect.iscoroutinefunction(method), name
    for attribute in vars(port).get("__annotations__", {}):
        assert hasattr(store, attribute), f"{backend} has no {attribute}"


def test_store_is_every_port_and_each_method_is_in_one_port() -> None:
    named = [name for port in PORTS for name in _methods(port)]
    assert len(named) == len(set(named))
    assert set(_methods_of_store()) == set(named)


def test_the_methods_only_tests_use_are_in_no_port() -> None:
    only_tests = set(_methods(StoreForTests))
    assert only_tests == {"append_event", "find_definitions"}
    assert not only_tests & set(_methods_of_store())


def _methods_of_store() -> list[str]:
    return [name for klass in base.Store.__mro__ if klass in PORTS for name in _methods(klass)]
