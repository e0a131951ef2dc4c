"""Online FedBNR against plain numpy transcriptions of docs/algorithms.md §4."""

from __future__ import annotations

import copy
import doctest
import importlib
import math
import pickle

import numpy as np
import pytest
from river import checks, proba

from streamfed.algorithms.fedbnr.client import FedBNRClient
from streamfed.algorithms.fedbnr.estimator import LAZY_GAP, FedBNRRegressor
from streamfed.algorithms.fedbnr.evidence import fit_hyperparameters, log_evidence, spectral_log_evidence
from streamfed.algorithms.fedbnr.messages import GlobalModel, Upload
from streamfed.algorithms.fedbnr.metrics import RidgeComparator
from streamfed.algorithms.fedbnr.personalisation import OTHERS_WEIGHT_GRID
from streamfed.algorithms.fedbnr.server import FedBNRServer
from streamfed.core.features import KernelSpec, RFFBank, RFFMap
from streamfed.core.stats import SufficientStats

# ----------------------------------------------------------------------------- oracles


def oracle_posterior(phi: np.ndarray, y: np.ndarray, sigma: float,
                     lam: float) -> tuple[np.ndarray, np.ndarray]:
    """A = σ⁻²ΦᵀΦ + λ⁻²I, m = σ⁻²A⁻¹Φᵀy, covariance A⁻¹."""
    f = phi.shape[1]
    a = phi.T @ phi / sigma**2 + np.eye(f) / lam**2
    cov = np.linalg.inv(a)
    return cov @ phi.T @ y / sigma**2, cov


def oracle_predictive(phi: np.ndarray, y: np.ndarray, phi_star: np.ndarray, sigma: float,
                      lam: float) -> tuple[float, float]:
    m, cov = oracle_posterior(phi, y, sigma, lam)
    return float(phi_star @ m), float(sigma**2 + phi_star @ cov @ phi_star)


def oracle_log_evidence(phi: np.ndarray, y: np.ndarray, sigma: float, lam: float) -> float:
    """log N(y; 0, λ²ΦΦᵀ + σ²I), the n×n Gaussian."""
    n = len(y)
    k = lam**2 * phi @ phi.T + sigma**2 * np.eye(n)
    _, logdet = np.linalg.slogdet(k)
    return float(-0.5 * (n * np.log(2 * np.pi) + logdet + y @ np.linalg.solve(k, y)))


def oracle_ridge_loss(phi: np.ndarray, y: np.ndarray, sigma: float, lam: float) -> float:
    """min_w Σ(y - φᵀw)² + (σ²/λ²)‖w‖², by solving for w and evaluating the objective."""
    reg = sigma**2 / lam**2
    w = np.linalg.solve(phi.T @ phi + reg * np.eye(phi.shape[1]), phi.T @ y)
    return float(((y - phi @ w) ** 2).sum() + reg * w @ w)


class TanhMap:
    """A feature map independent of the RFF code: tanh of random projections plus a bias."""

    def __init__(self, n_inputs: int, dim: int, seed: int = 0, name: str = "tanh") -> None:
        rng = np.random.default_rng(seed)
        self.w = rng.standard_normal((dim - 1, n_inputs))
        self.c = rng.standard_normal(dim - 1)
        self.dim = dim
        self.version = f"{name}-{seed}-{dim}"

    def transform_one(self, x: np.ndarray) -> np.ndarray:
        return np.append(np.tanh(self.w @ x + self.c) / math.sqrt(self.dim), 1.0)

    def transform_many(self, xs: np.ndarray) -> np.ndarray:
        return np.stack([self.transform_one(x) for x in xs])


def make_data(n: int, d: int = 2, seed: int = 0, noise: float = 0.1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.uniform(-2, 2, (n, d))
    y = np.sin(x.sum(axis=1)) + noise * rng.standard_normal(n)
    return x, y


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(np.asarray(a) - np.asarray(b)) / max(np.linalg.norm(b), 1e-300))


def snapshot(client: FedBNRClient) -> bytes:
    return pickle.dumps({k: v for k, v in client.__dict__.items() if k not in ("_features", "_cache")})


# ----------------------------------------------------------------------------- feature map


def test_default_feature_map_is_gaussian_rff_plus_bias() -> None:
    client = FedBNRClient(n_inputs=3, n_features=10, bandwidth=0.7, seed=5)
    ref = RFFMap(RFFBank([KernelSpec("gaussian", 0.7)], 10, 3, 5), bias=True)
    x = np.array([0.3, -1.0, 2.0])
    assert client.dim == ref.dim == 21
    assert client.kernel_version == ref.version
    assert np.array_equal(client.features(x)[0], ref.transform_one(x))
    assert np.allclose(client.features_many(np.stack([x, -x]))[:, 0], ref.transform_many(np.stack([x, -x])))


# ----------------------------------------------------------------------------- client posterior


@pytest.mark.parametrize("sigma,lam", [(0.1, 1.0), (0.7, 0.3)])
def test_prequential_predictions_and_metrics_match_oracle(sigma: float, lam: float) -> None:
    fmap = TanhMap(2, 9, seed=1)
    client = FedBNRClient(fmap, sigma=sigma, lam=lam)
    x, y = make_data(60, seed=2)
    phi = np.stack([fmap.transform_one(xi) for xi in x])
    means, variances = [], []
    for t in range(len(y)):
        mu, var = client.predict(x[t])
        om, ov = oracle_predictive(phi[:t], y[:t], phi[t], sigma, lam)
        assert mu == pytest.approx(om, rel=1e-9, abs=1e-12)
        assert var == pytest.approx(ov, rel=1e-9)
        means.append(om)
        variances.append(ov)
        client.learn(x[t], y[t])
    means_a, vars_a = np.array(means), np.array(variances)
    r = y - means_a
    assert client.metrics.count == 60
    assert client.metrics.mse == pytest.approx(np.mean(r**2), rel=1e-9)
    assert client.metrics.coverage95 == np.mean(np.abs(r) <= 1.959963984540054 * np.sqrt(vars_a))
    nlpd = np.mean(0.5 * np.log(2 * np.pi * vars_a) + r**2 / (2 * vars_a))
    assert client.metrics.mean_nlpd == pytest.approx(nlpd, rel=1e-9)
    m, cov = client.posterior()
    om, ocov = oracle_posterior(phi, y, sigma, lam)
    assert rel(m, om) < 1e-9 and rel(cov, ocov) < 1e-9


def test_client_predict_one_returns_river_gaussian() -> None:
    fmap = TanhMap(2, 5, seed=3)
    client = FedBNRClient(fmap, sigma=0.4, lam=2.0)
    x, y = make_data(20, seed=30)
    for xi, yi in zip(x, y, strict=True):
        client.learn_one(xi, yi)
    phi = np.stack([fmap.transform_one(xi) for xi in x])
    om, ov = oracle_predictive(phi, y, fmap.transform_one(x[0]), 0.4, 2.0)
    dist = client.predict_one(x[0], with_dist=True)
    assert isinstance(dist, proba.Gaussian)
    assert dist.mu == pytest.approx(om, rel=1e-9) and dist.sigma**2 == pytest.approx(ov, rel=1e-9)
    assert client.predict_one(x[0]) == pytest.approx(om, rel=1e-9)


def test_learn_many_equals_learn_loop() -> None:
    x, y = make_data(80, d=3, seed=3)
    a = FedBNRClient(n_inputs=3, n_features=8, bandwidth=(0.5, 2.0), sigma=0.3)
    b = FedBNRClient(n_inputs=3, n_features=8, bandwidth=(0.5, 2.0), sigma=0.3)
    loop = []
    for xi, yi in zip(x, y, strict=True):
        loop.append(a.predict(xi))
        a.learn(xi, yi)
    means, variances = b.learn_many(x, y)
    assert np.allclose(means, [m for m, _ in loop], rtol=1e-12, atol=1e-12)
    assert np.allclose(variances, [v for _, v in loop], rtol=1e-12)
    assert np.allclose(a._ra, b._ra, rtol=1e-12, atol=1e-13)
    assert a.own_stats() == b.own_stats() or rel(a.own_stats().S, b.own_stats().S) < 1e-14
    assert a.metrics.count == b.metrics.count == 80
    assert a.metrics.mse == pytest.approx(b.metrics.mse, rel=1e-12)


def test_learn_features_path_matches_learn() -> None:
    x, y = make_data(30, seed=4)
    a = FedBNRClient(n_inputs=2, n_features=6)
    b = FedBNRClient(n_inputs=2, n_features=6)
    for xi, yi in zip(x, y, strict=True):
        a.learn(xi, yi)
        b.learn_features(b.features(xi), yi)
    assert np.allclose(a._ra, b._ra, rtol=1e-13, atol=1e-14)


@pytest.mark.parametrize("kwargs", [
    {},
    {"bandwidth": (0.5, 2.0)},  # a dictionary: Bayesian model average with evidence weights
    {"forgetting": 0.97},  # decay and cyclic prior refresh
    {"bandwidth": (0.5, 2.0), "forgetting": 0.9, "sigma": 0.3, "lam": 2.0},
])
def test_learn_predict_equals_predict_then_learn(kwargs: dict) -> None:
    x, y = make_data(90, d=3, seed=40)
    a = FedBNRClient(n_inputs=3, n_features=7, min_upload=16, **kwargs)
    b = FedBNRClient(n_inputs=3, n_features=7, min_upload=16, **kwargs)
    c = FedBNRClient(n_inputs=3, n_features=7, min_upload=16, **kwargs)
    server = FedBNRServer.for_client(a)
    for t, (xi, yi) in enumerate(zip(x, y.tolist(), strict=True)):
        two = a.predict(xi)
        a.learn(xi, yi)
        assert b.learn_predict(xi, yi) == two  # bit for bit: the same kernels in the same order
        c.learn(xi, yi)  # learn without a preceding predict takes the fused path too
        assert np.array_equal(a._ra, b._ra) and np.array_equal(a._ra, c._ra)  # (a global refactorises all alike)
        if t % 30 == 29:  # a global in between: refactorisation of every view of the packed state
            for cl in (a, b, c):
                up = cl.make_upload()
                assert up is not None
            server.apply(up)
            g = server.publish()
            for cl in (a, b, c):
                cl.apply_global(g)
    for other in (b, c):
        assert np.array_equal(a._ra, other._ra) and np.array_equal(a._pdiag, other._pdiag)
        assert (a._n_work, a._q_work, a._refresh_j) == (other._n_work, other._q_work, other._refresh_j)
        assert a.own_stats() == other.own_stats()
        assert a.metrics == other.metrics


def test_learn_predict_with_a_user_feature_map_and_numpy_target() -> None:
    fmap = TanhMap(2, 9, seed=1)
    a, b = FedBNRClient(fmap, sigma=0.5), FedBNRClient(fmap, sigma=0.5)
    x, y = make_data(20, seed=41)
    for xi, yi in zip(x, y, strict=True):  # yi is a numpy float64
        assert b.learn_predict(xi, yi) == a.predict(xi)
        a.learn(xi, yi)
    assert np.array_equal(a._ra, b._ra)


@pytest.mark.parametrize("x,y", [
    (np.array([np.nan, 0.0]), 1.0),
    (np.array([0.0, 0.0, 0.0]), 1.0),
    (np.array([0.0, 0.0]), math.nan),
    (np.array([0.0, 0.0]), 1e200),
    (np.array([0.0, 0.0]), "abc"),
])
def test_learn_predict_bad_input_changes_nothing(x: np.ndarray, y: object) -> None:
    client = FedBNRClient(n_inputs=2, n_features=5, min_upload=2)
    xs, ys = make_data(10, seed=12)
    client.learn_many(xs, ys)
    before = snapshot(client)
    with pytest.raises(ValueError):
        client.learn_predict(x, y)  # type: ignore[arg-type]
    assert snapshot(client) == before


def test_pickled_client_keeps_its_views_on_the_packed_buffer() -> None:
    x, y = make_data(60, d=2, seed=42)
    a = FedBNRClient(n_inputs=2, n_features=6, forgetting=0.98, bandwidth=(0.5, 1.5))
    a.learn_many(x[:30], y[:30])
    b = pickle.loads(pickle.dumps(a))
    d = copy.deepcopy(a)
    for other in (b, d):
        for attr in FedBNRClient._VIEWS:
            assert np.shares_memory(getattr(other, attr), other._buf), attr
    for xi, yi in zip(x[30:], y[30:].tolist(), strict=True):
        for cl in (a, b, d):
            cl.learn_predict(xi, yi)
    assert np.array_equal(a._ra, b._ra) and np.array_equal(a._ra, d._ra)
    assert a.metrics == b.metrics == d.metrics


# ----------------------------------------------------------------------------- evidence


@pytest.mark.parametrize("sigma,lam", [(0.2, 1.0), (1.5, 0.2), (0.05, 4.0)])
def test_log_evidence_equals_n_by_n_gaussian(sigma: float, lam: float) -> None:
    fmap = TanhMap(2, 7, seed=3)
    x, y = make_data(25, seed=5)
    phi = np.stack([fmap.transform_one(xi) for xi in x])
    expected = oracle_log_evidence(phi, y, sigma, lam)
    st = SufficientStats.from_samples(phi, y)
    assert log_evidence(st, sigma, lam) == pytest.approx(expected, rel=1e-9)
    e, u = np.linalg.eigh(st.S)
    spec = spectral_log_evidence(e, (u.T @ st.b) ** 2, st.n, st.q, np.log(sigma), np.log(lam))
    assert float(spec) == pytest.approx(expected, rel=1e-8)
    client = FedBNRClient(fmap, sigma=sigma, lam=lam)
    client.learn_many(x, y)
    assert float(client.log_evidence()[0]) == pytest.approx(expected, rel=1e-9)


def test_refit_growth_refits_only_once_the_sums_grew_by_the_fraction() -> None:
    """`refit_growth = 0.5`: σ, λ are refitted at a publish only when the sums hold ≥ 1.5× the samples of the last
    fit — and then to exactly what a server refitting every time finds; in between they stay."""
    fmap = TanhMap(2, 6, seed=3)
    x, y = make_data(200, seed=5)
    phis = np.stack([fmap.transform_one(xi) for xi in x])[:, None, :]
    lazy = FedBNRServer(dim=6, kernel_version=fmap.version, min_samples=1, refit_growth=0.5)
    eager = FedBNRServer(dim=6, kernel_version=fmap.version, min_samples=1)
    fitted_at = []
    for seq, t0 in enumerate(range(0, 200, 20), start=1):
        d = SufficientStats.from_samples(phis[t0:t0 + 20], y[t0:t0 + 20], kernel_version=fmap.version)
        for srv in (lazy, eager):
            srv.apply(Upload("a", seq, 0, d))
        before = lazy.sigma.copy()
        g_lazy, g_eager = lazy.publish(), eager.publish()
        if t0 + 20 >= 1.5 * (fitted_at[-1] if fitted_at else 0):
            fitted_at.append(t0 + 20)
            assert np.array_equal(g_lazy.sigma, g_eager.sigma) and np.array_equal(g_lazy.lam, g_eager.lam)
        else:
            assert np.array_equal(g_lazy.sigma, before)
            assert g_lazy.log_evidence == pytest.approx(log_evidence(lazy.stats, lazy.sigma, lazy.lam))
    assert fitted_at == [20, 40, 60, 100, 160]
    with pytest.raises(ValueError, match="refit_growth"):
        FedBNRServer(dim=6, refit_growth=-0.1)


def test_fit_hyperparameters_finds_the_evidence_maximum() -> None:
    fmap = TanhMap(2, 11, seed=4)
    x, y = make_data(70, seed=6, noise=0.2)
    phi = np.stack([fmap.transform_one(xi) for xi in x])
    st = SufficientStats.from_samples(phi, y)
    sigma, lam, value = fit_hyperparameters(st.S, st.b, st.n, st.q)
    at_fit = oracle_log_evidence(phi, y, sigma, lam)
    assert value == pytest.approx(at_fit, rel=1e-8)
    # Brute force with the n×n oracle on an independent grid: nothing is better than the fit.
    best = max(oracle_log_evidence(phi, y, s, lm) for s in np.geomspace(0.02, 2.0, 40)
               for lm in np.geomspace(0.05, 50.0, 40))
    assert at_fit >= best - 1e-6
    # And the fit is a local maximum in every direction.
    for ds, dl in [(1.01, 1), (0.99, 1), (1, 1.01), (1, 0.99)]:
        assert oracle_log_evidence(phi, y, sigma * ds, lam * dl) <= at_fit + 1e-9


# ----------------------------------------------------------------------------- uploads and server


def test_upload_respects_privacy_floor_and_carries_exact_deltas() -> None:
    fmap = TanhMap(2, 5, seed=0)
    client = FedBNRClient(fmap, min_upload=10, client_id="a")
    x, y = make_data(25, seed=7)
    client.learn_many(x[:9], y[:9])
    assert client.make_upload() is None and client.n_pending == 9
    client.learn(x[9], y[9])
    up = client.make_upload()
    assert up is not None and up.client == "a" and up.seq == 1 and up.base_version == 0
    phi = np.stack([fmap.transform_one(xi) for xi in x])
    assert rel(up.stats.S[0], phi[:10].T @ phi[:10]) < 1e-13
    assert rel(up.stats.b[0], phi[:10].T @ y[:10]) < 1e-13
    assert up.stats.n == 10 and up.stats.q == pytest.approx(y[:10] @ y[:10], rel=1e-13)
    assert np.array_equal(up.stats.S[0], up.stats.S[0].T)
    assert client.n_pending == 0 and client.make_upload() is None
    client.learn_many(x[10:25], y[10:25])
    up2 = client.make_upload()
    assert up2 is not None and up2.seq == 2 and up2.stats.n == 15
    assert [u.seq for u in client.unacked] == [1, 2]
    msg = up2.to_message()
    assert msg["S_upper"].shape == (1, 15) and msg["b"].shape == (1, 5)
    assert Upload.from_message(msg) == up2


def _uploads(n_clients: int, per_client: int, seed: int, fmap: TanhMap) -> tuple[list[Upload], np.ndarray,
                                                                                      np.ndarray]:
    x, y = make_data(n_clients * per_client, seed=seed)
    ups = []
    for c in range(n_clients):
        cl = FedBNRClient(fmap, min_upload=4, client_id=f"c{c}")
        for start in range(c * per_client, (c + 1) * per_client, 8):
            cl.learn_many(x[start:start + 8], y[start:start + 8])
            ups.append(cl.make_upload())
    return ups, x, y


def test_server_sums_each_upload_once_in_any_order() -> None:
    fmap = TanhMap(2, 6, seed=1)
    ups, x, y = _uploads(3, 32, seed=8, fmap=fmap)
    rng = np.random.default_rng(0)
    order = list(rng.permutation(len(ups))) + list(rng.integers(0, len(ups), 10))  # with duplicates
    server = FedBNRServer(6, kernel_version=fmap.version, min_samples=4, fit_hyperparameters=False)
    seen = set()
    for i in order:
        up = ups[i]
        fresh = (up.client, up.seq) not in seen
        assert server.apply(up) is fresh
        seen.add((up.client, up.seq))
    assert server.waiting() == {}
    assert server.included == {"c0": 4, "c1": 4, "c2": 4}
    phi = np.stack([fmap.transform_one(xi) for xi in x])
    assert rel(server.stats.S[0], phi.T @ phi) < 1e-12
    assert server.stats.n == 96
    g = server.publish()
    assert g.version == 1 and g.included == server.included
    g2 = GlobalModel.from_message(g.to_message())
    assert g2.stats == g.stats and g2.included == g.included and np.array_equal(g2.sigma, g.sigma)


def test_out_of_order_upload_waits_for_the_gap() -> None:
    fmap = TanhMap(2, 4, seed=2)
    ups, _, _ = _uploads(1, 24, seed=9, fmap=fmap)
    server = FedBNRServer(4, kernel_version=fmap.version, min_samples=4, fit_hyperparameters=False)
    assert server.apply(ups[2]) and server.apply(ups[1])
    assert server.waiting() == {"c0": [2, 3]} and server.stats.n == 0 and server.included == {}
    assert server.publish().included == {}
    assert server.apply(ups[0])
    assert server.included == {"c0": 3} and server.stats.n == 24 and server.waiting() == {}


def test_server_rejects_bad_uploads_without_changing_state() -> None:
    fmap = TanhMap(2, 4, seed=2)
    ups, _, _ = _uploads(1, 8, seed=10, fmap=fmap)
    good = ups[0]
    server = FedBNRServer(4, kernel_version=fmap.version, min_samples=4)
    before = pickle.dumps(server.__dict__)
    wrong_version = Upload("c0", 1, 0, SufficientStats(good.stats.S, good.stats.b, 8, 1.0, "other"))
    wrong_shape = Upload("c0", 1, 0, SufficientStats.zeros(5, (1,), fmap.version))
    bad = good.stats.copy()
    bad.S[0, 1, 1] = np.inf
    non_finite = Upload("c0", 1, 0, bad)
    small = good.stats.copy()
    small.n = 3.0
    too_few = Upload("c0", 1, 0, small)
    seq0 = Upload("c0", 0, 0, good.stats)
    for up in (wrong_version, wrong_shape, non_finite, too_few, seq0):
        with pytest.raises(ValueError):
            server.apply(up)
    assert pickle.dumps(server.__dict__) == before


# ----------------------------------------------------------------------------- global → client


def test_no_double_counting_when_a_global_contains_some_uploads() -> None:
    fmap = TanhMap(2, 7, seed=5)
    sigma, lam = 0.3, 0.8
    x, y = make_data(150, seed=11)
    a = FedBNRClient(fmap, min_upload=10, client_id="a", sigma=sigma, lam=lam)
    b = FedBNRClient(fmap, min_upload=10, client_id="b", sigma=sigma, lam=lam)
    server = FedBNRServer(7, kernel_version=fmap.version, min_samples=10, sigma=sigma, lam=lam,
                          fit_hyperparameters=False)
    a_ups = []
    for k in range(3):
        a.learn_many(x[10 * k:10 * k + 10], y[10 * k:10 * k + 10])
        a_ups.append(a.make_upload())
    a.learn_many(x[30:35], y[30:35])  # pending, below the floor
    b.learn_many(x[100:150], y[100:150])
    server.apply(b.make_upload())
    server.apply(a_ups[0])
    server.apply(a_ups[1])
    assert a.apply_global(server.publish())
    assert [u.seq for u in a.unacked] == [3]
    a_idx = np.r_[0:35, 100:150]
    phi = np.stack([fmap.transform_one(xi) for xi in x])
    ws = a.working_stats()
    assert ws.n == 85
    assert rel(ws.S[0], phi[a_idx].T @ phi[a_idx]) < 1e-12
    m, cov = a.posterior()
    om, ocov = oracle_posterior(phi[a_idx], y[a_idx], sigma, lam)
    assert rel(m, om) < 1e-9 and rel(cov, ocov) < 1e-9
    mu, var = a.predict(x[60])
    assert (mu, var) == pytest.approx(oracle_predictive(phi[a_idx], y[a_idx], phi[60], sigma, lam), rel=1e-9)
    # Upload 3 arrives (and again, duplicated): the posterior does not move.
    server.apply(a_ups[2])
    assert not server.apply(a_ups[2])
    assert a.apply_global(server.publish())
    assert a.unacked == [] and a.working_stats().n == 85
    assert rel(a.posterior()[0], om) < 1e-9
    # A stale global changes nothing.
    before = snapshot(a)
    old = GlobalModel(1, fmap.version, 0, SufficientStats.zeros(7, (1,), fmap.version), np.ones(1),
                      np.ones(1), np.zeros(1), {})
    assert not a.apply_global(old)
    assert snapshot(a) == before


def test_global_of_another_kernel_version_is_rejected() -> None:
    client = FedBNRClient(TanhMap(2, 4, seed=1))
    g = GlobalModel(1, "other", 0, SufficientStats.zeros(4, (1,), "other"), np.ones(1), np.ones(1),
                    np.zeros(1), {})
    with pytest.raises(ValueError, match="kernel version"):
        client.apply_global(g)


def test_restarted_client_continues_sequence_numbers() -> None:
    fmap = TanhMap(2, 4, seed=1)
    g = GlobalModel(3, fmap.version, 0, SufficientStats.zeros(4, (1,), fmap.version), np.ones(1), np.ones(1),
                    np.zeros(1), {"a": 7})
    client = FedBNRClient(fmap, client_id="a", min_upload=1)
    client.apply_global(g)
    client.learn(np.zeros(2), 1.0)
    up = client.make_upload()
    assert up is not None and up.seq == 8 and up.base_version == 3


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("x,y", [
    (np.array([np.nan, 0.0]), 1.0),
    (np.array([0.0, np.inf]), 1.0),
    (np.array([0.0, 0.0, 0.0]), 1.0),
    (np.array([[0.0, 0.0]]), 1.0),
    (np.array([0.0, 0.0]), np.nan),
    (np.array([0.0, 0.0]), math.inf),
    (np.array([0.0, 0.0]), 1e200),  # y² overflows
    (np.array([0.0, 0.0]), "abc"),
])
def test_bad_input_raises_and_leaves_state_unchanged(x: np.ndarray, y: object) -> None:
    client = FedBNRClient(n_inputs=2, n_features=5, min_upload=2)
    xs, ys = make_data(10, seed=12)
    client.learn_many(xs, ys)
    before = snapshot(client)
    with pytest.raises(ValueError):
        client.learn(x, y)  # type: ignore[arg-type]
    assert snapshot(client) == before
    bad_xs = np.vstack([xs[:3], np.atleast_2d(x)[:, :2]]) if x.size >= 2 else xs[:3, :1]
    bad_ys = np.r_[ys[:3], y] if isinstance(y, float) else np.r_[ys[:3], np.nan]
    if np.all(np.isfinite(bad_xs)) and np.all(np.abs(bad_ys) < 1e100) and bad_xs.shape[1] == 2:
        bad_ys[-1] = np.nan
    with pytest.raises(ValueError):
        client.learn_many(bad_xs, bad_ys)
    assert snapshot(client) == before


def test_non_finite_statistics_never_reach_an_upload() -> None:
    client = FedBNRClient(n_inputs=2, n_features=4, min_upload=2)
    xs, ys = make_data(4, seed=13)
    client.learn_many(xs, ys)
    client._s_pend[0, 0, 1] = np.nan  # e.g. memory corruption: must raise, not publish
    with pytest.raises(ValueError, match="non-finite"):
        client.make_upload()
    assert client.n_pending == 4 and client.next_seq == 1 and client.unacked == []


# ----------------------------------------------------------------------------- kernel dictionary


def test_dictionary_mode_is_a_bayesian_model_average() -> None:
    maps = [TanhMap(2, 6, seed=s, name=f"m{s}") for s in (1, 2, 3)]
    sigma, lam = 0.2, 1.0
    client = FedBNRClient(maps, sigma=sigma, lam=lam)
    x, y = make_data(40, seed=14)
    client.learn_many(x, y)
    xs = np.array([0.3, -0.4])
    phis = [np.stack([m.transform_one(xi) for xi in x]) for m in maps]
    ev = np.array([oracle_log_evidence(p, y, sigma, lam) for p in phis])
    assert np.allclose(client.log_evidence(), ev, rtol=1e-9)
    w = np.exp(ev - ev.max())
    w /= w.sum()
    assert np.allclose(client.kernel_weights(), w, rtol=1e-8, atol=1e-300)
    assert client.best_kernel == int(np.argmax(ev))
    preds = [oracle_predictive(p, y, m.transform_one(xs), sigma, lam)
             for p, m in zip(phis, maps, strict=True)]
    means_k, vars_k = client.predict_kernels(xs)
    assert np.allclose(means_k, [p[0] for p in preds], rtol=1e-9)
    assert np.allclose(vars_k, [p[1] for p in preds], rtol=1e-9)
    mu = float(w @ means_k)
    var = float(w @ (vars_k + means_k**2) - mu**2)
    assert client.predict(xs) == pytest.approx((mu, var), rel=1e-9)


def test_dictionary_server_fits_each_kernel_and_reports_the_best() -> None:
    x, y = make_data(200, d=2, seed=15, noise=0.1)
    client = FedBNRClient(n_inputs=2, n_features=10, bandwidth=(0.05, 1.0, 50.0), min_upload=32)
    client.learn_many(x, y)
    server = FedBNRServer.for_client(client)
    server.apply(client.make_upload())
    g = server.publish()
    phis = client.features_many(x)
    for k in range(3):
        assert g.log_evidence[k] == pytest.approx(oracle_log_evidence(phis[:, k], y, g.sigma[k], g.lam[k]),
                                                  rel=1e-8)
    # sin(x1 + x2) on [-2, 2]²: bandwidth 1 explains it; 0.05 (noise-like features) and 50 (almost
    # linear) do not.
    assert g.best_kernel == 1
    client.apply_global(g)
    assert client.best_kernel == 1 and client.kernel_weights()[1] > 0.99


# ----------------------------------------------------------------------------- forgetting


def test_forgetting_matches_the_documented_recursion() -> None:
    fmap = TanhMap(2, 5, seed=6)
    gamma, sigma, lam = 0.9, 0.3, 0.7
    client = FedBNRClient(fmap, sigma=sigma, lam=lam, forgetting=gamma)
    x, y = make_data(40, seed=16)
    f = fmap.dim
    a = np.eye(f) / lam**2
    h = np.zeros(f)
    for t in range(len(y)):
        phi = fmap.transform_one(x[t])
        mu, var = client.predict(x[t])
        cov = np.linalg.inv(a)
        assert mu == pytest.approx(phi @ cov @ h, rel=1e-9, abs=1e-12)
        assert var == pytest.approx(sigma**2 + phi @ cov @ phi, rel=1e-9)
        client.learn(x[t], y[t])
        # Documented: M ← γM, prior refresh F(1-γ)λ⁻² on coordinate t mod F, then the sample.
        a = gamma * a
        a[t % f, t % f] += f * (1 - gamma) / lam**2
        a += np.outer(phi, phi) / sigma**2
        h = gamma * h + phi * y[t] / sigma**2
    # The pending (uploaded) statistics stay exact and undecayed.
    phis = np.stack([fmap.transform_one(xi) for xi in x])
    assert rel(client.own_stats().S[0], phis.T @ phis) < 1e-13
    # learn_many follows the same recursion.
    other = FedBNRClient(fmap, sigma=sigma, lam=lam, forgetting=gamma)
    other.learn_many(x, y)
    assert np.allclose(other._ra, client._ra, rtol=1e-10, atol=1e-12)
    assert np.allclose(other._pdiag, client._pdiag, rtol=1e-12)
    assert other.working_stats().n == pytest.approx(client.working_stats().n, rel=1e-12)


def test_forgetting_with_a_global_adds_other_clients_once() -> None:
    fmap = TanhMap(2, 5, seed=7)
    gamma, sigma, lam = 0.95, 0.3, 0.7
    x, y = make_data(100, seed=17)
    a = FedBNRClient(fmap, sigma=sigma, lam=lam, forgetting=gamma, min_upload=20, client_id="a")
    b = FedBNRClient(fmap, sigma=sigma, lam=lam, min_upload=20, client_id="b")
    server = FedBNRServer(5, kernel_version=fmap.version, min_samples=20, sigma=sigma, lam=lam,
                          fit_hyperparameters=False)
    a.learn_many(x[:40], y[:40])
    server.apply(a.make_upload())
    b.learn_many(x[50:100], y[50:100])
    server.apply(b.make_upload())
    a.apply_global(server.publish())
    a.learn_many(x[40:50], y[40:50])
    phis = np.stack([fmap.transform_one(xi) for xi in x])
    wts = gamma ** np.arange(49, -1, -1.0)  # own samples 0..49, weight γ^(49-t)
    expected = (phis[:50] * wts[:, None]).T @ phis[:50] + gamma**10 * phis[50:].T @ phis[50:]
    assert rel(a.working_stats().S[0], expected) < 1e-8
    b_exp = phis[:50].T @ (wts * y[:50]) + gamma**10 * phis[50:].T @ y[50:]
    assert rel(a.working_stats().b[0], b_exp) < 1e-8


def test_forgetting_tracks_an_abrupt_drift() -> None:
    rng = np.random.default_rng(18)
    x = rng.uniform(-1, 1, (1200, 1))
    y = np.where(np.arange(1200) < 600, 1.0, -1.0) * np.sin(3 * x[:, 0]) + 0.05 * rng.standard_normal(1200)
    errs = {}
    for g in (1.0, 0.98):
        c = FedBNRClient(n_inputs=1, n_features=10, bandwidth=0.5, sigma=0.05, lam=1.0, forgetting=g)
        means, _ = c.learn_many(x, y)
        errs[g] = float(np.mean((means[700:] - y[700:]) ** 2))
    assert errs[0.98] < 0.2 * errs[1.0]


# ----------------------------------------------------------------------------- regret


def test_regret_against_best_ridge_in_hindsight() -> None:
    fmap = TanhMap(2, 6, seed=8)
    sigma, lam = 0.2, 0.9
    client = FedBNRClient(fmap, sigma=sigma, lam=lam, min_upload=16)
    x, y = make_data(70, seed=19)
    phis = np.stack([fmap.transform_one(xi) for xi in x])
    loss = 0.0
    for t in range(70):
        mu, _ = oracle_predictive(phis[:t], y[:t], phis[t], sigma, lam)
        loss += (y[t] - mu) ** 2
        client.learn(x[t], y[t])
        if t % 20 == 19:
            client.make_upload()  # regret counts uploaded and pending samples alike
    r = client.regret()
    ridge = oracle_ridge_loss(phis, y, sigma, lam)
    assert r["n"] == 70
    assert r["loss"] == pytest.approx(loss, rel=1e-9)
    assert r["ridge_loss"] == pytest.approx(ridge, rel=1e-9)
    assert r["regret"] == pytest.approx(loss - ridge, rel=1e-8)


def test_a_dictionary_of_rff_maps_takes_the_stacked_bank_bit_for_bit() -> None:
    """A list of RFF + bias maps (a fleet's dictionary) is evaluated as one stacked bank in one compiled call: the
    same numbers as the maps one by one, and the client takes the fused step with it."""
    maps = [RFFMap(RFFBank([KernelSpec.parse(s)], 7, 3, seed=2), bias=True) for s in ("gaussian:0.3", "gaussian:2.0",
                                                                                     "laplacian:1.0")]
    client = FedBNRClient(maps, sigma=0.5, lam=1.0)
    assert client._fast is not None  # noqa: SLF001 (the path is what is tested)
    rng = np.random.default_rng(3)
    for x in rng.standard_normal((20, 3)) * 3:
        assert np.array_equal(client.features(x), np.stack([m.transform_one(x) for m in maps]))
    no_bias = FedBNRClient([RFFMap(RFFBank(["gaussian:1.0"], 7, 3, seed=2))], sigma=0.5, lam=1.0)
    assert no_bias._fast is None  # noqa: SLF001
    with pytest.raises(ValueError):
        client.features(np.array([0.0, np.nan, 1.0]))


def test_a_global_message_is_decoded_once_and_read_only_by_its_learners() -> None:
    """Learners installing one message share its decode; a distinct message (even an equal one) is decoded anew;
    and a client installing it through the shared decode predicts as one given its own decode."""
    from streamfed.algorithms.fedbnr.learner import StatsLearner, decoded_global
    from streamfed.algorithms.fedbnr.wire import global_fields, global_message

    x, y = make_data(64, seed=2)
    clients = [FedBNRClient(n_inputs=2, n_features=5, min_upload=8, client_id=f"c{i}") for i in range(3)]
    server = FedBNRServer.for_client(clients[0])
    for i, c in enumerate(clients):
        c.learn_many(x[i::3], y[i::3])
        server.apply(c.make_upload())
    g = server.publish()
    st = g.stats.to_packed()

    def message() -> object:
        return global_message("f", "agg", g.version, st["S_upper"], st["b"], st["n"], st["q"], g.sigma, g.lam,
                              g.log_evidence, g.included, kernel_version=g.kernel_version)

    msg = message()
    learners = [StatsLearner(c) for c in clients[:2]]
    assert all(lr.install_global(msg) for lr in learners)
    assert decoded_global(msg) is decoded_global(msg)
    assert decoded_global(message()) is not decoded_global(msg)
    alone = copy.deepcopy(clients[2])
    clients[2].apply_global(GlobalModel.from_message(global_fields(msg)))
    StatsLearner(alone).install_global(msg)
    for xi in x[:5]:
        assert alone.predict(xi) == clients[2].predict(xi)


@pytest.mark.parametrize("f", [1, 31, 32, 33, 70])
def test_symmetric_from_upper_mirrors_the_upper_triangle_across_tiles(f: int) -> None:
    from streamfed.algorithms.fedbnr._compiled import kern

    upper = np.random.default_rng(f).standard_normal((2, f, f))  # the lower triangle is garbage, never read
    out = np.full_like(upper, np.nan)
    kern.symmetric_from_upper(upper, out)
    tri = np.triu(upper)
    assert np.array_equal(out, tri + np.swapaxes(np.triu(upper, 1), 1, 2))


def test_ridge_comparator_last_pivot_is_the_ridge_loss() -> None:
    """The comparator's loss, the square of the last pivot of the augmented factor of `[Φ y]` with `rI` on the
    features' diagonal, is `yᵀy - bᵀA⁻¹b` (A = rI + ΦᵀΦ, b = Φᵀy): checked against a plain solve, for rows
    taken one at a time from empty statistics and for a factor made from statistics then given more rows."""
    rng = np.random.default_rng(4)
    phi, y = rng.standard_normal((40, 2, 5)), rng.standard_normal(40)
    reg = np.array([0.3, 2.0])

    def plain(t: int, k: int) -> float:
        a = reg[k] * np.eye(5) + phi[:t, k].T @ phi[:t, k]
        b = phi[:t, k].T @ y[:t]
        return float(y[:t] @ y[:t] - b @ np.linalg.solve(a, b))

    one_by_one = RidgeComparator.of(SufficientStats.zeros(5, (2,)), reg)
    for t in range(40):
        one_by_one.fold_samples(phi[t:t + 1], y[t:t + 1])
        assert one_by_one.loss() == pytest.approx([plain(t + 1, 0), plain(t + 1, 1)], rel=1e-10)
    half = RidgeComparator.of(SufficientStats.from_samples(phi[:25], y[:25]), reg)
    half.fold_samples(phi[25:], y[25:])
    assert half.n == one_by_one.n == 40
    assert half.loss() == pytest.approx([plain(40, 0), plain(40, 1)], rel=1e-10)


def test_ridge_comparator_best_skips_only_kernels_that_cannot_win() -> None:
    """`best` at new regularisers equals the plain minimum over kernels every time, while kernels whose bound
    rules them out stay at their old regulariser (and keep taking samples there)."""
    rng = np.random.default_rng(7)
    kk, f = 6, 4
    scale = np.geomspace(0.05, 3.0, kk)  # kernels of very different fit: most are far from the best
    phi = rng.standard_normal((120, kk, f)) * scale[None, :, None]
    y = phi[:, -1] @ rng.standard_normal(f) + 0.1 * rng.standard_normal(120)
    reg = np.ones(kk)
    cmp = RidgeComparator.of(SufficientStats.zeros(f, (kk,)), reg)
    skipped = 0
    for t0 in range(0, 120, 10):
        cmp.fold_samples(phi[t0:t0 + 10], y[t0:t0 + 10])
        reg = reg * rng.uniform(0.5, 2.0, kk)
        t = t0 + 10
        plain = [float(y[:t] @ y[:t] - (b := phi[:t, k].T @ y[:t]) @ np.linalg.solve(
            phi[:t, k].T @ phi[:t, k] + reg[k] * np.eye(f), b)) for k in range(kk)]
        loss, k = cmp.best(reg, lambda t=t: SufficientStats.from_samples(phi[:t], y[:t]))
        assert k == int(np.argmin(plain))
        assert loss == pytest.approx(min(plain), rel=1e-10)
        skipped += int(np.sum(cmp.reg != reg))
    assert skipped > 0


@pytest.mark.parametrize("path", ["learn", "learn_predict", "learn_many"])
def test_regret_read_often_follows_every_path_of_own_samples(path: str) -> None:
    """The regret read every few samples (the comparator kept up to date between reads) equals the plain
    transcription at every read: across stage flushes, uploads, new σ, λ from globals and a dictionary."""
    maps = [TanhMap(2, 6, seed=8), TanhMap(2, 6, seed=9, name="tanh2")]
    if path == "learn_predict":  # the default RFF map: the fused compiled step
        client = FedBNRClient(n_inputs=2, n_features=4, bandwidth=[0.7, 1.5], sigma=0.3, lam=0.8, min_upload=16)
    else:
        client = FedBNRClient(maps, sigma=0.3, lam=0.8, min_upload=16)
    server = FedBNRServer.for_client(client)
    x, y = make_data(400, seed=21)
    phis = np.stack([client.features(xi) for xi in x])
    loss = 0.0
    t = 0
    rng = np.random.default_rng(1)
    while t < 400:
        step = int(rng.choice([1, 5, 11, 40, 75]))  # reads between, and across, flushes of the 32-row stage
        if path == "learn_many":
            means, _ = client.learn_many(x[t:t + step], y[t:t + step])
            loss += float(((y[t:t + step] - means) ** 2).sum())
        else:
            for i in range(t, min(t + step, 400)):
                mu, _ = client.learn_predict(x[i], y[i]) if path == "learn_predict" else client.predict(x[i])
                if path == "learn":
                    client.learn(x[i], y[i])
                loss += (y[i] - mu) ** 2
        t = min(t + step, 400)
        if (up := client.make_upload()) is not None:  # flushes the stage
            server.apply(up)
            if rng.random() < 0.4:
                client.apply_global(server.publish())  # σ, λ refitted: the comparator's ridge changes
        r = client.regret()
        ridge = min(oracle_ridge_loss(phis[:t, k], y[:t], float(client.sigma[k]), float(client.lam[k]))
                    for k in range(2))
        assert r["n"] == t
        assert r["loss"] == pytest.approx(loss, rel=1e-9)
        assert r["ridge_loss"] == pytest.approx(ridge, rel=1e-9)
    assert client.global_version >= 3


# ----------------------------------------------------------------------------- River


@pytest.mark.slow  # over 2 s: outside the pure tier, in every full run
@pytest.mark.parametrize("params", list(FedBNRRegressor._unit_test_params()))
def test_river_check_estimator(params: dict) -> None:
    checks.check_estimator(FedBNRRegressor(**params))


def test_river_regressor_maps_sorted_keys_and_returns_gaussian() -> None:
    x, y = make_data(50, d=2, seed=20)
    model = FedBNRRegressor(n_features=6, sync_every=1000, bandwidth=1.0, standardise=False)  # a plain client
    ref = FedBNRClient(n_inputs=2, n_features=6)
    for xi, yi in zip(x, y, strict=True):
        model.learn_one({"zeta": xi[1], "alpha": xi[0]}, yi)  # sorted: alpha, zeta
        ref.learn(xi, yi)
    dist = model.predict_one({"alpha": 0.2, "zeta": -0.3, "unknown": 5.0}, with_dist=True)
    mu, var = ref.predict(np.array([0.2, -0.3]))
    assert isinstance(dist, proba.Gaussian)
    assert dist.mu == pytest.approx(mu, rel=1e-12) and dist.sigma == pytest.approx(math.sqrt(var), rel=1e-12)
    assert model.predict_one({"alpha": 0.2}) == pytest.approx(ref.predict(np.array([0.2, 0.0]))[0], rel=1e-12)


@pytest.mark.parametrize(("growth", "synced", "version"), [(0.0, 192, 6), (0.5, 160, 4), (1.0, 128, 3)])
def test_river_regressor_syncs_and_fits_hyperparameters(growth: float, synced: int, version: int) -> None:
    # g = 0: a sync (and refit) every 32 samples; g = 0.5 (the default): at 32, 64 (≥ 48), 96, 160 (≥ 144) samples,
    # the first multiple of 32 at which the samples have grown by half; g = 1: at 32, 64, 128, when they doubled
    x, y = make_data(200, d=2, seed=21, noise=0.05)
    model = FedBNRRegressor(n_features=20, sync_every=32, bandwidth=1.0, standardise=False, refit_growth=growth)
    for xi, yi in zip(x, y, strict=True):
        model.learn_one({"a": xi[0], "b": xi[1]}, yi)
    assert model.server is not None and model.client is not None
    assert model.server.stats.n == synced and model.client.n_pending == 200 - synced
    assert model.client.global_version == version
    assert 0.02 < model.client.sigma[0] < 0.15  # fitted noise level near the true 0.05


def test_river_learn_many_equals_learn_one_loop() -> None:
    x, y = make_data(100, d=3, seed=22)
    a = FedBNRRegressor(n_features=8, sync_every=16, bandwidth=(0.5, 2.0), standardise=False)
    b = FedBNRRegressor(n_features=8, sync_every=16, bandwidth=(0.5, 2.0), standardise=False)
    for xi, yi in zip(x, y, strict=True):
        a.learn_one(dict(enumerate(xi)), yi)
    b.learn_many(x[:37], y[:37])
    b.learn_many(x[37:], y[37:])
    assert a.client is not None and b.client is not None
    assert a.client.global_version == b.client.global_version == 4  # synced (refits) at 16, 32, 48, 80 samples
    assert np.allclose(a.client._ra, b.client._ra, rtol=1e-9, atol=1e-11)
    assert np.allclose(b.predict_many(x[:5]), [a.predict_one(dict(enumerate(xi))) for xi in x[:5]], rtol=1e-9)


@pytest.mark.parametrize("bad", [{"a": math.nan, "b": 1.0}, {"a": None, "b": 1.0}, {"a": "x", "b": 1.0}])
def test_river_bad_input_raises_and_leaves_state_unchanged(bad: dict) -> None:
    model = FedBNRRegressor(n_features=4)
    with pytest.raises(ValueError):
        model.learn_one(bad, 1.0)
    assert model.client is None
    model.learn_one({"a": 0.1, "b": 0.2}, 1.0)
    before = pickle.dumps(model)
    with pytest.raises(ValueError):
        model.learn_one(bad, 1.0)
    with pytest.raises(ValueError):
        model.learn_one({"a": 0.1, "b": 0.2}, math.nan)
    with pytest.raises(ValueError):
        model.learn_many(np.array([[0.1, 0.2], [np.nan, 0.0]]), np.array([1.0, 2.0]))
    with pytest.raises(ValueError):
        model.learn_many(np.zeros((2, 3)), np.zeros(2))
    assert pickle.dumps(model) == before


def test_river_predict_before_learning_is_the_prior() -> None:
    model = FedBNRRegressor(sigma=0.5, lam=2.0, bandwidth=1.0, standardise=False)
    dist = model.predict_one({"a": 1.0}, with_dist=True)
    assert dist.mu == 0.0 and dist.sigma == pytest.approx(math.sqrt(0.25 + 2 * 4.0))
    model.learn_one({"a": 1.0}, 0.0)
    # With one sample at y=0 the mean stays 0 and the variance is the oracle's.
    client = copy.deepcopy(model.client)
    assert client is not None
    phi = client.features(np.array([1.0]))[0]
    _, ov = oracle_predictive(phi[None], np.zeros(1), phi, 0.5, 2.0)
    assert model.predict_one({"a": 1.0}, with_dist=True).sigma == pytest.approx(math.sqrt(ov), rel=1e-10)


# ----------------------------------------------------------------------------- docs


DOCUMENTED = [f"streamfed.algorithms.fedbnr.{m}" for m in (
    "checks", "client", "estimator", "evidence", "factor", "features", "learner", "messages", "metrics", "packed_state",
    "personalisation", "server")] + ["streamfed.core.stats"]


@pytest.mark.parametrize("module", DOCUMENTED)
def test_docstring_examples(module: str) -> None:
    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    result = doctest.testmod(importlib.import_module(module), optionflags=flags)
    assert result.attempted > 0 and result.failed == 0


# ----------------------------------------------------------------------------- personalisation


def _two_client_setup(alpha: float | str, sigma: float = 0.3, lam: float = 0.8):
    fmap = TanhMap(2, 6, seed=9)
    x, y = make_data(120, seed=23)
    y[60:] += 0.5 * x[60:, 0]  # the other client's data follow a different function
    me = FedBNRClient(fmap, sigma=sigma, lam=lam, min_upload=10, client_id="me", others_weight=alpha)
    other = FedBNRClient(fmap, sigma=sigma, lam=lam, min_upload=10, client_id="other")
    server = FedBNRServer(6, kernel_version=fmap.version, min_samples=10, sigma=sigma, lam=lam,
                          fit_hyperparameters=False)
    me.learn_many(x[:30], y[:30])
    server.apply(me.make_upload())
    me.learn_many(x[30:50], y[30:50])
    me.make_upload()  # not in the global
    me.learn_many(x[50:60], y[50:60])  # pending
    other.learn_many(x[60:], y[60:])
    server.apply(other.make_upload())
    me.apply_global(server.publish())
    phi = np.stack([fmap.transform_one(xi) for xi in x])
    return me, phi, y


@pytest.mark.parametrize("alpha", [0.0, 0.3, 1.0])
def test_others_weight_is_a_power_prior_on_the_other_clients(alpha: float) -> None:
    sigma, lam = 0.3, 0.8
    me, phi, y = _two_client_setup(alpha, sigma, lam)
    own, oth = slice(0, 60), slice(60, 120)
    a = (phi[own].T @ phi[own] + alpha * phi[oth].T @ phi[oth]) / sigma**2 + np.eye(6) / lam**2
    h = (phi[own].T @ y[own] + alpha * phi[oth].T @ y[oth]) / sigma**2
    m, cov = me.posterior()
    assert rel(cov, np.linalg.inv(a)) < 1e-9 and rel(m, np.linalg.solve(a, h)) < 1e-9
    assert me.working_stats().n == pytest.approx(60 + 60 * alpha)


def test_auto_others_weight_maximises_the_evidence_of_own_data() -> None:
    sigma, lam = 0.3, 0.8
    me, phi, y = _two_client_setup("auto", sigma, lam)
    own, oth = slice(0, 60), slice(60, 120)

    def oracle_score(alpha: float) -> float:
        # L_others^α is a Gaussian likelihood with noise σ²/α (constants cancel in the ratio), so
        # log p(y_own | power prior) = log N([y_o; y_own]) - log N(y_o), both n×n Gaussians.
        if alpha == 0.0:
            return oracle_log_evidence(phi[own], y[own], sigma, lam)
        p = np.vstack([phi[oth], phi[own]])
        yy = np.r_[y[oth], y[own]]
        noise = np.r_[np.full(60, sigma**2 / alpha), np.full(60, sigma**2)]
        k = lam**2 * p @ p.T + np.diag(noise)
        ko = lam**2 * phi[oth] @ phi[oth].T + sigma**2 / alpha * np.eye(60)
        joint = -0.5 * (np.linalg.slogdet(2 * np.pi * k)[1] + yy @ np.linalg.solve(k, yy))
        marg = -0.5 * (np.linalg.slogdet(2 * np.pi * ko)[1] + y[oth] @ np.linalg.solve(ko, y[oth]))
        return float(joint - marg)

    scores = [oracle_score(a) for a in OTHERS_WEIGHT_GRID]
    expected = OTHERS_WEIGHT_GRID[int(np.argmax(scores))]
    assert me.others_weight == expected
    assert 0.0 < expected < 1.0  # the data are built so neither extreme wins
    own_st = me.own_stats()
    others = SufficientStats.from_samples(phi[oth], y[oth], kernel_version=own_st.kernel_version)
    others = SufficientStats(others.S[None], others.b[None], others.n, others.q, own_st.kernel_version)
    for a_, sc in zip(OTHERS_WEIGHT_GRID, scores, strict=True):
        prior = others.scaled(a_)
        got = float(log_evidence(prior + own_st, sigma, lam)[0] - log_evidence(prior, sigma, lam)[0])
        assert got == pytest.approx(sc, rel=1e-8, abs=1e-8)


def test_local_hyperparameters_are_fitted_on_the_working_statistics() -> None:
    fmap = TanhMap(2, 6, seed=10)
    x, y = make_data(150, seed=24, noise=0.3)
    me = FedBNRClient(fmap, min_upload=10, client_id="me", others_weight=0.2, local_hyperparameters=True)
    other = FedBNRClient(fmap, min_upload=10, client_id="other")
    server = FedBNRServer(6, kernel_version=fmap.version, min_samples=10)
    me.learn_many(x[:50], y[:50])
    server.apply(me.make_upload())
    other.learn_many(x[50:], 3.0 * y[50:])  # another noise level: the global's σ is not this client's
    server.apply(other.make_upload())
    g = server.publish()
    me.apply_global(g)
    phi = np.stack([fmap.transform_one(xi) for xi in x])
    ws = SufficientStats.from_samples(phi[:50], y[:50]) + SufficientStats.from_samples(
        phi[50:], 3.0 * y[50:]).scaled(0.2)
    sigma, lam, _ = fit_hyperparameters(ws.S, ws.b, ws.n, ws.q)
    assert me.sigma[0] == pytest.approx(sigma, rel=1e-6) and me.lam[0] == pytest.approx(lam, rel=1e-6)
    assert abs(me.sigma[0] - g.sigma[0]) > 0.05
    m, _ = me.posterior()
    a = ws.S / sigma**2 + np.eye(6) / lam**2
    assert rel(m, np.linalg.solve(a, ws.b / sigma**2)) < 1e-6


def test_state_pickled_before_the_packed_buffer_still_loads() -> None:
    x, y = make_data(50, d=2, seed=43)
    a = FedBNRClient(n_inputs=2, n_features=5, forgetting=0.97, bandwidth=(0.7, 2.0), min_upload=8)
    a.learn_many(x[:25], y[:25])
    # the earlier layout: every array its own attribute (copies), scalars as plain attributes, no buffer
    old = {k: v for k, v in a.__getstate__().items() if k not in ("_buf", "_layout")}
    for attr in FedBNRClient._VIEWS:
        if attr != "_wt":
            old[attr] = np.array(getattr(a, attr))
    for attr in FedBNRClient._SCALARS:
        old[attr] = getattr(a, attr)
    b = FedBNRClient.__new__(FedBNRClient)
    b.__setstate__(old)
    for xi, yi in zip(x[25:], y[25:].tolist(), strict=True):
        assert a.learn_predict(xi, yi) == b.learn_predict(xi, yi)
    assert np.array_equal(a._ra, b._ra) and a.own_stats() == b.own_stats()


# ----------------------------------------------------------------------------- lazy kernels and the cheap defaults


def _drifting_stream(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Smooth first (the wide kernels win by far), then rough (a narrow kernel's weight rises again)."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-2, 2, (n, 2))
    y = np.where(np.arange(n) < n // 2, 0.5 * x[:, 0], np.sin(6 * x[:, 0]) * np.cos(5 * x[:, 1]))
    return x, y + 0.05 * rng.standard_normal(n)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lazy_kernels_predict_as_the_eager_path(seed: int) -> None:
    """Lazy kernels against every kernel updated at every sample (`lazy_gap = 0`): the same predictions to
    rounding while kernels sleep, wake (their weight rises on the drifting stream) and a global is installed; their
    evidence bound is never below the exact evidence; after a wake the factors are the eager ones."""
    x, y = _drifting_stream(600, seed)
    kw = {"n_inputs": 2, "n_features": 12, "bandwidth": (0.05, 0.3, 1.0, 4.0, 20.0), "sigma": 0.1, "lam": 1.0,
          "min_upload": 50, "seed": seed}
    lazy, eager = FedBNRClient(lazy_gap=LAZY_GAP, **kw), FedBNRClient(**kw)
    servers = [FedBNRServer.for_client(c, fit_hyperparameters=False) for c in (lazy, eager)]
    slept = woke = 0
    for t in range(len(y)):
        before = lazy._lazy.copy()
        m1, v1 = lazy.learn_predict(x[t], float(y[t]))
        m2, v2 = eager.learn_predict(x[t], float(y[t]))
        assert m1 == pytest.approx(m2, rel=1e-10, abs=1e-12) and v1 == pytest.approx(v2, rel=1e-10)
        slept += int(np.sum((before == 0) & (lazy._lazy != 0)))
        woke += int(np.sum((before != 0) & (lazy._lazy == 0)))
        exact = eager.log_evidence()
        asleep = lazy._lazy != 0
        assert np.all(lazy._bound[asleep] >= exact[asleep] - 1e-8)  # an upper bound of the evidence
        if t % 250 == 249:  # a global (same statistics, same σ, λ): every factor rebuilt
            for c, srv in zip((lazy, eager), servers, strict=True):
                srv.apply(c.make_upload())
                c.apply_global(srv.publish())
    assert slept > 0 and woke > 0  # both paths were taken
    assert np.allclose(lazy.kernel_weights(), eager.kernel_weights(), rtol=1e-9, atol=1e-300)
    assert rel(lazy._ra, eager._ra) < 1e-10  # kernel_weights() woke every kernel: the eager factors


def test_lazy_kernels_off_with_forgetting_and_one_kernel() -> None:
    # the evidence bound needs the evidence to be a sum of log predictive densities: no forgetting
    from streamfed.algorithms.fedbnr import _layout as lay

    for kw in ({"forgetting": 0.99}, {"half_life_s": 60.0}):
        c = FedBNRClient(n_inputs=1, n_features=4, bandwidth=(1.0, 2.0), lazy_gap=5.0, **kw)
        assert c._buf[lay.H_LAZY_GAP] == 0.0
    assert FedBNRClient(n_inputs=1, n_features=4, lazy_gap=5.0)._buf[lay.H_LAZY_GAP] == 0.0  # one kernel
    with pytest.raises(ValueError):
        FedBNRClient(n_inputs=1, n_features=4, lazy_gap=-1.0)


def test_client_pickled_before_lazy_kernels_loads() -> None:
    """A packed buffer of the layout before the `lazy`/`bound` blocks: padded on load, no kernel lazy."""
    from streamfed.algorithms.fedbnr import _layout as lay

    x, y = make_data(40, seed=5)
    c = FedBNRClient(n_inputs=2, n_features=6, bandwidth=(0.5, 2.0))
    c.learn_many(x, y)
    state = c.__getstate__()
    old = state["_buf"][: state["_layout"]["lazy"][0]].copy()  # the earlier layout is this prefix
    old[lay._H_OFF + lay.BLOCKS.index("lazy")] = old[lay._H_OFF + lay.BLOCKS.index("bound")] = 0.0
    twin = object.__new__(FedBNRClient)
    twin.__setstate__({**state, "_buf": old})
    assert twin.predict(np.array([0.3, -0.2])) == c.predict(np.array([0.3, -0.2]))
    assert np.all(twin._lazy == 0.0) and twin._buf[lay.H_LAZY_GAP] == 0.0


class _EverySync(FedBNRRegressor):
    """The estimator as it synced before: every `sync_every` samples, refit due or not."""

    def _until_sync(self) -> float:
        assert self.client is not None
        return int(self.sync_every) - self.client.n_pending


@pytest.mark.parametrize("growth", [0.0, 0.5, 1.0])
def test_river_regressor_syncing_at_refits_is_syncing_every_32(growth: float) -> None:
    """Skipping the syncs without a refit gives the model a sync every `sync_every` samples gives (a global
    without a refit holds exactly the statistics the working posterior has): to rounding, lazy kernels or not."""
    x, y = _drifting_stream(300, 7)
    ref = _EverySync(n_features=10, refit_growth=growth, lazy_gap=0.0)
    models = [FedBNRRegressor(n_features=10, refit_growth=growth, lazy_gap=g) for g in (0.0, LAZY_GAP)]
    for xi, yi in zip(x, y, strict=True):
        xd = {"a": xi[0], "b": xi[1]}
        want = ref.predict_one(xd, with_dist=True)
        for m in models:
            got = m.predict_one(xd, with_dist=True)
            assert got.mu == pytest.approx(want.mu, rel=1e-9, abs=1e-12)
            assert got.sigma == pytest.approx(want.sigma, rel=1e-9)
            m.learn_one(xd, yi)
        ref.learn_one(xd, yi)
    assert models[0].client is not None and ref.client is not None
    # the same fits, at the same sample counts (to rounding: the profile search's σ is continuous in the sums, which
    # are added up in other groupings; a fit at another sample count would move σ by far more)
    assert np.allclose(models[0].client.sigma, ref.client.sigma, rtol=1e-10, atol=0.0)
    if growth > 0:
        assert models[0].client.global_version < ref.client.global_version


def _factor_stats(client: FedBNRClient) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`(S (K,F,F), b (K,F), q (K,))` held in the working factors, written out: `M = RₐᵀRₐ`, `S = σ²(M_FF − λ⁻²I)`,
    `b = σ² M_F,F+1`, `q = σ² M_F+1,F+1` (no forgetting)."""
    out_s, out_b, out_q = [], [], []
    f = client.dim
    for k in range(client.n_kernels):
        r = client._ra[k]
        m = r.T @ r
        s2, l2 = float(client.sigma[k]) ** 2, float(client.lam[k]) ** 2
        out_s.append(s2 * (m[:f, :f] - np.eye(f) / l2))
        out_b.append(s2 * m[:f, f])
        out_q.append(s2 * m[f, f])
    return np.array(out_s), np.array(out_b), np.array(out_q)


@pytest.mark.parametrize("seed", [0, 1])
def test_lazy_kernels_fold_in_every_row(seed: int) -> None:
    """A lazily held kernel's statistics, once it is evaluated again, are the eager ones: the factors of every kernel
    (those that slept included) hold `Σ φφᵀ`, `Σ φy`, `Σ y²` of every sample learned — sums written out in numpy from
    the feature rows — to rounding, at checkpoints while kernels sleep and wake and at the end. A row a sleeping
    kernel missed (or took twice) moves its sums by a whole `φφᵀ` and fails this."""
    x, y = _drifting_stream(500, seed)
    c = FedBNRClient(n_inputs=2, n_features=12, bandwidth=(0.05, 0.3, 1.0, 4.0, 20.0), sigma=0.1, lam=1.0,
                     min_upload=10**6, seed=seed, lazy_gap=LAZY_GAP)
    phis = c.features_many(x)  # (T, K, F)
    slept = 0
    for t in range(len(y)):
        c.learn_predict(x[t], float(y[t]))
        slept += int(np.sum(c._lazy != 0))
        if t % 125 == 124 or t == len(y) - 1:
            c.kernel_weights()  # an evaluation outside the hot path: every lazy kernel is brought up to date
            assert np.all(c._lazy == 0)
            s, b, q = _factor_stats(c)
            want_s = np.einsum("tki,tkj->kij", phis[: t + 1], phis[: t + 1])
            want_b = np.einsum("tki,t->ki", phis[: t + 1], y[: t + 1])
            want_q = float(y[: t + 1] @ y[: t + 1])
            assert np.allclose(s, want_s, rtol=0, atol=1e-8 * np.abs(want_s).max())
            assert np.allclose(b, want_b, rtol=0, atol=1e-8 * np.abs(want_b).max())
            assert np.allclose(q, want_q, rtol=1e-9)
    assert slept > 0  # kernels were held lazily


class _Eager(FedBNRRegressor):
    """The estimator with every sample given to its client at once (no deferred learn)."""

    def _learn_z(self, z: np.ndarray, zy: float) -> None:
        self._settle()
        assert self._client is not None
        self._client.learn(z, zy)


@pytest.mark.parametrize("standardise", [True, False])
def test_river_regressor_deferred_learn_is_the_eager_model(standardise: bool) -> None:
    """`learn_one` hands its sample to the client at the next `predict_one` (one pass over each factor): the same
    predictions to the last bit as giving it at once (every kernel eager); with lazy kernels (the default), the same
    to rounding while kernel weights move (the drifting stream's narrow kernels sleep, then wake); and at the end the
    client's statistics are the numpy sums of every sample's feature rows (no row lost or doubled by either)."""
    x, y = _drifting_stream(400, 3)
    kw = {"n_features": 10, "standardise": standardise, "calibrate": False, "sync_every": 16}
    eager = _Eager(lazy_gap=0.0, **kw)
    deferred, default = FedBNRRegressor(lazy_gap=0.0, **kw), FedBNRRegressor(**kw)
    slept = woke = 0
    for xi, yi in zip(x, y, strict=True):
        xd = {"a": float(xi[0]), "b": float(xi[1])}
        want = eager.predict_one(xd, with_dist=True)
        got = deferred.predict_one(xd, with_dist=True)
        assert (got.mu, got.sigma) == (want.mu, want.sigma)
        lazy_before = None if default._client is None else default._client._lazy.copy()
        g = default.predict_one(xd, with_dist=True)
        assert g.mu == pytest.approx(want.mu, rel=1e-9, abs=1e-12) and g.sigma == pytest.approx(want.sigma, rel=1e-9)
        if lazy_before is not None:
            slept += int(np.sum((lazy_before == 0) & (default._client._lazy != 0)))
            woke += int(np.sum((lazy_before != 0) & (default._client._lazy == 0)))
        for m in (eager, deferred, default):
            m.learn_one(xd, float(yi))
    assert slept > 0 and woke > 0
    assert deferred._deferred is not None  # the last sample is still waiting for a predict ...
    client = deferred.client  # ... and reading the client gives it over
    assert deferred._deferred is None and client is not None
    if not standardise:  # the client saw the raw inputs: its statistics are sums of their feature rows
        phis = client.features_many(x)
        own = client.own_stats()
        assert own.n == len(y)
        assert np.allclose(own.S, np.einsum("tki,tkj->kij", phis, phis), rtol=1e-12, atol=1e-9)
        assert np.allclose(own.b, np.einsum("tki,t->ki", phis, y), rtol=1e-12, atol=1e-9)
    eager_client = eager.client
    assert eager_client is not None
    assert np.array_equal(client._ra, eager_client._ra) and client.own_stats() == eager_client.own_stats()


def test_river_regressor_pickled_with_a_deferred_sample() -> None:
    """A copy (pickle) gives the deferred sample to the client first: the copy predicts as the original."""
    x, y = _drifting_stream(80, 4)
    m = FedBNRRegressor(n_features=8)
    for xi, yi in zip(x, y, strict=True):
        xd = {"a": float(xi[0]), "b": float(xi[1])}
        m.predict_one(xd)
        m.learn_one(xd, float(yi))
    twin = pickle.loads(pickle.dumps(m))
    probe = {"a": 0.3, "b": -0.4}
    assert twin.predict_one(probe, with_dist=True).mu == m.predict_one(probe, with_dist=True).mu
    assert twin.client is not None and twin.client.n_pending == m.client.n_pending  # type: ignore[union-attr]


def test_compiled_zoom_search_is_the_numpy_search() -> None:
    from streamfed.algorithms.fedbnr._compiled import kern
    from streamfed.algorithms.fedbnr.evidence import MAX_CONDITION, zoom_search_reference

    rng = np.random.default_rng(3)
    for _ in range(12):
        n, f = int(rng.integers(3, 300)), int(rng.integers(1, 40))
        phi = rng.standard_normal((n, f)) * rng.uniform(0.1, 3.0)
        yv = phi @ rng.standard_normal(f) * rng.uniform(0.0, 1.0) + rng.standard_normal(n) * rng.uniform(0.01, 1.0)
        e, u = np.linalg.eigh(phi.T @ phi)
        e = np.clip(e, 0.0, None)
        z2 = (u.T @ (phi.T @ yv)) ** 2
        q = float(yv @ yv)
        gs, gl = np.linspace(-6.0, 2.0, 7), np.linspace(-4.0, 5.0, 9)
        out = np.empty((7, 9))
        kern.evidence_grid(e, z2, float(n), q, gs, gl, out)
        assert np.allclose(out, spectral_log_evidence(e, z2, float(n), q, gs[:, None], gl[None, :]), rtol=1e-12)
        lo, hi = np.array([-8.0, -6.0]), np.array([2.0, 6.0])
        want, want_value = zoom_search_reference(e, z2, float(n), q, lo, hi)
        best = np.empty(2)
        value = kern.zoom_search(e, z2, float(n), q, lo, hi, 21, 6, math.log(MAX_CONDITION), best)
        assert np.allclose(best, want, rtol=0.0, atol=1e-12) and value == pytest.approx(want_value, rel=1e-12)


def _random_stats(rng: np.random.Generator) -> SufficientStats:
    n, f = int(rng.integers(2, 300)), int(rng.integers(1, 60))
    phi = rng.standard_normal((n, f)) * rng.uniform(0.1, 3.0)
    if f > 3 and rng.uniform() < 0.3:
        phi[:, -1] = phi[:, 0]  # a singular scatter
    yv = phi @ rng.standard_normal(f) * rng.uniform(0.0, 1.0) + rng.standard_normal(n) * rng.uniform(0.01, 1.0)
    return SufficientStats.from_samples(phi, yv)


def test_profile_search_is_its_numpy_transcription_and_beats_the_grid() -> None:
    """`fit_hyperparameters(search="profile")` (tridiagonal form, compiled) against its plain numpy transcription
    on `S` itself (dense `slogdet`/`solve` per point): the same point and evidence to rounding; that evidence is
    the exact one (Cholesky) at the returned `σ, λ`, and at least the 2-d grid's (the profile is exact in `σ`)."""
    from streamfed.algorithms.fedbnr.evidence import profile_search_reference

    rng = np.random.default_rng(11)
    for _ in range(25):
        st = _random_stats(rng)
        sig, lam, value = fit_hyperparameters(st.S, st.b, st.n, st.q, search="profile")
        # the box of docs/algorithms.md §4.7: σ ∈ ȳ·[1e-4, 10], λ ∈ (ȳ/φ̄)·[1e-3, 1e3], ȳ = √(q/n), φ̄ = √(tr S / n)
        y_bar, phi_bar = math.sqrt(st.q / st.n), math.sqrt(np.trace(st.S) / st.n)
        lo = np.log([y_bar * 1e-4, y_bar / phi_bar * 1e-3])
        hi = np.log([y_bar * 10.0, y_bar / phi_bar * 1e3])
        want, want_value = profile_search_reference(st.S, st.b, st.n, st.q, lo, hi)
        # the evidence to rounding — which grows with the condition number of the precision: near the cap (an
        # interpolating fit, n < F, cond ~1e11) the evaluations differ at ~1e-8 — and the points too, except along
        # directions where the evidence is flat to rounding (there the residual term is ~0 for a range of σ)
        cond = 1.0 + lam**2 * np.linalg.eigvalsh(st.S)[-1] / sig**2
        tol = 1e-10 if cond < 1e6 else 1e-6
        assert value == pytest.approx(want_value, rel=tol)
        assert value == pytest.approx(float(log_evidence(st, sig, lam)), rel=tol)
        if st.n > 2 * st.dim:
            assert np.allclose([math.log(sig), math.log(lam)], want, rtol=0.0, atol=1e-6)
        g_sig, g_lam, g_value = fit_hyperparameters(st.S, st.b, st.n, st.q)
        assert value >= g_value - 1e-7 * abs(g_value)
        assert lo[0] - 1e-12 <= math.log(sig) <= hi[0] + 1e-12 and lo[1] - 1e-12 <= math.log(lam) <= hi[1] + 1e-12
    with pytest.raises(ValueError, match="search"):
        fit_hyperparameters(st.S, st.b, st.n, st.q, search="newton")
    with pytest.raises(ValueError, match="search"):
        FedBNRServer(dim=3, search="newton")
    with pytest.raises(ValueError, match="evidence_search"):
        FedBNRRegressor(evidence_search="newton")


def test_profile_search_respects_the_condition_cap() -> None:
    """A target that repeats exactly (a noise-free fit): the evidence would have σ → 0, the cap on the condition
    number of the precision (`MAX_CONDITION`) holds it, as in the grid search."""
    from streamfed.algorithms.fedbnr.evidence import MAX_CONDITION

    phi = np.random.default_rng(2).standard_normal((50, 5))
    st = SufficientStats.from_samples(phi, phi @ np.arange(1.0, 6.0))
    sig, lam, value = fit_hyperparameters(st.S, st.b, st.n, st.q, search="profile")
    top = np.linalg.eigvalsh(st.S)[-1]
    assert 1.0 + lam**2 * top / sig**2 <= MAX_CONDITION * (1 + 1e-9) and math.isfinite(value)
    factor_ok = np.linalg.cholesky(st.S / sig**2 + np.eye(5) / lam**2)
    assert np.all(np.isfinite(factor_ok))


def test_factorise_into_out_is_factorise_and_all_or_nothing() -> None:
    from streamfed.algorithms.fedbnr.factor import factorise

    rng = np.random.default_rng(5)
    st = SufficientStats.from_samples(rng.standard_normal((30, 3, 6)), rng.standard_normal(30))
    sigma, lam, pdiag = np.array([0.5, 1.0, 2.0]), np.array([1.0, 0.3, 3.0]), np.ones((3, 6))
    want = factorise(st.S, st.b, st.q, sigma, lam, pdiag)
    out = np.full((3, 7, 7), np.nan)
    assert factorise(st.S, st.b, st.q, sigma, lam, pdiag, out=out) is out and np.array_equal(out, want)
    bad = st.S.copy()
    bad[2] = -np.eye(6) * 1e3  # the last kernel's precision is not positive definite
    keep = out.copy()
    with pytest.raises(ValueError, match="positive definite"):
        factorise(bad, st.b, st.q, sigma, lam, pdiag, out=out)
    assert np.array_equal(out, keep)


def test_standardiser_rows_are_the_numpy_formulas() -> None:
    """The compiled row transform and Welford update against their numpy transcription, bit for bit."""
    from streamfed.core.standardise import OnlineStandardiser

    rng = np.random.default_rng(4)
    s = OnlineStandardiser(3, clip=5.0)
    for t in range(60):
        v = rng.standard_normal(3) * [1.0, 100.0, 1e-3] + [0.0, 1e3, 5.0]
        if t == 10:
            v[2] = s.mean[2]  # a column without spread so far falls back to |mean|
        count, mean, m2 = s.count, s.mean.copy(), s.m2.copy()
        if count >= 2:
            with np.errstate(invalid="ignore", divide="ignore"):
                scale = np.sqrt(m2 / (count - 1))
        else:
            scale = np.zeros(3)
        scale = np.where(scale > 0, scale, np.where(mean != 0, np.abs(mean), 1.0))
        assert np.array_equal(s.transform(v), np.clip((v - mean) / scale, -5.0, 5.0))
        s.update(v)
        delta = v - mean
        want_mean = mean + delta / (count + 1)
        assert np.array_equal(s.mean, want_mean) and np.array_equal(s.m2, m2 + delta * (v - want_mean))
    with pytest.raises(ValueError):
        s.update(np.array([1e300, 0.0, 0.0]) * 1e10)
    assert s.count == 60


def test_stream_scales_learn_is_the_numpy_formulas() -> None:
    """`StreamScales.learn` (no copies; the input standardised by the predict before it reused) against the numpy
    transcription of past-only standardisation and Welford's update, bit for bit, inputs and target; a refused
    sample (overflow, or the learner raising) changes nothing."""
    from streamfed.core.standardise import StreamScales

    rng = np.random.default_rng(5)
    sc = StreamScales(2)
    xs, ys, seen = [], [], []

    def transcribe(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        mean, m2 = np.zeros(rows.shape[1]), np.zeros(rows.shape[1])
        for t in range(len(rows)):  # Welford, as the module documents
            delta = rows[t] - mean
            mean = mean + delta / (t + 1)
            m2 = m2 + delta * (rows[t] - mean)
        return mean, m2

    for t in range(40):
        v, yv = rng.standard_normal(2) * [3.0, 1e-2] + [10.0, -1.0], float(rng.normal(50.0, 5.0))
        if t % 3 == 0 and sc.ready:
            sc.predict(v, lambda z: (0.0, 1.0))  # a predict first: its z is reused
        if sc.ready:
            mean, m2 = transcribe(np.array(xs))
            scale = np.sqrt(m2 / (len(xs) - 1))
            want_x = np.clip((v - mean) / scale, -INPUT, INPUT)
            ym, ym2 = transcribe(np.array(ys)[:, None])
            want_y = (yv - ym[0]) / math.sqrt(ym2[0] / (len(ys) - 1))
        sc.learn(v, yv, lambda z, zy: seen.append((z.copy(), zy)))
        if len(xs) >= 2:
            assert np.array_equal(seen[-1][0], want_x) and seen[-1][1] == want_y
        xs.append(v)
        ys.append(yv)
    mean, m2 = transcribe(np.array(xs))
    assert np.array_equal(sc.x.mean, mean) and np.array_equal(sc.x.m2, m2) and sc.x.count == 40
    before = (sc.x.mean.copy(), sc.x.m2.copy(), sc.y.mean.copy(), sc.y.m2.copy(), sc.x.count, sc.y.count)

    def refuse(z: np.ndarray, zy: float) -> None:
        raise ValueError("no")

    for bad in (lambda: sc.learn(np.array([1e300, 0.0]) * 1e10, 1.0, seen.append),
                lambda: sc.learn(np.array([1.0, 0.0]), 1e300, seen.append),
                lambda: sc.learn(np.array([1.0, 0.0]), 1.0, refuse)):
        with pytest.raises(ValueError), np.errstate(over="ignore"):
            bad()
        after = (sc.x.mean, sc.x.m2, sc.y.mean, sc.y.m2, sc.x.count, sc.y.count)
        assert all(np.array_equal(a, b) for a, b in zip(before, after, strict=True))


INPUT = 5.0  # the inputs' winsorising bound of the defaults (streamfed.core.standardise.INPUT_CLIP)


def test_predictive_distribution_is_rivers_gaussian() -> None:
    """`gaussian()` builds what River's own constructor does (without a generator seeded per distribution)."""
    from streamfed.core.river_inputs import gaussian

    ours, theirs = gaussian(1.5, 4.0), proba.Gaussian._from_state(n=1, m=1.5, var=4.0, ddof=0)
    assert type(ours) is type(theirs) and set(vars(ours)) == set(vars(theirs))
    for a, b in ((ours._var, theirs._var), (ours._var.mean, theirs._var.mean)):  # noqa: SLF001
        assert type(a) is type(b) and vars(a) == {k: v for k, v in vars(b).items() if k != "mean"} | (
            {"mean": a.mean} if "mean" in vars(b) else {})
    assert (ours.mu, ours.sigma, ours.n_samples) == (theirs.mu, theirs.sigma, theirs.n_samples) == (1.5, 2.0, 1)
    assert ours(0.3) == theirs(0.3) and ours.cdf(2.0) == theirs.cdf(2.0)
    assert math.isfinite(ours.sample())
