"""Property tests of online FedBNR: federation equals centralisation, in any partition and order."""

from __future__ import annotations

import math
import pickle

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamfed.algorithms.fedbnr import _kernels as kern
from streamfed.algorithms.fedbnr.client import FedBNRClient
from streamfed.algorithms.fedbnr.evidence import log_evidence
from streamfed.algorithms.fedbnr.server import FedBNRServer
from streamfed.core.stats import SufficientStats

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def oracle_posterior(phi: np.ndarray, y: np.ndarray, sigma: float,
                     lam: float) -> tuple[np.ndarray, np.ndarray]:
    """Centralised batch Bayesian linear regression: A = σ⁻²ΦᵀΦ + λ⁻²I, m = σ⁻²A⁻¹Φᵀy."""
    a = phi.T @ phi / sigma**2 + np.eye(phi.shape[1]) / lam**2
    cov = np.linalg.inv(a)
    return cov @ phi.T @ y / sigma**2, cov


def oracle_log_evidence(phi: np.ndarray, y: np.ndarray, sigma: float, lam: float) -> float:
    """log N(y; 0, λ²ΦΦᵀ + σ²I)."""
    n = len(y)
    k = lam**2 * phi @ phi.T + sigma**2 * np.eye(n)
    _, logdet = np.linalg.slogdet(k)
    return float(-0.5 * (n * math.log(2 * math.pi) + logdet + y @ np.linalg.solve(k, y)))


class CosMap:
    """Random cosine features plus a bias; independent of the package's RFF code."""

    def __init__(self, n_inputs: int, dim: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.w = rng.standard_normal((dim - 1, n_inputs))
        self.c = rng.uniform(0, 2 * np.pi, dim - 1)
        self.dim = dim
        self.version = f"cos-{seed}-{dim}"

    def transform_one(self, x: np.ndarray) -> np.ndarray:
        return np.append(np.cos(self.w @ x + self.c) * math.sqrt(2.0 / (self.dim - 1)), 1.0)

    def transform_many(self, xs: np.ndarray) -> np.ndarray:
        return np.stack([self.transform_one(x) for x in xs])


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@st.composite
def fleets(draw: st.DrawFn) -> dict:
    n_clients = draw(st.integers(1, 20))
    n = draw(st.integers(n_clients, 160))
    seed = draw(st.integers(0, 2**31))
    rng = np.random.default_rng(seed)
    owner = rng.integers(0, n_clients, n)  # random partition (some clients may get nothing)
    min_upload = draw(st.integers(1, 6))
    return {"n_clients": n_clients, "n": n, "seed": seed, "owner": owner, "min_upload": min_upload,
            "sigma": draw(st.floats(0.05, 2.0)), "lam": draw(st.floats(0.1, 5.0)),
            "dim": draw(st.integers(2, 12))}


@given(fleet=fleets(), data=st.data())
@SETTINGS
def test_global_posterior_equals_centralised_batch_solution(fleet: dict, data: st.DataObject) -> None:
    rng = np.random.default_rng(fleet["seed"])
    n, dim, sigma, lam = fleet["n"], fleet["dim"], fleet["sigma"], fleet["lam"]
    x = rng.uniform(-2, 2, (n, 3))
    y = np.sin(x[:, 0]) * 3 + x[:, 1] + 0.3 * rng.standard_normal(n)
    fmap = CosMap(3, dim, fleet["seed"] % 1000)
    clients = [FedBNRClient(fmap, sigma=sigma, lam=lam, min_upload=fleet["min_upload"], client_id=f"c{c}")
               for c in range(fleet["n_clients"])]
    uploads = []
    # Clients learn their own samples in a random interleaving, uploading whenever the floor allows.
    for t in rng.permutation(n):
        c = clients[fleet["owner"][t]]
        c.learn(x[t], y[t])
        if rng.random() < 0.3:
            up = c.make_upload()
            if up is not None:
                uploads.append(up)
    for c in clients:  # flush what is left (an upload may summarise fewer samples only here)
        if c.n_pending:
            c.min_upload = 1
            uploads.append(c.make_upload())
    # Delivery: random order, some duplicated.
    order = data.draw(st.permutations(list(range(len(uploads)))))
    dups = data.draw(st.lists(st.integers(0, max(len(uploads) - 1, 0)), max_size=10)) if uploads else []
    server = FedBNRServer(dim, kernel_version=fmap.version, min_samples=1, sigma=sigma, lam=lam,
                          fit_hyperparameters=False)
    for i in list(order) + dups:
        server.apply(uploads[i])
    assert server.waiting() == {}
    g = server.publish()
    phi = np.stack([fmap.transform_one(xi) for xi in x])
    om, ocov = oracle_posterior(phi, y, sigma, lam)
    a = g.stats.S[0] / sigma**2 + np.eye(dim) / lam**2
    cov = np.linalg.inv(a)
    mean = cov @ g.stats.b[0] / sigma**2
    assert rel(mean, om) < 1e-8 and rel(cov, ocov) < 1e-8
    assert g.stats.n == n
    # Every client's working posterior after the global is the same centralised posterior.
    for c in clients[:3]:
        assert c.apply_global(g)
        m_c, cov_c = c.posterior()
        assert rel(m_c, om) < 1e-8 and rel(cov_c, ocov) < 1e-8


@given(fleet=fleets(), data=st.data())
@SETTINGS
def test_no_double_counting_for_any_acknowledged_subset(fleet: dict, data: st.DataObject) -> None:
    """A client's working posterior = global + own uploads not in it + pending, whatever subset of its
    uploads the server has summed (possibly out of order, duplicated) when the global is made."""
    rng = np.random.default_rng(fleet["seed"])
    n, dim, sigma, lam = fleet["n"] + 20, fleet["dim"], fleet["sigma"], fleet["lam"]
    x = rng.uniform(-2, 2, (n, 2))
    y = np.cos(x[:, 0]) + 0.2 * rng.standard_normal(n)
    fmap = CosMap(2, dim, 7)
    me = FedBNRClient(fmap, sigma=sigma, lam=lam, min_upload=1, client_id="me")
    other = FedBNRClient(fmap, sigma=sigma, lam=lam, min_upload=1, client_id="other")
    split = data.draw(st.integers(1, n - 1))
    mine = []
    chunks = np.array_split(np.arange(split), data.draw(st.integers(1, min(split, 8))))
    for chunk in chunks:
        me.learn_many(x[chunk], y[chunk])
        mine.append(me.make_upload())
    pending = data.draw(st.integers(0, min(10, n - split - 1)))
    me.learn_many(x[split:split + pending], y[split:split + pending])
    other.learn_many(x[split + pending:], y[split + pending:])
    server = FedBNRServer(dim, kernel_version=fmap.version, min_samples=1, sigma=sigma, lam=lam,
                          fit_hyperparameters=False)
    server.apply(other.make_upload())
    delivered = data.draw(st.lists(st.sampled_from(range(len(mine))), max_size=2 * len(mine)))
    for i in delivered:
        server.apply(mine[i])
    g = server.publish()
    assert me.apply_global(g)
    inc = g.included.get("me", 0)
    assert [u.seq for u in me.unacked] == [u.seq for u in mine if u.seq > inc]
    phi = np.stack([fmap.transform_one(xi) for xi in x])
    om, ocov = oracle_posterior(phi, y, sigma, lam)  # every sample exactly once
    m, cov = me.posterior()
    assert rel(m, om) < 1e-8 and rel(cov, ocov) < 1e-8
    assert me.working_stats().n == n
    # Deliver the rest, twice: the client's posterior stays the same.
    for up in mine + mine:
        server.apply(up)
    assert me.apply_global(server.publish())
    assert me.unacked == [] and rel(me.posterior()[0], om) < 1e-8


@given(n=st.integers(1, 40), dim=st.integers(1, 10), seed=st.integers(0, 2**31),
       sigma=st.floats(0.05, 3.0), lam=st.floats(0.05, 5.0))
@SETTINGS
def test_evidence_equals_the_n_by_n_gaussian(n: int, dim: int, seed: int, sigma: float, lam: float) -> None:
    rng = np.random.default_rng(seed)
    phi = rng.standard_normal((n, dim)) / math.sqrt(dim)
    y = rng.standard_normal(n) * rng.uniform(0.1, 3.0)
    expected = oracle_log_evidence(phi, y, sigma, lam)
    st_ = SufficientStats.from_samples(phi, y)
    assert math.isclose(float(log_evidence(st_, sigma, lam)), expected, rel_tol=1e-8, abs_tol=1e-8)
    client = FedBNRClient(_Fixed(phi), sigma=sigma, lam=lam)
    client.learn_features_many(phi, y)
    assert math.isclose(float(client.log_evidence()[0]), expected, rel_tol=1e-8, abs_tol=1e-8)


class _Fixed:
    """A stand-in feature map for tests that feed features directly."""

    def __init__(self, phi: np.ndarray) -> None:
        self.dim = phi.shape[1]
        self.version = "fixed"

    def transform_one(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(x, dtype=np.float64)


@given(dim=st.integers(1, 30), seed=st.integers(0, 2**31), scale=st.floats(1e-3, 1e3),
       augmented=st.booleans())
@SETTINGS
def test_rank_one_cholesky_update_equals_refactorisation(dim: int, seed: int, scale: float,
                                                         augmented: bool) -> None:
    rng = np.random.default_rng(seed)
    g = rng.standard_normal((dim, dim + 2))
    m = g @ g.T + 0.1 * np.eye(dim)
    x = rng.standard_normal(dim) * scale
    if augmented:
        # The augmented factor's last diagonal may be exactly 0 (no data yet): still a valid update.
        m[-1, :] = 0.0
        m[:, -1] = 0.0
        r = np.zeros((dim, dim))
        if dim > 1:
            r[:-1, :-1] = np.linalg.cholesky(m[:-1, :-1]).T
    else:
        r = np.linalg.cholesky(m).T.copy()
    expected = np.linalg.cholesky(m + np.outer(x, x)).T
    work = x.copy()
    kern.chol_update(r, work)
    assert np.allclose(r, expected, rtol=1e-9, atol=1e-9 * max(1.0, scale))
    assert np.allclose(r.T @ r, m + np.outer(x, x), rtol=1e-9, atol=1e-9 * max(1.0, scale**2))


@given(seed=st.integers(0, 2**31), bad=st.sampled_from(["nan_x", "inf_x", "shape", "nan_y", "big_y"]),
       where=st.integers(0, 9))
@SETTINGS
def test_bad_input_is_rejected_without_state_change(seed: int, bad: str, where: int) -> None:
    rng = np.random.default_rng(seed)
    client = FedBNRClient(n_inputs=3, n_features=4, bandwidth=(0.5, 2.0), min_upload=4)
    client.learn_many(rng.standard_normal((6, 3)), rng.standard_normal(6))
    before = pickle.dumps({k: v for k, v in client.__dict__.items() if k not in ("_features", "_cache")})
    xs = rng.standard_normal((10, 3))
    ys = rng.standard_normal(10)
    if bad == "nan_x":
        xs[where, where % 3] = np.nan
    elif bad == "inf_x":
        xs[where, 0] = -np.inf
    elif bad == "shape":
        xs = xs[:, :2]
    elif bad == "nan_y":
        ys[where] = np.nan
    else:
        ys[where] = 1e300
    try:
        client.learn_many(xs, ys)
        raised = False
    except ValueError:
        raised = True
    assert raised
    try:
        client.learn(xs[where], ys[where])
        single_raised = False
    except ValueError:
        single_raised = True
    assert single_raised
    after = pickle.dumps({k: v for k, v in client.__dict__.items() if k not in ("_features", "_cache")})
    assert after == before


def _rows_chol_update(r: np.ndarray, x: np.ndarray) -> None:
    """The rank-one update row by row, in plain Python (the recurrence `kern.chol_update` documents)."""
    n = r.shape[0]
    for k in range(n):
        xk = x[k]
        if xk == 0.0:
            continue
        rkk = r[k, k]
        rnew = math.sqrt(rkk * rkk + xk * xk)
        r[k, k] = rnew
        if k + 1 == n:
            break
        c, s, inv_c = rnew * (1.0 / rkk), xk * (1.0 / rkk), rkk / rnew
        for j in range(k + 1, n):
            rkj = (r[k, j] + s * x[j]) * inv_c
            r[k, j] = rkj
            x[j] = c * x[j] - s * rkj


def _rows_solve_rt(r: np.ndarray, rhs: np.ndarray, n: int) -> np.ndarray:
    out = rhs[:n].copy()
    for k in range(n):
        vk = out[k] / r[k, k]
        out[k] = vk
        for j in range(k + 1, n):
            out[j] -= r[k, j] * vk
    return out


@given(seed=st.integers(0, 2**31), f=st.integers(1, 9), zeros=st.integers(0, 3), y_zero=st.booleans())
@SETTINGS
def test_paired_kernels_compute_the_row_by_row_numbers(seed: int, f: int, zeros: int, y_zero: bool) -> None:
    """The kernels take the factor's rows two at a time (fewer stores): every entry must still see the operations
    of the row-by-row recurrences in their order — the same numbers to the last bit, with exact zeros in the
    input (identity rotations, which break the pairs) and the augmented row's ρ."""
    rng = np.random.default_rng(seed)
    g = rng.standard_normal((f + 1, f + 3))
    r0 = np.linalg.cholesky(g @ g.T + 0.1 * np.eye(f + 1)).T.copy()
    phi = rng.standard_normal(f)
    phi[rng.choice(f, size=min(zeros, f), replace=False)] = 0.0
    y = 0.0 if y_zero else float(rng.standard_normal())
    inv_sigma = float(rng.uniform(0.5, 2.0))
    x = np.append(phi * inv_sigma, y * inv_sigma)

    r_ref, x_ref = r0.copy(), x.copy()
    _rows_chol_update(r_ref, x_ref)
    r_new, x_new = r0.copy(), x.copy()
    kern.chol_update(r_new, x_new)
    assert np.array_equal(r_new, r_ref) and np.array_equal(x_new, x_ref)

    v_ref = _rows_solve_rt(r0, phi, f)
    v_new = np.empty(f)
    kern.solve_rt(r0, phi, v_new, f)
    assert np.array_equal(v_new, v_ref)

    r_fused = r0.copy()
    mean, quad = kern.predict_update(r_fused, phi, y, inv_sigma, np.empty(f), np.empty(f + 1))
    assert np.array_equal(r_fused, r_ref)  # the fused sweep: the update's numbers ...
    m_ref, q_ref = kern.predict_one(r0, phi, np.empty(f + 1))
    m_rows = q_rows = 0.0
    for k in range(f):  # predict_one's sums, in its order
        m_rows += v_ref[k] * r0[k, f]
        q_rows += v_ref[k] * v_ref[k]
    assert (mean, quad) == (m_ref, q_ref) == (m_rows, q_rows)  # ... and the predictive's


@given(seed=st.integers(0, 2**31), f=st.integers(1, 9), zeros=st.integers(0, 3), y_zero=st.booleans())
@SETTINGS
def test_update_then_predict_in_one_sweep_is_the_two_recurrences(seed: int, f: int, zeros: int,
                                                                 y_zero: bool) -> None:
    """The deferred learn (`update_predict`): a sample's rank-one update, then the next input's forward substitution
    on the updated rows, in one pass — to the last bit the row-by-row update followed by the row-by-row solve and
    predict_one's sums, with exact zeros in both inputs (identity rotations; zero right-hand sides)."""
    rng = np.random.default_rng(seed)
    g = rng.standard_normal((f + 1, f + 3))
    r0 = np.linalg.cholesky(g @ g.T + 0.1 * np.eye(f + 1)).T.copy()
    phi_old, phi_new = rng.standard_normal(f), rng.standard_normal(f)
    phi_old[rng.choice(f, size=min(zeros, f), replace=False)] = 0.0
    phi_new[rng.choice(f, size=min(zeros, f), replace=False)] = 0.0
    y = 0.0 if y_zero else float(rng.standard_normal())
    inv_sigma = float(rng.uniform(0.5, 2.0))
    x = np.append(phi_old * inv_sigma, y * inv_sigma)

    r_ref = r0.copy()
    _rows_chol_update(r_ref, x.copy())
    v_ref = _rows_solve_rt(r_ref, phi_new, f)
    m_ref = q_ref = 0.0
    for k in range(f):
        m_ref += v_ref[k] * r_ref[k, f]
        q_ref += v_ref[k] * v_ref[k]

    r_fused, v = r0.copy(), np.empty(f)
    mean, quad = kern.update_predict(r_fused, x.copy(), phi_new, v)
    assert np.array_equal(r_fused, r_ref) and np.array_equal(v, v_ref)
    assert (mean, quad) == (m_ref, q_ref)
