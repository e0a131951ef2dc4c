"""Constants and buffer layout of the POF-MKL client step, shared by the numba kernels
(:mod:`._pofmkl_kernels`) and the Python class (:mod:`.pofmkl`), which must not need numba."""

from __future__ import annotations

STEP_OK = 0
STEP_BAD_INPUT = 1
STEP_BAD_LABEL = 2
STEP_NON_FINITE = 3
STEP_NEED_DRAWS = 4  # the block of uniform draws is used up: refill it and call again
STEP_BAD_SHAPE = 5  # x does not have d values

# Largest step along a sample's features, `η/q_J` (docs/algorithms.md §3.5, "step cap"): with `‖z‖ = 1`,
# a step of 1/2 makes the selected kernel fit the sample exactly, so a larger one only overshoots and,
# from 1 on, diverges. Below it (every `η ≤ ξ/(2B)`) the step is the paper's, unchanged.
STEP_CAP = 0.5
# A kernel's per-sample loss above this is counted as an overflow and taken as this value: the kernel
# gets weight ~0 and the step goes on, instead of one runaway kernel refusing every later sample.
LOSS_CAP = 1e150

N_DRAWS = 256  # uniforms per block (drawn with one `rng.random(N_DRAWS)`)

# Index buffer of a client (int64): [N, D, M, order (N), selected kernels (M)].
_I_HEADER = 3


def packed_layout(n_kernels: int, n_feat: int, bin_size: int) -> dict[str, tuple[int, int]]:
    """Offsets `(start, stop)` of each state array inside a client's one float64 buffer.

    One buffer because every array argument costs numba's dispatcher a type check on each call;
    the step takes five arrays (frequencies, x, this buffer, the index buffer) and a float. `draws`
    is `[number used, N_DRAWS uniforms]`; `delta` is the last step's upload (`M × 2D`)."""
    dim = 2 * n_feat
    sizes = [("hyper", 4), ("draws", 1 + N_DRAWS), ("theta", n_kernels * dim), ("theta_sq", n_kernels),
             ("logw", n_kernels), ("acc", 4 + 2 * n_kernels), ("scratch", 2 * n_kernels * n_feat + 3 * n_kernels),
             ("delta", bin_size * dim)]
    out, o = {}, 0
    for name, size in sizes:
        out[name] = (o, o + size)
        o += size
    return out
