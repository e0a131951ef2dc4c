"""Forgetting on the fleet's time base for URK-FedBNR's last layer (`half_life_s`, fixed networks): phase 2 is
FedBNR's client, so a sample observed at `t_i` weighs `w_i = 2^(−(T − t_i)/h)` in its statistics, its uploads
and the globals. Compared here with the discounted sums `S = Σ w_i φ_i φ_iᵀ`, `b = Σ w_i φ_i y_i`, `n = Σ w_i`,
`q = Σ w_i y_i²` written out with numpy over every uploaded sample."""

from __future__ import annotations

import numpy as np
import pytest

from streamfed.algorithms.urk import URKParams
from streamfed.algorithms.urk.messages import StatsItem
from streamfed.algorithms.urk.network import URKArch, initial_weights, omega
from streamfed.algorithms.urk.server import URKServer
from streamfed.core.stats import SufficientStats

H = 3600.0


def _cfg(names: list[str], **params: object):  # noqa: ANN202
    from streamfed.fleet.config import FleetConfig
    from streamfed.fleet.robustness import Robustness

    p = {"n_omega": 4, "half_life_s": H, "min_upload": 4, "learn_kernel": False, "fit_hyperparameters": False,
         "calibrate": False, **params}
    return FleetConfig(fleet="f", algorithm="urk-fedbnr", n_inputs=2, standardise="none", clients=tuple(names),
                       robust=Robustness(aggregation="exact"), params=p)


def test_agents_forget_on_the_readings_time_base_and_the_global_is_the_discounted_sum() -> None:
    """Real agents and the aggregator core through the codec, readings stamped in 2013 on irregular clocks: each
    upload carries its last reading's time and raw count; the global equals the discounted sums of every uploaded
    sample at the global's time; an upload stamped far ahead of the aggregator's clock is refused."""
    from streamfed.fleet.agent import AgentCore
    from streamfed.fleet.aggregator import AggregatorCore
    from streamfed.fleet.sources import Reading
    from streamfed.wire.message import Message, decode, encode

    names = ["a", "b"]
    cfg = _cfg(names)
    agents = {n: AgentCore(cfg, n, i) for i, n in enumerate(names)}
    core = AggregatorCore(cfg, clients=names, mode="async", window=0.0)
    rng = np.random.default_rng(2)
    streams = {}
    for i, n in enumerate(names):
        X = rng.uniform(-2, 2, (20 + 3 * i, 2))
        t = 1.36e9 + 500.0 * i + np.cumsum(rng.choice([0.0, 60.0, 1800.0, 7200.0], len(X)))
        streams[n] = (X, np.sin(X[:, 0]) + 0.1 * rng.standard_normal(len(X)), t)
    uploaded = dict.fromkeys(names, 0)
    last = None
    for _t, n, j in sorted((t, n, j) for n, (_, _, ts) in streams.items() for j, t in enumerate(ts)):
        X, y, ts = streams[n]
        for m in agents[n].on_reading(Reading(f"{n}{j}", X[j], float(ts[j]), float(y[j])), now=1.8e9)[1]:
            if m.kind.endswith(".update"):
                uploaded[n] += int(m.n_samples)
                assert float(m.arrays["time"]) == float(ts[uploaded[n] - 1]) and float(m.arrays["n"]) < m.n_samples
                last = m
                for g in core.on_update(n, encode(m, cfg), now=1.8e9):
                    if g.kind.endswith(".global"):
                        for a in agents.values():
                            a.on_global(decode(encode(g, cfg), cfg, kernel_version=a.kernel_version), now=1.8e9)
    assert all(uploaded.values())
    server = core.aggregation.server
    phase2 = agents["a"].learner.client.phase2
    rows = [(np.array([phase2.features(x)[0] for x in streams[n][0][:k]]), streams[n][1][:k], streams[n][2][:k])
            for n, k in uploaded.items()]
    phis, ys, ts = (np.concatenate(r) for r in zip(*rows, strict=True))
    assert server.time == max(float(t[uploaded[n] - 1]) for n, (_, _, t) in streams.items())
    w = 0.5 ** ((server.time - ts) / H)
    np.testing.assert_allclose(server.stats.S[0], (phis * w[:, None]).T @ phis, rtol=1e-11, atol=1e-11)
    np.testing.assert_allclose(server.stats.b[0], phis.T @ (w * ys), rtol=1e-11, atol=1e-11)
    assert server.stats.n == pytest.approx(w.sum(), rel=1e-12) and server.stats.q == pytest.approx(w @ ys**2, rel=1e-12)
    g = decode(encode(core.aggregation.global_message("f", "agg", agents["a"].kernel_version), cfg), cfg)
    assert float(g.arrays["time"]) == server.time
    assert last is not None
    future = Message(last.fleet, last.client, last.kind, last.seq + 1, last.global_version, last.kernel_version,
                     last.n_samples, 0.0, dict(last.arrays, time=np.asarray(1e11)), {}, {}, last.epoch)
    with pytest.raises(ValueError, match="ahead of this aggregator's clock"):
        core.aggregation.check(future)


def test_the_privacy_floor_counts_raw_samples_and_the_shares_follow_the_discounted_sums() -> None:
    arch = URKArch(n_inputs=1, widths=(), n_omega=2)
    one = SufficientStats.from_samples(np.full((4, 1, 4), 0.5), np.ones(4), "v")
    server = URKServer(initial_weights(arch, 0), omega(arch, 0), "v", min_samples=4, fit=False, learn_kernel=False,
                       share=(1.0, 1e9), half_life_s=H)
    server.apply(StatsItem("old", 1, 0, 0, one, time=0.0, count=4))
    server.apply(StatsItem("new", 1, 0, 0, one, time=0.0, count=4))
    server.apply(StatsItem("new", 2, 0, 0, one, time=3 * H, count=4))  # the sums move to 3H
    server.apply(StatsItem("old", 2, 0, 0, one.scaled(0.5), time=H, count=4))  # n = 2 < floor: 4 raw samples
    held = {"old": 4 * 0.5**3 + 2 * 0.5**2, "new": 4 * 0.5**3 + 4}
    assert server.time == 3 * H and server.stats.n == pytest.approx(sum(held.values()), rel=1e-14)
    for c, s in server.client_shares().items():
        assert s == pytest.approx(held[c] / sum(held.values()), rel=1e-12)
    with pytest.raises(ValueError, match="privacy floor"):  # n = 2 ≤ 3 raw samples, under the floor of 4
        server.apply(StatsItem("x", 1, 0, 0, one.scaled(0.5), time=0.0, count=3))
    with pytest.raises(ValueError, match="not time-discounted"):
        server.apply(StatsItem("x", 1, 0, 0, one))
    with pytest.raises(ValueError, match="discounted count"):
        server.apply(StatsItem("x", 1, 0, 0, one.scaled(2.0), time=0.0, count=4))  # weighs more than its samples


def test_forgetting_needs_a_fixed_network_and_shards_are_refused() -> None:
    from streamfed.algorithms.urk import ALGORITHM

    with pytest.raises(ValueError, match="learn_kernel"):
        URKParams(half_life_s=H)
    agg = ALGORITHM.aggregation(_cfg(["a"]))
    with pytest.raises(ValueError, match="discounted"):
        agg.for_partials("shard")
    plain = ALGORITHM.schemas(_cfg(["a"], half_life_s=None))
    assert not any("time" in s.array_names for s in plain)
