"""FedBNR's compiled kernels (``_kernels.py``), registered with :func:`streamfed.core.compiled.register`:
their ahead-of-time build when there is one for these sources, else numba's JIT. The learner calls them
through :data:`kern`. No numba here: an agent on the build never loads it."""

from __future__ import annotations

from streamfed.core.compiled import Entry, register

__all__ = ["ENTRIES", "SOURCES", "kern"]

_K = "streamfed.algorithms.fedbnr._kernels"
_C = "streamfed.algorithms.fedbnr._check_kernels"
ENTRIES: tuple[Entry, ...] = (
    Entry("fedbnr", _K, "all_finite", ("f8[1]",)),
    Entry("fedbnr", _K, "same_vector", ("f8[1]", "f8[1]")),
    Entry("fedbnr", _K, "solve_rt", ("f8[2]", "f8[1]", "!f8[1]", "i8")),
    Entry("fedbnr", _K, "log_evidence_from_factor", ("f8[2]", "f8", "f8", "f8")),
    Entry("fedbnr", _K, "predict_mixture", ("f8[3]", "f8[2]", "f8[1]", "f8[1]", "!f8[1]", "!f8[1]", "!f8[1]")),
    Entry("fedbnr", _K, "rff_bias_features", ("f8[2]", "f8[1]", "!f8[1]", "!f8[2]")),
    Entry("fedbnr", _K, "flush", ("!f8[3]", "!f8[2]", "f8[3]", "f8[1]", "i8")),
    Entry("fedbnr", _K, "learn_batch",
          ("!f8[3]", "!f8[3]", "!f8[2]", "!f8[3]", "!f8[1]", "i8", "f8[3]", "f8[1]", "f8[1]", "f8[1]", "f8", "f8",
           "!f8[1]", "i8", "!f8[1]", "!f8[1]", "!f8[1]")),
    Entry("fedbnr", _K, "fold_rows", ("!f8[3]", "f8[3]", "f8[1]", "i8", "i8")),
    Entry("fedbnr", _K, "fold_samples", ("!f8[3]", "f8[3]", "f8[1]")),
    Entry("fedbnr", _K, "decay_refresh", ("!f8[3]", "f8", "f8[1]", "i8", "!f8[1]")),
    Entry("fedbnr", _K, "symmetric_from_upper", ("f8[3]", "!f8[3]")),
    Entry("fedbnr", _K, "packed_predict", ("!f8[1]", "f8[1]")),
    Entry("fedbnr", _K, "packed_learn", ("!f8[1]", "f8")),
    Entry("fedbnr", _K, "packed_step", ("!f8[1]", "f8[1]", "f8")),
    Entry("fedbnr", _K, "packed_learn_predict", ("!f8[1]", "f8", "f8[1]")),
    Entry("fedbnr", _K, "update_predict", ("!f8[2]", "!f8[1]", "f8[1]", "!f8[1]")),
    Entry("fedbnr", _K, "evidence_grid", ("f8[1]", "f8[1]", "f8", "f8", "f8[1]", "f8[1]", "!f8[2]")),
    Entry("fedbnr", _K, "zoom_search",
          ("f8[1]", "f8[1]", "f8", "f8", "f8[1]", "f8[1]", "i8", "i8", "f8", "!f8[1]")),
    Entry("fedbnr", _K, "profile_search",
          ("f8[1]", "f8[1]", "f8[1]", "f8", "f8", "f8[1]", "f8[1]", "i8", "i8", "f8", "f8", "!f8[1]")),
    Entry("fedbnr", _C, "scan",  # the aggregator's per-upload check (.packed_check)
          ("f8[2]", "f8[2]", "f8", "f8", "f8", "f8", "i8", "f8", "i8", "f8", "i8", "!f8[3]", "!f8[2]", "!f8[1]",
           "!f8[3]")),
)
# what the build is made from: the kernels and what they import (paths under the streamfed package)
SOURCES = ("algorithms/fedbnr/_kernels.py", "algorithms/fedbnr/_layout.py", "algorithms/fedbnr/_check_kernels.py",
           "algorithms/fedbnr/_check_codes.py",
           "core/_feature_kernels.py", "core/numerics.py")

kern = register("fedbnr", ENTRIES, SOURCES)
