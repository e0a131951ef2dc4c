"""URK-FedBNR (streamfed.algorithms.urk): the URK features against the Gaussian kernel, torch's gradients
against finite differences, the torch evidence against plain transcriptions of docs/algorithms.md §4 in numpy,
numpy features against torch features."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import multivariate_normal

torch = pytest.importorskip("torch")

from streamfed.algorithms.urk.network import URKArch, URKWeights, features, initial_weights, omega  # noqa: E402
from streamfed.algorithms.urk.training import features_t, fit_local, log_evidence  # noqa: E402

torch.set_num_threads(1)


# =========================================================================== oracles: plain transcriptions


def oracle_log_evidence(phi: np.ndarray, y: np.ndarray, sigma: float, lam: float) -> float:
    """docs/algorithms.md §4, line by line: A = σ⁻²S + λ⁻²I;
    log p(y) = −(n/2) log(2πσ²) − ½ log|I + λ²σ⁻²S| − ½ (σ⁻²q − σ⁻⁴ bᵀA⁻¹b)."""
    n, f = phi.shape
    S, b, q = phi.T @ phi, phi.T @ y, y @ y
    A = S / sigma**2 + np.eye(f) / lam**2
    return float(-(n / 2) * np.log(2 * np.pi * sigma**2)
                 - 0.5 * np.log(np.linalg.det(np.eye(f) + lam**2 / sigma**2 * S))
                 - 0.5 * (q / sigma**2 - b @ np.linalg.inv(A) @ b / sigma**4))


def oracle_marginal(phi: np.ndarray, y: np.ndarray, sigma: float, lam: float) -> float:
    """The same evidence by its definition: y ~ N(0, σ²I + λ²ΦΦᵀ) (w ~ N(0, λ²I) integrated out)."""
    cov = sigma**2 * np.eye(len(y)) + lam**2 * phi @ phi.T
    return float(multivariate_normal(np.zeros(len(y)), cov).logpdf(y))


def oracle_features(x: np.ndarray, W: list[np.ndarray], c: list[np.ndarray], ls: np.ndarray, om: np.ndarray
                    ) -> np.ndarray:
    """URK of the thesis eq. 3.2 with g = [cos(h(ω)ᵀf(x)), sin(h(ω)ᵀf(x))], h(ω) = ω/ℓ, one sample at a time."""
    h = x
    for i, (Wi, ci) in enumerate(zip(W, c, strict=True)):
        h = Wi @ h + ci
        if i < len(W) - 1:
            h = np.tanh(h)
    m = om.shape[0]
    z = [np.array([math.cos((om[i] / ls) @ h), math.sin((om[i] / ls) @ h)]) for i in range(m)]
    s = np.concatenate(z)  # s^m_ω(x): m samples of z_ω(x), each (cos, sin)
    return s / math.sqrt(m - 1)


def reorder(s: np.ndarray) -> np.ndarray:
    """The oracle interleaves (cos_i, sin_i); the package lays out all cosines, then all sines."""
    return np.concatenate([s[0::2], s[1::2]])


# =========================================================================== 1. the feature map


def test_features_match_the_oracle_with_an_mlp() -> None:
    arch = URKArch(n_inputs=3, widths=(5, 4), n_omega=6)
    w = initial_weights(arch, seed=3, lengthscale=0.7)
    w.arrays["c0"] = np.random.default_rng(1).standard_normal(5)  # non-zero biases: they must be used
    om = omega(arch, 3)
    X = np.random.default_rng(2).standard_normal((4, 3))
    mine = features(w, om, X)
    for t in range(4):
        ref = reorder(oracle_features(X[t], [w.arrays["W0"], w.arrays["W1"]], [w.arrays["c0"], w.arrays["c1"]],
                                      np.exp(w.arrays["log_ls"]), om))
        assert np.allclose(mine[t], ref, rtol=0, atol=1e-14)


def test_omega_is_derived_from_the_seed_alone() -> None:
    arch = URKArch(n_inputs=2, widths=(), n_omega=8)
    assert np.array_equal(omega(arch, 5), omega(arch, 5))
    assert not np.array_equal(omega(arch, 5), omega(arch, 6))


def gaussian(X: np.ndarray, ell: float) -> np.ndarray:
    d2 = ((X[:, None, :] - X[None, :, :]) ** 2).sum(-1)
    return np.exp(-d2 / (2 * ell**2))


def test_identity_extractor_approximates_the_gaussian_kernel_like_one_over_root_m() -> None:
    """Plain RFF as a URK (f = identity, h = ω/ℓ): the error of URK(x, x') against exp(−‖x−x'‖²/2ℓ²) falls
    like m^(−1/2) — the fitted log-log slope over m = 16 … 4096, averaged over seeds."""
    ell = 1.3
    X = np.random.default_rng(0).uniform(-2, 2, (12, 2))
    K = gaussian(X, ell)
    ms = [16, 64, 256, 1024, 4096]
    errs = []
    for m in ms:
        arch = URKArch(n_inputs=2, widths=(), n_omega=m)
        e = []
        for seed in range(12):
            phi = features(initial_weights(arch, seed, lengthscale=ell), omega(arch, seed), X)
            e.append(np.sqrt(np.mean((phi @ phi.T - K) ** 2)))
        errs.append(np.mean(e))
    slope = np.polyfit(np.log(ms), np.log(errs), 1)[0]
    assert -0.62 < slope < -0.38, (slope, errs)
    assert errs[-1] < 0.03


def test_the_normalisation_is_the_theses_m_over_m_minus_one() -> None:
    """With √(m−1) (eq. 3.2) the expectation of URK is m/(m−1)·k: at m = 2 and x = x', exactly 2 (cos² + sin²
    = 1 for each of the two samples, divided by 1); on average over draws, 2k(x, x') off the diagonal."""
    ell, X = 1.0, np.array([[0.0, 0.0], [0.6, -0.3]])
    arch = URKArch(n_inputs=2, widths=(), n_omega=2)
    vals = []
    for seed in range(4000):
        phi = features(initial_weights(arch, seed, lengthscale=ell), omega(arch, seed), X)
        assert phi[0] @ phi[0] == pytest.approx(2.0, abs=1e-12)
        vals.append(phi[0] @ phi[1])
    k = gaussian(X, ell)[0, 1]
    assert np.mean(vals) == pytest.approx(2 * k, abs=4 * np.std(vals) / math.sqrt(len(vals)))


# =========================================================================== 2. evidence and gradients


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_torch_evidence_equals_both_oracles(seed: int) -> None:
    rng = np.random.default_rng(seed)
    phi = rng.standard_normal((15, 6)) * 0.5
    y = rng.standard_normal(15)
    sigma, lam = float(rng.uniform(0.2, 2.0)), float(rng.uniform(0.2, 3.0))
    mine = float(log_evidence(torch.tensor(phi), torch.tensor(y), torch.tensor(math.log(sigma), dtype=torch.float64),
                              torch.tensor(math.log(lam), dtype=torch.float64)))
    assert mine == pytest.approx(oracle_log_evidence(phi, y, sigma, lam), rel=1e-10, abs=1e-10)
    assert mine == pytest.approx(oracle_marginal(phi, y, sigma, lam), rel=1e-10, abs=1e-10)


def test_gradients_match_finite_differences() -> None:
    arch = URKArch(n_inputs=2, widths=(3, 2), n_omega=4, shifter_width=3)
    w = initial_weights(arch, seed=1)
    rng = np.random.default_rng(0)
    v = w.to_vector() + 0.1 * rng.standard_normal(arch.n_params)  # the shifter's residual away from zero
    om = torch.tensor(omega(arch, 1))
    X, y = torch.tensor(rng.standard_normal((7, 2))), torch.tensor(rng.standard_normal(7))

    def ev(p: torch.Tensor) -> torch.Tensor:
        return log_evidence(features_t(p, arch, om, X), y, p[-2], p[-1])

    def feats(p: torch.Tensor) -> torch.Tensor:
        return features_t(p, arch, om, X)

    p = torch.tensor(v, requires_grad=True)
    assert torch.autograd.gradcheck(ev, (p,), eps=1e-6, atol=1e-6, rtol=1e-5)
    assert torch.autograd.gradcheck(feats, (p,), eps=1e-6, atol=1e-6, rtol=1e-5)


def test_numpy_features_equal_torch_features() -> None:
    arch = URKArch(n_inputs=4, widths=(16, 8), n_omega=32, shifter_width=6)
    rng = np.random.default_rng(7)
    w = URKWeights.from_vector(arch, initial_weights(arch, 7).to_vector() + 0.2 * rng.standard_normal(arch.n_params))
    om = omega(arch, 7)
    X = rng.standard_normal((50, 4)) * 2
    ref = features_t(torch.tensor(w.to_vector()), arch, torch.tensor(om), torch.tensor(X)).numpy()
    assert np.max(np.abs(features(w, om, X) - ref)) <= 1e-12


def test_a_local_fit_raises_the_evidence_and_finds_the_noise() -> None:
    """`sin(x/0.3)` plus noise 0.1 on [−3, 3], from ℓ = 0.6, σ = 0.5: the fit raises the evidence (the numpy
    oracle's, not the code under test's) and finds σ near the true 0.1. (From ℓ = 2 it stops in the known
    local optimum that explains the function as noise, σ ≈ 0.67: evidence maximisation is not convex.)"""
    rng = np.random.default_rng(0)
    X = rng.uniform(-3, 3, (120, 1))
    y = np.sin(X[:, 0] / 0.3) + 0.1 * rng.standard_normal(120)
    arch = URKArch(n_inputs=1, widths=(), n_omega=32)
    w0 = initial_weights(arch, 0, lengthscale=0.6, sigma=0.5, lam=1.0)
    om = omega(arch, 0)
    w1 = fit_local(w0, om, X, y, steps=150, learning_rate=0.05)
    assert w1 is not None
    before = oracle_log_evidence(features(w0, om, X), y, w0.sigma, w0.lam)
    after = oracle_log_evidence(features(w1, om, X), y, w1.sigma, w1.lam)
    assert after > before + 50
    assert 0.07 < w1.sigma < 0.15


# =========================================================================== 3. phase 1 + phase 2: the two halves

from streamfed import algorithms  # noqa: E402
from streamfed.algorithms.urk.client import URKClient  # noqa: E402
from streamfed.algorithms.urk.messages import ChunkItem, StatsItem  # noqa: E402
from streamfed.algorithms.urk.server import URKServer  # noqa: E402
from streamfed.core.stats import SufficientStats  # noqa: E402
from streamfed.fleet.config import FleetConfig  # noqa: E402
from streamfed.wire.message import Message, ProtocolError, decode, encode  # noqa: E402

ARCH = URKArch(n_inputs=2, widths=(6, 3), n_omega=8)
LIMIT = 96  # bytes per chunk: at most 12 numbers, so a proposal of ARCH.n_params = 44 numbers takes 4 chunks of 11


def two_clients(seed: int = 0, reservoir: int = 40, carry: bool = True
                ) -> tuple[list[URKClient], list[tuple[np.ndarray, np.ndarray]]]:
    w0, om = initial_weights(ARCH, seed, lengthscale=1.5), omega(ARCH, seed)
    clients = [URKClient(w0, om, "v", client_id=f"c{i}", min_upload=10, reservoir=reservoir, fit_every=50,
                         fit_steps=5, learning_rate=0.05, max_chunk_numbers=LIMIT // 8, seed=seed, carry=carry)
               for i in range(2)]
    rng = np.random.default_rng(seed)
    data = []
    for i in range(2):
        X = rng.uniform(-2, 2, (50, 2)) + (2.0 * i - 1.0)  # non-i.i.d.: shifted inputs per client
        data.append((X, np.sin(2 * X[:, 0]) * np.cos(X[:, 1]) + 0.1 * rng.standard_normal(50)))
    return clients, data


def drain(c: URKClient) -> list:
    out = []
    while (up := c.take_update()) is not None:
        out.append(up)
    return out


def to_item(client: str, up) -> StatsItem | ChunkItem:
    """An Update through the wire's reader, as the aggregation sees it (independent of the client's objects)."""
    from streamfed.algorithms.urk.wire import UPDATE, read_update

    msg = Message("f", client, UPDATE, up.seq, up.global_version, "v", up.n_samples, 0.0, dict(up.arrays),
                  epoch=up.epoch)
    return read_update(msg, ARCH, "v")


def test_a_round_fedavg_new_epoch_re_embedding_and_stale_uploads() -> None:
    clients, data = two_clients(carry=False)  # the reservoir alone (tests/test_urk_carry.py: the carried rest)
    w0, om = clients[0].weights, clients[0].omega
    server = URKServer(w0, om, "v", min_samples=10, min_proposal_weight=10, proposal_quorum=1.0,
                       max_proposal_weight=40)
    ups = []
    for c, (X, y) in zip(clients, data, strict=True):
        for xi, yi in zip(X, y, strict=True):
            c.learn(xi, yi)
        assert c.n_proposals == 1 and len(c.queue) == 4  # fitted at sample 50; 44 numbers in chunks of ≤ 12
        ups.append(drain(c))
    # every upload within the bound; statistics and chunks numbered together, 1, 2, …
    for u in ups:
        assert [x.seq for x in u] == list(range(1, len(u) + 1))
        assert all(x.arrays["chunk"].nbytes <= LIMIT for x in u)
    # the FedAvg oracle: θ₀ + Σ w_c δ_c / Σ w_c, the deltas read back from the chunks' arrays
    deltas = [np.concatenate([x.arrays["chunk"] for x in u if x.arrays["chunk"].size]) for u in ups]
    weights = [float(u[-1].arrays["weight"]) for u in ups]
    assert weights == [40.0, 40.0]
    expected = w0.to_vector() + (weights[0] * deltas[0] + weights[1] * deltas[1]) / sum(weights)

    # one stats upload of client 1 held back: it will arrive after the kernel version moved
    late = ups[1].pop(0)
    for i, u in enumerate(ups):
        for x in u[::-1]:  # reversed: the server applies in seq order anyway
            server.apply(to_item(f"c{i}", x))
    assert server.waiting() == {"c1": list(range(2, len(ups[1]) + 2))}  # c1's seq 1 is missing: all wait
    assert server.apply(to_item("c1", late)) is True
    g = server.publish()
    assert g.epoch == 1 and np.allclose(g.theta, expected, rtol=0, atol=1e-13)
    assert g.stats.n == 0  # a new epoch starts with empty sums: nothing of the old network's statistics
    assert g.included == {"c0": len(ups[0]), "c1": len(ups[1]) + 1}

    # an old-epoch upload arriving now is not summed; one claiming a future epoch is refused
    stale = SufficientStats.from_samples(np.full((10, 1, ARCH.dim), 0.1), np.ones(10), "v", 0)
    assert server.apply(StatsItem("c9", 1, 0, 0, stale)) is True and server.stale_stats == 1
    assert server.stats.n == 0 and server.included["c9"] == 1
    with pytest.raises(ValueError, match="kernel version 5"):
        server.validate(StatsItem("c9", 2, 0, 5, stale))

    # the clients install the new version: they re-embed their reservoirs under the new network
    new_w = URKWeights.from_vector(ARCH, g.theta)
    for c in clients:
        assert c.apply_global(g) and c.epoch == 1 and c.n_pending == 40 and not c.queue
    for i, c in enumerate(clients):
        for x in drain(c):
            assert x.epoch == 1
            server.apply(to_item(f"c{i}", x))
    g2 = server.publish()
    # the oracle: statistics of both reservoirs under the new network, from the plain feature transcription
    W = [new_w.arrays["W0"], new_w.arrays["W1"]]
    cs = [new_w.arrays["c0"], new_w.arrays["c1"]]
    Xr = np.concatenate([c.reservoir[0] for c in clients])
    yr = np.concatenate([c.reservoir[1] for c in clients])
    Phi = np.stack([reorder(oracle_features(x, W, cs, np.exp(new_w.arrays["log_ls"]), om)) for x in Xr])
    assert g2.epoch == 1 and g2.stats.n == 80
    assert np.allclose(g2.stats.S[0], Phi.T @ Phi, rtol=0, atol=1e-11)
    assert np.allclose(g2.stats.b[0], Phi.T @ yr, rtol=0, atol=1e-11)
    # ... and the posterior every client predicts with is the centralised one on those samples
    for c in clients:
        assert c.apply_global(g2)
        x = np.array([0.3, -0.2])
        phi = reorder(oracle_features(x, W, cs, np.exp(new_w.arrays["log_ls"]), om))
        A = Phi.T @ Phi / g2.sigma**2 + np.eye(ARCH.dim) / g2.lam**2
        mean = phi @ np.linalg.solve(A, Phi.T @ yr) / g2.sigma**2
        var = g2.sigma**2 + phi @ np.linalg.solve(A, phi)
        assert c.predict(x) == pytest.approx((mean, var), rel=1e-9, abs=1e-10)


def test_a_proposal_counts_only_with_all_its_chunks() -> None:
    clients, data = two_clients(1)
    c = clients[0]
    for xi, yi in zip(*data[0], strict=True):
        c.learn(xi, yi)
    ups = drain(c)
    server = URKServer(c.weights, c.omega, "v", min_samples=10, min_proposal_weight=1, proposal_quorum=1.0)
    chunks = [u for u in ups if u.arrays["chunk"].size]
    assert len(chunks) == 4
    for u in ups:
        if u is not chunks[2]:
            item = to_item("c0", u)
            if u.seq < chunks[2].seq:
                server.apply(item)
    assert server.prop_weight == 0 and not server.ready_to_move()
    server.apply(to_item("c0", chunks[2]))
    server.apply(to_item("c0", chunks[3]))
    assert server.prop_weight > 0 and server.ready_to_move()
    # a chunk repeated (a retransmission) changes nothing
    assert server.apply(to_item("c0", chunks[3])) is False


def test_bad_chunks_are_refused_before_anything_changes() -> None:
    cfg = FleetConfig(fleet="f", algorithm="urk-fedbnr", n_inputs=2, standardise="none",
                      params={"widths": [6, 3], "n_omega": 8, "max_chunk_bytes": LIMIT, "min_upload": 10})
    alg = algorithms.get("urk-fedbnr")
    agg = alg.aggregation(cfg, max_abs=1e100)

    def chunk_msg(seq: int, part: list[int], data: np.ndarray, weight: float = 10.0) -> Message:
        return Message("f", "a", "urk.update", seq, 0, cfg.kernel_version, 0, 0.0,
                       {"S_upper": np.zeros(0), "b": np.zeros(0), "n": np.asarray(0.0), "q": np.asarray(0.0),
                        "chunk": data, "part": np.array(part, dtype=np.int64), "weight": np.asarray(weight)})

    P = ARCH.n_params
    assert P == 44
    agg.take("a", 1, agg.check(chunk_msg(1, [1, 0, 4, P], np.zeros(11))))
    for bad in (chunk_msg(2, [1, 1, 5, P], np.zeros(9)),       # another count than its sibling
                chunk_msg(2, [1, 1, 4, P + 1], np.zeros(12)),  # another length than the network
                chunk_msg(2, [1, 1, 4, P], np.zeros(10)),      # wrong size for its position
                chunk_msg(2, [1, 1, 4, P], np.full(11, 1e200)),  # beyond max_abs
                chunk_msg(2, [1, 4, 4, P], np.zeros(11))):     # index out of range
        with pytest.raises(ValueError):
            agg.check(bad)
    # more numbers than max_chunk_bytes allows: the codec itself refuses, before any algorithm code runs
    assert decode(encode(chunk_msg(2, [1, 1, 4, P], np.zeros(12))), cfg.protocol_schema, kinds=("urk.update",))
    with pytest.raises(ProtocolError, match=r"'chunk'.*length 13, allowed 0\.\.12"):
        decode(encode(chunk_msg(2, [1, 1, 4, P], np.zeros(13))), cfg.protocol_schema, kinds=("urk.update",))
    assert agg.server.chunks.open_vectors() == {"a": [1]}


def oracle_kd_loss(w: URKWeights, clients: list[URKWeights], om: np.ndarray, X: np.ndarray, y: np.ndarray,
                   alpha: float) -> float:
    """Thesis eq. 3.4 in numpy: −log p_kd(y)/n + α·MSE(ΦΦᵀ − mean_c Φ_cΦ_cᵀ)."""
    target = np.mean([features(c, om, X) @ features(c, om, X).T for c in clients], axis=0)
    phi = features(w, om, X)
    return (-oracle_log_evidence(phi, y, w.sigma, w.lam) / len(y)
            + alpha * float(np.mean((phi @ phi.T - target) ** 2)))


def test_distillation_lowers_the_theses_kd_loss_from_the_average() -> None:
    clients, data = two_clients(2)
    w0, om = clients[0].weights, clients[0].omega
    rng = np.random.default_rng(5)
    Xkd = rng.uniform(-3, 3, (16, 2))
    ykd = np.sin(2 * Xkd[:, 0]) * np.cos(Xkd[:, 1])
    servers = {a: URKServer(w0, om, "v", min_samples=10, min_proposal_weight=10, proposal_quorum=1.0,
                            aggregation=a, distill_set=(Xkd, ykd), distill_alpha=1.0, distill_steps=30,
                            distill_learning_rate=0.02) for a in ("fedavg", "distill")}
    for i, (c, (X, y)) in enumerate(zip(clients, data, strict=True)):
        for xi, yi in zip(X, y, strict=True):
            c.learn(xi, yi)
        for u in drain(c):
            for s in servers.values():
                s.apply(to_item(f"c{i}", u))
    props = [URKWeights.from_vector(ARCH, p) for p in servers["fedavg"].proposals]
    avg, kd = (URKWeights.from_vector(ARCH, s.publish().theta) for s in servers.values())
    assert servers["distill"].epoch == servers["fedavg"].epoch == 1
    assert oracle_kd_loss(kd, props, om, Xkd, ykd, 1.0) < oracle_kd_loss(avg, props, om, Xkd, ykd, 1.0) - 1e-3


def test_params_refuse_distillation_without_a_set() -> None:
    with pytest.raises(ValueError, match="server-held"):
        FleetConfig(fleet="f", algorithm="urk-fedbnr", n_inputs=2, params={"aggregation": "distill"})


# =========================================================================== 4. in the fleet: replay, MQTT, no torch

from streamfed.evaluation.datasets import synthetic_fleet  # noqa: E402
from streamfed.evaluation.replay import AlgorithmConfig  # noqa: E402
from tests.test_plugins import rel_diff, replay_keeping_arrangement, run_mqtt_fleet  # noqa: E402

URK = "urk-fedbnr"
FLEET_PARAMS = {"widths": [6, 3], "n_omega": 8, "min_upload": 10, "fit_every": 40, "fit_steps": 3,
                "reservoir": 40, "min_proposal_weight": 40, "max_chunk_bytes": LIMIT}


def fleet_cfg(name: str, n_inputs: int, **params: object) -> FleetConfig:
    return FleetConfig(standardise="none", fleet=name, algorithm=URK, n_inputs=n_inputs, seed=3,
                       params={**FLEET_PARAMS, **params})


def test_replay_with_kernel_learning_moves_versions_and_rejects_nothing() -> None:
    fleet = synthetic_fleet(3, 200, 2, seed=4)
    acfg = AlgorithmConfig(n_kernels=1, n_features=8, params={URK: FLEET_PARAMS})
    result, arr = replay_keeping_arrangement(fleet, URK, acfg, seed=3)
    agg = arr.aggregations[0]
    assert int(result.rejected.sum()) == 0 and agg.server.epoch >= 2
    assert agg.server.refused_proposals == 0
    for learner in arr.learners:
        assert learner.client.epoch == agg.server.epoch  # every client follows the kernel version
        m, v = learner.predict(np.zeros(fleet.n_inputs))
        assert math.isfinite(m) and v > 0


def test_fixed_kernel_over_mosquitto_equals_replay(mosquitto_dev) -> None:
    """With the network fixed (no phase 1) and σ, λ fixed, the last global over a real broker equals the
    replay's: the same summed statistics, the same predictions at every agent."""
    fleet = synthetic_fleet(3, 60, 2, seed=11)
    names = [f"c{i}" for i in range(len(fleet))]
    params = {"learn_kernel": False, "fit_hyperparameters": False, "calibrate": False}  # the model's own variance
    cfg = fleet_cfg("urk-fixed", fleet.n_inputs, **params)
    acfg = AlgorithmConfig(n_kernels=1, n_features=8, params={URK: {**FLEET_PARAMS, **params}})
    _, arr = replay_keeping_arrangement(fleet, URK, acfg, seed=3)
    ref = arr.global_message(arr.aggregations[0])
    agg, agents = run_mqtt_fleet(cfg, mosquitto_dev.broker_config(), fleet, names)
    assert agg.core.rejected == {}
    g = agg.core.global_message()
    assert g.included == ref.included == {n: 6 for n in names}
    for k in ("S_upper", "b", "n", "q", "theta"):
        assert rel_diff(g.arrays[k], ref.arrays[k]) <= 1e-12
    probes = np.random.default_rng(0).uniform(-1, 1, (4, fleet.n_inputs))
    for i, a in enumerate(agents):
        mine = np.array([a.core.learner.predict(x) for x in probes])
        theirs = np.array([arr.learners[i].predict(x) for x in probes])
        assert rel_diff(mine, theirs) <= 1e-10


def test_kernel_learning_over_mosquitto(mosquitto_dev) -> None:
    """Chunks and statistics over a real broker: nothing rejected, the kernel version moves, every agent ends on
    the aggregator's last global (and so on its network)."""
    fleet = synthetic_fleet(3, 160, 2, seed=12)
    names = [f"c{i}" for i in range(len(fleet))]
    cfg = fleet_cfg("urk-learn", fleet.n_inputs)
    agg, agents = run_mqtt_fleet(cfg, mosquitto_dev.broker_config(), fleet, names)
    assert agg.core.rejected == {}
    server = agg.core.aggregation.server
    assert server.epoch >= 1 and server.refused_proposals == 0
    g = agg.core.global_message()
    for a in agents:
        assert a.core.global_version == agg.core.version and not a.core.outbox
        assert a.core.learner.client.epoch == server.epoch == g.epoch
        assert np.array_equal(a.core.learner.client.weights.to_vector(), g.arrays["theta"])


def test_an_agent_without_torch_predicts_and_contributes() -> None:
    """torch hidden: the package imports, an agent learns and uploads statistics (and never fits), the
    aggregator sums them; no torch module gets loaded. (Hidden by an import hook, not `sys.modules["torch"] =
    None`: scipy.stats, which the fleet's privacy layer imports, probes `sys.modules["torch"].Tensor`.)"""
    import subprocess
    import sys

    code = """
import sys
class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch is hidden")
sys.meta_path.insert(0, NoTorch())
import numpy as np
from streamfed.fleet.agent import AgentCore
from streamfed.fleet.aggregator import AggregatorCore
from streamfed.fleet.config import FleetConfig
from streamfed.wire.message import encode
from streamfed.fleet.sources import Reading
cfg = FleetConfig(fleet="f", algorithm="urk-fedbnr", n_inputs=2, params={"n_omega": 8, "min_upload": 10,
                  "fit_every": 20})
agent, agg = AgentCore(cfg, "a", 0), AggregatorCore(cfg, mode="async", window=0.0)
sent = 0
for t in range(60):
    _, msgs = agent.on_reading(Reading(f"r{t}", np.array([t / 60, 0.5]), float(t), y=float(np.cos(t))))
    for m in msgs:
        sent += 1
        agg.on_update("a", encode(m), now=0.0)
d = agent.learner.diagnostics()
assert sent >= 5 and d["local_fits"] == 0 and d["proposals"] == 0
assert agg.aggregation.server.stats.n >= 50 and agg.rejected == {}
assert np.isfinite(agent.learner.predict(np.zeros(2))[0])
assert "torch" not in [m for m in sys.modules if sys.modules[m] is not None]
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_rff_normalisation_reproduces_the_rff_bank_exactly() -> None:
    """normalisation="rff", identity extractor, h = ω/ℓ: the features are docs/algorithms.md §2's RFF map of the
    frequencies ω/ℓ — the library's RFFBank, bit for bit up to rounding (sines first, m^{-1/2})."""
    from streamfed.core.features import RFFBank

    arch = URKArch(n_inputs=3, widths=(), n_omega=16, normalisation="rff")
    w = initial_weights(arch, 4, lengthscale=0.8)
    om = omega(arch, 4)
    bank = RFFBank.from_frequencies(om / 0.8)
    X = np.random.default_rng(1).standard_normal((5, 3))
    ref = np.stack([bank.transform_one(x)[0] for x in X])
    assert np.max(np.abs(features(w, om, X) - ref)) <= 1e-13
    assert np.allclose(np.sum(features(w, om, X) ** 2, axis=1), 1.0, rtol=0, atol=1e-14)
    torch_feats = features_t(torch.tensor(w.to_vector()), arch, torch.tensor(om), torch.tensor(X)).numpy()
    assert np.max(np.abs(torch_feats - ref)) <= 1e-13


def test_regret_comparator_is_ridge_on_the_initial_features_and_state_pickles() -> None:
    """The regret's best fixed predictor: min_w Σ(y − φ₀ᵀw)² + (σ₀²/λ₀²)‖w‖² over the initial network's
    features φ₀ of every own sample (numpy, from the plain feature transcription), whatever versions came;
    and a client pickled mid-stream resumes exactly."""
    import pickle

    clients, data = two_clients(3)
    c = clients[0]
    X, y = data[0]
    w0 = c.weights
    for xi, yi in zip(X[:37], y[:37], strict=True):
        c.learn(xi, yi)
    twin = pickle.loads(pickle.dumps(c))
    for xi, yi in zip(X[37:], y[37:], strict=True):
        assert c.learn(xi, yi) == twin.learn(xi, yi)
    W = [w0.arrays["W0"], w0.arrays["W1"]]
    cs = [w0.arrays["c0"], w0.arrays["c1"]]
    Phi0 = np.stack([reorder(oracle_features(x, W, cs, np.exp(w0.arrays["log_ls"]), c.omega)) for x in X])
    ridge = y @ y - (Phi0.T @ y) @ np.linalg.solve(Phi0.T @ Phi0 + (w0.sigma / w0.lam) ** 2 * np.eye(ARCH.dim),
                                                   Phi0.T @ y)
    r = c.regret()
    assert r["n"] == 50 and r["best_loss"] == pytest.approx(ridge, rel=1e-9)
    assert r == twin.regret()


# =========================================================================== 5. River

from river import checks  # noqa: E402

from streamfed.algorithms.urk.estimator import URKRegressor  # noqa: E402


@pytest.mark.slow  # over 2 s: outside the pure tier, in every full run
@pytest.mark.parametrize("params", list(URKRegressor._unit_test_params()))  # noqa: SLF001
def test_river_check_estimator(params: dict) -> None:
    checks.check_estimator(URKRegressor(**params))


def test_river_regressor_with_a_fixed_kernel_is_the_bayesian_posterior() -> None:
    """learn_kernel off, no standardisation: after the syncs, the predictive is the posterior of Bayesian linear
    regression on the plain transcription of the features (σ, λ refitted on the sums by the server)."""
    rng = np.random.default_rng(3)
    X = rng.uniform(-1, 1, (64, 2))
    y = np.sin(3 * X[:, 0]) + 0.1 * rng.standard_normal(64)
    model = URKRegressor(widths=None, n_omega=8, learn_kernel=False, standardise=False, sync_every=32)
    for xi, yi in zip(X, y, strict=True):
        model.learn_one({"zeta": xi[1], "alpha": xi[0]}, yi)  # sorted keys: alpha, zeta
    assert model.client is not None and model.server is not None and model.client.n_pending == 0
    w = model.client.weights
    Phi = np.stack([reorder(oracle_features(x, [], [], np.exp(w.arrays["log_ls"]), model.client.omega)) for x in X])
    sig, lam = model.server.sigma, model.server.lam
    A = Phi.T @ Phi / sig**2 + np.eye(16) / lam**2
    phi = reorder(oracle_features(np.array([0.2, -0.3]), [], [], np.exp(w.arrays["log_ls"]), model.client.omega))
    mean, var = phi @ np.linalg.solve(A, Phi.T @ y) / sig**2, sig**2 + phi @ np.linalg.solve(A, phi)
    dist = model.predict_one({"alpha": 0.2, "zeta": -0.3, "unknown": 5.0}, with_dist=True)
    assert dist.mu == pytest.approx(mean, abs=1e-9) and dist.sigma == pytest.approx(math.sqrt(var), abs=1e-9)


def test_fixed_kernel_through_two_shards_and_a_reducer_equals_the_replay() -> None:
    """Statistics split across shards sum exactly (a resent update included): the reducer's global equals the
    replay's single aggregation."""
    from streamfed.fleet.agent import AgentCore
    from streamfed.fleet.sharding import ReducerCore, ShardCore
    from streamfed.fleet.sources import Reading

    fleet = synthetic_fleet(3, 60, 2, seed=13)
    names = [f"c{i}" for i in range(len(fleet))]
    params = {"learn_kernel": False, "fit_hyperparameters": False}
    cfg = fleet_cfg("urk-shards", fleet.n_inputs, **params)
    acfg = AlgorithmConfig(n_kernels=1, n_features=8, params={URK: {**FLEET_PARAMS, **params}})
    _, arr = replay_keeping_arrangement(fleet, URK, acfg, seed=3)
    ref = arr.global_message(arr.aggregations[0])
    shards = [ShardCore(cfg, f"s{i}", clients=names, mode="async") for i in range(2)]
    reducer = ReducerCore(cfg, clients=names, mode="async", window=3600.0)
    for i, s in enumerate(fleet.streams):
        core = AgentCore(cfg, names[i], i)
        for t in range(len(s.y)):
            _, msgs = core.on_reading(Reading(f"r{t}", s.X[t], float(t), float(s.y[t])), now=0.0)
            for m in msgs:
                shards[m.seq % 2].on_update(names[i], encode(m), now=0.0)
                if m.seq == 1:
                    shards[(m.seq + 1) % 2].on_update(names[i], encode(m), now=0.0)
    queue = [(sh, p) for sh in shards for p in sh.flush(now=0.0)]
    while queue:
        sh, p = queue.pop(0)
        for out in reducer.on_partial(sh.name, encode(p), now=0.0):
            queue += [(sh, q) for q in sh.on_ack(out, now=0.0)]
    assert [m.kind for m in reducer.tick(now=1e9)] == ["urk.global"]
    g = reducer.global_message()
    assert g.included == ref.included == {n: 6 for n in names}
    for k in ("S_upper", "b", "n", "q", "theta"):
        assert rel_diff(g.arrays[k], ref.arrays[k]) <= 1e-12


def test_a_server_never_publishes_a_non_finite_value() -> None:
    """A fixed σ so small that σ⁻² overflows makes the evidence non-finite: the global carries σ, λ as they were
    and no evidence (0), never an inf or a NaN (the codec would refuse to publish it)."""
    w0, om = initial_weights(ARCH, 0), omega(ARCH, 0)
    server = URKServer(w0, om, "v", min_samples=1, fit=False)
    server.sigma = 1e-200  # σ⁻² overflows: the evidence is not finite
    st = SufficientStats(np.zeros((1, ARCH.dim, ARCH.dim)), np.zeros((1, ARCH.dim)), 3.0, 5.0, "v", 0)
    server.apply(StatsItem("a", 1, 0, 0, st))
    g = server.publish()
    assert math.isfinite(g.log_evidence) and g.sigma == 1e-200 and server.failed_fits == 1
