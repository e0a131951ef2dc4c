"""Fixed share moved to :mod:`streamfed.algorithms.fixed_share` (FSGP uses it too: algorithms share it from
there, never across each other's packages); this path re-exports it."""

from streamfed.algorithms.fixed_share import FixedShare, gaussian_log_density, mixture_moments

__all__ = ["FixedShare", "gaussian_log_density", "mixture_moments"]
