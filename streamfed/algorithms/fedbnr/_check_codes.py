"""What FedBNR's per-upload check (:mod:`.packed_check`) found first, in the order the numpy checks run, and its
slacks: shared by the compiled pass (:mod:`._check_kernels`) and its caller, without importing numba."""

from __future__ import annotations

__all__ = ["BEYOND_MAX_ABS", "B_NORM", "B_ROW", "LABELS", "OK", "REL", "SLACK", "TRACE_HIGH", "TRACE_LOW"]

OK, BEYOND_MAX_ABS, TRACE_HIGH, TRACE_LOW, LABELS, B_ROW, B_NORM = range(7)
REL = 1e-9  # check_statistics' relative slack
SLACK = 1e-9  # check_labelled_scatter's
