"""Secure aggregation (Bonawitz et al. 2017, "SecAgg"; Bell et al. 2020, "SecAgg+"): the server learns the
sum of the clients' fixed-point vectors in `Z_{2^64}` and nothing else, even when clients drop out.

One round, three steps and a fourth when someone drops early; each message is validated by whoever receives
it (:class:`SecAggError` with a stable `reason`, never a traceback), with exact sizes:

1. **advertise keys** — client `u` makes two X25519 key pairs (`c_u` to encrypt shares, `s_u` to agree
   on masks) and sends both public keys (32 bytes each). The server keeps the set `U1` and sends each client
   its neighbours' keys.
2. **shares and masked input, one message** — `u` draws a self-mask seed `b_u` (32 bytes), splits `b_u` and its
   mask secret key `s_u^SK` into Shamir shares (threshold `t`) for its neighbours `N(u) ∩ U1`, encrypts each
   neighbour's two shares with ChaCha20-Poly1305 under `KA(c_u, c_v)` (the server holds them; it cannot read
   them), and sends with them `y_u = x_u + PRG(b_u) + Σ_{v ∈ N(u) ∩ U1} ±PRG(KA(s_u, s_v))` (`+` when
   `u < v`). Both need only the neighbours' keys. `U2` = clients whose message arrived.
3. **pairwise seeds** (only if `U1 \\ U2` is not empty) — each `u ∈ U2` with neighbours in `U1 \\ U2` reveals the
   seeds `HKDF(KA(s_u, s_v))` of its masks with them: those clients' inputs are not in the sum and they shared
   nothing, so the seeds say nothing about them, and `x_u` stays hidden by its self-mask. A client asked that
   does not answer is taken out of the sum. `U3` = the rest of `U2`.
4. **unmasking** — the server forwards to each survivor the ciphertexts its neighbours of `U2` sent it, with
   the list of survivors among them; it reveals its share of `b_v` if `v ∈ U3`, else of `s_v^SK` (never both,
   and neither for a neighbour whose pairwise seed it revealed). With `t` shares the server removes the
   self-masks of `U3`, the masks of `U3` with `U1 \\ U2` (the seeds) and with `U2 \\ U3` (the rebuilt keys).

Bonawitz's protocol sends the shares, has the server forward them, then takes the masked input of the clients
whose shares arrived: seven messages a client. Masking with every neighbour of the roster at once saves the
round trip of the forward; the price is step 3, paid only by the neighbours of a client that left between
its roster and its input.

The result is `Σ_{u ∈ U3} x_u` exactly (integers modulo 2^64). Neighbours: every other client (SecAgg),
or `k = O(log n)` of them on a random Harary graph drawn from a public seed (SecAgg+), which brings the
client's cost from `O(n)` key agreements and shares to `O(log n)`.

The PRG is the ChaCha20 keystream under a key derived with HKDF-SHA256 from the secret and the round id,
so masks of two rounds never repeat.

>>> import numpy as np
>>> xs = {c: np.full(4, i, dtype=np.uint64) for i, c in enumerate(["a", "b", "c", "d"])}
>>> run_round(xs, round_id=1, drop_before_sharing={"d"}).tolist()
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

__all__ = ["CIPHERTEXT_BYTES", "KEY_BYTES", "MAX_VECTOR", "SEED_BYTES", "Neighbourhood", "SecAggClient", "SecAggError",
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
    >>> for c in cs: srv.add_masked(c.client, c.masked_input(x))
    >>> srv.pairwise_requests()  # nobody dropped: no pairwise seeds asked
    {}
    >>> for c in cs: srv.add_unmasking(c.client, c.unmask(srv.survivors_for(c.client), srv.forwarded(c.client)))
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
        self._roster: dict[str, Keys] = {}
        self._aeads: dict[str, ChaCha20Poly1305] = {}
        self._seeds_for: frozenset[str] | None = None  # the dropped neighbours whose pairwise seeds I revealed
        self._revealed = False
        self._masked: tuple[np.ndarray, np.ndarray] | None = None  # (x, y) of the one input masked this round

    def advertise(self) -> Keys:
        """Step 1: my two public keys."""
        return Keys(self.client, _raw_public(self._c_sk), _raw_public(self._s_sk))

    def _aead(self, other: str) -> ChaCha20Poly1305:
        # kept from step 2 to step 4: a key agreement is most of a client's work in a round
        if other not in self._aeads:
            self._aeads[other] = ChaCha20Poly1305(_agree(self._c_sk, self._roster[other].c_pk,
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
        if self._roster and self._roster != dict(roster):
            raise SecAggError("out_of_order", "a second, different roster in one round")
        self._roster = dict(roster)
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

    def masked_input(self, x: np.ndarray) -> np.ndarray:
        """Step 2, with the shares: `y_u` of my fixed-point vector `x` (uint64, the round's length), masked with
        every neighbour in my roster (`U1 ∩ N(u)`: all it needs are their mask keys, so it leaves in the same
        message as my shares). A neighbour that then sends nothing has its mask with me removed by the key I
        reveal in :meth:`pairwise`. Once per round: the same input again gives the same bytes, another is
        refused."""
        v = self.view
        x = np.asarray(x)
        if x.dtype != np.uint64 or x.shape != (v.length,):
            raise SecAggError("bad_vector", f"input must be uint64 of shape ({v.length},), got {x.dtype} {x.shape}")
        if not self._roster:
            raise SecAggError("out_of_order", "masked input before share keys")
        if self._masked is not None:
            # one input per round: a second one masked alike would give away the difference of the two
            if np.array_equal(self._masked[0], x):
                return self._masked[1].copy()
            raise SecAggError("out_of_order", "a second masked input in one round")
        # rows: my self-mask, then the masks I add (neighbours after me), then those I subtract (before me)
        peers = sorted(u for u in self._roster if u != self.client)
        after = [u for u in peers if self.client < u]
        before = [u for u in peers if u < self.client]
        m = masks([(self._b, b"self"), *((self._pair_key(u), b"mask") for u in (*after, *before))], v.length,
                  v.round_id)
        # uint64 sums wrap modulo 2^64: y = x + PRG(b) + Σ_after PRG(s_uv) − Σ_before PRG(s_uv)
        y = x + m[: 1 + len(after)].sum(axis=0, dtype=np.uint64)
        if before:
            y -= m[1 + len(after):].sum(axis=0, dtype=np.uint64)
        self._masked = (x.copy(), y.copy())
        return y

    def _pair_key(self, other: str) -> bytes:
        # the HKDF of my mask agreement with `other` this round: the seed of our pairwise mask
        return _agree(self._s_sk, self._roster[other].s_pk, _info(b"mask", self.view.round_id))

    def pairwise(self, dropped: Collection[str]) -> dict[str, bytes]:
        """Step 3, only when some neighbours sent nothing after the roster: the seeds of my pairwise masks with
        those `dropped` neighbours (32 bytes each), so that the server can take them out of the sum. A dropped
        neighbour's input is not in the sum and it shared no secret, so the seed tells nothing about it; my own
        input stays hidden by my self-mask. Once per round (the same request again gives the same bytes); I never
        reveal a share of a neighbour whose seed I revealed (:meth:`unmask` refuses), so the server cannot get
        both its pairwise masks and its self-mask from me."""
        dropped = frozenset(dropped)
        if self._masked is None:
            raise SecAggError("out_of_order", "pairwise seeds asked before my masked input")
        if not dropped or not dropped <= set(self._roster) - {self.client}:
            raise SecAggError("bad_dropped", "dropped clients must be neighbours of my roster")
        if self._revealed:
            raise SecAggError("out_of_order", "pairwise seeds asked after unmasking")
        if self._seeds_for is not None:
            if self._seeds_for != dropped:
                raise SecAggError("out_of_order", "pairwise seeds asked again for other neighbours")
        self._seeds_for = dropped
        return {u: self._pair_key(u) for u in sorted(dropped)}

    def unmask(self, survivors: Collection[str], received: Mapping[str, bytes]) -> dict[str, tuple[str, bytes]]:
        """Step 4: given the ciphertexts my neighbours sent me (`received`: sender → ciphertext, forwarded now)
        and which of them are summed (`survivors`: the survivors of my neighbourhood and I), for each sender my
        share of its self-mask seed (`"b"`) if it is a survivor, else of its mask secret key (`"s"`: it sent its
        input but left before the sum, which no longer holds it). Once per round."""
        if self._revealed:
            raise SecAggError("out_of_order", "unmasking asked twice")
        if self._masked is None:
            raise SecAggError("out_of_order", "unmasking before my masked input")
        v = self.view
        survivors = set(survivors)
        for u, ct in received.items():
            if u not in v.neighbours or u not in self._roster:
                raise SecAggError("not_a_neighbour", f"shares from {u!r}")
            if not isinstance(ct, bytes) or len(ct) != CIPHERTEXT_BYTES:
                raise SecAggError("bad_ciphertext", f"from {u!r}: {len(ct) if isinstance(ct, bytes) else ct!r}")
        if self._seeds_for is not None and self._seeds_for & (set(received) | survivors):
            # its pairwise seed is out: a share of its secrets as well could hand the server its input
            raise SecAggError("bad_survivors", "shares asked of a neighbour whose pairwise seed I revealed")
        if not survivors <= set(received) | {self.client}:
            raise SecAggError("bad_survivors", "survivors that are not neighbours who sent me shares")
        if self.client not in survivors:
            raise SecAggError("bad_survivors", "I sent my masked input but am not listed as a survivor")
        if len(survivors) < v.threshold:
            raise SecAggError("bad_survivors", f"{len(survivors)} survivors, below the threshold")
        self._revealed = True
        out = {}
        for u in sorted(received):
            try:
                plain = self._aead(u).decrypt(_nonce(u, self.client), received[u], _aad(v.round_id, u, self.client))
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
        self.masked: dict[str, np.ndarray] = {}  # U2: their shares and masked input (one message)
        self._requests: dict[str, tuple[str, ...]] | None = None  # step 3's requests, once step 2 closed
        self.pairwise: dict[str, dict[str, bytes]] = {}  # asked client → dropped neighbour → pairwise seed
        self._survivors: frozenset[str] | None = None  # U3, once announced
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

    # step 2: a client's shares and its masked input arrive together
    def add_shares(self, sender: str, cts: Mapping[str, bytes]) -> None:
        s = self.settings
        if sender not in self.keys:
            raise SecAggError("out_of_order", f"shares from {sender!r}, who advertised no keys")
        if sender in self.shares:
            raise SecAggError("duplicate", f"shares of {sender!r} twice")
        if self._requests is not None:
            raise SecAggError("out_of_order", f"shares from {sender!r} after the stage closed")
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

    def add_masked(self, sender: str, y: np.ndarray) -> None:
        s = self.settings
        if sender not in self.shares:
            raise SecAggError("out_of_order", f"masked input from {sender!r}, who shared no keys")
        if self._requests is not None:
            raise SecAggError("out_of_order", f"masked input from {sender!r} after the stage closed")
        if sender in self.masked:
            raise SecAggError("duplicate", f"masked input of {sender!r} twice")
        y = np.asarray(y)
        if y.dtype != np.uint64 or y.shape != (s.length,):
            raise SecAggError("bad_vector", f"from {sender!r}: {y.dtype} {y.shape}, expected uint64 ({s.length},)")
        self.masked[sender] = y

    def dropped(self) -> frozenset[str]:
        """`U1 \\ U2`: clients that advertised keys (their neighbours masked with them) and sent no input."""
        return frozenset(self.keys) - frozenset(self.masked)

    # step 3, only when some client of U1 sent no input
    def pairwise_requests(self) -> dict[str, tuple[str, ...]]:
        """Closes step 2: for each client of `U2` with neighbours in `U1 \\ U2`, those neighbours (it masked with
        them; it is asked for the seeds of those masks). Empty when nobody dropped: step 3 is skipped."""
        if self._requests is None:
            gone = self.dropped()
            self._requests = {}
            for u in sorted(self.masked):
                lost = tuple(v for v in self.settings.neighbours[u] if v in gone)
                if lost:
                    self._requests[u] = lost
        return dict(self._requests)

    def add_pairwise(self, sender: str, seeds: Mapping[str, bytes]) -> None:
        requests = self.pairwise_requests()
        if sender not in requests or self._survivors is not None:
            raise SecAggError("out_of_order", f"pairwise seeds from {sender!r}, who was not asked for them")
        if sender in self.pairwise:
            raise SecAggError("duplicate", f"pairwise seeds of {sender!r} twice")
        if set(seeds) != set(requests[sender]):
            raise SecAggError("bad_dropped", f"{sender!r} sent seeds of other neighbours than asked")
        if not all(isinstance(k, bytes) and len(k) == SEED_BYTES for k in seeds.values()):
            raise SecAggError("bad_seed", f"{sender!r}: seeds must be {SEED_BYTES} bytes")
        self.pairwise[sender] = dict(seeds)

    def survivors(self) -> frozenset[str]:
        """`U3`, announced for step 4 (closes step 3): the clients of `U2` whose input stays in the sum — all of
        them but those asked for pairwise seeds that did not send them (their input is taken out: their masks
        with the dropped cannot be)."""
        if self._survivors is None:
            requests = self.pairwise_requests()
            self._survivors = frozenset(u for u in self.masked if u not in requests or u in self.pairwise)
        if len(self._survivors) < self.settings.threshold:
            raise SecAggError("too_few_clients", f"{len(self._survivors)} masked inputs")
        return self._survivors

    def survivors_for(self, client: str) -> frozenset[str]:
        """What `client` is told in step 4: the survivors among its neighbours, and itself."""
        alive = self.survivors()
        return frozenset(c for c in (client, *self.settings.neighbours[client]) if c in alive)

    def forwarded(self, receiver: str) -> dict[str, bytes]:
        """What `receiver` gets in step 4 with its survivors: the ciphertexts addressed to it by neighbours of
        `U2` (those of a client that sent no input are never forwarded: nothing of its secrets is needed)."""
        return {u: self.shares[u][receiver] for u in self.settings.neighbours[receiver]
                if u in self.masked and receiver in self.shares[u]}

    # step 4
    def add_unmasking(self, sender: str, shares: Mapping[str, tuple[str, bytes]]) -> None:
        alive = self.survivors()
        if sender not in alive:
            raise SecAggError("out_of_order", f"unmasking from {sender!r}, not a survivor")
        if sender in self.unmasking:
            raise SecAggError("duplicate", f"unmasking of {sender!r} twice")
        for u, (which, share) in shares.items():
            if u not in self.masked or sender not in self.shares[u]:
                raise SecAggError("not_a_neighbour", f"{sender!r} holds no share of {u!r}")
            if which != ("b" if u in alive else "s"):
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
        alive = self.survivors()
        total = np.zeros(s.length, dtype=np.uint64)
        for u in sorted(alive):
            total += self.masked[u]
        for u in sorted(alive):
            total -= prg(self._secret(u, "b"), s.length, s.round_id, b"self")
        # the masks of survivors with clients that sent no input: from the seeds the survivors revealed
        for u in sorted(alive):
            for v, seed in sorted(self.pairwise.get(u, {}).items()):
                mask = prg(seed, s.length, s.round_id)
                total = total - mask if u < v else total + mask  # u added +mask when u < v
        # the masks of survivors with clients whose input was taken out: from those clients' rebuilt mask keys
        info = _info(b"mask", s.round_id)
        for u in sorted(set(self.masked) - alive):
            sk = X25519PrivateKey.from_private_bytes(self._secret(u, "s"))
            for v in s.neighbours[u]:
                if v not in alive:
                    continue  # v's input is not in the sum either
                mask = prg(_agree(sk, self.keys[v].s_pk, info), s.length, s.round_id)
                # v added +mask when v < u: take it out with the opposite sign
                total = total - mask if v < u else total + mask
        return total


# =========================================================================== one round, in process


def run_round(inputs: Mapping[str, np.ndarray], round_id: int = 1, *, degree: int | None = None,
              threshold: int | None = None, graph_seed: int = 0,
              drop_before_sharing: Iterable[str] = (), drop_before_masking: Iterable[str] = (),
              drop_before_unmasking: Iterable[str] = (), stats: dict[str, float] | None = None,
              summed_out: set[str] | None = None) -> np.ndarray:
    """Run one round among `inputs`' clients in process, the listed clients dropping out at the given
    step — before their shares and masked input (`drop_before_sharing`), after them (`drop_before_masking`:
    they answer nothing more, so one asked for pairwise seeds is taken out of the sum), or after the pairwise
    seeds (`drop_before_unmasking`) — and return the unmasked sum of the survivors (`summed_out`, when given,
    receives their names). Each client is handed only what the fleet sends it: its neighbours' keys, which of
    them dropped, their shares and the survivors of its neighbourhood. `stats`,
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
    for c in alive:  # step 2: the shares and the masked input, one message
        roster = srv.roster_for(c)
        cts = agents[c].share_keys(roster)
        y = agents[c].masked_input(np.asarray(inputs[c], dtype=np.uint64))
        down[c] += 2 * KEY_BYTES * len(roster)
        srv.add_shares(c, cts)
        srv.add_masked(c, y)
        up[c] += len(cts) * CIPHERTEXT_BYTES + 8 * length
    alive = [c for c in alive if c not in dead_mask]  # sent their input, then left: answer nothing more
    for c, lost in srv.pairwise_requests().items():  # step 3: only when someone sent no input
        if c in alive:
            down[c] += 8 * len(lost)
            srv.add_pairwise(c, agents[c].pairwise(lost))
            up[c] += len(lost) * SEED_BYTES
    summed = srv.survivors()
    if summed_out is not None:
        summed_out.update(summed)
    for c in [c for c in alive if c in summed and c not in dead_unmask]:
        survivors, fwd = srv.survivors_for(c), srv.forwarded(c)
        down[c] += len(survivors) * 8 + len(fwd) * CIPHERTEXT_BYTES
        try:
            shares = agents[c].unmask(survivors, fwd)
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
