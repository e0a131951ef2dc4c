"""FSGP's compiled kernels (``_kernels.py``), registered with :func:`streamfed.core.compiled.register`:
their ahead-of-time build when there is one for these sources, else numba's JIT. The client calls them
through :data:`kern`. No numba here: an agent on the build never loads it."""

from __future__ import annotations

from streamfed.core.compiled import Entry, register

__all__ = ["ENTRIES", "SOURCES", "kern"]

_K = "streamfed.algorithms.fsgp._kernels"
ENTRIES: tuple[Entry, ...] = (
    Entry("fsgp", _K, "covariance_column", ("f8[2]", "f8[1]", "f8", "i8", "f8[1]", "!f8[1]")),
    Entry("fsgp", _K, "step",
          ("f8[2]", "f8[1]", "f8[1]", "i8", "f8[1]", "f8", "f8[2]", "!f8[2]", "!f8[2]", "i8", "i8", "!f8[1]",
           "!f8[1]")),
)
# what the build is made from: the kernels and what they import (FedBNR's Cholesky helpers, and theirs)
SOURCES = ("algorithms/fsgp/_kernels.py", "algorithms/fedbnr/_kernels.py", "algorithms/fedbnr/_layout.py",
           "core/_feature_kernels.py", "core/numerics.py")

kern = register("fsgp", ENTRIES, SOURCES)
