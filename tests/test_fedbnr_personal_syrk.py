"""The hierarchical evidence evaluated by a symmetric rank update (issue 29) against the direct transcription."""

from __future__ import annotations

import math

import numpy as np

from streamfed.algorithms.fedbnr_personal import evidence
from streamfed.algorithms.fedbnr_personal.evidence import hierarchical_log_evidence
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


def test_the_evidence_by_rank_update_matches_the_direct_evidence() -> None:
    stats = _fleet(5, k=5, f=9)
    for s, lam, tau in ((0.3, 1.5, 0.2), (1.0, 0.1, 2.0), (0.05, 3.0, 1e-3)):
        direct = hierarchical_log_evidence(stats, s, lam, tau)[0]
        spectral = evidence._Spectra(stats).log_evidence(math.log(s), math.log(lam), math.log(tau))
        assert math.isclose(spectral, direct, rel_tol=1e-10)
