"""Forgetting that federates exactly, for FSGP (`half_life_s`, docs/algorithms.md, FSGP "Forgetting").

The transcription: a sample `(x_i, y_i)` observed at time `t_i` weighs `w_i = 2^(−(T − t_i)/h)` at reference time
`T`; with `k_i = c(Z, x_i)` (the SE covariance written out entry by entry) the discounted statistics are

    P = Σ w_i k_i k_iᵀ,   r = Σ w_i k_i y_i,   n = Σ w_i,   q = Σ w_i y_i²,

a tempered (robust) upload's samples weigh `share · w_i`, and a version change carries statistics by Bui et al.'s
map `P' = (σ'²/σ²) W P Wᵀ`, `r' = (σ'²/σ²) W r`, `q' = (σ'²/σ²) q`, `W = c'(Z', Z) C⁻¹` (dense inverses here).
The predictive is Titsias' from those weighted samples. Everything below is compared with these, written directly
with numpy over every sample of every client.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamfed.algorithms.fsgp.aggregation import FSGPAggregation, check_statistics
from streamfed.algorithms.fsgp.client import FSGPClient
from streamfed.algorithms.fsgp.kernels import Hyper
from streamfed.algorithms.fsgp.messages import TemperedUpload, Upload
from streamfed.algorithms.fsgp.posterior import Stats
from streamfed.algorithms.fsgp.projection import ProjectionMap
from streamfed.algorithms.fsgp.server import FSGPServer, RobustFSGPServer
from streamfed.algorithms.fsgp.wire import PARTIAL, UPDATE, update_arrays
from streamfed.core.discount import Discount
from streamfed.wire.message import Message

H = 3600.0  # half-life, seconds
SIGMA = 0.3
JITTER = 1e-6
T0 = 1.7e9


def plain_cov(h: Hyper, A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """SE covariance, entry by entry."""
    amp, ls = math.exp(h.log_amp), np.exp(h.log_ls)
    return np.array([[amp * amp * math.exp(-0.5 * float(np.sum(((a - b) / ls) ** 2))) for b in B] for a in A])


def hyper0() -> Hyper:
    Z = np.array([[-1.5, -1.0], [-0.5, 1.0], [0.0, 0.0], [0.7, -0.8], [1.5, 1.2]])
    return Hyper.initial("se", Z, amplitude=1.0, lengthscale=1.0, sigma=SIGMA)


def central(h: Hyper, X: np.ndarray, y: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray, float, float]:
    """`(P, r, n, q)` of samples `X, y` with weights `w`, under `h`."""
    K = plain_cov(h, X, h.Z)
    return (K * w[:, None]).T @ K, K.T @ (w * y), float(w.sum()), float(w @ y**2)


def weights(t: np.ndarray, t_ref: float) -> np.ndarray:
    return 0.5 ** ((t_ref - np.asarray(t)) / H)


def plain_projection(old: Hyper, new: Hyper, P: np.ndarray, r: np.ndarray, q: float) -> tuple:
    C_a = plain_cov(old, old.Z, old.Z) + JITTER * math.exp(2 * old.log_amp) * np.eye(old.m)
    W = plain_cov(new, new.Z, old.Z) @ np.linalg.inv(C_a)
    ratio = math.exp(2 * new.log_sigma) / math.exp(2 * old.log_sigma)
    return ratio * W @ P @ W.T, ratio * W @ r, ratio * q


def plain_predictive(h: Hyper, X: np.ndarray, y: np.ndarray, w: np.ndarray, x: np.ndarray) -> tuple[float, float]:
    """Titsias' sparse-GP predictive from weighted samples (dense inverses)."""
    amp2, s2 = math.exp(2 * h.log_amp), math.exp(2 * h.log_sigma)
    Kmm = plain_cov(h, h.Z, h.Z) + JITTER * amp2 * np.eye(h.m)
    k = plain_cov(h, h.Z, x[None, :])[:, 0]
    Kmn = plain_cov(h, h.Z, X) if len(y) else np.zeros((h.m, 0))
    A = Kmm + (Kmn * w) @ Kmn.T / s2
    mean = float(k @ np.linalg.inv(A) @ Kmn @ (w * y)) / s2
    var = amp2 + s2 - float(k @ (np.linalg.inv(Kmm) - np.linalg.inv(A)) @ k)
    return mean, max(var, s2)


def stream(rng: np.random.Generator, n: int, start: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    X = rng.uniform(-2, 2, (n, 2))
    y = np.sin(X[:, 0]) + 0.5 * X[:, 1] + 0.1 * rng.standard_normal(n)
    # irregular clocks: gaps of 0 (the same timestamp) to 2 hours
    return X, y, start + np.cumsum(rng.choice([0.0, 60.0, 1800.0, 7200.0], n))


def client(name: str, h: Hyper, **kw: object) -> FSGPClient:
    kw.setdefault("personal", False)
    return FSGPClient(h, min_upload=4, client_id=name, learn_hyperparameters=False, half_life_s=H, jitter=JITTER,
                      **kw)  # type: ignore[arg-type]


def close(a: np.ndarray | float, b: np.ndarray | float, rel: float = 1e-11) -> None:
    """Equal to rounding, relative to the larger array's scale."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    np.testing.assert_allclose(a, b, rtol=rel, atol=rel * max(float(np.max(np.abs(b))), 1e-300))


# ----------------------------------------------------------------------------------------------------- the fleet
@pytest.mark.parametrize("seed", [0, 1])
def test_fleet_global_equals_the_centralised_discounted_statistics(seed: int) -> None:
    """Three clients on irregular clocks upload at different times; the server sums them out of order (across and
    within clients), takes one upload tempered (robust share 0.4), moves to a new `(θ, σ, Z)` between two phases
    (late epoch-0 uploads are carried one by one), and the clients carry their pending samples over. The global
    equals the centralised discounted statistics: the projection of the epoch-0 samples' plus the epoch-1
    samples', each sample weighted `2^(−(T − t)/h)` (× the share)."""
    rng = np.random.default_rng(seed)
    h0 = hyper0()
    server = RobustFSGPServer(h0, min_samples=4, learn_hyperparameters=False, half_life_s=H, jitter=JITTER)
    names = ["a", "b", "c"]
    clients = {n: client(n, h0, personal=(n == "b")) for n in names}
    data = {n: stream(rng, 60 + 5 * i, T0 + 700.0 * i) for i, n in enumerate(names)}
    n1 = {n: 23 + 3 * i for i, n in enumerate(names)}  # samples each learns in phase 1 (epoch 0)
    uploads: list[Upload] = []
    for n in names:
        c, (X, y, t) = clients[n], data[n]
        for j in range(n1[n]):
            c.advance(t[j])
            c.learn(X[j], y[j])
            if j % 6 == 5:
                up = c.make_upload()
                assert up is not None and up.time == t[j] and up.count == 6 and up.stats.n < 6
                uploads.append(up)
    order = rng.permutation(len(uploads))
    early, late = order[: len(order) // 2], order[len(order) // 2:]
    share: dict[tuple[str, int], float] = {}
    for i in early:
        server.apply(uploads[i])
    # the version change: a new (θ, σ, Z), as an average of proposals would make it
    new = Hyper.initial("se", h0.Z + 0.15, amplitude=1.2, lengthscale=0.8, sigma=0.25)
    server.prop_sum, server.prop_weight = new.to_vector() * 8.0, 8.0
    assert server.move() and server.epoch == 1
    h1 = server.hyper
    for k, i in enumerate(late):  # epoch-0 uploads after the change: carried by the server, one of them tempered
        up = uploads[i]
        if k == 0:
            share[(up.client, up.seq)] = 0.4
            up = TemperedUpload(up.client, up.seq, up.base_version, up.stats, up.proposal, up.weight,
                                time=up.time, count=up.count, share=0.4)
        server.apply(up)
    g = server.publish()
    assert g.epoch == 1 and g.time == max(u.time for u in uploads)
    k_up = {}  # per client: the samples its uploads cover (its first k)
    for n in names:
        c, (X, y, t) = clients[n], data[n]
        assert c.apply_global(g)  # pending (epoch 0) carried over by the client
        assert c.clock == max(t[n1[n] - 1], g.time) and c.epoch == 1 and getattr(c, "n_clamped", 0) == 0
        # on one fleet clock the next readings come after the global (a reading older than a client's clock would
        # count as taken at the clock: statistics never move back in time)
        t[n1[n]:] += max(g.time - t[n1[n]], 0.0)
        for j in range(n1[n], len(y)):
            c.advance(t[j])
            c.learn(X[j], y[j])
            if j % 7 == 6:
                server.apply(c.make_upload())
        last = c.make_upload()
        if last is not None:
            server.apply(last)
        k_up[n] = len(y) - c.n_pending
        assert c.n_pending < 4
    T = server.time
    # the transcription: epoch-0 samples' statistics at T, carried; epoch-1 samples' at T
    P0, r0, q0, P1, r1, q1, nn = np.zeros((5, 5)), np.zeros(5), 0.0, np.zeros((5, 5)), np.zeros(5), 0.0, 0.0
    seqs = {n: 0 for n in names}
    for up in uploads:  # which phase-1 samples went out in which (possibly tempered) upload
        seqs[up.client] = max(seqs[up.client], up.seq)
    for n in names:
        X, y, t = (a[: k_up[n]] for a in data[n])
        w = weights(t, T)
        for (cl, seq), s in share.items():
            if cl == n:
                w[(seq - 1) * 6: seq * 6] *= s
        ph1 = np.arange(len(y)) < n1[n]
        P, r, nw, q = central(h0, X[ph1], y[ph1], w[ph1])
        P0, r0, q0, nn = P0 + P, r0 + r, q0 + q, nn + nw
        P, r, nw, q = central(h1, X[~ph1], y[~ph1], w[~ph1])
        P1, r1, q1, nn = P1 + P, r1 + r, q1 + q, nn + nw
    Pc, rc, qc = plain_projection(h0, h1, P0, r0, q0)
    out = server.publish().stats
    close(out.P, Pc + P1, 1e-12)
    close(out.r, rc + r1, 1e-12)
    assert out.n == pytest.approx(nn, rel=1e-12) and out.q == pytest.approx(qc + q1, rel=1e-12)
    assert out.n < sum(k_up.values())  # discounted, not a count


def test_projection_commutes_with_the_discount() -> None:
    """A projection is linear and a discount a scalar: carrying discounted statistics is discounting carried ones,
    so the server may carry its sums (held at its time) and late uploads (held at theirs) in any order."""
    rng = np.random.default_rng(3)
    h0 = hyper0()
    h1 = Hyper.initial("se", h0.Z * 0.9 + 0.1, amplitude=0.8, lengthscale=1.3, sigma=0.4)
    X, y = rng.uniform(-2, 2, (30, 2)), rng.standard_normal(30)
    s = Stats.from_samples(plain_cov(h0, X, h0.Z), y)
    step, d = ProjectionMap(h0, h1, 1, JITTER), Discount(H)
    for dt in (0.0, 1800.0, 5 * H):
        a, b = step(d.shift(s, T0, T0 + dt)), d.shift(step(s), T0, T0 + dt)
        close(a.P, b.P, 1e-12)
        close(a.r, b.r, 1e-12)
        assert (a.n, a.q) == pytest.approx((b.n, b.q), rel=1e-14)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abc"), st.lists(st.floats(0, 5 * H), min_size=4, max_size=6)),
                min_size=1, max_size=8),
       st.randoms(use_true_random=False))
def test_server_sums_are_exact_in_any_arrival_order(uploads: list, rnd: object) -> None:
    """Uploads of samples at any times (each discounted by its client to its latest one), arriving in any order:
    the sums at the server's reference time are the weighted sums over every sample."""
    rng = np.random.default_rng(len(uploads))
    h = hyper0()
    seqs: dict[str, int] = {}
    made, rows = [], []
    for name, ts in uploads:
        ts = np.sort(np.array(ts))
        X, y = rng.uniform(-2, 2, (len(ts), 2)), rng.standard_normal(len(ts))
        P, r, nw, q = central(h, X, y, weights(ts, ts[-1]))
        seqs[name] = seqs.get(name, 0) + 1
        made.append(Upload(name, seqs[name], 0, Stats(P, r, nw, q), time=float(ts[-1]), count=len(ts)))
        rows.append((X, y, ts))
    rnd.shuffle(made)  # type: ignore[attr-defined]
    server = FSGPServer(h, min_samples=4, learn_hyperparameters=False, half_life_s=H)
    for up in made:
        server.apply(up)
    X, y, ts = (np.concatenate(r) for r in zip(*rows, strict=True))
    assert server.time == ts.max()
    P, r, nw, q = central(h, X, y, weights(ts, server.time))
    close(server.stats.P, P, 1e-12)
    close(server.stats.r, r, 1e-12)
    assert server.stats.n == pytest.approx(nw, rel=1e-12) and server.stats.q == pytest.approx(q, rel=1e-12)


# ----------------------------------------------------------------------------------------------------- a client
@pytest.mark.parametrize("personal", [False, True])
def test_client_predicts_with_the_fresh_posterior_of_its_discounted_statistics(personal: bool) -> None:
    """A client that learned on an irregular clock, installed another client's global and kept learning predicts
    as a fresh sparse-GP posterior of every sample it knows of, each weighted by its age on its clock; its
    own-samples expert (personalised) is that of its own samples alone. An advance with no new sample discounts
    everything too."""
    rng = np.random.default_rng(7)
    h = hyper0()
    a, b = client("a", h, personal=personal), client("b", h)
    Xa, ya, ta = stream(rng, 30, T0)
    Xb, yb, tb = stream(rng, 12, T0 - 30 * H)  # all before a's first reading: the global is older than a's clock
    for x, y, t in zip(Xb, yb, tb, strict=True):
        b.advance(t)
        b.learn(x, y)
    server = FSGPServer(h, min_samples=4, learn_hyperparameters=False, half_life_s=H, jitter=JITTER)
    server.apply(b.make_upload())
    g = server.publish()
    for j, (x, y, t) in enumerate(zip(Xa, ya, ta, strict=True)):
        a.advance(t)
        a.learn(x, y)
        if j == 9:
            server.apply(a.make_upload())  # one own upload the global will not hold (unacked)
        if j == 17:
            assert a.apply_global(g)
    probes = rng.uniform(-2, 2, (4, 2))
    for extra in (0.0, 2.5 * H):
        a.advance(a.clock + extra)
        T = a.clock
        X, y = np.concatenate([Xa, Xb]), np.concatenate([ya, yb])
        w = np.concatenate([weights(ta, T), weights(tb, T)])
        for x in probes:
            glob, own = a.expert_predictions(x)
            m, v = plain_predictive(h, X, y, w, x)
            assert glob == pytest.approx((m, v), rel=1e-8, abs=1e-10)
            if personal:
                assert own == pytest.approx(plain_predictive(h, Xa, ya, weights(ta, T), x), rel=1e-8, abs=1e-10)
        _ = a.pending  # (folds the staged rows into the sums)
        mg, vg = a.post.predict_many(probes)  # the working posterior from its statistics, not the per-sample factor
        want = np.array([plain_predictive(h, X, y, w, x) for x in probes])
        np.testing.assert_allclose(np.column_stack([mg, vg]), want, rtol=1e-8, atol=1e-10)
    # the regret's comparator stays the undiscounted best fixed predictor: the ridge fit `kᵀw` of every own sample
    # at weight 1, `w = (KᵀK + σ²C)⁻¹Kᵀy`
    K = plain_cov(h, Xa, h.Z)
    C = plain_cov(h, h.Z, h.Z) + JITTER * np.eye(h.m)
    wr = np.linalg.solve(K.T @ K + SIGMA**2 * C, K.T @ ya)
    assert a.regret()["best_loss"] == pytest.approx(float(np.sum((ya - K @ wr) ** 2)), rel=1e-8)


def test_a_client_without_a_clock_refuses_to_learn_and_bad_times_are_refused() -> None:
    c = client("a", hyper0())
    with pytest.raises(ValueError, match="advance"):
        c.learn(np.zeros(2), 1.0)
    with pytest.raises(ValueError, match="finite"):
        c.advance(math.nan)
    c.advance(T0)
    c.learn(np.zeros(2), 1.0)
    c.advance(T0 - 10 * H)  # back in time: counts as the clock
    assert c.clock == T0
    plain = FSGPClient(hyper0(), min_upload=1, learn_hyperparameters=False)
    plain.advance(1e9)  # a no-op without a half-life
    plain.learn(np.zeros(2), 1.0)
    up = plain.make_upload()
    assert up is not None and up.count == 0 and "time" not in update_arrays(up, 2)


# ----------------------------------------------------------------------------------------------------- checks
def _timed_upload(n: int, gap: float) -> tuple[Upload, FSGPClient]:
    c = client("a", hyper0())
    for i, x in enumerate(np.random.default_rng(2).uniform(-1, 1, (n, 2))):
        c.advance(T0 + gap * i)
        c.learn(x, float(np.clip(x[0], -1, 1)))
    up = c.make_upload()
    assert up is not None
    return up, c


def _message(up: Upload, n_samples: int, **arrays: object) -> Message:
    return Message("f", up.client, UPDATE, up.seq, 0, "k", n_samples, 0.0,
                   {**update_arrays(up, 2), **{k: np.asarray(v) for k, v in arrays.items()}})


def test_the_privacy_floor_and_the_rate_limits_use_the_raw_count() -> None:
    """Discounted, 6 samples weigh n < 4; the privacy floor (4) counts the 6 real samples, and n_samples (what the
    rate limits charge) must be that raw count; a discounted n above it, a time that is not finite, or statistics
    beyond what the discounted n allows are refused."""
    up, _ = _timed_upload(6, H)
    assert up.count == 6 and up.stats.n < 4
    server = FSGPServer(hyper0(), min_samples=4, learn_hyperparameters=False, half_life_s=H)
    agg = FSGPAggregation(server, label_bound=1.0)
    got = agg.check(_message(up, 6))
    assert got.count == 6 and got.time == up.time and got.stats.n == pytest.approx(up.stats.n, rel=1e-15)
    # the envelope's n_samples is the raw count: charged for fewer samples than it holds, it is under the floor, or
    # (fewer than its discounted n) refused outright
    with pytest.raises(ValueError, match="privacy floor"):
        agg.check(_message(up, 3))
    with pytest.raises(ValueError, match="discounted count"):
        agg.check(_message(up, int(up.stats.n)))
    with pytest.raises(ValueError, match="discounted count"):
        agg.check(_message(up, 6, n=6.5))  # weighs more than its samples
    assert 6.000000000000001 > 6  # rows all at the clock's time: a few ulp above the count by rounding, valid
    assert agg.check(_message(up, 6, n=6.000000000000001)).count == 6
    with pytest.raises(ValueError, match="not finite"):
        agg.check(_message(up, 6, time=math.inf))
    with pytest.raises(ValueError, match="tr P"):
        agg.check(_message(up, 6, P_upper=update_arrays(up, 2)["P_upper"] * 50))
    floor = FSGPServer(hyper0(), min_samples=8, learn_hyperparameters=False, half_life_s=H)
    with pytest.raises(ValueError, match="privacy floor"):
        floor.apply(up)
    # a forgetting server refuses undiscounted uploads, and the other way round
    with pytest.raises(ValueError, match="not time-discounted"):
        server.apply(Upload("b", 1, 0, up.stats.copy()))
    with pytest.raises(ValueError, match="does not forget"):
        FSGPServer(hyper0(), min_samples=4, learn_hyperparameters=False).apply(up)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.floats(-2, 2), st.floats(-2, 2), st.floats(-1, 1), st.floats(0, 1e5)), min_size=1,
                max_size=12), st.floats(1.0, 1e5))
def test_discounted_statistics_pass_every_bound(rows: list, half_life: float) -> None:
    """The trace, label, Cauchy–Schwarz and PSD bounds are homogeneous in the sample weights: discounted
    statistics of honest samples pass them with the discounted n."""
    h = hyper0()
    c = FSGPClient(h, min_upload=1, learn_hyperparameters=False, half_life_s=half_life)
    t = 0.0
    for x0, x1, y, dt in rows:
        t += dt
        c.advance(t)
        c.learn(np.array([x0, x1]), y)
    up = c.make_upload()
    assert up is not None and 0 < up.stats.n <= up.count == len(rows)
    check_statistics(up.stats, max_abs=1e100, label_bound=1.0, feat_sq=h.m * h.amplitude**4, count=up.count)


def test_an_upload_stamped_in_the_future_is_refused() -> None:
    """Attack: an upload stamped years ahead would move the sums there and discount every other client's
    statistics to nothing. The aggregator refuses a time beyond its clock (plus a small skew)."""
    up, _ = _timed_upload(4, 1.0)
    agg = FSGPAggregation(FSGPServer(hyper0(), min_samples=4, learn_hyperparameters=False, half_life_s=H))
    agg.now = lambda: T0 + 10.0  # type: ignore[method-assign]
    assert agg.check(_message(up, 4)).time == T0 + 3
    with pytest.raises(ValueError, match="ahead of this aggregator's clock"):
        agg.check(_message(up, 4, time=T0 + 10 * 365 * 86400.0))


def test_robust_shares_follow_the_discounted_sums() -> None:
    """Robust mode's per-client shares are each client's weight in the discounted sums: a client that uploaded
    long ago holds a small share of the current global."""
    from streamfed.algorithms.shares import Robust

    h = hyper0()
    X = np.random.default_rng(1).uniform(-1, 1, (4, 2))
    one = Stats.from_samples(plain_cov(h, X, h.Z), np.zeros(4))
    agg = FSGPAggregation(RobustFSGPServer(h, min_samples=1, learn_hyperparameters=False, half_life_s=H),
                          robust=Robust(share_cap=1.0, floor=1e9, screen_clients=1))
    agg.take("old", 1, Upload("old", 1, 0, one, time=0.0, count=4))
    agg.take("new", 1, Upload("new", 1, 0, one, time=0.0, count=4))
    agg.take("new", 2, Upload("new", 2, 0, one, time=3 * H, count=4))  # the sums move to 3H
    agg.take("old", 2, Upload("old", 2, 0, one.scaled(0.5), time=H, count=4))  # late, older: moved to 3H
    held = {"old": 4 * 0.5**3 + 2 * 0.5**2, "new": 4 * 0.5**3 + 4}
    total = sum(held.values())
    assert agg.server.stats.n == pytest.approx(total, rel=1e-14)
    for c, s in agg.client_shares().items():
        assert s == pytest.approx(held[c] / total, rel=1e-12)


def test_shards_and_the_reducer_sum_discounted_partials_exactly() -> None:
    """Two shards sum uploads held at different times into partials stamped with their latest time; the reducer
    brings them to one time: the global equals a single server's sums."""
    h = hyper0()
    rng = np.random.default_rng(9)
    ups = []
    for i, name in enumerate("abcd"):
        X, y, t = stream(rng, 5, T0 + 1000.0 * i)
        P, r, nw, q = central(h, X, y, weights(t, t[-1]))
        ups.append(Upload(name, 1, 0, Stats(P, r, nw, q), time=float(t[-1]), count=5))

    def server() -> FSGPServer:
        return FSGPServer(h, min_samples=4, learn_hyperparameters=False, half_life_s=H)

    single = server()
    for up in ups:
        single.apply(up)
    shards = [FSGPAggregation(server()), FSGPAggregation(server())]
    reducer = FSGPAggregation(server())
    totals = []
    for shard, part in zip(shards, (ups[::2], ups[1::2]), strict=True):
        arrays, n, epoch = shard.partial(part)
        assert n == 10 and float(arrays["n"]) < 10
        totals.append(reducer.read_partial(Message("f", "s", PARTIAL, 1, 0, "k", n, 0.0, arrays, epoch=epoch)))
        reducer.check_sum(totals[-1], n)
    reducer.apply_partial(reducer.combine_partials(totals[::-1], {}), 4, {u.client: 1 for u in ups})
    assert reducer.server.time == single.time == max(u.time for u in ups)
    close(reducer.server.stats.P, single.stats.P, 1e-13)
    close(reducer.server.stats.r, single.stats.r, 1e-13)
    assert reducer.server.stats.n == pytest.approx(single.stats.n, rel=1e-13)


# ----------------------------------------------------------------------------------------------------- the fleet
def _cfg(names: list[str], **params: object):  # noqa: ANN202
    from streamfed.fleet.config import FleetConfig
    from streamfed.fleet.robustness import Robustness

    p = {"n_inducing": 5, "half_life_s": H, "min_upload": 4, "sigma": SIGMA, "learn_hyperparameters": False,
         "calibrate": False, "personal": False, "jitter": JITTER, **params}
    return FleetConfig(fleet="f", algorithm="fsgp", n_inputs=2, standardise="none", clients=tuple(names),
                       robust=Robustness(aggregation="exact"), params=p)


def test_agents_forget_on_the_readings_time_base_through_the_codec() -> None:
    """Real agents and the aggregator core through the strict codec: readings stamped in 2013 (a replayed CSV, a
    sensor's clock) are discounted by *their* times, not this process's clock; every upload carries its last
    reading's time and its raw count, and the global equals the centralised discounted statistics of every
    uploaded sample at the global's time."""
    from streamfed.algorithms.fsgp import initial_hyper
    from streamfed.fleet.agent import AgentCore
    from streamfed.fleet.aggregator import AggregatorCore
    from streamfed.fleet.sources import Reading
    from streamfed.wire.message import decode, encode

    names = ["a", "b", "c"]
    cfg = _cfg(names)
    h = initial_hyper(cfg)
    agents = {n: AgentCore(cfg, n, i) for i, n in enumerate(names)}
    core = AggregatorCore(cfg, clients=names, mode="async", window=0.0)
    rng = np.random.default_rng(5)
    streams = {n: stream(rng, 22 + 5 * i, 1.36e9 + 900.0 * i) for i, n in enumerate(names)}
    uploaded = dict.fromkeys(names, 0)
    stamps = []
    for _t, n, j in sorted((t, n, j) for n, (_, _, ts) in streams.items() for j, t in enumerate(ts)):
        X, y, ts = streams[n]
        for m in agents[n].on_reading(Reading(f"{n}{j}", X[j], float(ts[j]), float(y[j])), now=1.8e9)[1]:
            if m.kind.endswith(".update"):
                uploaded[n] += int(m.n_samples)
                assert float(m.arrays["time"]) == float(ts[uploaded[n] - 1]) and float(m.arrays["n"]) <= m.n_samples
                stamps.append(float(m.arrays["time"]))
                for g in core.on_update(n, encode(m, cfg), now=1.8e9):
                    if g.kind.endswith(".global"):
                        for a in agents.values():
                            a.on_global(decode(encode(g, cfg), cfg, kernel_version=a.kernel_version), now=1.8e9)
    assert all(uploaded.values()) and max(stamps) < 1.4e9
    server = core.aggregation.server
    assert server.time == max(stamps)
    rows = [tuple(a[:k] for a in streams[n]) for n, k in uploaded.items()]
    X, y, ts = (np.concatenate(r) for r in zip(*rows, strict=True))
    P, r, nw, q = central(h, X, y, weights(ts, server.time))
    close(server.stats.P, P, 1e-11)
    close(server.stats.r, r, 1e-11)
    assert server.stats.n == pytest.approx(nw, rel=1e-12) and server.stats.q == pytest.approx(q, rel=1e-12)
    g = decode(encode(core.aggregation.global_message("f", "agg", agents["a"].kernel_version), cfg), cfg)
    assert float(g.arrays["time"]) == server.time


def test_without_a_half_life_the_wire_is_unchanged_and_old_uploads_decode() -> None:
    """Backward compatibility: without a half-life the schemas hold no `time`, an upload decodes as before (count
    0), and a timed upload is refused by the codec; a global without `time` installs with time 0."""
    from streamfed.algorithms.fsgp import ALGORITHM
    from streamfed.wire.message import decode, encode

    plain = _cfg(["a"], half_life_s=None)
    assert not any("time" in s.array_names for s in ALGORITHM.schemas(plain))
    assert all("time" in s.array_names for s in ALGORITHM.schemas(_cfg(["a"])))
    learner = ALGORITHM.learner(plain, "a", 0)
    for x in np.random.default_rng(0).uniform(-1, 1, (4, 2)):
        learner.learn(x, float(x[0]))
    upd = learner.take_update()
    assert upd is not None and "time" not in upd.arrays and upd.n_samples == 4
    msg = Message("f", "a", UPDATE, upd.seq, 0, ALGORITHM.kernel_version(plain), upd.n_samples, 0.0,
                  dict(upd.arrays))
    back = decode(encode(msg, plain), plain)
    agg = ALGORITHM.aggregation(plain)
    up = agg.check(back)
    assert (up.count, up.time, up.stats.n) == (0, 0.0, 4.0)
    timed = Message("f", "a", UPDATE, upd.seq, 0, ALGORITHM.kernel_version(plain), upd.n_samples, 0.0,
                    dict(upd.arrays, time=np.asarray(T0)))
    with pytest.raises(ValueError):
        encode(timed, plain)
    agg.take("a", up.seq, up)
    assert agg.close_window({}, lambda _: 0)
    assert learner.install_global(agg.global_message("f", "agg", ALGORITHM.kernel_version(plain)))
    with pytest.raises(ValueError, match="exclusive"):
        ALGORITHM.learner(_cfg(["a"]).model_copy(update={"secure_aggregation": True}), "a", 0)
    # differential privacy clips and noises the statistics and the proposal; a timed upload's time stays public
    assert learner.upload_sensitivity(1.0).arrays is None
    timed_learner = ALGORITHM.learner(_cfg(["a"]), "a", 0)
    names = timed_learner.upload_sensitivity(1.0).arrays
    assert names is not None and "time" not in names and {"P_upper", "r", "q"} <= set(names)


def test_a_restored_client_and_server_continue_bit_for_bit() -> None:
    from streamfed.fleet.persistence import dumps, loads

    rng = np.random.default_rng(4)
    X, y, t = stream(rng, 30, T0)
    h = hyper0()
    c = client("a", h, personal=True)
    server = FSGPServer(h, min_samples=4, learn_hyperparameters=False, half_life_s=H)
    for j in range(20):
        c.advance(t[j])
        c.learn(X[j], y[j])
    server.apply(c.make_upload())
    c.advance(t[20])
    c.learn(X[20], y[20])  # pending after the upload
    state = loads(dumps({"kind": "t", "client": c, "server": server}))
    outs = []
    for cl, sv in ((c, server), (state["client"], state["server"])):
        cl.apply_global(sv.publish())
        for j in range(21, 30):
            cl.advance(t[j])
            cl.learn(X[j], y[j])
        u = cl.make_upload()
        sv.apply(u)
        outs.append((cl.predict(X[0]), sv.publish().stats.P.copy(), u.time, sv.time))
    assert outs[0][0] == outs[1][0] and outs[0][2:] == outs[1][2:]
    assert np.array_equal(outs[0][1], outs[1][1])


def test_replay_with_a_ten_year_gap_forgets_everything() -> None:
    """`replay` hands each learner its row's time: a ten-year gap in the streams' clock (thousands of half-lives)
    forgets everything, so the first prediction after it is as uncertain as the very first one."""
    from streamfed.evaluation.datasets.base import ClientStream, Fleet
    from streamfed.evaluation.replay import AlgorithmConfig, replay

    rng = np.random.default_rng(4)
    hours = np.concatenate([np.arange(20), 24 * 3650 + np.arange(20)]).astype("timedelta64[h]")
    times = np.datetime64("2013-03-01T00", "h") + hours
    streams = []
    for name in ("a", "b"):
        X = rng.uniform(-1, 1, (40, 2))
        streams.append(ClientStream(name, X, np.sin(3 * X[:, 0]) + 0.05 * rng.standard_normal(40), ("u", "v"),
                                    time=times))
    fleet = Fleet(tuple(streams), "synthetic", "none", "test")
    cfg = AlgorithmConfig(params={"fsgp": {"half_life_s": 10 * 86400.0, "min_upload": 4, "sigma": 0.1,
                                           "n_inducing": 8, "learn_hyperparameters": False, "calibrate": False,
                                           "personal": False}})
    res = replay(fleet, "fsgp", cfg)
    for v in res.variances:
        assert v[19] < 0.5 * v[0]  # learned: more certain than the prior
        assert v[20] == pytest.approx(v[0], rel=1e-6)  # after the gap: the prior again


@pytest.mark.slow
def test_a_private_forgetting_agent_keeps_its_time_public_and_its_uploads_are_taken() -> None:
    """Under differential privacy an FSGP upload is clipped whole and noised, but its `time` is public (as its
    timing is): the aggregator receives the reading's time unchanged, and takes every upload."""
    from streamfed.fleet.agent import AgentCore
    from streamfed.fleet.aggregator import AggregatorCore
    from streamfed.fleet.sources import Reading
    from streamfed.wire.message import encode

    cfg = _cfg(["a1"], min_upload=8).model_copy(update={"dp_epsilon": 1.0})
    agent = AgentCore(cfg, "a1", 0, mode="async")
    agent.privacy.rng = np.random.default_rng(3)  # type: ignore[union-attr]
    agg = AggregatorCore(cfg, clients=["a1"], mode="async", window=0.0, check_stats=False)
    times = []
    for t in range(200):
        ts = 1.36e9 + 3600.0 * t
        for m in agent.on_reading(Reading(f"r{t}", np.array([np.sin(t), 0.3]), ts, y=0.1 * np.cos(t)),
                                  now=1.8e9)[1]:
            if m.kind.endswith(".update"):
                times.append((float(m.arrays["time"]), ts))
                agg.on_update("a1", encode(m, cfg), now=1.8e9)
    assert len(times) >= 5 and all(sent == ts for sent, ts in times)
    assert sum(agg.rejected.values()) == 0, agg.rejected
