"""A synthetic non-i.i.d. fleet for tests and quick experiments."""

from __future__ import annotations

import numpy as np

from streamfed.evaluation.datasets.base import ClientStream, Fleet


def synthetic_fleet(n_clients: int, n_steps: int, n_inputs: int, seed: int, noise: float = 0.1,
                    heterogeneity: float = 0.5, n_basis: int = 6) -> Fleet:
    """Clients whose targets are different mixtures of the same smooth functions of `x`.

    The shared basis has `n_basis` functions: Gaussian bumps `exp(-‖x - μ_k‖²/(2 s_k²))` alternating
    with ridge waves `sin(ω_k·x + b_k)`. Client `c` uses the weights `(1 - h) w + h u_c` (`h` =
    `heterogeneity` in `[0, 1]`; `w` shared, `u_c` its own, both standard normal), and draws its
    inputs uniformly from `[-1, 1]^d` shifted by `h · m_c`, `m_c ~ U[-0.5, 0.5]^d` — so `h = 0` gives
    i.i.d. clients and `h = 1` unrelated functions on shifted inputs. `y = f_c(x) + noise · N(0, 1)`.

    Deterministic for a seed; every client and every random stream has its own child of
    `SeedSequence(seed)`, so client `c`'s stream does not depend on `n_clients`, and a shorter
    `n_steps` gives a prefix of a longer one. Returned raw (`normalisation="none"`); see
    :func:`streamfed.evaluation.datasets.normalise`.

    >>> f = synthetic_fleet(3, 100, 2, seed=1)
    >>> f.names, f[0].X.shape
    (('client-0', 'client-1', 'client-2'), (100, 2))
    >>> bool(np.array_equal(f[1].y, synthetic_fleet(2, 100, 2, seed=1)[1].y))
    True
    """
    if n_clients < 1 or n_steps < 0 or n_inputs < 1 or n_basis < 1:
        raise ValueError("need n_clients >= 1, n_steps >= 0, n_inputs >= 1 and n_basis >= 1")
    if not 0.0 <= heterogeneity <= 1.0:
        raise ValueError(f"heterogeneity must be in [0, 1], got {heterogeneity}")
    if noise < 0:
        raise ValueError(f"noise must be >= 0, got {noise}")
    shared_ss, clients_ss = np.random.SeedSequence(seed).spawn(2)
    rng = np.random.default_rng(shared_ss)
    d = n_inputs
    centres = rng.uniform(-1.0, 1.0, size=(n_basis, d))
    # widths grow like sqrt(d) so that bumps stay wide relative to typical distances in [-1, 1]^d
    widths = rng.uniform(0.3, 0.8, size=n_basis) * np.sqrt(d)
    omegas = rng.normal(0.0, 1.5 / np.sqrt(d), size=(n_basis, d))
    phases = rng.uniform(0.0, 2.0 * np.pi, size=n_basis)
    w_shared = rng.standard_normal(n_basis)

    def target(x: np.ndarray, w: np.ndarray) -> np.ndarray:
        # explicit loops of elementwise operations rather than matrix products: BLAS may round
        # differently for different lengths, which would break the prefix property
        f = np.zeros(x.shape[0])
        for k in range(n_basis):
            acc = np.zeros(x.shape[0]) if k % 2 == 0 else np.full(x.shape[0], phases[k])
            for j in range(d):
                acc += (x[:, j] - centres[k, j]) ** 2 if k % 2 == 0 else x[:, j] * omegas[k, j]
            f += w[k] * (np.exp(-acc / (2.0 * widths[k] ** 2)) if k % 2 == 0 else np.sin(acc))
        return f

    h = float(heterogeneity)
    names = tuple(f"x{j}" for j in range(d))
    streams = []
    for c, css in enumerate(clients_ss.spawn(n_clients)):
        params_ss, x_ss, noise_ss = css.spawn(3)
        prng = np.random.default_rng(params_ss)
        w = (1.0 - h) * w_shared + h * prng.standard_normal(n_basis)
        shift = h * prng.uniform(-0.5, 0.5, size=d)
        X = np.random.default_rng(x_ss).uniform(-1.0, 1.0, size=(n_steps, d)) + shift
        y = target(X, w) + noise * np.random.default_rng(noise_ss).standard_normal(n_steps)
        streams.append(ClientStream(f"client-{c}", X, y, names))
    return Fleet(tuple(streams), dataset="synthetic", normalisation="none", split="synthetic", seed=seed,
                 target="y", scaling={"method": "none", "noise": float(noise), "heterogeneity": h})
