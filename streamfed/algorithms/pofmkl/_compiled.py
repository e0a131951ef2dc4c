"""POF-MKL's compiled kernels (``_kernels.py``), registered with :func:`streamfed.core.compiled.register`:
their ahead-of-time build when there is one for these sources, else numba's JIT. The learner calls them
through :data:`kern`. No numba here: an agent on the build never loads it."""

from __future__ import annotations

from streamfed.core.compiled import Entry, register

__all__ = ["ENTRIES", "SOURCES", "kern"]

_K = "streamfed.algorithms.pofmkl._kernels"
ENTRIES: tuple[Entry, ...] = (
    Entry("pofmkl", _K, "pofmkl_step_packed", ("f8[2]", "f8[1]", "f8", "!f8[1]", "!i8[1]")),
    Entry("pofmkl", _K, "pofmkl_predict",
          ("f8[2]", "f8[1]", "f8[2]", "f8[1]", "!f8[1]", "!f8[1]", "!f8[1]", "!f8[1]", "f8")),
    Entry("pofmkl", _K, "accumulate_checked", ("!f8[2]", "i8[1]", "f8[2]")),
    Entry("pofmkl", _K, "row_sq_norms", ("f8[2]", "!f8[1]")),
)
# what the build is made from: the kernels and what they import (paths under the streamfed package)
SOURCES = ("algorithms/pofmkl/_kernels.py", "algorithms/pofmkl/_layout.py", "core/_feature_kernels.py",
           "core/numerics.py")

kern = register("pofmkl", ENTRIES, SOURCES)
