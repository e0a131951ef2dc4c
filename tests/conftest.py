"""Shared pytest fixtures.

Keep this file small and generic: one section per external service or concern, each fixture a thin
wrapper around an importable helper module (`tests/brokers.py` for Mosquitto), so that tests and
scripts can use the helpers without pytest. Add new sections below the existing ones.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator

import pytest

from tests import brokers

# --------------------------------------------------------------------------- Mosquitto (real broker)


@pytest.fixture(scope="session")
def mosquitto_dev() -> Iterator[brokers.Broker]:
    """A development-flavour broker (loopback, anonymous, persistence) shared by the session.
    Tests sharing it use their own topics and client ids."""
    with brokers.start_or_fail("dev") as broker:
        yield broker


@pytest.fixture(scope="session")
def mosquitto_prod() -> Iterator[brokers.Broker]:
    """A production-flavour broker (TLS only, the dynamic-security plugin with a generated roster) shared by
    the session. Accounts `f.aggregator`, `viewer`, `monitor`, `a1`, `a2` with random passwords
    (`broker.users`), each bound to one client id (`broker.client_ids`)."""
    with brokers.start_or_fail("prod") as broker:
        yield broker


@pytest.fixture
def mosquitto_factory() -> Iterator[Callable[..., brokers.Broker]]:
    """Start private brokers (`factory("dev")`, `factory("prod", users=[...])`); all stopped after the test."""
    started: list[brokers.Broker] = []

    def factory(flavour: str = "dev", **kw: object) -> brokers.Broker:
        broker = brokers.start_or_fail(flavour, **kw)
        started.append(broker)
        return broker

    yield factory
    for broker in started:
        broker.close()


# --------------------------------------------------------------------------- tiers
# `pytest -m "not broker"` is the pure tier: no Mosquitto, Prometheus or CLI process started. A test is marked
# `broker` here when it, or a fixture it uses, starts one (its source says so), so no test can forget the mark.
_PROCESS_SIGNS = ("start_or_fail", "MosquittoProcess", "Mosquitto(", "prometheus", "subprocess", "Popen",
                  "EmbeddedBroker", "run_demo", "run_loadtest", "mosquitto_dev", "mosquitto_prod", "mosquitto_factory")
_starts: dict[object, bool] = {}


def _starts_processes(fn: object) -> bool:
    if fn not in _starts:
        try:
            source = inspect.getsource(fn)  # type: ignore[arg-type]
        except (OSError, TypeError):
            source = ""
        _starts[fn] = any(sign in source for sign in _PROCESS_SIGNS)
    return _starts[fn]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("broker"):
            continue
        fixtures = getattr(item, "_fixtureinfo", None)  # pytest's own record of the fixtures an item uses
        defs = [d for ds in (fixtures.name2fixturedefs.values() if fixtures else ()) for d in ds]
        funcs = [getattr(item, "function", None), *(d.func for d in defs)]
        if any(f is not None and _starts_processes(f) for f in funcs):
            item.add_marker(pytest.mark.broker)
