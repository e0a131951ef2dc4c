"""Shamir secret sharing over the prime field `GF(2^521 - 1)` (a Mersenne prime: every 256-bit key or seed
fits in one element).

A secret `s` is the constant term of a random polynomial of degree `t - 1`; share `i` is its value at
`x = i` (`i = 1..n`). Any `t` shares give `s` back by Lagrange interpolation at 0; any `t - 1` shares are
uniformly distributed whatever `s` is (they reveal nothing).

>>> import random
>>> shares = split(1234, n=5, t=3, rng=random.Random(0))
>>> reconstruct(shares[1:4]), reconstruct([shares[0], shares[4], shares[2]])
(1234, 1234)
"""

from __future__ import annotations

import functools
import operator
import random
import secrets
from collections.abc import Sequence

__all__ = ["PRIME", "SHARE_BYTES", "from_bytes", "random_elements", "reconstruct", "split", "to_bytes"]

PRIME = 2**521 - 1
SHARE_BYTES = 66  # one field element, big-endian
_TABLE = 4096  # the most powers `split` tabulates for one (n, t) (SecAgg+ at 100,000 clients: 68 × 35)
_BITS = (1 << 521) - 1  # the low 521 bits of a 66-byte draw (equal to PRIME: a Mersenne prime is all ones)


def split(secret: int, n: int, t: int, rng: random.Random | None = None) -> list[tuple[int, int]]:
    """`n` shares `(x, y)` of `secret`, any `t` of which reconstruct it. `rng` only for tests: by default
    the coefficients come from the operating system's CSPRNG (:func:`random_elements`)."""
    if not 1 <= t <= n:
        raise ValueError(f"need 1 <= t <= n, got t={t}, n={n}")
    if not 0 <= secret < PRIME:
        raise ValueError("secret out of the field")
    coeffs = [secret, *([rng.randrange(PRIME) for _ in range(t - 1)] if rng is not None else random_elements(t - 1))]
    if n * t > _TABLE:  # a full graph of hundreds: Horner's rule, no table kept
        out = []
        for x in range(1, n + 1):
            y = 0
            for c in reversed(coeffs):
                y = (y * x + c) % PRIME
            out.append((x, y))
        return out
    # y(x) = Σ_j c_j·x^j with the powers x^j mod p tabulated once per (n, t): t products and one reduction a share,
    # where Horner's rule reduces after every step (a round's client splits two secrets into k = 40 shares)
    return [(x, sum(map(operator.mul, coeffs, powers)) % PRIME) for x, powers in enumerate(_powers(n, t), 1)]


def random_elements(count: int) -> list[int]:
    """`count` field elements drawn uniformly from the operating system's CSPRNG: 521 random bits each, drawn
    again in the rare case (probability 2^-521) that they spell `PRIME` itself; one `secrets.token_bytes` call for
    all of them.

    >>> len(random_elements(3)), all(0 <= v < PRIME for v in random_elements(3))
    (3, True)
    """
    out: list[int] = []
    while len(out) < count:
        raw = secrets.token_bytes(SHARE_BYTES * (count - len(out)))
        for i in range(0, len(raw), SHARE_BYTES):
            v = int.from_bytes(raw[i:i + SHARE_BYTES], "big") & _BITS
            if v < PRIME:
                out.append(v)
    return out


@functools.lru_cache(maxsize=64)
def _powers(n: int, t: int) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(pow(x, j, PRIME) for j in range(t)) for x in range(1, n + 1))


def reconstruct(shares: Sequence[tuple[int, int]]) -> int:
    """The constant term of the polynomial through `shares` (distinct non-zero `x`). With fewer shares than
    the threshold the result is some unrelated field element — nothing says so: use exactly `t` or more."""
    xs = tuple(int(x) % PRIME for x, _ in shares)
    if len(set(xs)) != len(xs) or 0 in xs:
        raise ValueError("share abscissae must be distinct and non-zero")
    return sum(int(y) * w for (_, y), w in zip(shares, _weights_at_zero(xs), strict=True)) % PRIME


@functools.lru_cache(maxsize=256)
def _weights_at_zero(xs: tuple[int, ...]) -> tuple[int, ...]:
    # the Lagrange basis at 0 depends on the abscissae alone: a server recovering many secrets from the same
    # positions (1..t when no neighbour dropped) computes it once
    out = []
    for i, xi in enumerate(xs):
        num, den = 1, 1
        for j, xj in enumerate(xs):
            if j != i:
                num = num * (-xj) % PRIME
                den = den * (xi - xj) % PRIME
        out.append(num * pow(den, -1, PRIME) % PRIME)
    return tuple(out)


def to_bytes(y: int) -> bytes:
    """A field element as :data:`SHARE_BYTES` big-endian bytes."""
    return int(y).to_bytes(SHARE_BYTES, "big")


def from_bytes(b: bytes) -> int:
    """Inverse of :func:`to_bytes`; `ValueError` for the wrong length or a value outside the field."""
    if len(b) != SHARE_BYTES:
        raise ValueError(f"a share is {SHARE_BYTES} bytes, got {len(b)}")
    y = int.from_bytes(b, "big")
    if y >= PRIME:
        raise ValueError("share outside the field")
    return y
