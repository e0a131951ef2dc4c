"""Plain NumPy transcriptions of the POF-MKL paper's baselines (docs/algorithms.md §3.7).

Each function runs a whole lock-step fleet: at each t every client predicts and computes its
uploads with the θ of the previous round, then the server applies eq. (10)-style averaging.
"""

import numpy as np

from tests.oracles.pofmkl import rff


def _grads(V, theta, x, y, eta, lam):
    z = rff(V, x)
    f = np.einsum("pi,pi->p", theta, z)
    loss = (f - y) ** 2 + lam * np.einsum("pi,pi->p", theta, theta)
    delta = eta * (2 * (f - y)[:, None] * z + 2 * lam * theta)  # Δ_p = η(2(f_p - y) z_p + 2λθ_p)
    return f, loss, delta


def run_fleet(kind, V, xs, ys, eta, lam, draws=None):
    """kind: ofskl (V has one kernel), ofmkl-avg, vm-kofl, em-kofl. Returns (predictions (T, C), θ).

    em-kofl needs `draws`: the server's uniforms, first the initial kernel index, then one per round.
    """
    n_kernels, n_feat = V.shape[0], V.shape[1]
    theta = np.zeros((n_kernels, 2 * n_feat))
    L = np.zeros(n_kernels)  # Σ_c Σ_t ℓ_{c,p}: fleet cumulative regularised loss per kernel
    chosen = draws[0] if kind == "em-kofl" else None
    T, C = ys[0].size, len(ys)
    preds = np.zeros((T, C))
    for t in range(T):
        total = np.zeros_like(theta)
        loss_sum = np.zeros(n_kernels)
        for c in range(C):
            f, loss, delta = _grads(V, theta, xs[c][t], ys[c][t], eta, lam)
            if kind == "ofskl":
                preds[t, c] = f[0]
                total += delta
            elif kind == "ofmkl-avg":
                preds[t, c] = f.mean()
                total += delta
            elif kind == "vm-kofl":
                v = np.exp(-eta * (L - L.min()))
                preds[t, c] = (v / v.sum()) @ f
                total += delta
            else:  # em-kofl: predict with and update only the server-chosen kernel
                preds[t, c] = f[chosen]
                total[chosen] += delta[chosen]
            loss_sum += loss
        theta = theta - total / C
        L = L + loss_sum
        if kind == "em-kofl":
            v = np.exp(-eta * (L - L.min()))
            cdf = np.cumsum(v / v.sum())
            chosen = min(int(np.searchsorted(cdf, draws[t + 1], side="right")), n_kernels - 1)
    return preds, theta
