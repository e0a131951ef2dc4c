"""The agents' resend timer backs off while globals are late (issue 27 part 5): an aggregator behind its input
by more than `resend_after` used to get every outstanding update again each period."""

from __future__ import annotations

import time

import numpy as np

from streamfed.fleet.agent import AgentCore
from streamfed.fleet.config import BrokerConfig, FleetConfig
from streamfed.fleet.sources import Reading, array_source
from streamfed.runtime.agent import AgentService, AgentSettings


def agent(n_updates: int) -> AgentService:
    cfg = FleetConfig(fleet="rb", algorithm="pofmkl", n_inputs=3, n_kernels=2, n_features=4)
    core = AgentCore(cfg, "a", 0, mode="async")
    rng = np.random.default_rng(0)
    for t in range(200):  # a varying target: the first samples only set the stream's scales
        x = rng.random(3)
        core.on_reading(Reading(f"r{t}", x, float(t), float(np.sin(x.sum()) + 0.1 * rng.standard_normal())))
        if len(core.outbox) == n_updates:
            break
    assert sorted(core.outbox) == list(range(1, n_updates + 1))
    return AgentService(core, BrokerConfig(), source=array_source(np.zeros((0, 3)), np.zeros(0)),
                        settings=AgentSettings(resend_after=10.0, resend_backoff=4.0))


def resent_after(svc: AgentService, waited: float) -> list[int]:
    """Pretend every outstanding update was sent `waited` seconds ago; what the timer sends again (then
    "sent" now, as the sender would)."""
    now = time.monotonic()
    svc._sent_at = {s: now - waited for s in svc.core.outbox}
    svc._resend_due = 0.0
    svc._resend_overdue()
    again = [m.seq for m in svc.updates]
    for m in list(svc.updates):
        svc._sent(True, m, 0)
    svc.updates.clear()
    return again


def test_the_resend_wait_doubles_while_nothing_is_included_and_resets_when_something_is() -> None:
    svc = agent(3)
    assert resent_after(svc, 9.0) == []
    assert resent_after(svc, 10.5) == [1, 2, 3]  # the first wait: resend_after
    assert resent_after(svc, 10.5) == []  # globals are late: now 20 s
    assert resent_after(svc, 20.5) == [1, 2, 3]
    assert resent_after(svc, 39.0) == []  # 40 s = resend_backoff × resend_after, the cap
    assert resent_after(svc, 40.5) == [1, 2, 3]
    assert resent_after(svc, 39.0) == []  # stays at the cap
    assert resent_after(svc, 40.5) == [1, 2, 3]
    del svc.core.outbox[1]  # a global included seq 1: globals are coming again
    assert resent_after(svc, 10.5) == [2, 3]
