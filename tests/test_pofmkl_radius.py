"""POF-MKL's declared bound from the configuration alone (issue 30 part 1): θ is projected onto `‖θ_p‖ ≤ R`, the
per-step bound uses `R`, and a lock-step upload is one step — so nothing an attacker sends can raise the bound.
Checked against the attack that broke the old bound (rows just under it, claiming every step, window after window:
the bound grew with the θ it let the attacker publish)."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from streamfed.algorithms.pofmkl import POFMKLParams
from streamfed.algorithms.pofmkl.aggregation import POFMKLAggregation, StepBound
from streamfed.algorithms.pofmkl.server import POFMKLServer, project_rows
from streamfed.algorithms.pofmkl.wire import update_message
from streamfed.algorithms.robust_mean import row_norms

N, DIM = 4, 6


def _bound(radius: float) -> StepBound:
    return StepBound.of(eta=0.005, lam=1e-4, xi=0.1, n_kernels=N, bin_size=1, label_bound=10.0, radius=radius)


def _send(agg: POFMKLAggregation, client: str, seq: int, kernels: list[int], rows: np.ndarray, n: int) -> bool:
    msg = update_message("f", client, seq, np.array(kernels), rows, global_version=agg.version,
                         kernel_version="k", n_samples=n)
    try:
        item = agg.check(msg)
    except ValueError:
        return False
    agg.take(client, seq, item)
    return True


def _grow(agg: POFMKLAggregation, windows: int) -> list[float]:
    """The growing-rows attacker alone in its windows: each upload claims `n` steps and sends every kernel's row at
    just under `n ×` the per-step bound at the radius the aggregation assumes, pointing along θ_p (so θ_p grows)."""
    peak = []
    for w in range(windows):
        n = 50
        per_step = agg.bound.per_step(agg.radius) * n * (1 - 1e-9)
        theta = agg.server.theta
        direction = np.where(row_norms(theta)[:, None] > 0, -theta, -np.ones_like(theta))
        rows = direction / row_norms(direction)[:, None] * per_step[:, None]
        assert _send(agg, "attacker", w + 1, list(range(N)), rows, n)
        agg.close_window({"attacker": 0}, lambda c: 0)
        peak.append(float(row_norms(agg.server.theta).max()))
    return peak


def test_the_projection_is_onto_the_ball_and_leaves_inner_rows_alone() -> None:
    """Against the definition: argmin over the ball of ‖v − θ_p‖ is θ_p·R/‖θ_p‖ outside it, θ_p inside."""
    rng = np.random.default_rng(3)
    theta = rng.normal(size=(20, 5)) * rng.choice([0.1, 10.0], size=(20, 1))
    want = [t if np.linalg.norm(t) <= 2.0 else t * 2.0 / np.linalg.norm(t) for t in theta]
    project_rows(theta, 2.0)
    np.testing.assert_allclose(theta, np.array(want), rtol=1e-15)


def test_growing_rows_stay_within_the_configured_radius() -> None:
    agg = POFMKLAggregation(N, DIM, bound=_bound(50.0))
    peak = _grow(agg, 200)
    assert max(peak) <= 50.0 * (1 + 1e-12)
    assert peak[-1] >= 49.0  # the attack reaches the radius: the bound is what it says, not more


def test_without_a_radius_the_same_attack_grows_without_bound() -> None:
    """The pre-fix bound (radius = largest ‖θ_p‖ ever published): the same attacker multiplies θ window after
    window — what the projection removes (this is the test that fails if the radius is ignored)."""
    agg = POFMKLAggregation(N, DIM, bound=_bound(math.inf))
    peak = _grow(agg, 40)
    assert peak[-1] > 1e12 * peak[0]  # measured: 200 after the first window, 7.8e53 after 40


def test_a_lockstep_upload_is_one_step_whatever_it_claims() -> None:
    agg = POFMKLAggregation(N, DIM, bound=_bound(50.0))
    agg.lockstep = True
    one_step = float(agg.bound.per_step(agg.radius[:1])[0])
    assert _send(agg, "a", 1, [0], np.full((1, DIM), 0.99 * one_step / math.sqrt(DIM)), n=1000)
    assert not _send(agg, "b", 1, [0], np.full((1, DIM), 1.5 * one_step / math.sqrt(DIM)), n=1000)


def test_the_default_radius_is_the_regularised_comparators_bound() -> None:
    """‖θ*‖ ≤ B/√λ for θ* = argmin Σ_t (θᵀz_t − y_t)² + Tλ‖θ‖² with |y_t| ≤ B: θ* beats θ = 0, so Tλ‖θ*‖² ≤ T·B².
    Checked on random problems by solving the ridge problem directly."""
    rng = np.random.default_rng(0)
    for _ in range(50):
        t, d, lam, b = int(rng.integers(1, 60)), int(rng.integers(1, 8)), 10 ** rng.uniform(-6, 0), 3.0
        z = rng.normal(size=(t, d))
        z /= np.linalg.norm(z, axis=1, keepdims=True)
        y = rng.uniform(-b, b, size=t)
        theta = np.linalg.solve(z.T @ z + t * lam * np.eye(d), z.T @ y)
        assert np.linalg.norm(theta) <= POFMKLParams(lam=lam).radius(b) * (1 + 1e-9)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(1, 20), st.floats(0.0, 1.0), st.integers(0, 2**31)),
                min_size=1, max_size=40))
def test_any_in_bound_updates_keep_the_global_within_the_radius(uploads: list) -> None:
    """Fuzz: clients send any rows the declared bound accepts (any claimed steps, any direction); after every
    window the global is finite and within the radius, and its predictions within R (‖z_p‖ = 1)."""
    radius = 20.0
    agg = POFMKLAggregation(N, DIM, bound=_bound(radius))
    seqs: dict[str, int] = {}
    for client_no, n, frac, seed in uploads:
        c = f"c{client_no}"
        seqs[c] = seqs.get(c, 0) + 1
        rng = np.random.default_rng(seed)
        kernels = sorted(rng.choice(N, size=int(rng.integers(1, N + 1)), replace=False).tolist())
        rows = rng.normal(size=(len(kernels), DIM))
        limit = agg.bound.per_step(agg.radius[kernels]) * n * frac
        rows *= (limit / np.maximum(row_norms(rows), 1e-300))[:, None]
        _send(agg, c, seqs[c], kernels, rows, n)
        agg.close_window({k: i for i, k in enumerate(sorted(seqs))}, lambda c: 0)
        norms = row_norms(agg.server.theta)
        assert np.all(np.isfinite(norms)) and norms.max() <= radius * (1 + 1e-12)


def test_an_honest_server_never_meets_the_default_ball() -> None:
    """The projection changes nothing an honest fleet does: a server at the default radius applies the same
    rounds as one without a radius, bit for bit (honest θ stays far inside B/√λ)."""
    rng = np.random.default_rng(1)
    a, b = POFMKLServer(N, DIM), POFMKLServer(N, DIM, radius=POFMKLParams().radius(10.0))
    from streamfed.algorithms.pofmkl.messages import KernelUpdate

    for _ in range(300):
        ups = [KernelUpdate(np.array([int(rng.integers(N))]), rng.normal(size=(1, DIM)) * 0.05) for _ in range(3)]
        a.apply_round(ups)
        b.apply_round(ups)
    assert np.array_equal(a.theta, b.theta)
