"""Fixed-point encoding of float64 vectors in the ring `Z_{2^64}` (numpy uint64 wraps modulo 2^64).

`x` is encoded as `round(x · 2^f)` in two's complement; the sum of encodings is the encoding of the sum
*exactly* (integer arithmetic) as long as the true integer sum stays within `(-2^63, 2^63)`:
:func:`frac_bits_for` chooses `f` from a bound on the summands' magnitude and their number so that it
cannot overflow. Decoding divides by `2^f` once, so the decoded sum differs from the float sum of the
inputs by at most `n · 2^-(f+1)` (each input's rounding), and from the sum of the decoded inputs by
nothing at all.

>>> enc = encode(np.array([1.5, -2.0]), frac_bits=8)
>>> enc.dtype, decode(enc + enc, 8).tolist()
(dtype('uint64'), [3.0, -4.0])
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike

__all__ = ["MAX_FRAC_BITS", "decode", "encode", "frac_bits_for"]

MAX_FRAC_BITS = 52  # beyond the float64 mantissa nothing is gained, and magnitudes shrink for nothing


def frac_bits_for(max_abs: float, n_summands: int) -> int:
    """The largest number of fractional bits `f` such that `n_summands` values each of magnitude at most
    `max_abs` sum without overflowing a signed 64-bit integer (one bit of headroom kept).

    >>> frac_bits_for(1.0, 1), frac_bits_for(1e6, 1000)
    (52, 32)
    """
    if not (max_abs > 0 and math.isfinite(max_abs)) or n_summands < 1:
        raise ValueError(f"need a finite bound > 0 and at least one summand, got {max_abs!r}, {n_summands!r}")
    # |Σ round(x·2^f)| <= n·(max_abs·2^f + 1/2) <= n·(max_abs + 1)·2^f <= 2^62: a bit of headroom below 2^63
    f = math.floor(62 - math.log2(n_summands * (max_abs + 1.0)))
    if f < 0:
        raise ValueError(f"{n_summands} values of magnitude {max_abs:g} cannot be summed in 64 bits")
    return min(f, MAX_FRAC_BITS)


def encode(x: ArrayLike, frac_bits: int, max_abs: float | None = None) -> np.ndarray:
    """`round(x · 2^frac_bits)` as uint64 (two's complement). `ValueError` for a non-finite value, or one
    beyond `max_abs` (default: whatever fits in 62 bits)."""
    a = np.asarray(x, dtype=np.float64)
    if not np.isfinite(a).all():
        raise ValueError("cannot encode a non-finite value")
    limit = 2.0 ** (62 - frac_bits) if max_abs is None else float(max_abs)
    if a.size and float(np.max(np.abs(a))) > limit:
        raise ValueError(f"a value beyond ±{limit:g} cannot be encoded with {frac_bits} fractional bits")
    return np.rint(np.ldexp(a, frac_bits)).astype(np.int64).view(np.uint64)


def decode(v: ArrayLike, frac_bits: int) -> np.ndarray:
    """Inverse of :func:`encode` (also of a sum of encodings): the signed integer divided by `2^frac_bits`."""
    return np.ldexp(np.asarray(v, dtype=np.uint64).view(np.int64).astype(np.float64), -frac_bits)
