"""Secure aggregation (Bonawitz et al. 2017, "SecAgg"; Bell et al. 2020, "SecAgg+"): the server learns the
sum of the clients' fixed-point vectors in `Z_{2^64}` and nothing else, even when clients drop out.

One round, four steps; each message is validated by whoever receives it (:class:`SecAggError` with a
stable `reason`, never a traceback), with exact sizes:

1. **advertise keys** — client `u` makes two X25519 key pairs (`c_u` to encrypt shares, `s_u` to agree
   on masks) and sends both public keys (32 bytes each). The server keeps the set `U1`.
2. **share keys** — `u` draws a self-mask seed `b_u` (32 bytes), splits `b_u` and its mask secret key
   `s_u^SK` into Shamir shares (threshold `t`) for its neighbours `N(u) ∩ U1`, and sends each neighbour
   its two shares encrypted with ChaCha20-Poly1305 under `KA(c_u, c_v)`; the server forwards them
   (it cannot read them). `U2` = clients whose shares arrived.
3. **masked input** — `u` sends `y_u = x_u + PRG(b_u) + Σ_{v ∈ N(u) ∩ U2} ±PRG(KA(s_u, s_v))` (`+` when
   `u < v`): pairwise masks cancel in the sum, the self-mask protects `x_u` should its pairwise masks be
   revealed for a late client. `U3` = clients whose masked input arrived.
4. **unmasking** — each surviving neighbour of `u` reveals its share of `b_u` if `u ∈ U3`, else of
   `s_u^SK` (never both: an honest client refuses a request for both). With `t` shares the server removes
   the self-masks of `U3` and the pairwise masks that clients of `U3` share with dropped clients.

The result is `Σ_{u ∈ U3} x_u` exactly (integers modulo 2^64). Neighbours: every other client (SecAgg),
or `k = O(log n)` of them on a random Harary graph drawn from a public seed (SecAgg+), which brings the
client's cost from `O(n)` key agreements and shares to `O(log n)`.

The PRG is the ChaCha20 keystream under a key derived with HKDF-SHA256 from the secret and the round id,
so masks of two rounds never repeat.

>>> import numpy as np
>>> xs = {c: np.full(4, i, dtype=np.uint64) for i, c in enumerate(["a", "b", "c", "d"])}
>>> run_round(xs, round_id=1, drop_before_masking={"d"}).tolist()
[3, 3, 3, 3]
"""

from __future__ import annotations

import functools
import hashlib
import math
import secrets
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

from streamfed.privacy import shamir

__all__ = ["CIPHERTEXT_BYTES", "KEY_BYTES", "MAX_VECTOR", "Neighbourhood", "SecAggClient", "SecAggError",
           "SecAggServer", "SecAggSettings", "default_degree", "default_threshold", "harary_neighbours", "harary_size",
           "masks", "prg", "roster_seed", "run_round"]

KEY_BYTES = 32
SEED_BYTES = 32
CIPHERTEXT_BYTES = 2 * shamir.SHARE_BYTES + 16  # two shares and the Poly1305 tag
MAX_VECTOR = 1 << 26  # ring elements of one vector (512 MiB): far above any model here, bounds allocation
MAX_CLIENTS = 100_000


class SecAggError(ValueError):
    """A secure-aggregation message or step was refused; `reason` is a stable code for metrics and logs.

    >>> str(SecAggError("bad_key", "client 'a': 31 bytes"))
    "bad_key: client 'a': 31 bytes"
    """

    def __init__(self, reason: str, detail: str = "") -> None:
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}" if detail else reason)


# =========================================================================== primitives


_SHA256 = hashes.SHA256()


def _hkdf(secret: bytes, info: bytes) -> bytes:
    return HKDF(algorithm=_SHA256, length=32, salt=None, info=info).derive(secret)


@functools.lru_cache(maxsize=4)
def _zeros(n_bytes: int) -> bytes:
    # the plaintext of a keystream: allocated once per vector length, not once per mask
    return bytes(n_bytes)


def _info(label: bytes, round_id: int) -> bytes:
    return b"streamfed-secagg/" + label + b"/" + str(int(round_id)).encode()


def _keystream_into(key: bytes, out: np.ndarray) -> None:
    # ChaCha20 (counter and nonce 0: each key is used for one stream only) written straight into `out`'s bytes
    if out.size:
        Cipher(algorithms.ChaCha20(key, bytes(16)), mode=None).encryptor().update_into(
            _zeros(out.nbytes), out.view(np.uint8))


def prg(seed: bytes, length: int, round_id: int, label: bytes = b"mask") -> np.ndarray:
    """`length` pseudo-random uint64 from a 32-byte `seed`: the ChaCha20 keystream under
    `HKDF(seed, "streamfed-secagg/<label>/<round>")`, read as little-endian 64-bit words.

    >>> a = prg(bytes(32), 3, round_id=1); a.dtype, a.shape, bool((a == prg(bytes(32), 3, 1)).all())
    (dtype('uint64'), (3,), True)
    """
    if not 0 <= length <= MAX_VECTOR:
        raise SecAggError("bad_length", f"vector length {length} outside [0, {MAX_VECTOR}]")
    out = np.empty(length, dtype="<u8")  # the keystream written straight into the vector: no copies
    _keystream_into(_hkdf(seed, _info(label, round_id)), out)
    return out.astype(np.uint64, copy=False)


def masks(seeds: Sequence[tuple[bytes, bytes]], length: int, round_id: int) -> np.ndarray:
    """The masks of `seeds` — pairs `(seed, label)` — as the rows of one `(len(seeds), length)` array: row `i` is
    `prg(*seeds[i] ...)`, every keystream written into one buffer (a client's `k + 1` masks cost `k + 1` keystream
    calls and no further copies).

    >>> m = masks([(bytes(32), b"self"), (bytes(range(32)), b"mask")], 5, round_id=3)
    >>> m.shape, bool((m[1] == prg(bytes(range(32)), 5, 3)).all())
    ((2, 5), True)
    """
    if not 0 <= length <= MAX_VECTOR:
        raise SecAggError("bad_length", f"vector length {length} outside [0, {MAX_VECTOR}]")
    out = np.empty((len(seeds), length), dtype="<u8")
    infos: dict[bytes, bytes] = {}
    for row, (seed, label) in zip(out, seeds, strict=True):
        info = infos.get(label)
        if info is None:
            info = infos[label] = _info(label, round_id)
        _keystream_into(_hkdf(seed, info), row)
    return out.astype(np.uint64, copy=False)


def _agree(sk: X25519PrivateKey, pk: bytes, info: bytes) -> bytes:
    try:
        shared = sk.exchange(X25519PublicKey.from_public_bytes(pk))
    except ValueError as e:  # a low-order point gives the all-zero secret: refused by the library
        raise SecAggError("bad_key", str(e)) from None
    return _hkdf(shared, info)


def _raw_public(sk: X25519PrivateKey) -> bytes:
    return sk.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def _raw_private(sk: X25519PrivateKey) -> bytes:
    return sk.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())


def default_degree(n: int) -> int:
    """SecAgg+'s neighbourhood size for `n` clients: everyone up to 16 clients, else the even number
    `2·⌈2·log2 n⌉` (40 at 1,000 clients). With the default threshold `⌊k/3⌋ + 1` a neighbourhood survives
    losing two thirds of its members; a third of the fleet dropping at random then leaves every
    neighbourhood above its threshold with high probability (Bell et al. 2020, §4 choose `k` and `t` from
    the dropout rate the same way).

    >>> default_degree(10), default_degree(100), default_degree(1000)
    (9, 28, 40)
    """
    if n <= 16:
        return max(n - 1, 0)
    return min(n - 1, 2 * math.ceil(2 * math.log2(n)))


def default_threshold(degree: int) -> int:
    """The Shamir threshold of a neighbourhood of `degree` clients: a majority, `⌊k/2⌋ + 1`. Secrets are safe
    unless `t` of a client's neighbours collude (with the server); a majority also means that the shares one set
    of neighbours holds and those another set holds cannot both reach `t` from honest clients alone. The round
    survives fewer than `k - t + 1` of a neighbourhood dropping (docs/privacy.md: the bound with numbers).

    >>> default_threshold(2), default_threshold(9), default_threshold(40)
    (2, 5, 21)
    """
    return degree // 2 + 1


def roster_seed(round_id: int, keys: Mapping[str, tuple[bytes, bytes]]) -> int:
    """The neighbour graph's seed for one round: a hash of the round id and every member's two public keys, so
    that it is new every round and no one — the aggregator included — chooses it alone (each member's keys are
    fresh random draws made before the roster is known).

    >>> a = roster_seed(1, {"a": (bytes(32), bytes(32)), "b": (bytes(range(32)), bytes(32))})
    >>> a == roster_seed(1, {"b": (bytes(range(32)), bytes(32)), "a": (bytes(32), bytes(32))}), a != roster_seed(2, {})
    (True, True)
    """
    h = hashlib.sha256(f"streamfed-secagg/graph/{int(round_id)}".encode())
    for name in sorted(keys):
        c_pk, s_pk = keys[name]
        h.update(name.encode() + b"\0" + bytes(c_pk) + bytes(s_pk))
    return int.from_bytes(h.digest()[:8], "big")


def harary_neighbours(clients: Sequence[str], degree: int, seed: int) -> dict[str, tuple[str, ...]]:
    """A random Harary graph (Bell et al. 2020): the clients in an order drawn from the public `seed`, each
    joined to its `⌈degree/2⌉` successors and predecessors on that ring. Symmetric; every client has
    `degree` neighbours (rounded up to even) when `degree < n - 1`, else everyone.

    >>> g = harary_neighbours(["a", "b", "c", "d", "e"], 2, seed=0)
    >>> all(len(v) == 2 and all(c in g[u] for u in v) for c, v in g.items())
    True
    """
    names = sorted(set(clients))
    if len(names) != len(clients):
        raise SecAggError("bad_roster", "client names repeat")
    n = len(names)
    if degree >= n - 1:
        return {c: tuple(x for x in names if x != c) for c in names}
    order = list(names)
    # the order from a public seed everyone can recompute (SHA-256 of seed and name: no shared RNG state)
    order.sort(key=lambda c: hashlib.sha256(f"{seed}/{c}".encode()).digest())
    half = (degree + 1) // 2
    out: dict[str, set[str]] = {c: set() for c in names}
    for i, c in enumerate(order):
        for j in range(1, half + 1):
            d = order[(i + j) % n]
            out[c].add(d)
            out[d].add(c)
    return {c: tuple(sorted(v)) for c, v in out.items()}


def harary_size(n: int, degree: int) -> int:
    """How many neighbours each of `n` clients has in :func:`harary_neighbours` with `degree`: everyone else
    when `degree >= n - 1`, else `degree` rounded up to even (the ring's successors and predecessors).

    >>> harary_size(1000, 40), harary_size(1000, 5), harary_size(10, 9)
    (40, 6, 9)
    """
    return n - 1 if degree >= n - 1 else 2 * ((degree + 1) // 2)


@dataclass(frozen=True)
class Neighbourhood:
    """What one member knows of a round (SecAgg+): its own name, its neighbours (sorted; the Shamir abscissa
    of a neighbour's share is its 1-based position here), how many members the round has, the vector length
    and the threshold. Nothing about members outside the neighbourhood, so that a member's part of a round —
    keys, shares, survivors — costs `O(k)` whatever the fleet's size.

    :meth:`announced` builds it from what the aggregator tells a member and checks it against the public rule
    (:func:`default_degree`, :func:`default_threshold`): the aggregator cannot give a member fewer neighbours
    or a lower threshold than the round's size calls for.

    >>> v = Neighbourhood.announced(1, "a", ("b", "c"), members=3, length=4)
    >>> v.threshold, v.share_index("c")
    (2, 2)
    """

    round_id: int
    client: str
    neighbours: tuple[str, ...]
    members: int
    length: int
    threshold: int

    def __post_init__(self) -> None:
        k = len(self.neighbours)
        if not 2 <= self.members <= MAX_CLIENTS:
            raise SecAggError("bad_roster", f"{self.members} clients; secure aggregation needs 2..{MAX_CLIENTS}")
        if not 0 <= self.length <= MAX_VECTOR:
            raise SecAggError("bad_length", f"vector length {self.length} outside [0, {MAX_VECTOR}]")
        if self.client in self.neighbours or len(set(self.neighbours)) != k or list(self.neighbours) != sorted(
                self.neighbours) or not 1 <= k < self.members:
            raise SecAggError("bad_roster", f"{self.client!r}: neighbours must be 1..n-1 other, sorted, distinct names")
        if not 1 <= self.threshold <= k:
            raise SecAggError("bad_threshold", f"threshold {self.threshold} outside [1, {k}]")

    @classmethod
    def announced(cls, round_id: int, client: str, neighbours: Iterable[str], members: int,
                  length: int) -> Neighbourhood:
        """A member's view as the aggregator announces it, held to the public rule for `members` clients:
        exactly :func:`harary_size` neighbours and the threshold :func:`default_threshold` of the degree."""
        names = tuple(sorted(neighbours))
        if not 2 <= members <= MAX_CLIENTS:
            raise SecAggError("bad_roster", f"{members} clients; secure aggregation needs 2..{MAX_CLIENTS}")
        degree = default_degree(members)
        if len(names) != harary_size(members, degree):
            raise SecAggError("bad_roster", f"{len(names)} neighbours announced; a round of {members} gives "
                              f"{harary_size(members, degree)}")
        return cls(round_id, client, names, members, length, default_threshold(degree))

    def share_index(self, holder: str) -> int:
        """The Shamir abscissa of `holder`'s share of my secrets."""
        return self.neighbours.index(holder) + 1


@dataclass(frozen=True)
class SecAggSettings:
    """Public parameters of one round: its id, the roster, the vector length, the neighbourhood size, the
    Shamir threshold (default :func:`default_threshold`, `⌊k/2⌋ + 1`) and the seed of the neighbour graph (the
    fleet draws it per round from every member's keys: :func:`roster_seed`).

    >>> s = SecAggSettings(round_id=1, clients=("a", "b", "c"), length=4)
    >>> s.degree, s.threshold, s.neighbours["a"]
    (2, 2, ('b', 'c'))
    """

    round_id: int
    clients: tuple[str, ...]
    length: int
    degree: int | None = None  # None: default_degree(n); >= n - 1: classic SecAgg (everyone)
    threshold: int | None = None
    graph_seed: int = 0
    neighbours: Mapping[str, tuple[str, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        n = len(self.clients)
        if not 2 <= n <= MAX_CLIENTS:
            raise SecAggError("bad_roster", f"{n} clients; secure aggregation needs 2..{MAX_CLIENTS}")
        if not 0 <= self.length <= MAX_VECTOR:
            raise SecAggError("bad_length", f"vector length {self.length} outside [0, {MAX_VECTOR}]")
        degree = default_degree(n) if self.degree is None else min(int(self.degree), n - 1)
        if degree < 1:
            raise SecAggError("bad_roster", "every client needs a neighbour")
        object.__setattr__(self, "degree", degree)
        t = default_threshold(degree) if self.threshold is None else int(self.threshold)
        if not 1 <= t <= degree:
            raise SecAggError("bad_threshold", f"threshold {t} outside [1, {degree}]")
        object.__setattr__(self, "threshold", t)
        object.__setattr__(self, "neighbours", harary_neighbours(self.clients, degree, self.graph_seed))

    def share_index(self, owner: str, holder: str) -> int:
        """The Shamir abscissa of `holder`'s share of `owner`'s secrets (1-based position in `owner`'s
        neighbour list)."""
        return self.neighbours[owner].index(holder) + 1

    def view(self, client: str) -> Neighbourhood:
        """What `client` needs to know of the round: its :class:`Neighbourhood`."""
        if client not in self.neighbours:
            raise SecAggError("unknown_client", f"{client!r} is not in the round's roster")
        assert self.threshold is not None
        return Neighbourhood(self.round_id, client, self.neighbours[client], len(self.clients), self.length,
                             self.threshold)


@dataclass(frozen=True)
class Keys:
    """Step 1's message: a client's two public keys (32 raw bytes each: one to encrypt shares, one for masks).

    >>> Keys("a", bytes(32), bytes(range(32))).client
    'a'
    """

    client: str
    c_pk: bytes
    s_pk: bytes


# =========================================================================== the client


class SecAggClient:
    """One client's half of a round. It knows only its :class:`Neighbourhood` (given, or taken from the
    round's full :class:`SecAggSettings`) and is handed only its neighbours' keys and shares. Every step checks
    what it is given and raises :class:`SecAggError`.

    >>> s = SecAggSettings(round_id=7, clients=("a", "b", "c"), length=2)
    >>> cs, srv = [SecAggClient(c, s) for c in s.clients], SecAggServer(s)
    >>> for c in cs: srv.add_keys(c.advertise())
    >>> for c in cs: srv.add_shares(c.client, c.share_keys(srv.roster_for(c.client)))
    >>> x = np.array([1, 2], dtype=np.uint64)
    >>> for c in cs: srv.add_masked(c.client, c.masked_input(x, srv.forwarded(c.client)))
    >>> for c in cs: srv.add_unmasking(c.client, c.unmask(srv.survivors_for(c.client)))
    >>> srv.result().tolist()
    [3, 6]
    """

    def __init__(self, client: str, settings: SecAggSettings | Neighbourhood,
                 keys: tuple[X25519PrivateKey, X25519PrivateKey] | None = None) -> None:
        view = settings.view(client) if isinstance(settings, SecAggSettings) else settings
        if view.client != client:
            raise SecAggError("unknown_client", f"a neighbourhood of {view.client!r} given to {client!r}")
        self.client = client
        self.view = view
        # `keys`: the pair advertised before the roster was known (a fleet agent makes them first)
        self._c_sk, self._s_sk = keys if keys is not None else (X25519PrivateKey.generate(),
                                                                X25519PrivateKey.generate())
        self._b = secrets.token_bytes(SEED_BYTES)
        # name → (c_pk, s_pk): plain tuples of bytes, which the garbage collector stops tracking, rather than the
        # roster's `Keys` objects (a fleet simulating a thousand members held 41,000 of them through a round, and
        # every full collection walked them)
        self._roster: dict[str, tuple[bytes, bytes]] = {}
        self._aeads: dict[str, ChaCha20Poly1305] = {}
        self._received: dict[str, bytes] = {}  # sender → ciphertext of my shares of its secrets
        self._masked_with: frozenset[str] = frozenset()
        self._revealed = False
        self._masked: tuple[np.ndarray, np.ndarray] | None = None  # (x, y) of the one input masked this round

    def advertise(self) -> Keys:
        """Step 1: my two public keys."""
        return Keys(self.client, _raw_public(self._c_sk), _raw_public(self._s_sk))

    def _aead(self, other: str) -> ChaCha20Poly1305:
        # kept from step 2 to step 4: a key agreement is most of a client's work in a round
        if other not in self._aeads:
            self._aeads[other] = ChaCha20Poly1305(_agree(self._c_sk, self._roster[other][0],
                                                         _info(b"share", self.view.round_id)))
        return self._aeads[other]

    def share_keys(self, roster: Mapping[str, Keys]) -> dict[str, bytes]:
        """Step 2: given my neighbours' advertised keys (`U1 ∩ N(u)`, and mine), my encrypted shares of `s_u^SK`
        and `b_u`, one ciphertext per neighbour. A roster naming anyone else is refused."""
        v = self.view
        check_roster(roster, {self.client, *v.neighbours})
        mine_keys = roster.get(self.client)
        if mine_keys is not None and mine_keys != self.advertise():
            raise SecAggError("bad_roster", "my keys in the roster are not mine")
        given = {c: (k.c_pk, k.s_pk) for c, k in roster.items()}
        if self._roster and self._roster != given:
            raise SecAggError("out_of_order", "a second, different roster in one round")
        self._roster = given
        mine = [u for u in v.neighbours if u in roster]
        if len(mine) < v.threshold:
            raise SecAggError("too_few_neighbours", f"{len(mine)} neighbours advertised keys, threshold {v.threshold}")
        full = len(v.neighbours)
        s_shares = shamir.split(int.from_bytes(_raw_private(self._s_sk), "big"), full, v.threshold)
        b_shares = shamir.split(int.from_bytes(self._b, "big"), full, v.threshold)
        out = {}
        for i, u in enumerate(v.neighbours):  # share i + 1 (the abscissa) goes to the i-th neighbour
            if u in roster:
                plain = shamir.to_bytes(s_shares[i][1]) + shamir.to_bytes(b_shares[i][1])
                out[u] = self._aead(u).encrypt(_nonce(self.client, u), plain, _aad(v.round_id, self.client, u))
        return out

    def masked_input(self, x: np.ndarray, received: Mapping[str, bytes]) -> np.ndarray:
        """Step 3: `y_u` of my fixed-point vector `x` (uint64, the round's length), masked with every
        neighbour whose shares reached me (`received`: sender → ciphertext, as forwarded; `U2`)."""
        v = self.view
        x = np.asarray(x)
        if x.dtype != np.uint64 or x.shape != (v.length,):
            raise SecAggError("bad_vector", f"input must be uint64 of shape ({v.length},), got {x.dtype} {x.shape}")
        if not self._roster:
            raise SecAggError("out_of_order", "masked input before share keys")
        for u, ct in received.items():
            if u not in v.neighbours or u not in self._roster:
                raise SecAggError("not_a_neighbour", f"shares from {u!r}")
            if not isinstance(ct, bytes) or len(ct) != CIPHERTEXT_BYTES:
                raise SecAggError("bad_ciphertext", f"from {u!r}: {len(ct) if isinstance(ct, bytes) else ct!r}")
        if self._masked is not None:
            # one input per round: a second one masked alike would give away the difference of the two
            if np.array_equal(self._masked[0], x) and self._masked_with == frozenset(received):
                return self._masked[1].copy()
            raise SecAggError("out_of_order", "a second masked input in one round")
        self._received = dict(received)
        self._masked_with = frozenset(received)
        info = _info(b"mask", v.round_id)
        # rows: my self-mask, then the masks I add (neighbours after me), then those I subtract (before me)
        after = [u for u in sorted(received) if self.client < u]
        before = [u for u in sorted(received) if u < self.client]
        m = masks([(self._b, b"self"), *((_agree(self._s_sk, self._roster[u][1], info), b"mask")
                                         for u in (*after, *before))], v.length, v.round_id)
        # uint64 sums wrap modulo 2^64: y = x + PRG(b) + Σ_after PRG(s_uv) − Σ_before PRG(s_uv)
        y = x + m[: 1 + len(after)].sum(axis=0, dtype=np.uint64)
        if before:
            y -= m[1 + len(after):].sum(axis=0, dtype=np.uint64)
        self._masked = (x.copy(), y.copy())
        return y

    def unmask(self, survivors: Collection[str]) -> dict[str, tuple[str, bytes]]:
        """Step 4: for each neighbour whose shares I hold, my share of its self-mask seed (`"b"`) if it is
        among the `survivors` (`U3`: the survivors of my neighbourhood and I; others are ignored), else of
        its mask secret key (`"s"`). Once per round."""
        if self._revealed:
            raise SecAggError("out_of_order", "unmasking asked twice")
        survivors = set(survivors)
        if not survivors <= set(self._roster):
            raise SecAggError("bad_survivors", "survivors that are not neighbours who advertised keys")
        if self.client not in survivors:
            raise SecAggError("bad_survivors", "I sent my masked input but am not listed as a survivor")
        if len(survivors) < self.view.threshold:
            raise SecAggError("bad_survivors", f"{len(survivors)} survivors, below the threshold")
        self._revealed = True
        out = {}
        v = self.view
        for u in sorted(self._received):
            try:
                plain = self._aead(u).decrypt(_nonce(u, self.client), self._received[u],
                                              _aad(v.round_id, u, self.client))
            except Exception:  # InvalidTag: the ciphertext was not made for me in this round
                raise SecAggError("bad_ciphertext", f"shares from {u!r} do not decrypt") from None
            which = "b" if u in survivors else "s"
            part = plain[: shamir.SHARE_BYTES] if which == "s" else plain[shamir.SHARE_BYTES:]
            out[u] = (which, part)
        return out


def _nonce(sender: str, receiver: str) -> bytes:
    # the key is fresh per pair and round; the nonce need only differ between the two directions
    return hashlib.sha256(f"{sender}>{receiver}".encode()).digest()[:12]


def _aad(round_id: int, sender: str, receiver: str) -> bytes:
    return f"{round_id}/{sender}/{receiver}".encode()


def check_roster(roster: Mapping[str, Keys], allowed: Collection[str]) -> None:
    """`SecAggError` unless every entry is one of the `allowed` clients with two 32-byte keys under its own
    name."""
    if len(roster) > len(allowed):
        raise SecAggError("bad_roster", f"{len(roster)} entries for {len(allowed)} clients")
    for c, k in roster.items():
        if c not in allowed or not isinstance(k, Keys) or k.client != c:
            raise SecAggError("bad_roster", f"entry {c!r}")
        if not (isinstance(k.c_pk, bytes) and isinstance(k.s_pk, bytes)
                and len(k.c_pk) == KEY_BYTES and len(k.s_pk) == KEY_BYTES):
            raise SecAggError("bad_key", f"client {c!r}: keys must be {KEY_BYTES} bytes")
        if k.c_pk == k.s_pk:
            raise SecAggError("bad_key", f"client {c!r}: the two keys must differ")


# =========================================================================== the server


class SecAggServer:
    """The server's half: it collects each step's messages (validated: sender in the roster and in the
    previous step's set, exact sizes, no repeats), forwards the shares, and unmasks the sum.

    >>> s = SecAggSettings(round_id=1, clients=("a", "b", "c"), length=1)
    >>> srv = SecAggServer(s)
    >>> try:
    ...     srv.add_keys(Keys("a", bytes(32), bytes(31)))
    ... except SecAggError as e:
    ...     print(e.reason)
    bad_key
    """

    def __init__(self, settings: SecAggSettings) -> None:
        self.settings = settings
        self.keys: dict[str, Keys] = {}  # U1
        self.shares: dict[str, dict[str, bytes]] = {}  # U2: sender → receiver → ciphertext
        self.masked: dict[str, np.ndarray] = {}  # U3
        self.unmasking: dict[str, dict[str, tuple[str, bytes]]] = {}  # U4

    # step 1
    def add_keys(self, k: Keys) -> None:
        check_roster({k.client: k}, self.settings.neighbours)
        if k.client in self.keys:
            raise SecAggError("duplicate", f"keys of {k.client!r} twice")
        self.keys[k.client] = k

    def roster(self) -> dict[str, Keys]:
        """`U1`: every advertised key (the server's own record; a member is sent :meth:`roster_for`)."""
        assert self.settings.threshold is not None
        if len(self.keys) < self.settings.threshold + 1:
            raise SecAggError("too_few_clients", f"{len(self.keys)} advertised keys")
        return dict(self.keys)

    def roster_for(self, client: str) -> dict[str, Keys]:
        """What `client` is sent in step 2: its own keys and its neighbours' (`U1 ∩ (N(u) ∪ {u})`), nobody
        else's."""
        assert self.settings.threshold is not None
        if len(self.keys) < self.settings.threshold + 1:
            raise SecAggError("too_few_clients", f"{len(self.keys)} advertised keys")
        return {c: self.keys[c] for c in (client, *self.settings.neighbours[client]) if c in self.keys}

    # step 2
    def add_shares(self, sender: str, cts: Mapping[str, bytes]) -> None:
        s = self.settings
        if sender not in self.keys:
            raise SecAggError("out_of_order", f"shares from {sender!r}, who advertised no keys")
        if sender in self.shares:
            raise SecAggError("duplicate", f"shares of {sender!r} twice")
        if len(cts) > len(s.neighbours[sender]):
            raise SecAggError("too_many", f"{len(cts)} ciphertexts from {sender!r}")
        for v, ct in cts.items():
            if v not in s.neighbours[sender] or v not in self.keys:
                raise SecAggError("not_a_neighbour", f"{sender!r} → {v!r}")
            if not isinstance(ct, bytes) or len(ct) != CIPHERTEXT_BYTES:
                raise SecAggError("bad_ciphertext", f"{sender!r} → {v!r}")
        if len(cts) < s.threshold:
            raise SecAggError("too_few_neighbours", f"{sender!r} shared with {len(cts)} < threshold")
        self.shares[sender] = dict(cts)

    def forwarded(self, receiver: str) -> dict[str, bytes]:
        """What `receiver` gets in step 3: the ciphertexts addressed to it, by sender (`U2` neighbours)."""
        return {u: self.shares[u][receiver] for u in self.settings.neighbours[receiver]
                if u in self.shares and receiver in self.shares[u]}

    # step 3
    def add_masked(self, sender: str, y: np.ndarray) -> None:
        s = self.settings
        if sender not in self.shares:
            raise SecAggError("out_of_order", f"masked input from {sender!r}, who shared no keys")
        if sender in self.masked:
            raise SecAggError("duplicate", f"masked input of {sender!r} twice")
        y = np.asarray(y)
        if y.dtype != np.uint64 or y.shape != (s.length,):
            raise SecAggError("bad_vector", f"from {sender!r}: {y.dtype} {y.shape}, expected uint64 ({s.length},)")
        self.masked[sender] = y

    def survivors(self) -> frozenset[str]:
        """`U3`, announced for step 4."""
        if len(self.masked) < self.settings.threshold:
            raise SecAggError("too_few_clients", f"{len(self.masked)} masked inputs")
        return frozenset(self.masked)

    def survivors_for(self, client: str) -> frozenset[str]:
        """What `client` is told in step 4: the survivors among its neighbours, and itself."""
        alive = self.survivors()
        return frozenset(c for c in (client, *self.settings.neighbours[client]) if c in alive)

    # step 4
    def add_unmasking(self, sender: str, shares: Mapping[str, tuple[str, bytes]]) -> None:
        if sender not in self.masked:
            raise SecAggError("out_of_order", f"unmasking from {sender!r}, not a survivor")
        if sender in self.unmasking:
            raise SecAggError("duplicate", f"unmasking of {sender!r} twice")
        for u, (which, share) in shares.items():
            if u not in self.shares or sender not in self.shares[u]:
                raise SecAggError("not_a_neighbour", f"{sender!r} holds no share of {u!r}")
            if which != ("b" if u in self.masked else "s"):
                raise SecAggError("wrong_share", f"{sender!r} revealed the {which!r} share of {u!r}")
            if not isinstance(share, bytes) or len(share) != shamir.SHARE_BYTES:
                raise SecAggError("bad_share", f"{sender!r}'s share of {u!r}")
        self.unmasking[sender] = dict(shares)

    def _secret(self, owner: str, which: str) -> bytes:
        s = self.settings
        got = self.unmasking
        pts = [(i + 1, shamir.from_bytes(got[h][owner][1])) for i, h in enumerate(s.neighbours[owner])
               if h in got and owner in got[h] and got[h][owner][0] == which]  # the holders: owner's neighbours
        if len(pts) < s.threshold:
            raise SecAggError("recovery_failed", f"{len(pts)} shares of {owner!r}'s {which!r}, need {s.threshold}")
        value = shamir.reconstruct(pts[: s.threshold])
        if value >= 1 << 256:  # t shares of a 256-bit secret give it back; anything else is a wrong share
            raise SecAggError("recovery_failed", f"{owner!r}'s {which!r} reconstructs out of range")
        return value.to_bytes(32, "big")

    def result(self) -> np.ndarray:
        """`Σ_{u ∈ U3} x_u` (uint64, modulo 2^64). `SecAggError("recovery_failed")` when some secret has
        fewer than `t` shares."""
        s = self.settings
        total = np.zeros(s.length, dtype=np.uint64)
        for u in sorted(self.masked):
            total += self.masked[u]
        info = f"streamfed-secagg/mask/{s.round_id}".encode()
        for u in sorted(self.masked):
            total -= prg(self._secret(u, "b"), s.length, s.round_id, b"self")
        for u in sorted(set(self.shares) - set(self.masked)):  # shared keys, then dropped out
            sk = X25519PrivateKey.from_private_bytes(self._secret(u, "s"))
            for v in self.shares[u]:
                if v not in self.masked:
                    continue  # v dropped too: its masked input is not in the sum
                mask = prg(_agree(sk, self.keys[v].s_pk, info), s.length, s.round_id)
                # v added +mask when v < u: take it out with the opposite sign
                total = total - mask if v < u else total + mask
        return total


# =========================================================================== one round, in process


def run_round(inputs: Mapping[str, np.ndarray], round_id: int = 1, *, degree: int | None = None,
              threshold: int | None = None, graph_seed: int = 0,
              drop_before_sharing: Iterable[str] = (), drop_before_masking: Iterable[str] = (),
              drop_before_unmasking: Iterable[str] = (), stats: dict[str, float] | None = None) -> np.ndarray:
    """Run one round among `inputs`' clients in process, the listed clients dropping out at the given
    step, and return the unmasked sum (of the clients that sent a masked input). Each client is handed only
    what the fleet sends it: its neighbours' keys, their shares, the survivors of its neighbourhood. `stats`,
    when given, receives the bytes each client sent and received on average (`bytes_up`, `bytes_down`) and
    the most any client received (`max_bytes_down`)."""
    clients = tuple(sorted(inputs))
    length = len(next(iter(inputs.values())))
    s = SecAggSettings(round_id, clients, length, degree, threshold, graph_seed)
    dead_share, dead_mask, dead_unmask = set(drop_before_sharing), set(drop_before_masking), set(drop_before_unmasking)
    agents = {c: SecAggClient(c, s.view(c)) for c in clients}  # each knows its neighbourhood, nothing more
    srv = SecAggServer(s)
    up = dict.fromkeys(clients, 0)
    down = dict.fromkeys(clients, 0)
    for c in clients:
        srv.add_keys(agents[c].advertise())
        up[c] += 2 * KEY_BYTES
    alive = [c for c in clients if c not in dead_share]
    for c in alive:
        roster = srv.roster_for(c)
        cts = agents[c].share_keys(roster)
        down[c] += 2 * KEY_BYTES * len(roster)
        srv.add_shares(c, cts)
        up[c] += len(cts) * CIPHERTEXT_BYTES
    alive = [c for c in alive if c not in dead_mask]
    for c in alive:
        fwd = srv.forwarded(c)
        down[c] += len(fwd) * CIPHERTEXT_BYTES
        srv.add_masked(c, agents[c].masked_input(np.asarray(inputs[c], dtype=np.uint64), fwd))
        up[c] += 8 * length
    for c in [c for c in alive if c not in dead_unmask]:
        survivors = srv.survivors_for(c)
        down[c] += len(survivors) * 8
        try:
            shares = agents[c].unmask(survivors)
        except SecAggError as e:
            if e.reason != "bad_survivors":
                raise
            # fewer than t of its neighbourhood survived: it refuses, as a fleet agent does (logged, no answer);
            # its own self-mask cannot be rebuilt then, so the round fails below with `recovery_failed`
            continue
        srv.add_unmasking(c, shares)
        up[c] += len(shares) * (shamir.SHARE_BYTES + 1)
    if stats is not None:
        stats["bytes_up"] = float(np.mean(list(up.values())))
        stats["bytes_down"] = float(np.mean(list(down.values())))
        stats["max_bytes_down"] = float(max(down.values()))
    return srv.result()
