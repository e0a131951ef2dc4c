"""The hierarchical evidence's per-client spectra, cached by content (issue 29): a lookup returns the
decomposition of exactly the statistics asked about, and a fit through the cache equals a fit without it."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as hs

from streamfed.algorithms.fedbnr_personal import evidence
from streamfed.algorithms.fedbnr_personal.evidence import client_spectrum, fit_hierarchical, hierarchical_log_evidence
from streamfed.core.stats import SufficientStats


def _fleet(seed: int, k: int = 4, f: int = 6, n: int = 40) -> list[SufficientStats]:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(f)
    out = []
    for _ in range(k):
        phi = rng.standard_normal((n, f))
        out.append(SufficientStats.from_samples(phi, phi @ (w + 0.3 * rng.standard_normal(f))
                                                + 0.1 * rng.standard_normal(n)))
    return out


@settings(max_examples=25, deadline=None)
@given(seed=hs.integers(0, 2**16), i=hs.integers(0, 5), j=hs.integers(0, 5), delta=hs.sampled_from([1e-12, 1e-3, 5.0]))
def test_a_changed_statistic_is_never_answered_from_the_cache(seed: int, i: int, j: int, delta: float) -> None:
    st = _fleet(seed, k=1)[0]
    client_spectrum(st)  # cached
    changed = st.copy()
    changed.S[i, j] += delta
    changed.S[j, i] += delta if i != j else 0.0
    e, u, z = client_spectrum(changed)
    e_ref, u_ref = np.linalg.eigh(0.5 * (changed.S + changed.S.T))
    assert np.array_equal(e, np.clip(e_ref, 0.0, None)) and np.array_equal(u, u_ref)
    assert np.array_equal(z, u_ref.T @ changed.b)
    b_changed = st.copy()
    b_changed.b[i] += delta
    assert np.array_equal(client_spectrum(b_changed)[2], client_spectrum(st)[1].T @ b_changed.b)


def test_a_fit_through_the_cache_equals_a_fit_from_scratch() -> None:
    stats = _fleet(3)
    evidence._SPECTRA_CACHE.clear()
    cold = fit_hierarchical(stats)
    warm = fit_hierarchical([st.copy() for st in stats])  # every spectrum from the cache
    assert cold == warm
    # the chain of a fleet: one client's statistics grow, the others are looked up
    grown = [stats[0] + _fleet(9, k=1)[0], *stats[1:]]
    evidence._SPECTRA_CACHE.clear()
    fresh = fit_hierarchical(grown, start=cold[:3])
    fit_hierarchical(stats, start=cold[:3])
    assert fit_hierarchical(grown, start=cold[:3]) == fresh


def test_the_evidence_by_rank_update_matches_the_direct_evidence() -> None:
    stats = _fleet(5, k=5, f=9)
    for s, lam, tau in ((0.3, 1.5, 0.2), (1.0, 0.1, 2.0), (0.05, 3.0, 1e-3)):
        direct = hierarchical_log_evidence(stats, s, lam, tau)[0]
        spectral = evidence._Spectra(stats).log_evidence(math.log(s), math.log(lam), math.log(tau))
        assert math.isclose(spectral, direct, rel_tol=1e-10)
