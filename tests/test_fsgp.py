"""FSGP (streamfed.algorithms.fsgp) against plain NumPy transcriptions of its equations kept in this file.

1. With fixed θ, σ, Z the federated predictive equals a centralised sparse GP (the variational/DTC
   predictive, transcribed below with dense solves) for random partitions, orders, duplicates and
   out-of-order deliveries — through the two halves, through the wire codec and the cores, in the replay
   and over a real Mosquitto.
2. Titsias' bound against its dense definition, its gradient against finite differences, the local fit.
3. The Bui projection: the identity when nothing moves, close to refitting from all data when Z and θ move,
   and closer than re-embedding a reservoir; versions never mix.
4. The River estimator, bad inputs.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import math

import numpy as np
import pytest
from river import checks, proba

from streamfed import algorithms
from streamfed.algorithms.base import Aggregation, Learner, NonFiniteError
from streamfed.algorithms.fsgp import ALGORITHM, initial_hyper
from streamfed.algorithms.fsgp.aggregation import check_statistics
from streamfed.algorithms.fsgp.client import FSGPClient
from streamfed.algorithms.fsgp.design import gaussian_design
from streamfed.algorithms.fsgp.elbo import collapsed_bound, collapsed_bound_and_grad, fit_hyper
from streamfed.algorithms.fsgp.estimator import FSGPRegressor
from streamfed.algorithms.fsgp.kernels import Hyper, cov
from streamfed.algorithms.fsgp.messages import GlobalModel, Upload
from streamfed.algorithms.fsgp.posterior import RANK_ONE_FROM, SparsePosterior, Stats, chol_update
from streamfed.algorithms.fsgp.projection import ProjectionMap, project, reembed
from streamfed.algorithms.fsgp.server import FSGPServer
from streamfed.evaluation.datasets import synthetic_fleet
from streamfed.evaluation.replay import AlgorithmConfig, replay
from streamfed.fleet.agent import AgentCore
from streamfed.fleet.aggregator import AggregatorCore
from streamfed.fleet.config import FleetConfig
from streamfed.fleet.sharding import ReducerCore, ShardCore
from streamfed.fleet.sources import Reading, array_source
from streamfed.wire.message import decode, encode

JITTER = 1e-6

# =========================================================================== oracles (plain NumPy)


def oracle_cov(kind: str, A: np.ndarray, B: np.ndarray, amp: float, ls: np.ndarray) -> np.ndarray:
    """The covariance functions written out entry by entry."""
    out = np.empty((len(A), len(B)))
    for i, a in enumerate(A):
        for j, b in enumerate(B):
            rho = math.sqrt(sum(((a[k] - b[k]) / ls[k]) ** 2 for k in range(len(ls))))
            if kind == "se":
                g = math.exp(-0.5 * rho * rho)
            elif kind == "matern32":
                g = (1 + math.sqrt(3) * rho) * math.exp(-math.sqrt(3) * rho)
            else:
                g = (1 + math.sqrt(5) * rho + 5 * rho * rho / 3) * math.exp(-math.sqrt(5) * rho)
            out[i, j] = amp * amp * g
    return out


def oracle_sgpr(h: Hyper, X: np.ndarray, y: np.ndarray, Xs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The variational (Titsias) / DTC sparse-GP predictive of y* from all the data at once:
    mean = σ⁻² k*ᵀ A⁻¹ K_mn y, var = c** + σ² - k*ᵀ (K_mm⁻¹ - A⁻¹) k*, A = K_mm + σ⁻² K_mn K_nm."""
    amp, ls, s2 = math.exp(h.log_amp), np.exp(h.log_ls), math.exp(2 * h.log_sigma)
    Kmm = oracle_cov(h.kind, h.Z, h.Z, amp, ls) + JITTER * amp * amp * np.eye(h.m)
    Kmn = oracle_cov(h.kind, h.Z, X, amp, ls)
    Ksm = oracle_cov(h.kind, Xs, h.Z, amp, ls)
    A = Kmm + Kmn @ Kmn.T / s2
    mean = Ksm @ np.linalg.solve(A, Kmn @ y) / s2
    var = amp * amp + s2 - np.einsum("ij,ji->i", Ksm, np.linalg.solve(Kmm, Ksm.T) - np.linalg.solve(A, Ksm.T))
    return mean, var


def oracle_bound(h: Hyper, X: np.ndarray, y: np.ndarray) -> float:
    """Titsias' bound as defined: log N(y | 0, Q + σ²I) - tr(K_nn - Q)/(2σ²), dense."""
    amp, ls, s2 = math.exp(h.log_amp), np.exp(h.log_ls), math.exp(2 * h.log_sigma)
    Kmm = oracle_cov(h.kind, h.Z, h.Z, amp, ls) + JITTER * amp * amp * np.eye(h.m)
    Kmn = oracle_cov(h.kind, h.Z, X, amp, ls)
    Q = Kmn.T @ np.linalg.solve(Kmm, Kmn)
    S = Q + s2 * np.eye(len(y))
    _, logdet = np.linalg.slogdet(S)
    ll = -0.5 * (len(y) * math.log(2 * math.pi) + logdet + y @ np.linalg.solve(S, y))
    return float(ll - (len(y) * amp * amp - np.trace(Q)) / (2 * s2))


def make_hyper(kind: str = "se", m: int = 6, d: int = 2, seed: int = 0) -> Hyper:
    rng = np.random.default_rng(seed)
    return Hyper(kind, math.log(1.3), np.log(rng.uniform(0.6, 1.5, d)), math.log(0.3), rng.uniform(-1.5, 1.5, (m, d)))


def make_data(n: int, d: int = 2, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.uniform(-2, 2, (n, d))
    return X, np.sin(2 * X[:, 0]) + 0.5 * np.cos(X[:, -1]) + 0.1 * rng.normal(size=n)


def max_abs(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))))


# =========================================================================== 1. exactness


@pytest.mark.parametrize("kind", ["se", "matern32", "matern52"])
def test_covariances_match_the_formulas(kind: str) -> None:
    h = make_hyper(kind, m=4, d=3, seed=1)
    X = np.random.default_rng(2).normal(size=(7, 3))
    assert max_abs(cov(h, X, h.Z), oracle_cov(kind, X, h.Z, h.amplitude, np.exp(h.log_ls))) < 1e-14
    assert np.allclose(np.diag(cov(h, X, X)), h.amplitude ** 2, rtol=0, atol=1e-15)


def test_rank_one_cholesky_update_is_the_factor_of_the_sum() -> None:
    rng = np.random.default_rng(3)
    A = rng.normal(size=(6, 6))
    A = A @ A.T + np.eye(6)
    L = np.linalg.cholesky(A)
    for _ in range(20):
        x = rng.normal(size=6)
        L = chol_update(L, x)
        A = A + np.outer(x, x)
    assert max_abs(L, np.linalg.cholesky(A)) < 1e-12


@pytest.mark.parametrize("kind", ["se", "matern32", "matern52"])
@pytest.mark.parametrize("m", [3, 40])
def test_compiled_per_sample_path_equals_the_plain_predictive_before_and_after_a_new_version(kind: str, m: int) -> None:
    """Every prediction a client makes sample by sample (one compiled call: predict, then the rank-one
    update of its augmented factor, rows staged into the sums 32 at a time) is the oracle's predictive
    from the samples before it; the same after a global of a new (θ, σ, Z) carries its statistics over."""
    h = make_hyper(kind, m=m, d=3, seed=m)
    X, y = make_data(90, d=3, seed=m + 1)
    c = FSGPClient(h, min_upload=10_000, learn_hyperparameters=False, jitter=JITTER)
    for i in range(50):
        mean, var = c.learn(X[i], y[i])
        if i == 0:
            om, ov = np.zeros(1), np.array([h.amplitude ** 2 + h.noise_var])
        else:
            om, ov = oracle_sgpr(h, X[:i], y[:i], X[i:i + 1])
        assert abs(mean - om[0]) < 1e-9 * (1 + abs(om[0])) and abs(var - ov[0]) < 1e-9 * ov[0]
        assert c.predict(X[i + 1]) == pytest.approx(tuple(np.ravel(oracle_sgpr(h, X[:i + 1], y[:i + 1],
                                                                                 X[i + 1:i + 2]))), rel=1e-9)
    assert c.n_pending == 50 and c.pending.n == 50  # staged rows reach the sums when read
    new = Hyper(h.kind, h.log_amp + 0.1, h.log_ls - 0.2, h.log_sigma, h.Z + 0.1)
    carried = project(c.pending, h, new, 1, JITTER)
    assert c.apply_global(GlobalModel(1, 1, new, Stats.zeros(m, 1), {}))
    post = SparsePosterior(new, carried, JITTER)
    for i in range(50, 90):
        mean, var = c.learn(X[i], y[i])
        em, ev = post.predict(X[i])
        assert abs(mean - em) < 1e-8 * (1 + abs(em)) and abs(var - ev) < 1e-8 * ev
        post.add(X[i], y[i])
    # the regret's comparator kept every sample under the initial version
    assert c.regret()["n"] == 90


@pytest.mark.slow  # over 2 s: outside the pure tier, in every full run
def test_reservoir_is_a_uniform_sample_of_the_stream() -> None:
    """Algorithm L keeps every sample of the stream with the same probability `cap / seen`."""
    h = make_hyper(m=3, d=1)
    counts = np.zeros(1000)
    for seed in range(300):
        c = FSGPClient(h, learn_hyperparameters=False, min_upload=10_000, reservoir=50, seed=seed)
        for i in range(1000):
            c.learn(np.array([i / 1000.0]), 0.0)
        kept = np.rint(c.reservoir[0][:, 0] * 1000).astype(int)
        assert len(set(kept.tolist())) == 50
        counts[kept] += 1
    # each sample kept 300 · 50/1000 = 15 times in expectation (sd ≈ 3.8 per sample, ≈ 0.17 per mean of 500)
    assert abs(counts[:500].mean() - 15.0) < 0.2 and abs(counts[500:].mean() - 15.0) < 0.2  # sums to 15 exactly
    assert abs(counts[:100].mean() - counts[-100:].mean()) < 1.6  # first and last samples alike (≈ 3 sd)


def test_compiled_covariance_column_matches_the_formulas() -> None:
    from streamfed.algorithms.fsgp._compiled import kern
    from streamfed.algorithms.fsgp.kernels import KIND_CODES

    for kind in ("se", "matern32", "matern52"):
        h = make_hyper(kind, m=5, d=3, seed=4)
        x = np.random.default_rng(5).normal(size=3)
        out = np.empty(5)
        assert kern.covariance_column(np.ascontiguousarray(h.Z), np.exp(-h.log_ls), h.amplitude ** 2,
                                      KIND_CODES[kind], x, out)
        assert max_abs(out, oracle_cov(kind, h.Z, x[None, :], h.amplitude, np.exp(h.log_ls))[:, 0]) < 1e-14
        assert not kern.covariance_column(np.ascontiguousarray(h.Z), np.exp(-h.log_ls), 1.0, 0,
                                          np.array([0.0, np.nan, 0.0]), out)


def test_large_m_follows_samples_by_rank_one_updates_to_the_same_predictive() -> None:
    m = RANK_ONE_FROM
    h = Hyper.initial("se", gaussian_design(m, 2, seed=1), lengthscale=1.5, sigma=0.3)
    X, y = make_data(40, seed=18)
    post = SparsePosterior(h, Stats.zeros(m), JITTER)
    for xi, yi in zip(X, y, strict=True):
        post.add(xi, yi)
    fresh = SparsePosterior(h, post.stats, JITTER)  # refactorised from the sums
    assert max_abs(post.L_B, fresh.L_B) < 1e-8 * float(np.max(np.abs(fresh.L_B)))
    pm, pv = post.predict_many(X[:5])
    om, ov = oracle_sgpr(h, X, y, X[:5])
    assert max_abs(pm, om) < 1e-8 and max_abs(pv, ov) < 1e-8


def federate(h: Hyper, X: np.ndarray, y: np.ndarray, owner: np.ndarray, min_upload: list[int],
             rng: np.random.Generator, jitter: float = JITTER) -> tuple[list[FSGPClient], FSGPServer, np.ndarray]:
    """Clients learn their samples (in the given order), upload at their floors; the server receives every
    upload once, some twice, in a random order; returns clients (with the last global installed), the
    server and the mask of uploaded samples."""
    k = len(min_upload)
    clients = [FSGPClient(h, min_upload=min_upload[c], client_id=f"c{c}", learn_hyperparameters=False,
                          jitter=jitter) for c in range(k)]
    server = FSGPServer(h, min_samples=1, learn_hyperparameters=False, jitter=jitter)
    uploaded = np.zeros(len(y), dtype=bool)
    mine: list[list[int]] = [[] for _ in range(k)]
    ups: list[Upload] = []
    for i in range(len(y)):
        c = int(owner[i])
        clients[c].learn(X[i], y[i])
        mine[c].append(i)
        up = clients[c].make_upload()
        if up is not None:
            ups.append(up)
            uploaded[mine[c]] = True
            mine[c] = []
    deliveries = ups + [ups[j] for j in rng.choice(len(ups), size=len(ups) // 2)] if ups else []
    for j in rng.permutation(len(deliveries)):
        server.apply(deliveries[j])
    assert server.waiting() == {}
    g = server.publish()
    for c in clients:
        assert c.apply_global(g)
    return clients, server, uploaded


def check_federated_equals_centralised(seed: int, n: int, k: int, kind: str) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    h = make_hyper(kind, m=int(rng.integers(2, 9)), d=2, seed=seed)
    X, y = make_data(n, seed=seed)
    owner = rng.integers(0, k, n)
    floors = [int(f) for f in rng.integers(1, 6, k)]
    clients, server, uploaded = federate(h, X, y, owner, floors, rng)
    Xs = rng.uniform(-2.5, 2.5, (9, 2))
    worst_mean = worst_var = 0.0
    # the global: every uploaded sample of every client
    gm, gv = SparsePosterior(h, server.stats, JITTER).predict_many(Xs)
    om, ov = oracle_sgpr(h, X[uploaded], y[uploaded], Xs)
    worst_mean, worst_var = max(worst_mean, max_abs(gm, om)), max(worst_var, max_abs(gv, ov))
    # each client: the global plus its own samples below the floor
    for c, client in enumerate(clients):
        keep = uploaded | (owner == c)
        cm, cv = client.predict_many(Xs)
        om, ov = oracle_sgpr(h, X[keep], y[keep], Xs)
        worst_mean, worst_var = max(worst_mean, max_abs(cm, om)), max(worst_var, max_abs(cv, ov))
        assert client.n_pending == int(np.sum((owner == c) & ~uploaded))
    return worst_mean, worst_var


@pytest.mark.parametrize("kind", ["se", "matern32", "matern52"])
@pytest.mark.parametrize("seed", range(4))
def test_federated_predictive_equals_centralised_sparse_gp(seed: int, kind: str) -> None:
    worst_mean, worst_var = check_federated_equals_centralised(seed, n=60 + 20 * seed, k=1 + seed, kind=kind)
    assert worst_mean < 1e-8 and worst_var < 1e-8


def test_federated_equals_centralised_property() -> None:
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies

    @hypothesis.settings(max_examples=25, deadline=None, derandomize=True)
    @hypothesis.given(seed=st.integers(0, 10_000), n=st.integers(1, 80), k=st.integers(1, 5),
                      kind=st.sampled_from(["se", "matern32", "matern52"]))
    def prop(seed: int, n: int, k: int, kind: str) -> None:
        worst_mean, worst_var = check_federated_equals_centralised(seed, n, k, kind)
        assert worst_mean < 1e-8 and worst_var < 1e-8

    prop()


def test_the_exactness_check_can_fail() -> None:
    # one sample summed twice is visible at the tolerance the tests use
    h = make_hyper(m=5)
    X, y = make_data(30, seed=4)
    s = Stats.from_samples(cov(h, X, h.Z), y)
    s.add(cov(h, X[:1], h.Z)[0], float(y[0]))
    m, _ = SparsePosterior(h, s, JITTER).predict_many(X[:5])
    assert max_abs(m, oracle_sgpr(h, X, y, X[:5])[0]) > 1e-6


def gpytorch_sgpr(h: Hyper, X: np.ndarray, y: np.ndarray, Xs: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """gpytorch's SGPR (an ExactGP over an InducingPointKernel, float64): the predictive mean and variance
    of y* and Titsias' bound (its marginal log likelihood in training mode, times n). Without its diagonal
    correction (which turns the training covariance into FITC's) its variance is DTC's; Titsias' predictive
    adds back c(x*, x*) - Q(x*, x*), computed here from gpytorch's own kernel."""
    torch = pytest.importorskip("torch")
    gpytorch = pytest.importorskip("gpytorch")
    if h.kind != "se":
        raise ValueError("the gpytorch oracle is set up for the SE-ARD covariance")
    t = lambda a: torch.tensor(np.asarray(a), dtype=torch.float64)  # noqa: E731

    class SGPR(gpytorch.models.ExactGP):
        def __init__(self, lik):
            super().__init__(t(X), t(y), lik)
            self.mean_module = gpytorch.means.ZeroMean()
            self.base = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=h.d))
            self.covar_module = gpytorch.kernels.InducingPointKernel(self.base, inducing_points=t(h.Z),
                                                                     likelihood=lik)

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))

    lik = gpytorch.likelihoods.GaussianLikelihood(noise_constraint=gpytorch.constraints.GreaterThan(1e-10)).double()
    model = SGPR(lik).double()
    # float64 tensors, set after .double(): a Python float or a float32 parameter rounds σ², a² at ~1e-8
    lik.noise = t(h.noise_var)
    model.base.outputscale = t(h.amplitude ** 2)
    model.base.base_kernel.lengthscale = t(np.exp(h.log_ls))
    model.train()
    lik.train()
    with torch.no_grad():
        bound = float(gpytorch.mlls.ExactMarginalLogLikelihood(lik, model)(model(t(X)), t(y))) * len(y)
    model.eval()
    lik.eval()
    with torch.no_grad(), gpytorch.settings.sgpr_diagonal_correction(False):
        out = lik(model(t(Xs)))
        kzz = model.base(t(h.Z), t(h.Z)).to_dense().numpy()
        ksz = model.base(t(Xs), t(h.Z)).to_dense().numpy()
    q = np.einsum("ij,ji->i", ksz, np.linalg.solve(kzz, ksz.T))
    return out.mean.numpy(), out.variance.numpy() + (h.amplitude ** 2 - q), bound


@pytest.mark.parametrize("seed", range(3))
def test_federated_predictive_and_bound_equal_gpytorch_sgpr(seed: int) -> None:
    """The second oracle (only where torch and gpytorch are installed: the optional `torch` extra)."""
    pytest.importorskip("gpytorch")
    rng = np.random.default_rng(100 + seed)
    h = make_hyper("se", m=7, d=2, seed=seed)
    X, y = make_data(90, seed=seed)
    owner = rng.integers(0, 4, 90)
    _, server, uploaded = federate(h, X, y, owner, [1, 2, 3, 1], rng, jitter=1e-12)
    Xs = rng.uniform(-2.5, 2.5, (11, 2))
    gm, gv, gbound = gpytorch_sgpr(h, X[uploaded], y[uploaded], Xs)
    fm, fv = SparsePosterior(h, server.stats, 1e-12).predict_many(Xs)
    assert max_abs(fm, gm) < 1e-8 and max_abs(fv, gv) < 1e-8
    assert collapsed_bound(h, X[uploaded], y[uploaded], 1e-12) == pytest.approx(gbound, rel=1e-9)


FIXED = {"learn_hyperparameters": False, "n_inducing": 8, "min_upload": 10, "lengthscale": 0.7, "sigma": 0.2}


def fixed_cfg(n_inputs: int, fleet: str = "fsgp-test", seed: int = 3, **over: object) -> FleetConfig:
    return FleetConfig(fleet=fleet, algorithm="fsgp", n_inputs=n_inputs, seed=seed, standardise="none",
                       params={**FIXED, **over})


def test_registered_and_fills_the_contract() -> None:
    assert "fsgp" in algorithms.names() and algorithms.get("fsgp") is ALGORITHM
    cfg = fixed_cfg(3)
    assert isinstance(ALGORITHM.learner(cfg, "a", 0), Learner)
    assert isinstance(ALGORITHM.aggregation(cfg), Aggregation)
    h = initial_hyper(cfg)
    shapes = cfg.array_shapes("fsgp.update")
    proposal = sum(math.prod(shapes[k][1]) for k in ("theta", "log_sigma", "Z"))
    assert proposal == h.n_numbers == 8 * 3 + 3 + 2  # M·d + d + 2
    with pytest.raises(ValueError):
        ALGORITHM.learner(cfg, "a", 0, "lockstep")


def test_through_the_codec_and_the_cores_equals_centralised() -> None:
    """Agent cores → encoded updates (some twice, shuffled) → aggregator core → the global every agent
    installs: the centralised sparse GP of every uploaded sample."""
    fleet = synthetic_fleet(3, 47, 2, seed=6)
    # the model's own variance against the oracle's (no conformal scale); the fleet's posterior itself, not the
    # personalised mixture (tests/test_fsgp_personal.py checks that)
    cfg = fixed_cfg(2, calibrate=False, personal=False)
    names = list(fleet.names)
    agg = AggregatorCore(cfg, clients=names, mode="async", window=0.0)
    agents = [AgentCore(cfg, nm, i) for i, nm in enumerate(names)]
    payloads: list[tuple[str, bytes]] = []
    for a, s in zip(agents, fleet.streams, strict=True):
        for t in range(len(s.y)):
            _, msgs = a.on_reading(Reading(f"r{t}", s.X[t], float(t), float(s.y[t])), now=0.0)
            payloads += [(s.name, encode(m)) for m in msgs]
    rng = np.random.default_rng(0)
    payloads += [payloads[i] for i in rng.choice(len(payloads), 4)]
    for i in rng.permutation(len(payloads)):
        agg.on_update(payloads[i][0], payloads[i][1], now=float(i))
    agg.tick(now=1e9)
    assert agg.rejected.get("invalid_update", 0) == 0
    g = decode(encode(agg.global_message()), cfg)
    assert g.included == {nm: 4 for nm in names}  # 47 samples, floor 10: four uploads each
    h = initial_hyper(cfg)
    Xs = np.random.default_rng(1).uniform(-1, 1, (6, 2))
    X = np.concatenate([s.X[:40] for s in fleet.streams])
    y = np.concatenate([s.y[:40] for s in fleet.streams])
    om, ov = oracle_sgpr(h, X, y, Xs)
    for a in agents:
        assert a.install_global(g).installed
        # an agent predicts with the global plus its own 7 pending samples
    own = [np.concatenate([X, s.X[40:]]) for s in fleet.streams]
    owny = [np.concatenate([y, s.y[40:]]) for s in fleet.streams]
    for a, Xo, yo in zip(agents, own, owny, strict=True):
        pm = np.array([a.learner.predict(x) for x in Xs])
        em, ev = oracle_sgpr(h, Xo, yo, Xs)
        assert max_abs(pm[:, 0], em) < 1e-8 and max_abs(pm[:, 1], ev) < 1e-8
    fresh = ALGORITHM.learner(cfg, "late", 9)
    assert fresh.install_global(g)
    pm = np.array([fresh.predict(x) for x in Xs])
    assert max_abs(pm[:, 0], om) < 1e-8 and max_abs(pm[:, 1], ov) < 1e-8


def test_shards_and_a_reducer_equal_centralised() -> None:
    """Fixed hyperparameters: two shards (one update in two reaches both, a resend) and a reducer."""
    fleet = synthetic_fleet(3, 35, 2, seed=8)
    cfg = fixed_cfg(2, fleet="fsgp-shards", personal=False)  # the fleet's posterior (not the personal mixture)
    names = list(fleet.names)
    shards = [ShardCore(cfg, f"s{i}", clients=names, mode="async") for i in range(2)]
    reducer = ReducerCore(cfg, clients=names, mode="async", window=3600.0)
    for i, s in enumerate(fleet.streams):
        core = AgentCore(cfg, s.name, i)
        for t in range(len(s.y)):
            _, msgs = core.on_reading(Reading(f"r{t}", s.X[t], float(t), float(s.y[t])), now=0.0)
            for m in msgs:
                shards[m.seq % 2].on_update(s.name, encode(m), now=0.0)
                if m.seq == 1:
                    shards[(m.seq + 1) % 2].on_update(s.name, encode(m), now=0.0)
    queue = [(sh, p) for sh in shards for p in sh.flush(now=0.0)]
    while queue:
        sh, p = queue.pop(0)
        for out in reducer.on_partial(sh.name, encode(p), now=0.0):
            queue += [(sh, q) for q in sh.on_ack(out, now=0.0)]
    reducer.tick(now=1e9)
    g = reducer.global_message()
    assert g.included == {n: 3 for n in names}
    X = np.concatenate([s.X[:30] for s in fleet.streams])
    y = np.concatenate([s.y[:30] for s in fleet.streams])
    Xs = np.random.default_rng(3).uniform(-1, 1, (5, 2))
    om, ov = oracle_sgpr(initial_hyper(cfg), X, y, Xs)
    fresh = ALGORITHM.learner(cfg, "late", 9)
    assert fresh.install_global(g)
    pm = np.array([fresh.predict(x) for x in Xs])
    assert max_abs(pm[:, 0], om) < 1e-8 and max_abs(pm[:, 1], ov) < 1e-8


def test_replay_equals_centralised_and_learning_runs() -> None:
    fleet = synthetic_fleet(3, 95, 2, seed=2)
    acfg = AlgorithmConfig(params={"fsgp": {**FIXED, "personal": False}})  # the fleet's posterior itself
    result = replay(fleet, "fsgp", acfg, seed=5)
    arr = result.arrangement
    assert arr is not None and int(result.rejected.sum()) == 0
    g = arr.global_message(arr.aggregations[0])
    assert g.included == {f"c{i}": 9 for i in range(3)}
    h = initial_hyper(acfg.fleet_config("fsgp", 2, 5))
    X = np.concatenate([s.X[:90] for s in fleet.streams])
    y = np.concatenate([s.y[:90] for s in fleet.streams])
    Xs = np.random.default_rng(1).uniform(-1, 1, (6, 2))
    om, ov = oracle_sgpr(h, X, y, Xs)
    fresh = ALGORITHM.learner(arr.cfg, "late", 9)
    fresh.install_global(g)
    pm = np.array([fresh.predict(x) for x in Xs])
    assert max_abs(pm[:, 0], om) < 1e-8 and max_abs(pm[:, 1], ov) < 1e-8
    # every upload: M(M+1)/2 + M + 2 statistics and the M·d + d + 2 proposal slot with its weight
    assert result.uploaded_numbers.tolist() == [9.0 * (36 + 8 + 2 + 16 + 2 + 1 + 1 + 1)] * 3

    # learned hyperparameters: versions move, every client follows, nothing is rejected or dropped
    learn = AlgorithmConfig(params={"fsgp": {**FIXED, "learn_hyperparameters": True, "fit_every": 20,
                                             "fit_steps": 5, "min_proposal_weight": 40.0}})
    result = replay(synthetic_fleet(3, 200, 2, seed=2), "fsgp", learn, seed=5)
    arr = result.arrangement
    server = arr.aggregations[0].server
    assert int(result.rejected.sum()) == 0 and server.epoch >= 2 and server.stale_dropped == 0
    assert all(lr.client.epoch == server.epoch for lr in arr.learners)
    assert np.isfinite(result.mse)


def test_agent_and_aggregator_resume_exactly_from_their_state() -> None:
    """Durable state (pickled, as fleet.persistence writes it) mid-stream, with versions moving: the resumed
    agent and aggregator continue exactly as the ones that never stopped."""
    import pickle

    fleet = synthetic_fleet(2, 160, 2, seed=9)
    cfg = fixed_cfg(2, fleet="fsgp-state", learn_hyperparameters=True, fit_every=20, fit_steps=3,
                    min_proposal_weight=20.0)
    names = list(fleet.names)

    def run(agents, agg, start, stop):
        out = []
        for t in range(start, stop):
            for i, (a, s) in enumerate(zip(agents, fleet.streams, strict=True)):
                pred, msgs = a.on_reading(Reading(f"r{t}", s.X[t], float(t), float(s.y[t])), now=float(t))
                out.append((pred.mean, pred.var))
                for m in msgs:
                    for g in agg.on_update(names[i], encode(m), now=float(t)):
                        for b in agents:
                            b.install_global(g)
            for g in agg.tick(now=float(t) + 0.5):
                if g.kind == cfg.global_kind:
                    for b in agents:
                        b.install_global(g)
        return out

    agents = [AgentCore(cfg, n, i) for i, n in enumerate(names)]
    agg = AggregatorCore(cfg, clients=names, mode="async", window=0.0)
    run(agents, agg, 0, 80)
    saved = pickle.dumps(([a.snapshot() for a in agents], agg.snapshot()))
    tail = run(agents, agg, 80, 160)
    assert agg.aggregation.server.epoch >= 2  # versions moved in the second half too
    a_states, g_state = pickle.loads(saved)
    resumed = [AgentCore(cfg, n, i) for i, n in enumerate(names)]
    for a, st in zip(resumed, a_states, strict=True):
        a.restore(st)
    agg2 = AggregatorCore(cfg, clients=names, mode="async", window=0.0)
    agg2.restore(g_state, now=79.5)
    assert run(resumed, agg2, 80, 160) == tail
    assert max_abs(agg2.aggregation.server.stats.P, agg.aggregation.server.stats.P) == 0.0


# =========================================================================== 2. the bound


@pytest.mark.parametrize("kind", ["se", "matern32", "matern52"])
def test_bound_equals_its_dense_definition_and_gradient_matches_finite_differences(kind: str) -> None:
    h = make_hyper(kind, m=5, d=2, seed=7)
    X, y = make_data(25, seed=8)
    f, g = collapsed_bound_and_grad(h, X, y, JITTER)
    assert f == pytest.approx(oracle_bound(h, X, y), rel=1e-9, abs=1e-9)
    assert collapsed_bound(h, X, y, JITTER) == f
    v = h.to_vector()
    fd = np.empty_like(v)
    for i in range(v.size):
        e = np.zeros_like(v)
        e[i] = 1e-6
        up = collapsed_bound(Hyper.from_vector(kind, v + e, 5, 2), X, y, JITTER)
        down = collapsed_bound(Hyper.from_vector(kind, v - e, 5, 2), X, y, JITTER)
        fd[i] = (up - down) / 2e-6
    assert max_abs(g, fd) < 1e-5 * max(1.0, float(np.max(np.abs(fd))))
    # the bound is below the exact log marginal likelihood
    amp, ls, s2 = h.amplitude, np.exp(h.log_ls), h.noise_var
    S = oracle_cov(kind, X, X, amp, ls) + s2 * np.eye(len(y))
    exact = -0.5 * (len(y) * math.log(2 * math.pi) + np.linalg.slogdet(S)[1] + y @ np.linalg.solve(S, y))
    assert f <= exact


def test_local_fit_raises_the_bound_and_finds_the_noise() -> None:
    rng = np.random.default_rng(0)
    X = rng.uniform(-3, 3, (200, 1))
    y = np.sin(2 * X[:, 0]) + 0.1 * rng.normal(size=200)
    h = Hyper.initial("se", gaussian_design(10, 1), lengthscale=2.0, sigma=1.0)
    fitted = fit_hyper(h, X, y, steps=300, learning_rate=0.05, jitter=JITTER)
    assert fitted is not None
    assert collapsed_bound(fitted, X, y) > collapsed_bound(h, X, y) + 50
    assert 0.07 < fitted.sigma < 0.15


# =========================================================================== 3. versions and the projection


def test_projection_with_unchanged_z_and_theta_is_exactly_the_identity() -> None:
    h = make_hyper(m=6)
    X, y = make_data(40, seed=9)
    s = Stats.from_samples(cov(h, X, h.Z), y)
    t = project(s, h, Hyper.from_vector(h.kind, h.to_vector(), h.m, h.d), epoch=1)
    assert np.array_equal(t.P, s.P) and np.array_equal(t.r, s.r) and (t.n, t.q) == (s.n, s.q) and t.epoch == 1
    # the general formula W = c(Z', Z) C⁻¹ with Z moved by nothing measurable: the identity up to the jitter
    # (C carries ε a² I, the cross-covariance does not), so with a tiny jitter, to rounding
    nudged = Hyper(h.kind, h.log_amp, h.log_ls, h.log_sigma, h.Z + 1e-13)
    assert ProjectionMap(h, nudged, 1).W is not None
    u = project(s, h, nudged, epoch=1, jitter=1e-12)
    assert max_abs(u.P, s.P) < 1e-8 * np.max(np.abs(s.P)) and max_abs(u.r, s.r) < 1e-8 * np.max(np.abs(s.r))
    # only σ moved: the old factor keeps its own noise level, P and r scale by σ'²/σ²
    sig = Hyper(h.kind, h.log_amp, h.log_ls, h.log_sigma + 0.5, h.Z)
    w = project(s, h, sig, epoch=1)
    assert np.allclose(w.P, s.P * math.exp(1.0), rtol=1e-15) and np.allclose(w.r, s.r * math.exp(1.0), rtol=1e-15)


def test_projection_through_an_ill_conditioned_c_keeps_b_positive_definite() -> None:
    """A projection met in a Beijing replay (M = 128, lengthscales from 2.5 to 345, so cond C ≈ 10⁸): the
    direct `W P Wᵀ` has an eigenvalue of -4.7e-3 and `C + P/σ²` is indefinite; the Gram form is
    positive semi-definite, equal to the direct product to rounding, and the posterior builds."""
    from pathlib import Path

    f = np.load(Path(__file__).parent / "fixtures" / "fsgp_illconditioned_projection.npz")
    m, d = int(f["m"]), int(f["d"])
    old, new = Hyper.from_vector("se", f["old"], m, d), Hyper.from_vector("se", f["new"], m, d)
    stats = Stats(f["P"].copy(), f["r"].copy(), float(f["n"]), float(f["q"]), 0)
    assert np.linalg.eigvalsh(stats.P)[0] > -1e-9 * np.linalg.eigvalsh(stats.P)[-1]  # a sum of outer products
    pm = ProjectionMap(old, new, 1)
    direct = pm.ratio * (pm.W @ stats.P @ pm.W.T)
    direct = 0.5 * (direct + direct.T)
    with pytest.raises(ValueError, match="not positive definite"):
        SparsePosterior(new, Stats(direct, pm.ratio * (pm.W @ stats.r), stats.n, stats.q, 1))
    carried = pm(stats)
    ev = np.linalg.eigvalsh(carried.P)
    assert ev[0] > -1e-12 * ev[-1]
    # they differ by the input's rounding-level negative part (-2.7e-7 of 2.6e6) carried through W, whose
    # norm is what makes this case hard: neither is exact, one is positive semi-definite
    assert max_abs(carried.P, direct) < 1e-5 * np.max(np.abs(direct))
    SparsePosterior(new, carried)  # builds


def test_carried_statistics_pass_the_servers_check_and_a_hostile_one_does_not() -> None:
    h = make_hyper(m=6)
    X, y = make_data(50, seed=16)
    s = Stats.from_samples(cov(h, X, h.Z), y)
    rng = np.random.default_rng(17)
    for _ in range(5):  # σ up or down, Z and θ moved: [[P, r], [rᵀ, q]] stays positive semi-definite
        new = Hyper(h.kind, h.log_amp + rng.normal(0, 0.3), h.log_ls + rng.normal(0, 0.3, h.d),
                    h.log_sigma + rng.normal(0, 0.5), h.Z + rng.normal(0, 0.5, h.Z.shape))
        check_statistics(project(s, h, new, 1), max_abs=1e100)
    bad = s.copy()
    bad.q = 0.0  # targets all zero but Σ k y ≠ 0: no samples have these statistics
    with pytest.raises(ValueError):
        check_statistics(bad, max_abs=1e100)
    check_statistics(bad, max_abs=1e100, psd=False)  # noised or masked uploads: count and bound only


def test_projection_to_moved_z_is_close_to_refitting_and_beats_reembedding_a_reservoir() -> None:
    rng = np.random.default_rng(11)
    X = rng.uniform(-3, 3, (600, 1))
    y = np.sin(2 * X[:, 0]) + 0.1 * rng.normal(size=600)
    old = Hyper.initial("se", np.linspace(-3, 3, 25)[:, None], lengthscale=0.6, sigma=0.1)
    new = Hyper(old.kind, old.log_amp + 0.05, old.log_ls + math.log(1.1), old.log_sigma,
                np.linspace(-2.9, 3.1, 25)[:, None] + 0.03 * rng.normal(size=(25, 1)))
    s_old = Stats.from_samples(cov(old, X, old.Z), y)
    carried = project(s_old, old, new, epoch=1)
    Xs = np.linspace(-2.8, 2.8, 50)[:, None]
    refit_m, refit_v = oracle_sgpr(new, X, y, Xs)
    pm, pv = SparsePosterior(new, carried, JITTER).predict_many(Xs)
    err_proj = max_abs(pm, refit_m)
    assert err_proj < 0.05 and max_abs(pv, refit_v) < 0.01
    # a reservoir of the last 100 samples (x > 0 only here) loses the rest of the stream
    order = np.argsort(X[:, 0])
    keep = order[-100:]
    rm, _ = SparsePosterior(new, reembed(X[keep], y[keep], new, 1), JITTER).predict_many(Xs)
    assert max_abs(rm, refit_m) > 5 * err_proj


def test_server_carries_late_uploads_and_never_mixes_versions() -> None:
    h = make_hyper(m=5)
    X, y = make_data(60, seed=12)
    a = FSGPClient(h, min_upload=10, client_id="a", learn_hyperparameters=False, jitter=JITTER)
    b = FSGPClient(h, min_upload=10, client_id="b", learn_hyperparameters=False, jitter=JITTER)
    server = FSGPServer(h, min_samples=10, learn_hyperparameters=True, min_proposal_weight=1.0, jitter=JITTER)
    for i in range(20):
        a.learn(X[i], y[i])
        b.learn(X[20 + i], y[20 + i])
    up_a, up_b = a.make_upload(), b.make_upload()
    assert up_a is not None and up_b is not None
    new = Hyper(h.kind, h.log_amp, h.log_ls + 0.1, h.log_sigma, h.Z + 0.05)
    # a's upload carries a proposal (as if from its local fit): the server moves to version 1 at publish
    server.apply(Upload("a", up_a.seq, 0, up_a.stats, new, 20.0))
    g1 = server.publish()
    assert g1.epoch == 1 and g1.hyper.same_as(new)
    assert max_abs(g1.stats.P, project(up_a.stats, h, new, 1).P) == 0.0
    # b's upload of version 0 arrives late: carried to version 1 before it is summed
    server.apply(up_b)
    g2 = server.publish()
    expected = project(up_a.stats + up_b.stats, h, new, 1)
    assert max_abs(g2.stats.P, expected.P) < 1e-12 * np.max(np.abs(expected.P))
    assert max_abs(g2.stats.r, expected.r) < 1e-12 * np.max(np.abs(expected.r))
    with pytest.raises(ValueError, match="versions 0 and 1"):
        _ = up_b.stats + g2.stats
    # the client follows: its pending statistics are carried, its prediction is the new version's
    for i in range(40, 45):
        b.learn(X[i], y[i])
    pend = b.pending.copy()
    assert b.apply_global(g2) and b.epoch == 1 and b.pending.epoch == 1
    assert max_abs(b.pending.P, project(pend, h, new, 1).P) == 0.0
    Xs = X[:4]
    bm, _ = b.predict_many(Xs)
    em, _ = SparsePosterior(new, g2.stats + project(pend, h, new, 1), JITTER).predict_many(Xs)
    assert max_abs(bm, em) < 1e-10
    assert not b.apply_global(g1)  # an older global (and version) changes nothing
    # a global that changes (θ, σ, Z) without a new version is refused
    bad = GlobalModel(9, 1, Hyper(h.kind, 0.0, h.log_ls, h.log_sigma, h.Z), g2.stats, {})
    with pytest.raises(ValueError, match="without a new epoch"):
        b.apply_global(bad)


def test_a_version_is_an_average_over_a_quorum_of_clients() -> None:
    h = make_hyper(m=3, d=1)
    server = FSGPServer(h, min_samples=1, min_proposal_weight=10.0, proposal_quorum=0.5, jitter=JITTER)
    s = Stats.zeros(3)
    s.add(np.array([0.1, 0.2, 0.3]), 1.0)
    s.n = 50.0  # as if of 50 samples (the server does not look inside): proposals may weigh up to that
    p1 = Hyper(h.kind, h.log_amp + 0.3, h.log_ls, h.log_sigma, h.Z + 0.1)
    p2 = Hyper(h.kind, h.log_amp - 0.1, h.log_ls - 0.2, h.log_sigma + 0.4, h.Z - 0.3)
    for c in "abcd":  # four clients heard from
        server.apply(Upload(c, 1, 0, s.copy()))
    server.apply(Upload("a", 2, 0, s.copy(), p1, 30.0))
    assert server.publish().epoch == 0  # one proposer of four: below the quorum of two
    server.apply(Upload("b", 2, 0, s.copy(), p2, 10.0))
    g = server.publish()
    assert g.epoch == 1 and server.proposers == set() and server.prop_weight == 0.0
    expected = (30.0 * p1.to_vector() + 10.0 * p2.to_vector()) / 40.0  # FedAvg weighted by samples
    assert max_abs(g.hyper.to_vector(), expected) < 1e-15
    # a proposal fitted from version 0 arriving after the move counts for nothing
    server.apply(Upload("c", 2, 0, s.copy(), p1, 100.0))
    assert server.stale_proposals == 1 and server.prop_weight == 0.0
    # the quorum counts the clients heard since the last version: c (heard) and d (silent since) leave
    # a alone, one of two, enough; so clients that stopped streaming do not hold the fleet back
    server.apply(Upload("a", 3, 1, Stats(s.P.copy(), s.r.copy(), s.n, s.q, 1), g.hyper, 10.0))
    assert server.publish().epoch == 2
    # a proposal weighs at most the samples its client has uploaded (4 × 50 for a by now, 50 for a newcomer)
    server.apply(Upload("a", 4, 2, Stats(s.P.copy(), s.r.copy(), s.n, s.q, 2), p1, 1e9))
    server.apply(Upload("e", 1, 2, Stats(s.P.copy(), s.r.copy(), s.n, s.q, 2), p2, 1e9))
    assert server.prop_weight == 200.0 + 50.0
    # proposed a, ℓ or σ outside the range every local fit keeps them in: refused, nothing changes
    wild = Hyper(h.kind, h.log_amp, h.log_ls + 10.0, h.log_sigma, h.Z)
    with pytest.raises(ValueError, match="outside"):
        server.apply(Upload("f", 1, 2, Stats(s.P.copy(), s.r.copy(), s.n, s.q, 2), wild, 1.0))
    assert "f" not in server.included and server.prop_weight == 250.0


# =========================================================================== 4. River, bad inputs


@pytest.mark.slow  # over 2 s: outside the pure tier, in every full run
@pytest.mark.parametrize("params", list(FSGPRegressor._unit_test_params()))  # noqa: SLF001
def test_river_check_estimator(params: dict) -> None:
    checks.check_estimator(FSGPRegressor(**params))


def test_river_regressor_is_a_plain_client_and_returns_gaussian() -> None:
    X, y = make_data(40, seed=13)
    model = FSGPRegressor(n_inducing=5, lengthscale=1.0, learn_hyperparameters=False, standardise=False,
                          sync_every=1000)
    h = Hyper.initial("se", gaussian_design(5, 2, seed=0), sigma=0.5)
    for xi, yi in zip(X, y, strict=True):
        model.learn_one({"zeta": xi[1], "alpha": xi[0]}, yi)  # sorted keys: alpha, zeta
    dist = model.predict_one({"alpha": 0.2, "zeta": -0.3, "unknown": 5.0}, with_dist=True)
    em, ev = oracle_sgpr(h, X, y, np.array([[0.2, -0.3]]))
    assert isinstance(dist, proba.Gaussian)
    assert dist.mu == pytest.approx(em[0], abs=1e-9) and dist.sigma == pytest.approx(math.sqrt(ev[0]), abs=1e-9)
    mean, var = model.predict_dist_many(np.array([[0.2, -0.3]]))
    assert mean[0] == pytest.approx(em[0], abs=1e-9) and var[0] == pytest.approx(ev[0], abs=1e-9)


def test_river_array_path_equals_the_dict_path() -> None:
    X, y = make_data(90, seed=14)
    a = FSGPRegressor(n_inducing=6, sync_every=16, fit_every=32, fit_steps=3)
    b = FSGPRegressor(n_inducing=6, sync_every=16, fit_every=32, fit_steps=3)
    for xi, yi in zip(X, y, strict=True):
        a.learn_one({0: xi[0], 1: xi[1]}, yi)
    b.learn_many(X, y)
    assert a.client is not None and a.client.epoch >= 1  # the hyperparameters moved
    assert np.array_equal(a.predict_many(X[:5]), b.predict_many(X[:5]))


def test_a_bad_sample_changes_nothing() -> None:
    cfg = fixed_cfg(2, learn_hyperparameters=True, fit_every=5)
    learner = ALGORITHM.learner(cfg, "a", 0)
    X, y = make_data(12, seed=15)
    for xi, yi in zip(X, y, strict=True):
        learner.learn(xi, yi)
    before = copy.deepcopy(learner.client)
    probe = np.array([0.3, -0.2])
    for bad_x, bad_y in ((np.array([np.nan, 0.0]), 1.0), (np.array([0.0, 0.0]), math.inf),
                         (np.array([0.0, 0.0]), 1e200), (np.array([0.0]), 1.0)):
        with pytest.raises(ValueError):
            learner.learn(bad_x, bad_y)
    with pytest.raises(NonFiniteError):
        learner.begin_learn(np.array([math.inf, 0.0]), 1.0)
    assert learner.predict(probe) == before.predict(probe)
    assert learner.client.n == before.n and np.array_equal(learner.client.pending.P, before.pending.P)
    # a sum that would overflow: 1e154² is finite, twice 1.3e154² is not
    learner.learn(np.array([0.0, 0.0]), 1e154)
    after = copy.deepcopy(learner.client)
    with pytest.raises(NonFiniteError):
        learner.learn(np.array([0.0, 0.0]), 1.3e154)
    assert learner.client.pending.q == after.pending.q and learner.client.n == after.n
    assert all(math.isfinite(v) for v in learner.predict(probe))
    model = FSGPRegressor(n_inducing=4)
    model.learn_one({"a": 1.0}, 2.0)
    with pytest.raises(ValueError):
        model.learn_one({"a": float("nan")}, 1.0)
    with pytest.raises(ValueError):
        model.learn_many(np.array([[1.0], [np.nan]]), np.array([1.0, 2.0]))


# =========================================================================== over MQTT


def test_over_mosquitto_equals_the_centralised_sparse_gp(mosquitto_dev) -> None:
    from streamfed.runtime.agent import AgentService, AgentSettings
    from streamfed.runtime.aggregator import AggregatorService

    fleet = synthetic_fleet(3, 60, 2, seed=21)
    names = [f"c{i}" for i in range(3)]
    # the model's own variance, not the conformal scale's; the fleet's posterior, not the personalised mixture
    cfg = fixed_cfg(2, fleet="fsgp-mqtt", calibrate=False, personal=False)

    async def main():
        agg = AggregatorService(AggregatorCore(cfg, clients=names, mode="async", window=0.05),
                                mosquitto_dev.broker_config())
        agents = [AgentService(AgentCore(cfg, n, i), mosquitto_dev.broker_config(),
                               array_source(s.X, s.y, rate_hz=300.0), settings=AgentSettings(linger=1.0))
                  for i, (n, s) in enumerate(zip(names, fleet.streams, strict=True))]
        agg_task = asyncio.create_task(agg.run())
        await asyncio.wait_for(agg.connected.wait(), 10)
        tasks = [asyncio.create_task(a.run()) for a in agents]
        try:
            await asyncio.wait_for(asyncio.gather(*tasks), 30)
        finally:
            agg.stop()
            for a in agents:
                a.stop()
            with contextlib.suppress(asyncio.CancelledError, asyncio.TimeoutError):
                await asyncio.wait_for(agg_task, 5)
        return agg, agents

    agg, agents = asyncio.run(main())
    assert agg.core.rejected == {} and agg.core.version > 1
    g = agg.core.global_message()
    assert g.included == {n: 6 for n in names}
    h = initial_hyper(cfg)
    X = np.concatenate([s.X for s in fleet.streams])
    y = np.concatenate([s.y for s in fleet.streams])
    Xs = np.random.default_rng(2).uniform(-1, 1, (5, 2))
    om, ov = oracle_sgpr(h, X, y, Xs)
    for a in agents:
        assert not a.core.outbox and a.core.learner.global_version == agg.core.version
        pm = np.array([a.core.learner.predict(x) for x in Xs])
        assert max_abs(pm[:, 0], om) < 1e-8 and max_abs(pm[:, 1], ov) < 1e-8
