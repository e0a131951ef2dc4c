"""The centralised Bayesian linear regression a FedBNR global must equal (docs/algorithms.md §4), by
numpy.linalg on all samples at once: no rank-one updates, no sufficient statistics kept between steps."""

import numpy as np


def assert_global_is_centralised(server, learner, streams) -> None:
    """`server`'s summed statistics (single kernel) are those of every sample of `streams` (features by
    `learner`'s map), and its posterior mean equals the centralised one at its own σ, λ."""
    phi = np.concatenate([learner.features_many(s.X) for s in streams]).reshape(sum(len(s.y) for s in streams), -1)
    y = np.concatenate([s.y for s in streams])
    st = server.stats
    assert st.n == len(y)  # every sample summed once
    np.testing.assert_allclose(st.S[0], phi.T @ phi, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(st.b[0], phi.T @ y, rtol=1e-10, atol=1e-10)
    sigma, lam = server.sigma[0], server.lam[0]
    prior = np.eye(phi.shape[1]) / lam**2
    m_central = np.linalg.solve(phi.T @ phi / sigma**2 + prior, phi.T @ y) / sigma**2
    m_global = np.linalg.solve(st.S[0] / sigma**2 + prior, st.b[0]) / sigma**2
    np.testing.assert_allclose(m_global, m_central, rtol=1e-8, atol=1e-10)
