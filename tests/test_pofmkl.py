"""POF-MKL against its plain NumPy oracle, numerical safety, River conformance, server half."""

import numpy as np
import pytest
from river import checks

from streamfed.algorithms.base import NonFiniteError
from streamfed.algorithms.pofmkl._kernels import N_DRAWS
from streamfed.algorithms.pofmkl.client import POFMKLClient
from streamfed.algorithms.pofmkl.estimator import POFMKLRegressor
from streamfed.algorithms.pofmkl.messages import KernelUpdate
from streamfed.algorithms.pofmkl.server import POFMKLServer, run_lockstep
from streamfed.core.features import KernelSpec, RFFBank, gaussian_dictionary
from tests.oracles.pofmkl import OracleClient, oracle_server_update


def make_streams(n_clients, n_steps, d, seed):
    """Non-i.i.d. clients: each has its own smooth target; ‖x‖ ≤ 1, y in about [0, 1]."""
    rng = np.random.default_rng(seed)
    xs, ys = [], []
    for _c in range(n_clients):
        x = rng.standard_normal((n_steps, d))
        x /= np.maximum(1.0, np.linalg.norm(x, axis=1))[:, None]
        a, b = rng.standard_normal(d), rng.uniform(1, 6)
        y = 0.5 + 0.4 * np.sin(b * x @ a) + 0.05 * rng.standard_normal(n_steps)
        xs.append(x)
        ys.append(y)
    return xs, ys


def mixed_dictionary(n):
    kinds = ["gaussian", "laplacian", "matern32", "matern52"]
    return [KernelSpec(kinds[p % 4], float(0.2 * 1.6**p)) for p in range(n)]


CONFIGS = [  # (N, M, ξ, η, λ)
    (8, 1, 0.3, 0.1, 1e-3),
    (8, 8, 0.0, 0.2, 1e-3),  # M = N: one bin, everything uploaded
    (7, 3, 0.0, 0.05, 1e-2),  # last bin smaller than M
    (6, 2, 1.0, 0.1, 0.0),  # ξ = 1: uniform bins, no sort
    (5, 1, 0.0, 0.05, 1e-4),  # M = 1, pure exploitation
    (16, 4, 0.3, 0.05, 1e-3),
]


@pytest.mark.parametrize(("n_kernels", "m", "xi", "eta", "lam"), CONFIGS)
def test_matches_plain_oracle(n_kernels, m, xi, eta, lam):
    n_clients, n_steps, d = 4, 5000, 3
    xs, ys = make_streams(n_clients, n_steps, d, seed=n_kernels * 10 + m)
    bank = RFFBank(mixed_dictionary(n_kernels), n_features=12, n_inputs=d, seed=42)
    clients = [POFMKLClient(bank, eta, lam, xi, m, rng=np.random.default_rng(100 + c))
               for c in range(n_clients)]
    server = POFMKLServer(n_kernels, bank.dim)
    oracles = [OracleClient(bank.frequencies, eta, lam, xi, m) for _ in range(n_clients)]
    oracle_rngs = [np.random.default_rng(100 + c) for c in range(n_clients)]  # same draws, one at a time
    theta_o = np.zeros((n_kernels, bank.dim))
    max_err = 0.0  # relative error of ŷ and of every Δ, over all steps and clients
    for t in range(n_steps):
        all_deltas = []
        for c in range(n_clients):
            yhat, upd = clients[c].step(xs[c][t], ys[c][t])
            yhat_o, deltas_o = oracles[c].step(theta_o, xs[c][t], ys[c][t], oracle_rngs[c].random())
            assert sorted(upd.kernels.tolist()) == sorted(deltas_o), f"bin differs at t={t}, c={c}"
            assert upd.n_numbers <= m * bank.dim
            max_err = max(max_err, abs(yhat - yhat_o) / (1.0 + abs(yhat_o)))
            expected = np.stack([deltas_o[int(k)] for k in upd.kernels])
            max_err = max(max_err, float(np.max(np.abs(upd.delta - expected) / (1.0 + np.abs(expected)))))
            server.add(upd)
            all_deltas.append(deltas_o)
        version = server.finish_round()
        theta_o = oracle_server_update(theta_o, all_deltas)
        for client in clients:
            client.set_global(server.theta, version)
    assert max_err < 1e-9
    np.testing.assert_allclose(server.theta, theta_o, rtol=1e-9, atol=1e-9)
    assert np.abs(server.theta).max() > 0.1  # it did learn something
    for client, oracle in zip(clients, oracles, strict=True):
        np.testing.assert_allclose(client.kernel_weights, oracle.wbar, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(client.cumulative_loss, oracle.L, rtol=1e-9)
        np.testing.assert_allclose(client.kernel_losses, oracle.Lp, rtol=1e-9)
        assert client.regret == pytest.approx(oracle.L - oracle.Lp.min(), rel=1e-9, abs=1e-9)


def test_run_lockstep_equals_manual_rounds():
    xs, ys = make_streams(3, 200, 2, seed=1)
    bank = RFFBank(gaussian_dictionary(4), 8, 2, seed=0)
    a = [POFMKLClient(bank, rng=c) for c in range(3)]
    sa = POFMKLServer(4, bank.dim)
    preds = run_lockstep(a, sa, xs, ys)
    b = [POFMKLClient(bank, rng=c) for c in range(3)]
    sb = POFMKLServer(4, bank.dim)
    for t in range(200):
        ups = []
        for c in range(3):
            yhat, u = b[c].step(xs[c][t], ys[c][t])
            assert yhat == preds[t, c]
            ups.append(u)
        v = sb.apply_round(ups)
        for cl in b:
            cl.set_global(sb.theta, v)
    np.testing.assert_array_equal(sa.theta, sb.theta)


def test_server_divides_by_reporting_clients():
    s = POFMKLServer(n_kernels=3, dim=2)
    s.apply_round([KernelUpdate(np.array([0]), np.array([[2.0, 4.0]])),
                   KernelUpdate(np.array([2]), np.array([[6.0, 0.0]])),
                   KernelUpdate(np.array([0, 1]), np.array([[1.0, 1.0], [3.0, 3.0]]))])
    np.testing.assert_allclose(s.theta, -np.array([[3.0, 5.0], [3.0, 3.0], [6.0, 0.0]]) / 3)
    assert s.version == 1


@pytest.mark.parametrize("bad", [
    KernelUpdate(np.array([0]), np.array([[np.nan, 0.0]])),
    KernelUpdate(np.array([5]), np.zeros((1, 2))),
    KernelUpdate(np.array([1, 1]), np.zeros((2, 2))),
    KernelUpdate(np.array([0]), np.zeros((1, 3))),
])
def test_server_rejects_bad_updates_without_change(bad):
    s = POFMKLServer(n_kernels=3, dim=2)
    s.apply_round([KernelUpdate(np.array([1]), np.ones((1, 2)))])
    before = s.theta.copy()
    with pytest.raises(ValueError):
        s.add(bad)
    assert s.finish_round() == 2
    np.testing.assert_array_equal(s.theta, before)


def client_state(c):
    # draws used from the current block; a used-up block (N_DRAWS) and a fresh one (0) are the same
    # position in the stream: the next step takes the first draw of a new block
    return c.logw.copy(), c.acc.copy(), c.theta.copy(), int(c._draws[0]) % N_DRAWS


def assert_same_state(a, b):
    for u, v in zip(a, b, strict=True):
        np.testing.assert_array_equal(u, v)


def test_bad_input_raises_and_changes_nothing():
    bank = RFFBank(gaussian_dictionary(4), 8, 3, seed=0)
    c = POFMKLClient(bank, rng=0)
    c.step(np.array([0.1, 0.2, 0.3]), 0.4)
    before = client_state(c)
    with pytest.raises(ValueError, match="non-finite"):
        c.step(np.array([0.1, np.nan, 0.3]), 0.4)
    with pytest.raises(ValueError, match="label"):
        c.step(np.array([0.1, 0.2, 0.3]), np.inf)
    with pytest.raises(ValueError, match="shape"):
        c.step(np.array([0.1, 0.2]), 0.4)
    assert_same_state(before, client_state(c))


def test_overflow_is_detected_and_never_uploaded():
    bank = RFFBank(gaussian_dictionary(4), 8, 3, seed=0)
    c = POFMKLClient(bank, eta=1e300, lam=0.0, rng=0)
    server = POFMKLServer(4, bank.dim)
    c.set_global(np.full((4, bank.dim), 1e10), 1)
    before = client_state(c)
    with pytest.raises(NonFiniteError, match="non-finite"):
        c.step(np.array([0.1, 0.2, 0.3]), 0.4)
    assert_same_state(before, client_state(c))
    assert server.finish_round() == 1 and not server.theta.any()
    with pytest.raises(NonFiniteError):
        c.set_global(np.full((4, bank.dim), np.inf), 2)


def test_log_weights_do_not_underflow():
    """Plain products w·exp(-ηℓ) underflow to 0/0 after a few thousand steps; log weights don't."""
    bank = RFFBank(gaussian_dictionary(3), 4, 2, seed=0)
    c = POFMKLClient(bank, eta=5.0, rng=0)
    for _ in range(5000):
        c.step(np.array([0.3, -0.2]), 10.0)  # a large constant loss every step
    assert np.all(np.isfinite(c.kernel_weights)) and c.kernel_weights.sum() == pytest.approx(1.0)


def test_uniform_blocks_equal_single_draws():
    """The oracle test relies on block draws giving the same stream as one-at-a-time draws."""
    a = np.random.default_rng(9).random(1000)
    r = np.random.default_rng(9)
    np.testing.assert_array_equal(a, [r.random() for _ in range(1000)])


@pytest.mark.slow  # over 2 s: outside the pure tier, in every full run
@pytest.mark.parametrize("params", list(POFMKLRegressor._unit_test_params()))
def test_river_check_estimator(params):
    checks.check_estimator(POFMKLRegressor(**params))


def test_river_regressor_learns_and_ignores_feature_order():
    xs, ys = make_streams(1, 3000, 3, seed=5)
    a, b = POFMKLRegressor(n_kernels=4, n_features=20), POFMKLRegressor(n_kernels=4, n_features=20)
    err_first = err_last = 0.0
    for t, (x, y) in enumerate(zip(xs[0], ys[0], strict=True)):
        d = {"a": x[0], "b": x[1], "c": x[2]}
        e = (a.predict_one(d) - y) ** 2
        assert b.predict_one({"c": x[2], "a": x[0], "b": x[1]}) == a.predict_one(d)
        a.learn_one(d, y)
        b.learn_one(dict(reversed(list(d.items()))), y)
        if t < 300:
            err_first += e
        elif t >= 2700:
            err_last += e
    assert err_last < 0.5 * err_first
    with pytest.raises(ValueError, match="not numeric"):
        a.learn_one({"a": "x", "b": 0.0, "c": 0.0}, 1.0)
    with pytest.raises(ValueError, match="not finite"):
        a.learn_one({"a": 0.0, "b": 0.0, "c": 0.0}, float("nan"))
