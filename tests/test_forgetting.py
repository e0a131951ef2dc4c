"""Forgetting that federates exactly (FedBNR with `half_life_s`, docs/algorithms.md §4.14).

The transcription: a sample observed at time `t_i` weighs `w_i = 2^(−(T − t_i)/h)` at reference time `T`, and the
discounted Bayesian linear regression is `A = σ⁻² Σ w_i φ_i φ_iᵀ + λ⁻² I`, `m = σ⁻² A⁻¹ Σ w_i φ_i y_i` — written
here directly with numpy over every sample of every client, and compared with what a fleet of clients uploading
at different times, summed by the server in any order, publishes and installs.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamfed.algorithms.fedbnr.aggregation import (
    FedBNRAggregation,
    RobustFedBNRServer,
    TemperedUpload,
    check_statistics,
)
from streamfed.algorithms.fedbnr.client import FedBNRClient
from streamfed.algorithms.fedbnr.discount import Discount
from streamfed.algorithms.fedbnr.learner import StatsLearner
from streamfed.algorithms.fedbnr.messages import GlobalModel, Upload
from streamfed.algorithms.fedbnr.server import FedBNRServer
from streamfed.algorithms.fedbnr.wire import UPDATE
from streamfed.core.stats import SufficientStats
from streamfed.wire.message import Message

H = 3600.0  # half-life, seconds
SIGMA, LAM = 0.3, 1.2


def _client(name: str, **kw: object) -> FedBNRClient:
    return FedBNRClient(n_inputs=2, n_features=4, bandwidth=1.0, seed=3, sigma=SIGMA, lam=LAM, min_upload=4,
                        half_life_s=H, client_id=name, **kw)


def _stream(rng: np.random.Generator, n: int, start: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    xs = rng.uniform(-2, 2, (n, 2))
    ys = np.sin(xs[:, 0]) + 0.5 * xs[:, 1] + 0.1 * rng.standard_normal(n)
    # irregular clocks: gaps of 0 (same timestamp) to 2 hours
    times = start + np.cumsum(rng.choice([0.0, 60.0, 1800.0, 7200.0], n))
    return xs, ys, times


def _central(phis: np.ndarray, ys: np.ndarray, times: np.ndarray, t_ref: float) -> tuple:
    """The centralised discounted statistics and posterior at `t_ref`, straight from the definitions."""
    w = 0.5 ** ((t_ref - times) / H)
    s = (phis * w[:, None]).T @ phis
    b = phis.T @ (w * ys)
    a = s / SIGMA**2 + np.eye(phis.shape[1]) / LAM**2
    cov = np.linalg.inv(a)
    return s, b, w.sum(), w @ ys**2, cov @ b / SIGMA**2, cov


def _fleet(seed: int) -> tuple[list[FedBNRClient], list[Upload], dict[str, tuple]]:
    """Three clients on their own clocks, each uploading several times; returns them, their uploads and every
    sample they learned (features, target, time), pending ones included."""
    rng = np.random.default_rng(seed)
    clients, uploads, seen = [], [], {}
    for i, name in enumerate(["a", "b", "c"]):
        c = _client(name)
        xs, ys, ts = _stream(rng, 30 + 7 * i, start=1.7e9 + 500.0 * i)
        for j, (x, y, t) in enumerate(zip(xs, ys, ts, strict=True)):
            c.advance(t)
            c.learn(x, y)
            if j % 9 == 8:  # uploads at different times on every client
                up = c.make_upload()
                assert up is not None and up.time == t and up.count == 9
                uploads.append(up)
        clients.append(c)
        seen[name] = (np.array([c.features(x)[0] for x in xs]), ys, ts)
    return clients, uploads, seen


@pytest.mark.parametrize("seed", [0, 1])
def test_fleet_sums_equal_the_centralised_discounted_statistics(seed: int) -> None:
    clients, uploads, seen = _fleet(seed)
    server = FedBNRServer.for_client(clients[0], fit_hyperparameters=False)
    order = np.random.default_rng(seed + 10).permutation(len(uploads))
    # out of order across clients; within a client the server sums in sequence order whatever arrives first
    for i in order:
        server.apply(uploads[i])
    g = server.publish()
    assert g.time == max(up.time for up in uploads)
    # every uploaded sample (not the pending tail), centralised, at the global's time
    rows = []
    for name, (phis, ys, ts) in seen.items():
        k = max(up.seq for up in uploads if up.client == name) * 9
        rows.append((phis[:k], ys[:k], ts[:k]))
    phis, ys, ts = (np.concatenate(r) for r in zip(*rows, strict=True))
    s, b, n, q, _, _ = _central(phis, ys, ts, g.time)
    np.testing.assert_allclose(g.stats.S[0], s, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(g.stats.b[0], b, rtol=1e-12, atol=1e-12)
    assert g.stats.n == pytest.approx(n, rel=1e-13) and g.stats.q == pytest.approx(q, rel=1e-13)
    assert g.stats.n < len(ys)  # discounted, not a count


@pytest.mark.parametrize("seed", [0, 1])
def test_installed_global_is_the_centralised_discounted_posterior(seed: int) -> None:
    """After a global, each client's working posterior is the discounted posterior of every sample it can know
    of — the global's, its own uploads the global does not hold yet, its pending samples — at its clock."""
    clients, uploads, seen = _fleet(seed)
    server = FedBNRServer.for_client(clients[0], fit_hyperparameters=False)
    held_back = uploads[-1]  # client c's last upload: not in this global (still in flight)
    for up in uploads[:-1]:
        server.apply(up)
    g = server.publish()
    for c in clients:
        assert c.apply_global(g)
        t_ref = max(c.clock, g.time)
        assert c.clock == t_ref
        rows = []
        for name, (phis, ys, ts) in seen.items():
            if name == c.client_id:
                rows.append((phis, ys, ts))  # own: all of it (uploaded, unacked or pending)
            else:
                k = max(up.seq for up in uploads[:-1] if up.client == name) * 9
                rows.append((phis[:k], ys[:k], ts[:k]))
        phis, ys, ts = (np.concatenate(r) for r in zip(*rows, strict=True))
        *_, mean, cov = _central(phis, ys, ts, t_ref)
        m, a_inv = c.posterior(0)
        np.testing.assert_allclose(m, mean, rtol=1e-9, atol=1e-10)
        np.testing.assert_allclose(a_inv, cov, rtol=1e-9, atol=1e-12)
    assert held_back.client == "c"


def test_discounted_upload_passes_every_check_and_charges_real_samples() -> None:
    c = _client("a")
    learner = StatsLearner(c, phi_sq=float(np.sum(c.features(np.zeros(2)) ** 2)))
    rng = np.random.default_rng(5)
    xs, ys, ts = _stream(rng, 12, 1.7e9)
    for x, y, t in zip(xs, ys, ts, strict=True):
        c.advance(t)
        c.learn(x, np.clip(y, -3, 3))
    upd = learner.take_update()
    assert upd is not None and upd.n_samples == 12 and float(upd.arrays["n"]) < 12
    server = FedBNRServer.for_client(c, fit_hyperparameters=False)
    phi_sq = learner.phi_sq
    agg = FedBNRAggregation(server, phi_sq=phi_sq, phi_sq_min=phi_sq, label_bound=3.0)

    def message(arrays: dict, n_samples: int) -> Message:
        return Message("f", "a", UPDATE, upd.seq, 0, c.kernel_version, n_samples, 0.0, arrays)

    up = agg.check(message(dict(upd.arrays), upd.n_samples))
    assert up.count == 12 and up.time == ts[-1]
    # a forged count: fewer real samples (n_samples, what the rate limit charges) than the discounted n claims —
    # each sample weighs at most 1, so an upload's weight never exceeds the samples it is charged for
    n = float(upd.arrays["n"])
    with pytest.raises(ValueError, match="claims more samples"):  # the trace pins the count (RFF: one norm)
        agg.check(message(dict(upd.arrays, n=np.asarray(12.5)), 12))
    assert n >= 2
    with pytest.raises(ValueError, match="discounted count"):
        agg.check(message(dict(upd.arrays), int(n) - 1))
    # a time that is not finite
    with pytest.raises(ValueError, match="not finite"):
        agg.check(message(dict(upd.arrays, time=np.asarray(np.inf)), 12))
    # scaled-up statistics: beyond the trace bound of the discounted count
    inflated = dict(upd.arrays, S_upper=2 * upd.arrays["S_upper"])
    with pytest.raises(ValueError, match="tr S"):
        agg.check(message(inflated, 12))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(-3, 3), st.floats(-3, 3), st.floats(0, 1e6)), min_size=1, max_size=20),
       st.floats(1.0, 1e5))
def test_discount_keeps_the_statistics_checks_satisfied(rows: list, half_life: float) -> None:
    """The trace, label, Cauchy–Schwarz and PSD bounds are homogeneous: they hold for discounted statistics of
    samples that satisfy them."""
    c = FedBNRClient(n_inputs=2, n_features=3, min_upload=1, half_life_s=half_life)
    phi_sq = float(np.sum(c.features(np.zeros(2)) ** 2))
    for x0, y, dt in rows:
        c.advance(max(c.clock, 0.0) + dt)
        c.learn(np.array([x0, -x0]), y)
    up = c.make_upload()
    assert up is not None
    assert 0 < up.stats.n <= up.count
    check_statistics(up.stats, max_abs=1e100, phi_sq=phi_sq, phi_sq_min=phi_sq, label_bound=3.0, whole_n=False)


def test_server_brings_earlier_and_later_uploads_to_one_reference_time() -> None:
    d = Discount(H)
    one = SufficientStats.from_samples(np.ones((1, 1, 2)), np.ones(1))
    server = RobustFedBNRServer(dim=2, min_samples=1, fit_hyperparameters=False, half_life_s=H)
    server.apply(Upload("a", 1, 0, one, time=2 * H, count=1))
    server.apply(TemperedUpload("b", 1, 0, one, time=0.0, count=1, weight=0.5))  # older, tempered
    server.apply(Upload("c", 1, 0, one, time=3 * H, count=1))  # newer: the sums move to 3H
    assert server.time == 3 * H
    assert server.stats.n == pytest.approx(0.5 + 0.5**3 * 0.5 + 1.0, rel=1e-15)
    assert d.factor(3 * H, 0.0) == 1.0  # never inflates


def test_uploads_without_a_time_are_refused_by_a_forgetting_server_and_vice_versa() -> None:
    one = SufficientStats.from_samples(np.ones((1, 1, 2)), np.ones(1))
    timed = FedBNRServer(dim=2, min_samples=1, half_life_s=H)
    with pytest.raises(ValueError, match="not time-discounted"):
        timed.apply(Upload("a", 1, 0, one))
    plain = FedBNRServer(dim=2, min_samples=1)
    with pytest.raises(ValueError, match="does not forget"):
        plain.apply(Upload("a", 1, 0, one, time=1.0, count=1))
    # the privacy floor counts real samples, not the discounted n
    floor = FedBNRServer(dim=2, min_samples=2, half_life_s=H)
    with pytest.raises(ValueError, match="privacy floor"):
        floor.apply(Upload("a", 1, 0, one, time=1.0, count=1))


def test_learner_on_the_agents_clock_round_trips_through_the_wire() -> None:
    class Clocked(StatsLearner):
        t = 1.7e9

        def now(self) -> float:
            self.t += 900.0
            return self.t

    c = _client("a")
    learner = Clocked(c, phi_sq=float(np.sum(c.features(np.zeros(2)) ** 2)))
    rng = np.random.default_rng(2)
    for x in rng.uniform(-1, 1, (4, 2)):
        learner.learn(x, float(x[0]))
    upd = learner.take_update()
    assert upd is not None and float(upd.arrays["time"]) == 1.7e9 + 4 * 900.0
    server = FedBNRServer.for_client(c, fit_hyperparameters=False)
    agg = FedBNRAggregation(server, phi_sq=learner.phi_sq)
    msg = Message("f", "a", UPDATE, upd.seq, 0, c.kernel_version, upd.n_samples, 0.0, dict(upd.arrays))
    agg.take("a", upd.seq, agg.check(msg))
    assert agg.close_window({}, lambda _: 0)
    out = agg.global_message("f", "agg", c.kernel_version)
    assert float(out.arrays["time"]) == 1.7e9 + 4 * 900.0
    assert learner.install_global(out)
    g = GlobalModel.from_message(GlobalModel(1, "v", 0, server.stats, np.ones(1), np.ones(1), np.zeros(1),
                                             time=5.0).to_message())
    assert g.time == 5.0


def test_without_a_half_life_nothing_changes_on_the_wire() -> None:
    c = FedBNRClient(n_inputs=2, n_features=3, min_upload=1)
    c.advance(1e9)  # a no-op without a half-life
    c.learn(np.zeros(2), 1.0)
    up = c.make_upload()
    assert up is not None and up.count == 0 and "time" not in up.to_message()
    with pytest.raises(ValueError, match="exclusive"):
        FedBNRClient(n_inputs=2, n_features=3, forgetting=0.99, half_life_s=H)


def test_robust_shares_follow_the_discounted_sums() -> None:
    """Robust mode's per-client shares are each client's weight in the discounted sums (not its lifetime
    samples): a client that uploaded long ago holds a small share of the current global."""
    from streamfed.algorithms.shares import Robust

    one = SufficientStats.from_samples(np.ones((4, 1, 2)), np.ones(4), kernel_version="v")
    server = RobustFedBNRServer(dim=2, kernel_version="v", min_samples=1, fit_hyperparameters=False,
                                half_life_s=H)
    agg = FedBNRAggregation(server, phi_sq=2.0, robust=Robust(share_cap=1.0, floor=1e9, screen_clients=1))
    agg.take("old", 1, Upload("old", 1, 0, one, time=0.0, count=4))
    agg.take("new", 1, Upload("new", 1, 0, one, time=0.0, count=4))
    agg.take("new", 2, Upload("new", 2, 0, one, time=3 * H, count=4))  # the sums move to 3H
    agg.take("old", 2, Upload("old", 2, 0, one.scaled(0.5), time=H, count=4))  # late, older: moved to 3H
    held = {"old": 4 * 0.5**3 + 2 * 0.5**2, "new": 4 * 0.5**3 + 4}
    total = sum(held.values())
    assert server.stats.n == pytest.approx(total, rel=1e-14)
    shares = agg.client_shares()
    for c, h in held.items():
        assert shares[c] == pytest.approx(h / total, rel=1e-12)


def test_an_upload_stamped_in_the_future_is_refused() -> None:
    """Attack: a client stamping its upload years ahead would move the sums to that time and discount every other
    client's statistics to nothing. The aggregator refuses times beyond its clock (plus a small skew)."""
    c = _client("a")
    now = 1.7e9
    for i, x in enumerate(np.random.default_rng(1).uniform(-1, 1, (4, 2))):
        c.advance(now + i)
        c.learn(x, 0.5)
    learner = StatsLearner(c, phi_sq=float(np.sum(c.features(np.zeros(2)) ** 2)))
    upd = learner.take_update()
    assert upd is not None
    agg = FedBNRAggregation(FedBNRServer.for_client(c, fit_hyperparameters=False), phi_sq=learner.phi_sq)
    agg.now = lambda: now + 10.0  # type: ignore[method-assign]
    msg = Message("f", "a", UPDATE, upd.seq, 0, c.kernel_version, upd.n_samples, 0.0, dict(upd.arrays))
    assert agg.check(msg).time == now + 3
    future = dict(upd.arrays, time=np.asarray(now + 10 * 365 * 86400.0))
    with pytest.raises(ValueError, match="ahead of this aggregator's clock"):
        agg.check(Message("f", "a", UPDATE, upd.seq, 0, c.kernel_version, upd.n_samples, 0.0, future))


def test_a_restored_client_and_server_continue_bit_for_bit() -> None:
    from streamfed.fleet.persistence import dumps, loads

    rng = np.random.default_rng(4)
    xs, ys, ts = _stream(rng, 40, 1.7e9)
    c = _client("a")
    server = FedBNRServer.for_client(c, fit_hyperparameters=False)
    for x, y, t in zip(xs[:25], ys[:25], ts[:25], strict=True):
        c.advance(t)
        c.learn(x, y)
    up = c.make_upload()
    assert up is not None
    server.apply(up)
    c.advance(ts[25])
    c.learn(xs[25], ys[25])  # pending after the upload
    state = loads(dumps({"kind": "t", "client": c, "server": server}))
    twins = [(c, server), (state["client"], state["server"])]
    outs = []
    for cl, sv in twins:
        cl.apply_global(sv.publish())
        for x, y, t in zip(xs[26:], ys[26:], ts[26:], strict=True):
            cl.advance(t)
            cl.learn(x, y)
        u = cl.make_upload()
        sv.apply(u)
        outs.append((cl.predict(xs[0]), sv.publish().stats.S.copy(), u.time))
    assert outs[0][0] == outs[1][0] and outs[0][2] == outs[1][2]
    assert np.array_equal(outs[0][1], outs[1][1])


def test_a_fleet_config_with_a_half_life_carries_time_through_the_codec() -> None:
    """FedBNRParams.half_life_s reaches the learner, the aggregation and the wire schema: an update and a global
    survive the strict codec with their `time`, and the aggregation takes the update."""
    from streamfed.algorithms.fedbnr import ALGORITHM
    from streamfed.fleet.config import FleetConfig
    from streamfed.wire.message import decode, encode

    cfg = FleetConfig(fleet="f", algorithm="fedbnr", n_inputs=2, n_features=3, kernels=["gaussian:1.0"],
                      params={"half_life_s": H, "min_upload": 4})
    learner = ALGORITHM.learner(cfg, "a1", 0)
    for x in np.random.default_rng(0).uniform(-1, 1, (4, 2)):
        learner.learn(x, float(x[0]))
    upd = learner.take_update()
    assert upd is not None and "time" in upd.arrays and upd.n_samples == 4
    msg = Message("f", "a1", UPDATE, upd.seq, 0, learner.client.kernel_version, upd.n_samples, 0.0,
                  dict(upd.arrays))
    back = decode(encode(msg, cfg), cfg)
    agg = ALGORITHM.aggregation(cfg)
    agg.take("a1", back.seq, agg.check(back))
    assert agg.close_window({}, lambda _: 0)
    out = decode(encode(agg.global_message("f", "agg", learner.client.kernel_version), cfg), cfg)
    assert float(out.arrays["time"]) == pytest.approx(float(upd.arrays["time"]))
    assert learner.install_global(out)
    # without a half-life the schema has no time: a timed update is refused by the codec
    plain = FleetConfig(fleet="f", algorithm="fedbnr", n_inputs=2, n_features=3, kernels=["gaussian:1.0"])
    with pytest.raises(ValueError):
        encode(msg, plain)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abc"), st.lists(st.floats(0, 5 * H), min_size=1, max_size=5)),
                min_size=1, max_size=8),
       st.randoms(use_true_random=False))
def test_server_sums_are_exact_in_any_arrival_order(uploads: list, rnd: object) -> None:
    """Any uploads (each: samples at given times, discounted by the client to its latest one), in any order of
    arrival across clients: the server's sums at its reference time are numpy's weighted sums over all samples."""
    rng = np.random.default_rng(len(uploads))
    seqs: dict[str, int] = {}
    made, rows = [], []
    for client, ts in uploads:
        ts = np.sort(np.array(ts))
        phi = rng.standard_normal((len(ts), 1, 2))
        y = rng.standard_normal(len(ts))
        w = 0.5 ** ((ts[-1] - ts) / H)
        stats = SufficientStats(np.einsum("t,tki,tkj->kij", w, phi, phi), np.einsum("t,tki,t->ki", w, phi, y),
                                float(w.sum()), float(w @ y**2))
        seqs[client] = seqs.get(client, 0) + 1
        made.append(Upload(client, seqs[client], 0, stats, time=float(ts[-1]), count=len(ts)))
        rows.append((phi[:, 0], y, ts))
    rnd.shuffle(made)  # type: ignore[attr-defined]
    server = FedBNRServer(dim=2, min_samples=1, fit_hyperparameters=False, half_life_s=H)
    for up in made:
        server.apply(up)
    phis, ys, ts = (np.concatenate(r) for r in zip(*rows, strict=True))
    assert server.time == ts.max()
    w = 0.5 ** ((server.time - ts) / H)
    np.testing.assert_allclose(server.stats.S[0], (phis * w[:, None]).T @ phis, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(server.stats.b[0], phis.T @ (w * ys), rtol=1e-12, atol=1e-12)
    assert server.stats.n == pytest.approx(w.sum(), rel=1e-12)
    assert server.stats.q == pytest.approx(w @ ys**2, rel=1e-12)


def test_agents_forget_on_the_readings_time_base_and_the_fleet_equals_the_centralised_posterior() -> None:
    """Real agents and the aggregator core through the codec: readings stamped years in the past (a replayed
    CSV, a sensor's own clock) are discounted by *their* times, not by this process's clock — every upload is
    stamped with its last reading's time, and the global equals the centralised discounted statistics of every
    uploaded sample at the global's time (written out above, `_central`)."""
    from streamfed.fleet.agent import AgentCore
    from streamfed.fleet.aggregator import AggregatorCore
    from streamfed.fleet.config import FleetConfig
    from streamfed.fleet.sources import Reading
    from streamfed.wire.message import decode, encode

    names = ["a", "b", "c"]
    cfg = FleetConfig(fleet="f", algorithm="fedbnr", n_inputs=2, n_features=4, kernels=["gaussian:1.0"],
                      standardise="none", clients=tuple(names),
                      params={"half_life_s": H, "min_upload": 4, "sigma": SIGMA, "lam": LAM,
                              "fit_hyperparameters": False, "calibrate": False})
    agents = {n: AgentCore(cfg, n, i) for i, n in enumerate(names)}
    core = AggregatorCore(cfg, clients=names, mode="async", window=0.0)
    rng = np.random.default_rng(5)
    streams = {n: _stream(rng, 25 + 6 * i, start=1.36e9 + 900.0 * i) for i, n in enumerate(names)}  # 2013
    uploaded = dict.fromkeys(names, 0)
    stamps: list[float] = []
    order = sorted((t, n, j) for n, (_, _, ts) in streams.items() for j, t in enumerate(ts))
    for _t, n, j in order:  # one fleet clock: readings in time order across agents
        xs, ys, ts = streams[n]
        _, msgs = agents[n].on_reading(Reading(f"{n}{j}", xs[j], float(ts[j]), float(ys[j])), now=1.8e9)
        for m in msgs:
            if m.kind.endswith(".update"):
                uploaded[n] += int(m.n_samples)
                stamps.append(float(m.arrays["time"]))
                assert float(m.arrays["time"]) == float(ts[uploaded[n] - 1])  # its last reading's time
                out = core.on_update(n, encode(m, cfg), now=1.8e9)
                for g in out:
                    if g.kind.endswith(".global"):
                        for a in agents.values():
                            a.on_global(decode(encode(g, cfg), cfg, kernel_version=a.kernel_version), now=1.8e9)
    assert all(uploaded.values()) and max(stamps) < 1.4e9  # the readings' times, not the clock's (1.8e9)
    server = core.aggregation.server
    feats = agents["a"].learner.client
    rows = [(np.array([feats.features(x)[0] for x in streams[n][0][:k]]), streams[n][1][:k], streams[n][2][:k])
            for n, k in uploaded.items()]
    phis, ys, ts = (np.concatenate(r) for r in zip(*rows, strict=True))
    s, b, nw, q, _, _ = _central(phis, ys, ts, server.time)
    assert server.time == max(stamps)
    np.testing.assert_allclose(server.stats.S[0], s, rtol=1e-11, atol=1e-11)
    np.testing.assert_allclose(server.stats.b[0], b, rtol=1e-11, atol=1e-11)
    assert float(server.stats.n) == pytest.approx(nw, rel=1e-12)
    assert float(server.stats.q) == pytest.approx(q, rel=1e-12)


def test_personalised_agents_forget_on_the_readings_time_base() -> None:
    """Personalised FedBNR with `half_life_s`: the same time base. Each client's statistics the server holds,
    brought to the global's time, are the discounted statistics of its uploaded samples by their readings'
    times (`_central`) — a client that samples four times as fast has its past weighed by hours, not by its own
    sample count — and an upload stamped far ahead of the aggregator's clock is refused."""
    from streamfed.algorithms.fedbnr_personal import PersonalParams
    from streamfed.fleet.agent import AgentCore
    from streamfed.fleet.aggregator import AggregatorCore
    from streamfed.fleet.config import FleetConfig
    from streamfed.fleet.sources import Reading
    from streamfed.wire.message import encode

    with pytest.raises(ValueError, match="one or the other"):
        PersonalParams(half_life_s=H, forgetting=0.99)
    names = ["fast", "slow"]
    cfg = FleetConfig(fleet="f", algorithm="fedbnr-personal", n_inputs=2, n_features=4,
                      kernels=["gaussian:1.0"], standardise="none", clients=tuple(names),
                      params={"half_life_s": H, "min_upload": 4, "fit_hyperparameters": False, "calibrate": False})
    agents = {n: AgentCore(cfg, n, i) for i, n in enumerate(names)}
    core = AggregatorCore(cfg, clients=names, mode="async", window=0.0)
    rng = np.random.default_rng(8)
    streams = {}
    for n, gap in (("fast", 900.0), ("slow", 3600.0)):
        xs = rng.uniform(-2, 2, (24, 2))
        streams[n] = (xs, np.sin(xs[:, 0]) + 0.1 * rng.standard_normal(24), 1.36e9 + gap * np.arange(1, 25))
    uploaded = dict.fromkeys(names, 0)
    last = None
    for t, n, j in sorted((t, n, j) for n, (_, _, ts) in streams.items() for j, t in enumerate(ts)):
        xs, ys, ts = streams[n]
        for m in agents[n].on_reading(Reading(f"{n}{j}", xs[j], float(t), float(ys[j])), now=1.8e9)[1]:
            if m.kind.endswith(".update"):
                uploaded[n] += int(m.n_samples)
                assert float(m.arrays["time"]) == float(ts[uploaded[n] - 1])
                core.on_update(n, encode(m, cfg), now=1.8e9)
                last = m
    server = core.aggregation.server
    t_ref = max(streams[n][2][uploaded[n] - 1] for n in names)
    held = server.stats_at(t_ref)
    feats = getattr(agents["fast"].learner.client, "personal", agents["fast"].learner.client)
    for n in names:
        xs, ys, ts = (a[:uploaded[n]] for a in streams[n])
        s, b, nw, q, _, _ = _central(np.array([feats.features_many(x[None])[0] for x in xs]), ys, ts, t_ref)
        np.testing.assert_allclose(held[n].S, s, rtol=1e-11, atol=1e-11)
        np.testing.assert_allclose(held[n].b, b, rtol=1e-11, atol=1e-11)
        assert float(held[n].n) == pytest.approx(nw, rel=1e-12) and float(held[n].q) == pytest.approx(q, rel=1e-12)
    assert last is not None
    future = Message(last.fleet, last.client, last.kind, last.seq + 1, last.global_version, last.kernel_version,
                     last.n_samples, 0.0, dict(last.arrays, time=np.asarray(1e11)), {}, {}, last.epoch)
    with pytest.raises(ValueError, match="ahead of this aggregator's clock"):
        core.aggregation.check(future)


def test_replay_discounts_by_the_rows_times() -> None:
    """`replay` hands each learner its row's time: a ten-year gap in the streams' clock (thousands of half-lives)
    forgets everything, so the first prediction after it is as uncertain as the very first one — on the replay's
    own clock (a fraction of a second) nothing would have been forgotten."""
    from streamfed.evaluation.datasets.base import ClientStream, Fleet
    from streamfed.evaluation.replay import AlgorithmConfig, replay

    rng = np.random.default_rng(4)
    hours = np.concatenate([np.arange(20), 24 * 3650 + np.arange(20)]).astype("timedelta64[h]")
    times = np.datetime64("2013-03-01T00", "h") + hours
    streams = []
    for name in ("a", "b"):
        X = rng.uniform(-1, 1, (40, 2))
        streams.append(ClientStream(name, X, np.sin(X[:, 0]) + 0.05 * rng.standard_normal(40), ("u", "v"),
                                    time=times))
    fleet = Fleet(tuple(streams), "synthetic", "none", "test")
    cfg = AlgorithmConfig(kernels=("gaussian:1.0",), n_features=8,
                          params={"fedbnr": {"half_life_s": 10 * 86400.0, "min_upload": 4, "sigma": 0.1,
                                             "fit_hyperparameters": False, "calibrate": False}})
    res = replay(fleet, "fedbnr", cfg)
    for v in res.variances:
        assert v[19] < 0.2 * v[0]  # learned: far more certain than the prior
        assert v[20] > 0.9 * v[0]  # after the gap: back to (almost) the prior


def test_a_discounted_count_rounded_above_the_raw_count_is_accepted() -> None:
    """Rows that all weigh 1 (learned at the clock's time) are staged relative to a reference time and scaled back:
    their discounted count can round a few ulp above the raw count. Such an upload is valid; one really above it
    is not."""
    one = SufficientStats.from_samples(np.ones((1, 1, 2)), np.ones(1))
    n = 32.00000000000001
    assert n > 32
    server = FedBNRServer(dim=2, min_samples=1, half_life_s=H)
    server.apply(Upload("a", 1, 0, one.scaled(n), time=1.0, count=32))
    with pytest.raises(ValueError, match="discounted count"):
        server.apply(Upload("b", 1, 0, one.scaled(32.001), time=1.0, count=32))


def _gappy_fleet(rng: np.random.Generator, n_clients: int = 3, rows: int = 60) -> object:
    """Hourly streams, each missing its own random hours (as Beijing's rows skipped for a missing value)."""
    from streamfed.evaluation.datasets.base import ClientStream, Fleet

    streams = []
    for c in range(n_clients):
        hours = np.sort(rng.choice(rows * 2, rows, replace=False)).astype("timedelta64[h]")
        X = rng.uniform(-1, 1, (rows, 2))
        streams.append(ClientStream(f"s{c}", X, np.sin(X[:, 0]) + 0.05 * rng.standard_normal(rows), ("u", "v"),
                                    time=np.datetime64("2013-03-01T00", "h") + hours))
    return Fleet(tuple(streams), "synthetic", "none", "test")


def test_an_aligned_replay_steps_through_the_fleets_times() -> None:
    """`align_times`: one step per distinct time of the fleet, each client taking its rows at their times — every
    row scored once; a client alone in the fleet (local-only) sees its rows in the same order as unaligned."""
    from dataclasses import replace

    from streamfed.evaluation.replay import AlgorithmConfig, replay

    fleet = _gappy_fleet(np.random.default_rng(7))
    cfg = AlgorithmConfig(kernels=("gaussian:1.0",), n_features=8,
                          params={"fedbnr": {"half_life_s": 10 * H, "min_upload": 4}})
    grid = np.unique(np.concatenate([s.time for s in fleet.streams]))
    aligned = replay(fleet, "fedbnr", cfg, align_times=True)
    assert aligned.rounds == grid.size and aligned.rounds < 60 * 3
    assert all(np.isfinite(q).all() and q.size == 60 for q in aligned.sq_errors)
    assert aligned.rejected.sum() == 0
    local = [replay(fleet, "fedbnr-local", cfg, align_times=a) for a in (False, True)]
    for a, b in zip(local[0].sq_errors, local[1].sq_errors, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-9)  # (the stage is flushed at other steps: rounding only)
    # federated, the order matters: aligned and unaligned fleets exchange different globals
    assert not all(np.array_equal(a, b) for a, b in zip(aligned.sq_errors,
                                                         replay(fleet, "fedbnr", cfg).sq_errors, strict=True))
    dup = np.array(fleet.streams[0].time)
    dup[1] = dup[0]
    twice = replace(fleet, streams=(replace(fleet.streams[0], time=dup), *fleet.streams[1:]))
    with pytest.raises(ValueError, match="two rows with one time"):
        replay(twice, "fedbnr", cfg, align_times=True)
