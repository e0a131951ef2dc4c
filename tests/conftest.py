"""Shared pytest fixtures.

Keep this file small and generic: one section per external service or concern, each fixture a thin
wrapper around an importable helper module (`tests/brokers.py` for Mosquitto), so that tests and
scripts can use the helpers without pytest. Add new sections below the existing ones.
"""

from __future__ import annotations

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
