"""FedBNR's per-sample forgetting path (`FedBNRClient.advance` with `half_life_s`): rows staged with weights relative
to a reference time, rebased as the clock moves on (docs/algorithms.md §4.14).

The transcription, written here directly with numpy and nothing of the client's but its feature map: a row learned
while the clock read `c_i` weighs `2^(−(T − c_i)/h)` in the pending statistics at clock `T` (each upload carries the
rows learned since the last one, discounted to the upload's clock); the working posterior (one kernel, no global)
is `A = σ⁻² S_w + λ⁻² diag(p)`, `m = σ⁻² A⁻¹ b_w`, where at each clock step by `g = 2^(−Δ/h)` the statistics
`S_w, b_w` and the prior diagonal `p` decay by `g` and `F(1 − g)` is given back on coordinate `j` (then `j + 1 mod
F`), or, when `g < 10⁻⁶`, `p` is reset to ones (what the client documents). Predictions are made after the clock
moved and before the row is learned. The times span more than 1,100 half-lives, with gaps that force the reference
time to be rebased many times.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamfed.algorithms.fedbnr.client import FedBNRClient

H = 600.0  # half-life, seconds
SIGMA, LAM = 0.4, 1.3


def _times(rng: np.random.Generator, n: int) -> np.ndarray:
    """Irregular times: mostly a fraction of a half-life apart, sometimes 5–60 half-lives (rebases and the
    nearly-everything-forgotten path), sometimes equal or earlier than the clock (counted as the clock)."""
    steps = rng.exponential(0.3 * H, n)
    jumps = rng.random(n)
    steps[jumps < 0.04] = rng.uniform(5 * H, 60 * H, int((jumps < 0.04).sum()))
    steps[jumps > 0.97] = -rng.uniform(0, H, int((jumps > 0.97).sum()))  # back in time: the clock holds
    steps[0] = 0.0
    return 1.7e9 + np.cumsum(steps)


def _run(seed: int, n: int, batch_every: int = 0, kernels: int = 1) -> tuple[list, list, list, list]:
    rng = np.random.default_rng(seed)
    bw = 1.0 if kernels == 1 else list(np.geomspace(0.5, 2.0, kernels))
    c = FedBNRClient(n_inputs=2, n_features=5, bandwidth=bw, seed=seed, sigma=SIGMA, lam=LAM, min_upload=23,
                     half_life_s=H)
    ts = _times(rng, n)
    xs = rng.uniform(-2, 2, (n, 2))
    ys = np.sin(xs[:, 0]) + 0.2 * rng.standard_normal(n)
    phis = np.array([c.features(x) for x in xs])  # (n, K, F): the map, not the statistics under test
    preds, clocks, uploads, upload_rows = [], [], [], []
    first_pending = 0
    for i in range(n):
        c.advance(ts[i])
        clocks.append(c.clock)
        if batch_every and i % batch_every == 0:
            m, v = c.learn_many(xs[i:i + 1], ys[i:i + 1])
            preds.append((m[0], v[0]))
        else:
            preds.append(c.learn_predict(xs[i], float(ys[i])))
        up = c.make_upload()
        if up is not None:
            uploads.append(up)
            upload_rows.append((first_pending, i + 1))
            first_pending = i + 1
    return preds, clocks, uploads, [(phis, ys, upload_rows)]


def _discounted(phis: np.ndarray, ys: np.ndarray, clocks: np.ndarray, t: float) -> tuple:
    w = np.exp2(-(t - clocks) / H)
    return (np.einsum("i,ika,ikb->kab", w, phis, phis),
            np.einsum("i,ika,i->ka", w, phis, ys), w.sum(), w @ (ys * ys))


def _close(a: np.ndarray, b: np.ndarray, rtol: float) -> bool:
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    return bool(np.max(np.abs(a - b)) <= rtol * max(np.max(np.abs(b)), 1e-300))


@pytest.mark.parametrize("seed,batch_every,kernels", [(0, 0, 1), (1, 5, 3), (2, 0, 2)])
def test_uploads_are_the_transcribed_discounted_statistics(seed: int, batch_every: int, kernels: int) -> None:
    n = 1000
    _, clocks, uploads, [(phis, ys, rows)] = _run(seed, n, batch_every, kernels)
    clocks = np.array(clocks)
    assert (clocks[-1] - clocks[0]) / H > 1100  # the span the reference time is rebased over
    assert len(uploads) >= 30
    for up, (a, b) in zip(uploads, rows, strict=True):
        s, bb, nn, q = _discounted(phis[a:b], ys[a:b], clocks[a:b], up.time)
        assert up.time == clocks[b - 1]
        assert _close(up.stats.S, s, 1e-12)
        assert _close(up.stats.b, bb, 1e-12)
        assert abs(up.stats.n - nn) <= 1e-12 * nn
        assert abs(up.stats.q - q) <= 1e-12 * q
        assert up.n_samples == b - a


def test_predictions_are_the_transcribed_discounted_posterior() -> None:
    n = 1000
    preds, clocks, _, [(phis, ys, _)] = _run(3, n)
    f = phis.shape[2]
    s_w, b_w, p, j = np.zeros((f, f)), np.zeros(f), np.ones(f), 0
    clock = -np.inf
    worst = 0.0
    for i in range(n):
        t = clocks[i]
        if t > clock and np.isfinite(clock):
            g = float(np.exp2(-(t - clock) / H))
            if g != 1.0:
                s_w *= g
                b_w *= g
                if g < 1e-6:
                    p = np.ones(f)
                else:
                    p *= g
                    p[j] += f * (1.0 - g)
                    j = (j + 1) % f
        clock = t
        a_mat = s_w / SIGMA**2 + np.diag(p) / LAM**2
        phi = phis[i, 0]
        mean = phi @ np.linalg.solve(a_mat, b_w) / SIGMA**2
        var = SIGMA**2 + phi @ np.linalg.solve(a_mat, phi)
        err = max(abs(preds[i][0] - mean) / max(abs(mean), 1e-3), abs(preds[i][1] - var) / var)
        # (the prior precision of coordinates not refreshed across a long step decays to ~2^-20: a solve's rounding
        # grows with the condition number, so the error is measured in units of cond(A)·1e-15)
        worst = max(worst, err / (1e-15 * np.linalg.cond(a_mat)))
        s_w += np.outer(phi, phi)
        b_w += phi * ys[i]
    assert worst < 100, worst


def test_the_deferred_scale_is_applied_when_the_statistics_are_read() -> None:
    # Two rows one half-life apart, uploaded one and five half-lives after the second: weights 1/2 + 1 at the
    # second row's clock, times 2^-1 and 2^-5 later. The staged weights are relative to a reference time tens of
    # half-lives ahead of the clock; forgetting to scale them back (or to rescale at a rebase) is off by 2^k.
    c = FedBNRClient(n_inputs=1, n_features=2, bandwidth=1.0, sigma=1.0, lam=1.0, min_upload=2, half_life_s=H)
    x = np.array([0.3])
    phi = c.features(x)[0]
    for t in (0.0, H):
        c.advance(t)
        c.learn_predict(x, 2.0)
    c.advance(2 * H)
    up = c.make_upload()
    assert up is not None
    assert up.stats.n == pytest.approx(0.75, rel=1e-14)
    assert up.stats.q == pytest.approx(3.0, rel=1e-14)
    assert np.allclose(up.stats.S[0], 0.75 * np.outer(phi, phi), rtol=1e-14, atol=0)
    for t in (100 * H, 101 * H):  # past several rebases
        c.advance(t)
        c.learn_predict(x, 2.0)
    c.advance(106 * H)
    up = c.make_upload()
    assert up is not None
    assert up.stats.n == pytest.approx(2.0**-6 + 2.0**-5, rel=1e-14)
    assert up.stats.b[0] == pytest.approx((2.0**-6 + 2.0**-5) * 2.0 * phi, rel=1e-14)
    # A rebase (the reference was 32 half-lives ahead) with rows learned before it, both folded (the stage holds 32)
    # and still staged.
    for t in [130 * H] * 33 + [134 * H]:
        c.advance(t)
        c.learn_predict(x, 2.0)
    c.advance(135 * H)
    up = c.make_upload()
    assert up is not None
    assert up.stats.n == pytest.approx(33 * 2.0**-5 + 2.0**-1, rel=1e-14)
    assert np.allclose(up.stats.S[0], (33 * 2.0**-5 + 2.0**-1) * np.outer(phi, phi), rtol=1e-14, atol=0)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(min_value=-3.0, max_value=80.0), min_size=2, max_size=60))
def test_discounted_count_is_the_sum_of_the_weights(steps: list[float]) -> None:
    """Property: whatever the clock's steps (in half-lives, some back in time), the uploaded count is
    `Σ_i 2^(−(T − c_i)/h)` over the rows' clocks."""
    c = FedBNRClient(n_inputs=1, n_features=2, bandwidth=1.0, min_upload=1, half_life_s=H)
    t, clock, clocks = 0.0, -np.inf, []
    for s in steps:
        t += s * H
        c.advance(t)
        clock = max(clock, t)
        clocks.append(clock)
        c.learn_predict(np.array([0.1]), 1.0)
    up = c.make_upload()
    assert up is not None and up.time == clock
    expected = float(np.exp2(-(clock - np.array(clocks)) / H).sum())
    assert up.stats.n == pytest.approx(expected, rel=1e-12)
    assert up.stats.q == pytest.approx(expected, rel=1e-12)


def test_a_client_saved_with_the_earlier_pending_layout_continues_exactly() -> None:
    """A state pickled before the weighted stage held the pending statistics discounted to the clock (`_dpend`)
    and the raw ones at the last advance (`_plast`), with the rows learned since still staged; restored, it must
    upload the transcribed discounted statistics of all its rows."""
    rng = np.random.default_rng(7)
    n, h = 60, H
    c = FedBNRClient(n_inputs=2, n_features=5, bandwidth=1.0, seed=1, sigma=SIGMA, lam=LAM, min_upload=1000,
                     half_life_s=h)
    ts = 1.7e9 + np.cumsum(rng.exponential(0.4 * h, n))
    xs = rng.uniform(-2, 2, (n, 2))
    ys = rng.standard_normal(n)
    phis = np.array([c.features(x) for x in xs])
    for i in range(40):
        c.advance(ts[i])
        c.learn_predict(xs[i], float(ys[i]))
    # The earlier layout, written from the transcription: rows 0..38 flushed and discounted to the clock, row 39
    # (learned at the clock) still staged, `_plast` the raw statistics of rows 0..38.
    state = c.__getstate__()
    s, b, nn, q = _discounted(phis[:39], ys[:39], np.array(ts[:39]), ts[39])
    dpend = c._zero_stats()
    dpend.S[...], dpend.b[...], dpend.n, dpend.q = s, b, nn, q
    plast = c._zero_stats()
    plast.S[...] = np.einsum("ika,ikb->kab", phis[:39], phis[:39])
    plast.b[...] = np.einsum("ika,i->ka", phis[:39], ys[:39])
    plast.n, plast.q = 39.0, float(ys[:39] @ ys[:39])
    buf = state["_buf"].copy()
    state["_buf"] = buf
    old = FedBNRClient.__new__(FedBNRClient)
    old.__setstate__(state)
    old._s_pend[...] = plast.S  # the raw scatter of the flushed rows, the stage holding row 39 alone
    old._b_pend[...] = plast.b
    old._stage[:, :, 0] = phis[39]
    old._stage_y[0] = ys[39]
    old._staged = 1
    # (that layout kept the upper triangles only exact: stale lower ones must not be read)
    lower = np.tril(np.full_like(s, 1e3), -1)
    for mat in (dpend.S, plast.S, old._s_pend):
        mat += lower
    state = old.__getstate__()
    for attr in ("_wpend", "_stage_w", "_t_ref", "_stage_mark"):
        state.pop(attr, None)
    state["_dpend"], state["_plast"] = dpend, plast
    restored = FedBNRClient.__new__(FedBNRClient)
    restored.__setstate__(state)
    for i in range(40, n):
        restored.advance(ts[i])
        restored.learn_predict(xs[i], float(ys[i]))
    restored.min_upload = 1
    up = restored.make_upload()
    assert up is not None
    s, b, nn, q = _discounted(phis, ys, np.maximum.accumulate(ts), ts[-1])
    assert _close(up.stats.S, s, 1e-12)
    assert _close(up.stats.b, b, 1e-12)
    assert abs(up.stats.n - nn) <= 1e-12 * nn and abs(up.stats.q - q) <= 1e-12 * q
