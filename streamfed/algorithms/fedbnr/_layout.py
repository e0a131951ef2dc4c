"""Layout of the packed FedBNR client buffer, shared by the numba kernels (:mod:`._fedbnr_kernels`)
and the Python class (:mod:`.fedbnr`), which must not need numba.

The client's per-sample state lives in ONE float64 buffer so a prequential step is one compiled call
with three arguments (numba's dispatcher costs ~0.1 µs per array argument). Layout: a header of
`HEADER` slots (sizes, offsets of each block, running scalars), then the blocks. The Python class
(`FedBNRClient`) holds numpy views of the blocks; `packed_layout` is the single source of the layout.
"""

from __future__ import annotations

import numpy as np

HEADER = 48
# header slots: sizes
H_K, H_F, H_B, H_D, H_ND = 0, 1, 2, 3, 4
# header slots: running scalars
H_N_WORK, H_Q_WORK, H_STAGED, H_N_PEND, H_Q_PEND, H_REFRESH_J, H_GAMMA, H_SQRT_GAMMA, H_DIRTY = (
    24, 25, 26, 27, 28, 29, 30, 31, 32)
# header slot: the lazy kernels' evidence gap (nats; 0 = every kernel updated at every sample, see .client)
H_LAZY_GAP = 33
# order of the blocks (their offsets are header slots 5, 6, ...)
BLOCKS = ("ra", "s_pend", "b_pend", "stage", "stage_y", "work", "phi", "means", "vars", "logw", "sigma",
          "inv_sigma", "lam", "refresh", "pdiag", "wt", "angles", "lazy", "bound")
# (blocks are only ever appended: a buffer of an earlier layout is its prefix, see PackedState.__setstate__)
_H_OFF = 5


def packed_layout(k: int, f: int, b: int, d: int, nd: int) -> tuple[dict[str, tuple[int, int]], int]:
    """`({block: (start, stop)}, total size)` of the packed buffer for `K` kernels of `F` features,
    `B` staged rows and (default RFF map) `d` inputs and `N·D` frequencies (`d = nd = 0` otherwise)."""
    sizes = {"ra": k * (f + 1) * (f + 1), "s_pend": k * f * f, "b_pend": k * f, "stage": k * f * b,
             "stage_y": b, "work": f + 1, "phi": k * f, "means": k, "vars": k, "logw": k, "sigma": k,
             "inv_sigma": k, "lam": k, "refresh": k, "pdiag": k * f, "wt": d * nd, "angles": 2 * nd,
             "lazy": k, "bound": k}
    assert _H_OFF + len(BLOCKS) <= H_N_WORK
    out, pos = {}, HEADER
    for name in BLOCKS:
        out[name] = (pos, pos + sizes[name])
        pos += sizes[name]
    return out, pos


def write_header(buf: np.ndarray, layout: dict[str, tuple[int, int]], k: int, f: int, b: int, d: int,
                 nd: int) -> None:
    buf[H_K], buf[H_F], buf[H_B], buf[H_D], buf[H_ND] = k, f, b, d, nd
    for i, name in enumerate(BLOCKS):
        buf[_H_OFF + i] = layout[name][0]
