"""How a client refines its factor (docs/algorithms.md, "PVI"): the settings :func:`.refine.refine` reads,
kept apart from it so that reading a configuration and building a learner need no torch."""

from __future__ import annotations

from dataclasses import dataclass

from streamfed.core.durable import durable

__all__ = ["RefineSettings"]


@durable("pvi.RefineSettings")
@dataclass(frozen=True)
class RefineSettings:
    """How a client refines: likelihood, parameterisation (``dpo`` / ``cpo``), `M_k`, Adam steps and
    rate, Monte Carlo draws of `φ` per step, `α`, jitter, Gauss–Hermite points.

    >>> RefineSettings(n_pseudo=8).parameterisation
    'dpo'
    """

    likelihood: str = "gaussian"
    parameterisation: str = "dpo"
    n_pseudo: int = 32
    steps: int = 50
    learning_rate: float = 0.01
    n_samples: int = 1
    alpha: float = 0.1
    jitter: float = 1e-6
    n_quadrature: int = 20
