"""The compiled parser of the Beijing station files (:mod:`.beijing`), in its own module so that a process which
reads the parsed tables from the cache folder never imports numba (~0.25 s of a short replay's start-up)."""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["parse_prsa"]


@numba.njit(cache=True)
def parse_prsa(buf: np.ndarray, start: int, ncols: int, wd_col: int, bearings: np.ndarray
                ) -> tuple[np.ndarray, int, list[tuple[int, int, int, int]]]:
    """Parse the PRSA CSV body `buf[start:]` (bytes) into a float `(rows, ncols)` array.

    Unquoted numbers become floats (bit-identical to Python's `float`: the decimal mantissa and the
    power of ten are both exact, so one correctly-rounded division/multiplication remains); `NA`
    becomes NaN; a quoted field becomes NaN, except in column `wd_col` where a compass word becomes
    its bearing in degrees. Numbers the exact path cannot take (over 15 significant digits or a
    power of ten beyond 1e22) are left NaN and listed in `hard` as `(row, col, begin, end)` for the
    caller to parse. Returns `(out, error_position or -1, hard)`.
    """
    n = buf.size
    nl = 0
    for i in range(start, n):
        if buf[i] == 10:
            nl += 1
    if n > start and buf[n - 1] != 10:
        nl += 1
    out = np.empty((nl, ncols))
    hard = [(0, 0, 0, 0)]
    hard.pop()
    i = start
    r = 0
    c = 0
    while i < n and r < nl:
        ch = buf[i]
        if ch == 34:  # quoted field: read up to the closing quote
            i += 1
            code = 0
            ok = True
            k = 0
            while i < n and buf[i] != 34:
                b = buf[i]
                letter = 1 if b == 78 else 2 if b == 69 else 3 if b == 83 else 4 if b == 87 else 0  # N E S W
                if letter == 0 or k >= 3:
                    ok = False
                code = code * 5 + letter
                k += 1
                i += 1
            if i >= n:
                return out, i, hard
            i += 1
            out[r, c] = bearings[code] if (c == wd_col and ok and k > 0) else np.nan
        elif ch == 78:  # NA
            if i + 1 < n and buf[i + 1] == 65:
                out[r, c] = np.nan
                i += 2
            else:
                return out, i, hard
        else:
            fs = i
            neg = False
            if ch == 45 or ch == 43:
                neg = ch == 45
                i += 1
            m = 0
            k = 0
            nd = 0
            nz = 0
            dot = False
            while i < n:
                b = buf[i]
                if 48 <= b <= 57:
                    nz += 1
                    if m > 0 or b != 48:
                        nd += 1
                    if nd <= 15:
                        m = m * 10 + (b - 48)
                        if dot:
                            k += 1
                    elif not dot:
                        k -= 1  # digits beyond 15 are dropped (and the field sent to `hard`)
                elif b == 46 and not dot:
                    dot = True
                else:
                    break
                i += 1
            if nz == 0:
                return out, i, hard
            p = -k
            if i < n and (buf[i] == 101 or buf[i] == 69):
                i += 1
                eneg = False
                if i < n and (buf[i] == 45 or buf[i] == 43):
                    eneg = buf[i] == 45
                    i += 1
                e = 0
                ne = 0
                while i < n and 48 <= buf[i] <= 57:
                    if ne < 6:
                        e = e * 10 + (buf[i] - 48)
                    ne += 1
                    i += 1
                if ne == 0:
                    return out, i, hard
                p += -e if eneg else e
            if nd > 15 or p < -22 or p > 22:
                hard.append((r, c, fs, i))
                out[r, c] = np.nan
            else:
                v = m / 10.0 ** (-p) if p < 0 else m * 10.0**p
                out[r, c] = -v if neg else v
        # field separator or end of line
        if i >= n or buf[i] == 10 or buf[i] == 13:
            if c != ncols - 1:
                return out, i, hard
            if i < n and buf[i] == 13:
                i += 1
            i += 1
            r += 1
            c = 0
        elif buf[i] == 44:
            i += 1
            c += 1
            if c >= ncols:
                return out, i, hard
        else:
            return out, i, hard
    if r != nl:
        return out, i, hard
    return out, -1, hard
