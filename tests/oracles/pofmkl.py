"""Plain NumPy transcription of POF-MKL, equations (6)-(10) of the paper as restated in
docs/algorithms.md §3. Deliberately naive: no log domain, no buffers, no numba — obviously
correct by reading, and independent of the optimised code (its own features from np.sin/np.cos).

The weights are kept as logarithms, as docs/algorithms.md asks: the plain products w·exp(-ηℓ) underflow
to exactly 0 for two different kernels, which then tie in the sort while their true weights differ.
Sorting by log w and w̄ = exp(log w - max) / Σ is the same algorithm written without that failure.
"""

import numpy as np


def rff(frequencies: np.ndarray, x: np.ndarray) -> np.ndarray:
    """z_p(x) = D^{-1/2} [sin(V_p x), cos(V_p x)] for every kernel p → (N, 2D)."""
    n, d_feat, _ = frequencies.shape
    out = np.zeros((n, 2 * d_feat))
    for p in range(n):
        a = frequencies[p] @ x
        out[p] = np.concatenate([np.sin(a), np.cos(a)]) / np.sqrt(d_feat)
    return out


class OracleClient:
    def __init__(self, frequencies, eta, lam, xi, m):
        self.V = frequencies
        self.N = frequencies.shape[0]
        self.eta, self.lam, self.xi, self.M = eta, lam, xi, m
        self.logw = np.zeros(self.N)  # w_{c,p} initialised to 1
        self.L = 0.0  # Σ (ŷ - y)²
        self.Lp = np.zeros(self.N)  # Σ (f_p - y)²

    def step(self, theta, x, y, u):
        z = rff(self.V, x)
        f = np.einsum("pi,pi->p", theta, z)  # f_p = θ_pᵀ z_p(x)
        wbar = np.exp(self.logw - self.logw.max())
        wbar = wbar / wbar.sum()
        yhat = wbar @ f  # eq. (6)

        # eq. (8): sort by weight (decreasing), bins of M, PMF q, draw J with the uniform u
        # (with ξ = 1 every bin has probability 1/B whatever its content, so, as docs/algorithms.md says,
        # no sort is needed: bins then follow kernel index order)
        if self.xi < 1:
            order = sorted(range(self.N), key=lambda p: (-self.logw[p], p))
        else:
            order = list(range(self.N))
        B = int(np.ceil(self.N / self.M))
        bins = [order[j * self.M:(j + 1) * self.M] for j in range(B)]
        q = np.array([(1 - self.xi) * sum(wbar[p] for p in b) + self.xi / B for b in bins])
        J = next((j for j in range(B) if u < q[: j + 1].sum()), None)
        if J is None:
            J = max(j for j in range(B) if q[j] > 0)
        selected, qJ = bins[J], q[J]

        # eq. (7): ℓ_p = (f_p - y)² + λ‖θ_p‖², w_p ← w_p exp(-η ℓ_p), i.e. log w_p ← log w_p - η ℓ_p
        loss = (f - y) ** 2 + self.lam * np.einsum("pi,pi->p", theta, theta)
        self.logw = self.logw - self.eta * loss

        # eq. (9): Δ_p = (η/q_J)(2(f_p - y) z_p + 2λθ_p) for p in the selected bin, with the step η/q_J
        # capped at 1/2 (docs/algorithms.md §3.5, "step cap": with ‖z‖ = 1 a step of 1/2 fits the sample exactly)
        step = min(self.eta / qJ, 0.5)
        deltas = {p: step * (2 * (f[p] - y) * z[p] + 2 * self.lam * theta[p]) for p in selected}

        self.wbar = np.exp(self.logw - self.logw.max()) / np.exp(self.logw - self.logw.max()).sum()
        self.L += (yhat - y) ** 2
        self.Lp += (f - y) ** 2
        return yhat, deltas


def oracle_server_update(theta, all_deltas):
    """eq. (10): θ_p ← θ_p - (1/|C_t|) Σ_{c, p∈S_c} Δ_{c,p}."""
    new = theta.copy()
    total = np.zeros_like(theta)
    for deltas in all_deltas:
        for p, d in deltas.items():
            total[p] += d
    new -= total / len(all_deltas)
    return new
