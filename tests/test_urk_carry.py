"""URK-FedBNR carries every sample's statistics across kernel versions (streamfed/algorithms/urk/carry.py),
checked against a plain numpy transcription of the projection and against the batch statistics."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamfed.algorithms.base import Update
from streamfed.algorithms.fedbnr.aggregation import check_statistics
from streamfed.algorithms.fedbnr.client import FedBNRClient
from streamfed.algorithms.urk.carry import carry, projection
from streamfed.algorithms.urk.client import URKClient
from streamfed.algorithms.urk.messages import StatsItem, URKGlobal
from streamfed.algorithms.urk.network import URKArch, URKFeatureMap, URKWeights, features, initial_weights, omega
from streamfed.algorithms.urk.server import URKServer
from streamfed.algorithms.urk.wire import UPDATE, read_update
from streamfed.core.durable import decode, encode
from streamfed.core.stats import SufficientStats
from streamfed.wire.message import Message

ARCH = URKArch(n_inputs=2, widths=(6, 3), n_omega=8)


def stream(seed: int, n: int = 100) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.uniform(-2, 2, (n, 2))
    return X, np.sin(2 * X[:, 0]) * np.cos(X[:, 1]) + 0.1 * rng.standard_normal(n)


def client(seed: int = 0, **kw: object) -> URKClient:
    return URKClient(initial_weights(ARCH, seed, lengthscale=1.5), omega(ARCH, seed), "v", client_id="c0",
                     min_upload=10, reservoir=40, learn_kernel=False, seed=seed, **kw)  # type: ignore[arg-type]


def new_version(theta: np.ndarray, epoch: int = 1, version: int = 5) -> URKGlobal:
    return URKGlobal(version, epoch, theta, SufficientStats.zeros(ARCH.dim, (1,), "v", epoch), 0.5, 1.0, 0.0, {})


def perturbed(w: URKWeights, scale: float, seed: int = 1) -> np.ndarray:
    v = w.to_vector()
    out = v + scale * np.random.default_rng(seed).standard_normal(v.size)
    out[-2:] = v[-2:]
    return out


def plain_carry(phi_old_res, phi_new_res, y_res, S_rest, b_rest, q_rest, n_rest, phi_sq):
    """The module's equations, transcribed plainly: A by scikit-learn's ridge regression of the new features on
    z = [old features, y] (no intercept, the module's ε = 1e-8 · tr(ZᵀZ)/(F + 1)), R from its residuals, then
    M' = T M Tᵀ + n [[R, 0], [0, 0]] and the trace pinned: S' = c M'_SS, b' = √c M'_Sy."""
    from sklearn.linear_model import Ridge

    Z = np.column_stack([phi_old_res, y_res])
    eps = 1e-8 * np.sum(Z**2) / Z.shape[1]
    A = Ridge(alpha=eps, fit_intercept=False, solver="svd").fit(Z, phi_new_res).coef_
    E = phi_new_res - Z @ A.T
    R = E.T @ E / len(Z)
    f = phi_new_res.shape[1]
    T = np.zeros((f + 1, Z.shape[1]))
    T[:f] = A
    T[f, -1] = 1.0
    M = np.block([[S_rest, b_rest[:, None]], [b_rest[None, :], np.array([[q_rest]])]])
    Mn = T @ M @ T.T
    S = Mn[:f, :f] + n_rest * R
    c = n_rest * phi_sq / np.trace(S)
    return c * S, np.sqrt(c) * Mn[:f, f]


@pytest.mark.slow  # scikit-learn's import
def test_projection_and_carry_equal_the_plain_transcription() -> None:
    rng = np.random.default_rng(0)
    w0, om = initial_weights(ARCH, 0, lengthscale=1.5), omega(ARCH, 0)
    w1 = URKWeights.from_vector(ARCH, perturbed(w0, 0.2))
    Xres, Xrest = rng.uniform(-2, 2, (60, 2)), rng.uniform(-2, 2, (90, 2))
    yres, yrest = np.sin(2 * Xres[:, 0]) + 0.1 * rng.standard_normal(60), np.sin(2 * Xrest[:, 0])
    po, pn = features(w0, om, Xres), features(w1, om, Xres)
    T, R = projection(po, pn, yres)
    P = features(w0, om, Xrest)
    rest = SufficientStats((P.T @ P)[None], (P.T @ yrest)[None], 90.0, float(yrest @ yrest))
    out = carry(rest, T, R, ARCH.phi_sq)
    S_ref, b_ref = plain_carry(po, pn, yres, P.T @ P, P.T @ yrest, float(yrest @ yrest), 90.0, ARCH.phi_sq)
    assert np.allclose(out.S[0], S_ref, rtol=1e-6, atol=1e-8) and np.allclose(out.b[0], b_ref, rtol=1e-6, atol=1e-8)
    assert out.n == 90.0 and out.q == pytest.approx(float(yrest @ yrest))
    assert np.trace(out.S[0]) == pytest.approx(90.0 * ARCH.phi_sq, rel=1e-12)
    # the carried scatter approximates the one the new features would have summed (what nothing carried loses)
    P1 = features(w1, om, Xrest)
    S_true, b_true = P1.T @ P1, P1.T @ yrest
    assert np.linalg.norm(out.S[0] - S_true) < 0.1 * np.linalg.norm(S_true)
    assert np.linalg.norm(out.b[0] - b_true) < 0.1 * np.linalg.norm(b_true)


def test_an_unchanged_kernel_carries_the_batch_statistics_exactly() -> None:
    X, y = stream(0)
    c = client()
    for xi, yi in zip(X, y, strict=True):
        c.learn(xi, yi)
    assert c.apply_global(new_version(c.weights.to_vector()))
    own = c.phase2.own_stats()
    Phi = features(c.weights, c.omega, X)
    assert own.n == 100 and c.n_pending == 100 and c.n_carried == 60
    assert np.allclose(own.S[0], Phi.T @ Phi, rtol=0, atol=1e-11)
    assert np.allclose(own.b[0], Phi.T @ y, rtol=0, atol=1e-11) and own.q == pytest.approx(float(y @ y))


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 10_000), st.floats(0.0, 0.5), st.integers(1, 3))
def test_sample_counts_add_up_and_every_upload_passes_the_checks(seed: int, scale: float, versions: int) -> None:
    """Over several versions: the statistics count every sample learned, their trace is n‖φ‖² and they pass the
    aggregation's checks of a sum of feature vectors (positive semi-definite, Cauchy–Schwarz on b)."""
    X, y = stream(seed, 150)
    c = client(seed)
    per = len(y) // (versions + 1)
    theta = c.weights.to_vector()
    for v in range(versions + 1):
        for xi, yi in zip(X[v * per:(v + 1) * per], y[v * per:(v + 1) * per], strict=True):
            c.learn(xi, yi)
        if v < versions:
            theta = perturbed(URKWeights.from_vector(ARCH, theta), scale, seed + v)
            assert c.apply_global(new_version(theta, v + 1, v + 1))
    own = c.phase2.own_stats()
    assert own.n == per * (versions + 1) and c.n_pending == own.n
    assert np.trace(own.S[0]) == pytest.approx(own.n * ARCH.phi_sq, rel=1e-9)
    check_statistics(own, max_abs=1e100, phi_sq=ARCH.phi_sq, label_bound=float(np.max(np.abs(y))) + 1e-9,
                     phi_sq_min=ARCH.phi_sq)


def test_the_last_global_sums_every_sample_of_every_client() -> None:
    w0, om = initial_weights(ARCH, 0, lengthscale=1.5), omega(ARCH, 0)
    server = URKServer(w0, om, "v", min_samples=10, fit=False)
    clients = [URKClient(w0, om, "v", client_id=f"c{i}", min_upload=10, reservoir=30, learn_kernel=False, seed=i)
               for i in range(3)]
    data = [stream(10 + i, 80) for i in range(3)]

    def to_item(name: str, up: Update) -> StatsItem:
        st = up.arrays  # through the wire's reader, as the aggregation sees it
        msg = Message("f", name, UPDATE, up.seq, up.global_version, "v", up.n_samples, 0.0, dict(st), epoch=up.epoch)
        item = read_update(msg, ARCH, "v")
        assert isinstance(item, StatsItem)
        return item

    def sync() -> URKGlobal:
        for i, c in enumerate(clients):
            while (up := c.take_update()) is not None:
                server.apply(to_item(f"c{i}", up))
        return server.publish()

    for half in (slice(0, 40), slice(40, 80)):
        for c, (X, y) in zip(clients, data, strict=True):
            for xi, yi in zip(X[half], y[half], strict=True):
                c.learn(xi, yi)
        g = sync()
        for c in clients:
            c.apply_global(g)
        if half.start == 0:  # a new network, as a move would make it (the server's own step, done by hand)
            server.epoch += 1
            server.weights = URKWeights.from_vector(ARCH, perturbed(w0, 0.1))
            server.theta = server.weights.to_vector()
            server.stats = SufficientStats.zeros(ARCH.dim, (1,), "v", server.epoch)
            g = server.publish()
            for c in clients:
                c.apply_global(g)
    g = sync()
    assert g.epoch == 1 and g.stats.n == 240  # without carrying: 3 reservoirs of 30 + 3 × 40 later samples = 210


def test_add_pending_gives_the_batch_posterior() -> None:
    X, y = stream(3, 60)
    fm = URKFeatureMap(initial_weights(ARCH, 0), omega(ARCH, 0), "v")
    Phi = fm.transform_many(X)
    a = FedBNRClient(fm, sigma=0.4, lam=1.2, min_upload=10)
    for xi, yi in zip(X[:20], y[:20], strict=True):
        a.learn(xi, yi)
    a.add_pending(SufficientStats((Phi[20:].T @ Phi[20:])[None], (Phi[20:].T @ y[20:])[None], 40.0,
                                  float(y[20:] @ y[20:]), fm.version, 0))
    A = Phi.T @ Phi / 0.4**2 + np.eye(ARCH.dim) / 1.2**2
    x = np.array([0.3, -0.5])
    phi = fm.transform_one(x)
    mean = phi @ np.linalg.solve(A, Phi.T @ y) / 0.4**2
    assert a.predict(x) == pytest.approx((mean, 0.4**2 + phi @ np.linalg.solve(A, phi)), rel=1e-9)
    up = a.make_upload()
    assert up is not None and up.stats.n == 60 and np.allclose(up.stats.S[0], Phi.T @ Phi, atol=1e-11)
    with pytest.raises(ValueError, match="whole count"):
        a.add_pending(SufficientStats(np.zeros((1, ARCH.dim, ARCH.dim)), np.zeros((1, ARCH.dim)), 1.5, 0.0,
                                      fm.version, 0))


def test_a_client_stored_before_carrying_loads_and_carries() -> None:
    X, y = stream(5)
    c = client()
    for xi, yi in zip(X, y, strict=True):
        c.learn(xi, yi)
    del c.__dict__["carry"], c.__dict__["n_carried"]  # the fields of a state written before this change
    old = decode(encode(c))
    assert old.apply_global(new_version(perturbed(c.weights, 0.1)))
    assert old.phase2.own_stats().n == 100 and old.n_carried == 60


@pytest.mark.slow
def test_the_default_network_learns_which_inputs_matter_across_clients() -> None:
    """URK's defaults (a lengthscale per input, ARD): on a fleet whose target depends on 2 of 6 inputs, the
    federated kernel's lengthscales of the 4 irrelevant inputs end far above the relevant ones' — what a fixed
    RFF bandwidth cannot do (docs/results.md, "URK-FedBNR against fixed RFF")."""
    pytest.importorskip("torch")
    from streamfed.evaluation.datasets import ClientStream, Fleet
    from streamfed.evaluation.replay import AlgorithmConfig, replay

    rng = np.random.default_rng(0)
    streams = []
    for c in range(4):
        X = rng.standard_normal((300, 6))
        streams.append(ClientStream(f"c{c}", X, np.sin(2 * X[:, 0]) + X[:, 1] ** 2 / 2 + 0.1 * rng.standard_normal(300),
                                    tuple(f"x{j}" for j in range(6))))
    res = replay(Fleet(tuple(streams), dataset="t", normalisation="none", split="iid"), "urk-fedbnr",
                 AlgorithmConfig(), seed=0)
    assert res.arrangement is not None
    server = res.arrangement.aggregations[0].server  # type: ignore[attr-defined]
    ls = np.exp(server.weights.arrays["log_ls"])
    assert server.epoch >= 3 and int(res.rejected.sum()) == 0
    assert ls[2:].min() > 3 * ls[:2].max(), ls
    assert server.stats.n >= 4 * (300 - 31)  # every sample above the privacy floor, carried across the versions


def test_urk_carries_by_default_in_exact_mode_only() -> None:
    """`carry = None` (the default) resolves by the fleet's aggregation: carried statistics in exact mode, restarts
    from the reservoirs under robust aggregation (tests/test_robust_nets.py: carried, a version pushed by hostile
    proposers keeps its loss); an explicit setting wins."""
    from streamfed.algorithms.urk import ALGORITHM as URK
    from streamfed.fleet.config import FleetConfig
    from streamfed.fleet.robustness import Robustness

    def carries(aggregation: str, **params: object) -> bool:
        cfg = FleetConfig(fleet="f", algorithm="urk-fedbnr", n_inputs=2, params=dict(params),
                          robust=Robustness(aggregation=aggregation))
        learner = URK.learner(cfg, "a", 0)
        return bool(getattr(learner, "inner", learner).client.carry)

    assert carries("exact") and carries("auto") and not carries("robust")
    assert carries("robust", carry=True) and not carries("exact", carry=False)
