"""Secure aggregation over the fleet's MQTT topics (docs/privacy.md): the message kinds, the agent's half
(:class:`SecAggAgent`) and the aggregator's (:class:`SecAggCoordinator`), both transport-free.

What is summed is generic: each agent turns its not-yet-included updates into the *partial sum* form its
algorithm already defines for sharded aggregation (`Aggregation.partial`), encodes the partial's floating
arrays in fixed point, and takes part in one SecAgg+ round (:mod:`.secagg`); the aggregator unmasks the sum of
the survivors and folds it in with `Aggregation.read_partial` / `apply_partial` — as a reducer folds a shard's
partial. Nothing asks which algorithm runs.

Kinds (meta `round` on each: the aggregator's round id), on the existing topics and ACLs:

* agent → aggregator on `updates/<client>`: ``secagg.keys`` (two X25519 public keys), ``secagg.shares`` (one
  148-byte ciphertext per neighbour), ``secagg.masked`` (the masked vector, uint64; its `seq` and `n_samples`
  are those of the newest update it sums), ``secagg.unmask`` (66-byte shares);
* aggregator → one agent on `acks/<client>` (which only that agent may read): ``secagg.roster`` (the agent
  and its neighbours in the round's graph as `included` = {name: index in the round's sorted names}, their
  keys, and meta `members`), ``secagg.forward`` (the ciphertexts addressed to it), ``secagg.survivors`` (the
  survivors of its neighbourhood). Each is `O(k)` bytes, `k` the neighbourhood size, whatever the fleet's size.

The aggregator closes a stage when every member of the previous one has answered, or after `timeout` seconds
with enough of them; a round that cannot finish is dropped (counted), and its agents start a new one with
fresh keys after their own timeout. The fixed-point scale is public: `frac_bits_for(secagg_max_abs,
max_clients)`.

>>> from streamfed.fleet.config import FleetConfig
>>> cfg = FleetConfig(fleet="f", algorithm="fedbnr", n_inputs=1, n_features=1, kernels=["gaussian:1.0"],
...                   secure_aggregation=True)
>>> sorted(k for k in cfg.protocol_schema.kinds if k.startswith("secagg."))[:3]
['secagg.forward', 'secagg.keys', 'secagg.masked']
>>> summed_layout(cfg)
[('S_upper', (1, 6)), ('b', (1, 3)), ('n', ()), ('q', ())]
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from streamfed.privacy import fixed_point, shamir
from streamfed.privacy.secagg import (
    CIPHERTEXT_BYTES,
    KEY_BYTES,
    Keys,
    Neighbourhood,
    SecAggClient,
    SecAggError,
    SecAggServer,
    SecAggSettings,
    roster_seed,
)
from streamfed.wire.message import Message
from streamfed.wire.schema import ArraySpec, MessageSchema, MetaSpec
from streamfed.wire.topics import Channel

if TYPE_CHECKING:
    from streamfed.fleet.config import FleetConfig

__all__ = ["DOWN_KINDS", "UP_KINDS", "SecAggAgent", "SecAggCoordinator", "frac_bits", "schemas", "summed_layout"]

log = logging.getLogger(__name__)

KEYS, SHARES, MASKED, UNMASK = "secagg.keys", "secagg.shares", "secagg.masked", "secagg.unmask"
ROSTER, FORWARD, SURVIVORS = "secagg.roster", "secagg.forward", "secagg.survivors"
UP_KINDS = (KEYS, SHARES, MASKED, UNMASK)
DOWN_KINDS = (ROSTER, FORWARD, SURVIVORS)
# An agent's patience in a round grows with the round: the aggregator sends each stage's messages to every member
# and closes a stage when all have answered (or at its `stage_wait`), so the wait between two of an agent's steps
# is up to two passes over the members — with 1,000 agents and the aggregator on one loop of a loaded machine,
# 1,000 rosters (64 kB each, when they carried every member's keys) took 45 s, one QoS 1 publish at a time.
# A fixed 10 s made most members of a 1,000-agent round give up and start again, and the round never finished.
PATIENCE_PER_MEMBER = 0.1
# The aggregator's side of the same: a stage waits for its last answers `timeout` plus this much a member (45 s at
# 1,000 with the default 5 s), well inside an agent's patience over two stages. A fixed 5 s closed every stage of a
# 1,000-member round with a fraction of its answers in (the rest counted as dropouts) and the round failed; a
# stage still closes as soon as every member answered, or once answers stopped coming for `timeout` seconds.
STAGE_PER_MEMBER = 0.04
# Before its roster an agent does not know how many members there are; it advertises fresh keys after `timeout`,
# then after twice that, and so on (the aggregator may be distributing a large roster, or be busy with a round
# that refused the keys), and keeps its last pairs: a roster is taken with whichever of them it carries.
KEPT_KEY_PAIRS = 5


def max_degree(max_clients: int) -> int:
    """The largest neighbourhood any round of up to `max_clients` clients has (bounds message sizes)."""
    return max(15, 2 * math.ceil(2 * math.log2(max(max_clients, 2))))


def summed_layout(cfg: FleetConfig) -> list[tuple[str, tuple[int, ...]]]:
    """The floating arrays of the fleet's partial kind with their (fixed) shapes: what is secure-summed."""
    from streamfed import algorithms

    # from the algorithm's own kinds, not the fleet's protocol schema (which is being built from this)
    partial = next(k for k in algorithms.get(cfg.algorithm).schemas(cfg) if k.channel == Channel.PARTIALS)
    out = []
    for a in partial.arrays:
        if a.dtype.startswith("float"):
            if not all(isinstance(d, int) for d in a.shape):
                raise ValueError(f"secure aggregation needs fixed-size partial sums; {a.name!r} has shape {a.shape}")
            out.append((a.name, tuple(int(d) for d in a.shape)))
    return out


def vector_length(cfg: FleetConfig) -> int:
    return sum(math.prod(s) for _, s in summed_layout(cfg))


def frac_bits(cfg: FleetConfig) -> int:
    """The public fixed-point scale: no sum of `max_clients` values within `±secagg_max_abs` overflows."""
    return fixed_point.frac_bits_for(cfg.secagg_max_abs, cfg.max_clients)


def schemas(cfg: FleetConfig) -> list[MessageSchema]:
    """The secure-aggregation kinds of a fleet (sizes bounded by its configuration)."""
    k, n, length = max_degree(cfg.max_clients), cfg.max_clients, vector_length(cfg)
    rnd = (MetaSpec("round"),)
    return [
        MessageSchema(KEYS, Channel.UPDATES, (ArraySpec("c_pk", "uint8", (KEY_BYTES,)),
                                              ArraySpec("s_pk", "uint8", (KEY_BYTES,))), meta=rnd),
        MessageSchema(SHARES, Channel.UPDATES, (ArraySpec("to", "int64", ("k",), index_bound=n, distinct=True),
                                                ArraySpec("ct", "uint8", ("k", CIPHERTEXT_BYTES))),
                      {"k": (1, k)}, meta=rnd),
        # `first`: the oldest update seq the masked input sums (its `seq` is the newest): the aggregator refuses one
        # that reaches back into what it has summed already
        MessageSchema(MASKED, Channel.UPDATES, (ArraySpec("y", "uint64", (length,)),),
                      meta=(*rnd, MetaSpec("first"))),
        MessageSchema(UNMASK, Channel.UPDATES, (ArraySpec("of", "int64", ("k",), index_bound=n, distinct=True),
                                                ArraySpec("which", "uint8", ("k",), index_bound=2),
                                                ArraySpec("share", "uint8", ("k", shamir.SHARE_BYTES))),
                      {"k": (0, k)}, meta=rnd),
        # a member's neighbourhood and itself (`included`: name → index in the round's sorted names), never more
        MessageSchema(ROSTER, Channel.ACKS, (ArraySpec("c_pk", "uint8", ("m", KEY_BYTES)),
                                             ArraySpec("s_pk", "uint8", ("m", KEY_BYTES))),
                      {"m": (2, k + 1)}, meta=(*rnd, MetaSpec("members")), max_included=k + 1),
        MessageSchema(FORWARD, Channel.ACKS, (ArraySpec("from", "int64", ("k",), index_bound=n, distinct=True),
                                              ArraySpec("ct", "uint8", ("k", CIPHERTEXT_BYTES))),
                      {"k": (0, k)}, meta=rnd),
        MessageSchema(SURVIVORS, Channel.ACKS, (ArraySpec("alive", "int64", ("s",), index_bound=n, distinct=True),),
                      {"s": (1, k + 1)}, meta=rnd),
    ]


def _u8(b: bytes) -> np.ndarray:
    return np.frombuffer(b, dtype=np.uint8).copy()


def _row_bytes(a: np.ndarray, rows: int | None = None) -> list[bytes]:
    # the rows of a 2-d uint8 array as byte strings: one copy of the whole, then slices. `rows`: how many its index
    # array says there are (the codec holds both to one dimension; this says so clearly should it not have)
    if a.ndim != 2 or (rows is not None and a.shape[0] != rows):
        raise SecAggError("bad_shape", f"{a.shape} rows of bytes where {rows} were indexed")
    raw, width = a.tobytes(), a.shape[1]
    return [raw[i:i + width] for i in range(0, len(raw), width)] if width else [b""] * a.shape[0]


def _rows(parts: Sequence[bytes], width: int) -> np.ndarray:
    # equal-length byte strings as the rows of one uint8 array: one join and one copy, not one array per row
    return np.frombuffer(b"".join(parts), dtype=np.uint8).reshape(len(parts), width).copy()


def _round_of(msg: Message) -> int:
    r = msg.meta.get("round")
    if type(r) is not int or r < 1:
        raise SecAggError("bad_round", f"meta round {r!r}")
    return r


# =========================================================================== the agent's half


class Contribution(NamedTuple):
    """What an agent adds in a round: its updates not yet in a global, summed in the algorithm's partial form
    (`arrays`), the oldest and newest update seq they cover, their samples and epoch."""

    arrays: Mapping[str, np.ndarray]
    first_seq: int
    seq: int
    n_samples: int
    epoch: int


class SecAggAgent:
    """One agent's part in the fleet's secure-aggregation rounds. `contribution()` gives what it has to add
    now — a :class:`Contribution` or None — read when its masked input is due.

    >>> from streamfed.fleet.config import FleetConfig
    >>> cfg = FleetConfig(fleet="f", algorithm="fedbnr", n_inputs=1, n_features=1, kernels=["gaussian:1.0"],
    ...                   secure_aggregation=True)
    >>> agent = SecAggAgent(cfg, "a", lambda: None)
    >>> agent.tick(0.0)  # nothing to add: nothing to say
    []
    """

    def __init__(self, cfg: FleetConfig, client: str,
                 contribution: Callable[[], Contribution | None],
                 timeout: float = 10.0) -> None:
        self.cfg = cfg
        self.client = client
        self.contribution = contribution
        self.timeout = float(timeout)
        self.layout = summed_layout(cfg)
        self.frac_bits = frac_bits(cfg)
        self._keys: tuple[X25519PrivateKey, X25519PrivateKey] | None = None
        self._advertised: list[tuple[X25519PrivateKey, X25519PrivateKey]] = []  # since the last roster, newest last
        self._round: int | None = None
        self._sa: SecAggClient | None = None
        self._members = 0  # of the round under way
        self._index: dict[str, int] = {}  # my neighbourhood (and I) → index in the round's sorted names
        self._by_index: dict[int, str] = {}
        self._since = 0.0
        self._sent_seq = 0  # newest seq of the masked input sent in the current round
        # this round's replies, sent again as they were when a request repeats (one masked input per round)
        self._masked_reply: Message | None = None
        self._unmask_reply: tuple[frozenset[str], Message] | None = None
        # the last round I left after sending my masked input: (round, client, my index, by index), to unmask it
        self._late: tuple[int, SecAggClient, dict[str, int], dict[int, str]] | None = None
        self.rounds_started = 0
        self.refused = 0  # messages of the aggregator refused (a reason is logged)

    def _msg(self, kind: str, arrays: dict[str, np.ndarray], seq: int = 0, n_samples: int = 0,
             epoch: int = 0, **meta: int) -> Message:
        return Message(self.cfg.fleet, self.client, kind, seq, 0, "", n_samples, time.time(), arrays,
                       {"round": int(self._round or 0) or 1, **meta}, epoch=epoch)

    def patience(self) -> float:
        """How long a step may wait for the aggregator's next message before the round counts as stalled:
        `timeout` plus `PATIENCE_PER_MEMBER` a member once the roster says how many there are; before it,
        `timeout` doubled with each key pair advertised since the last roster."""
        if self._sa is not None:
            return self.timeout + PATIENCE_PER_MEMBER * self._members
        return self.timeout * 2 ** max(0, len(self._advertised) - 1)

    def tick(self, now: float, pending: bool | None = None) -> list[Message]:
        """Start a round (fresh keys) when something waits to be added and no round is under way, or the
        round under way stalled for `patience()` seconds."""
        if pending is None:
            pending = self.contribution() is not None
        if not pending:
            return []
        if self._keys is not None and now - self._since < self.patience():
            return []
        if self._sa is not None:  # a round we were in stalled: its keys are spent
            self._advertised = []
            if self._masked_reply is not None and self._unmask_reply is None and self._round is not None:
                # My masked input is in that round: should it still finish, my neighbours' self-masks need my
                # shares of them. Kept to answer its survivor list once — what I would have revealed had I waited
                # (a round at 1,000 agents on a loaded machine failed with `recovery_failed` when 706 had left).
                self._late = (self._round, self._sa, dict(self._index), dict(self._by_index))
        self._keys = (X25519PrivateKey.generate(), X25519PrivateKey.generate())
        self._advertised = [*self._advertised[-(KEPT_KEY_PAIRS - 1):], self._keys]
        self._round, self._sa, self._since = None, None, now
        self._masked_reply = self._unmask_reply = None
        self.rounds_started += 1
        pub = [k.public_key().public_bytes_raw() for k in self._keys]
        return [Message(self.cfg.fleet, self.client, KEYS, 0, 0, "", 0, time.time(),
                        {"c_pk": _u8(pub[0]), "s_pk": _u8(pub[1])}, {"round": 1})]

    def done(self) -> None:
        """The global includes the round's contribution: forget the round (the next tick may start another)."""
        self._keys, self._round, self._sa = None, None, None
        self._masked_reply = self._unmask_reply = None
        self._advertised = []
        self._late = None

    @property
    def sent_seq(self) -> int:
        return self._sent_seq

    def on_message(self, msg: Message, now: float) -> list[Message]:
        """A `secagg.*` message from the aggregator; what to publish in reply (refusals are logged)."""
        try:
            return self._on_message(msg, now)
        except SecAggError as e:
            self.refused += 1
            if self.refused <= 3 or self.refused % 100 == 0:
                log.warning("agent %s: secure-aggregation message %s refused (%d so far): %s", self.client,
                            msg.kind, self.refused, e)
            return []

    def _on_message(self, msg: Message, now: float) -> list[Message]:
        rid = _round_of(msg)
        if msg.kind == ROSTER:
            if self._keys is None or self._sa is not None:
                raise SecAggError("out_of_order", "a roster while not waiting for one")
            # my neighbourhood only: me and my neighbours, each under its index in the round's sorted names
            members = msg.meta.get("members")
            if type(members) is not int:
                raise SecAggError("bad_roster", f"meta members {members!r}")
            names = tuple(sorted(msg.included, key=msg.included.__getitem__))
            idx = [msg.included[c] for c in names]
            if list(names) != sorted(names) or len(set(idx)) != len(idx) or not all(0 <= i < members for i in idx):
                raise SecAggError("bad_roster", "indices must be distinct, below the member count, in name order")
            c_pk, s_pk = msg.arrays["c_pk"], msg.arrays["s_pk"]
            if c_pk.shape[0] != len(names) or s_pk.shape[0] != len(names) or self.client not in msg.included:
                raise SecAggError("bad_roster", "keys and names disagree, or I am not in it")
            mine = names.index(self.client)
            theirs = (bytes(c_pk[mine]), bytes(s_pk[mine]))
            pair = next((p for p in reversed(self._advertised)
                         if tuple(k.public_key().public_bytes_raw() for k in p) == theirs), None)
            if pair is None:
                raise SecAggError("bad_roster", "my keys in the roster are not mine")
            view = Neighbourhood.announced(rid, self.client, (c for c in names if c != self.client), members,
                                           sum(math.prod(s) for _, s in self.layout))
            self._keys, self._advertised = pair, []
            self._round, self._members, self._since = rid, members, now
            self._index = dict(msg.included)
            self._by_index = {i: c for c, i in msg.included.items()}
            self._masked_reply = self._unmask_reply = None
            self._sa = SecAggClient(self.client, view, keys=self._keys)
            roster = {c: Keys(c, cb, sb) for c, cb, sb in zip(names, _row_bytes(c_pk, len(names)),
                                                           _row_bytes(s_pk, len(names)), strict=True)}
            cts = self._sa.share_keys(roster)
            to = sorted(cts, key=self._index.__getitem__)
            return [self._msg(SHARES, {"to": np.array([self._index[v] for v in to], dtype=np.int64),
                                       "ct": _rows([cts[v] for v in to], CIPHERTEXT_BYTES)})]
        late = self._late
        if msg.kind == SURVIVORS and late is not None and rid == late[0] and rid != self._round:
            self._late = None  # once: a second request for the round is refused below
            return [self._reveal(msg, late[1], late[2], late[3], rid)[1]]
        if self._sa is None or rid != self._round:
            raise SecAggError("wrong_round", f"round {rid}, mine is {self._round}")
        if msg.kind == FORWARD:
            if self._masked_reply is not None:
                # A repeated request (a QoS 1 redelivery, an aggregator that asks again): the same bytes again.
                # Masking a second input with the round's masks would put their difference in the clear.
                return [self._masked_reply]
            idx = msg.arrays["from"].tolist()
            if any(i not in self._by_index for i in idx):
                raise SecAggError("bad_index", "a sender outside my neighbourhood")
            received = {self._by_index[i]: ct for i, ct in zip(idx, _row_bytes(msg.arrays["ct"], len(idx)),
                                                                     strict=True)}
            got = self.contribution()
            if got is None:  # nothing to add any more (a global included it meanwhile): add zeros
                got = Contribution({k: np.zeros(s) for k, s in self.layout}, 0, 0, 0, 0)
            arrays, first, seq, n, epoch = got
            flat = np.concatenate([np.asarray(arrays[k], dtype=np.float64).ravel() for k, _ in self.layout])
            try:
                enc = fixed_point.encode(flat, self.frac_bits, max_abs=self.cfg.secagg_max_abs)
            except ValueError as e:
                raise SecAggError("out_of_range", f"{e} (raise secagg_max_abs)") from None
            y = self._sa.masked_input(enc, received)
            self._sent_seq, self._since = seq, now
            self._masked_reply = self._msg(MASKED, {"y": y}, seq=seq, n_samples=n, epoch=epoch, first=first)
            return [self._masked_reply]
        if msg.kind == SURVIVORS:
            if self._unmask_reply is not None:  # asked again: the same answer, never shares of another set
                idx = msg.arrays["alive"].tolist()
                if any(i not in self._by_index for i in idx):
                    raise SecAggError("bad_index", "a survivor outside my neighbourhood")
                if frozenset(self._by_index[i] for i in idx) != self._unmask_reply[0]:
                    raise SecAggError("out_of_order", "unmasking asked again for other survivors")
                return [self._unmask_reply[1]]
            self._unmask_reply = self._reveal(msg, self._sa, self._index, self._by_index, rid)
            self._since = now
            return [self._unmask_reply[1]]
        raise SecAggError("unknown_kind", msg.kind)

    def _reveal(self, msg: Message, sa: SecAggClient, index: Mapping[str, int], by_index: Mapping[int, str],
                rid: int) -> tuple[frozenset[str], Message]:
        """My unmasking shares for round `rid` given its survivor list (`msg`), and the survivors."""
        idx = msg.arrays["alive"].tolist()
        if any(i not in by_index for i in idx):
            raise SecAggError("bad_index", "a survivor outside my neighbourhood")
        alive = frozenset(by_index[i] for i in idx)
        shares = sa.unmask(alive)
        of = sorted(shares, key=index.__getitem__)
        return alive, self._msg(UNMASK, {
            "of": np.array([index[u] for u in of], dtype=np.int64),
            "which": np.array([0 if shares[u][0] == "b" else 1 for u in of], dtype=np.uint8),
            "share": _rows([shares[u][1] for u in of], shamir.SHARE_BYTES)}, round=rid)


# =========================================================================== the aggregator's half


class SecAggCoordinator:
    """The aggregator's part: one round at a time, stages closed by answers or by the clock. `on_message`
    and `tick` return `(messages for the agents, result)`; a result is `(arrays, n_clients, included, samples,
    epoch)`: the unmasked sum of the survivors' partial arrays, ready for `Aggregation.apply_partial`.

    >>> from streamfed.fleet.config import FleetConfig
    >>> cfg = FleetConfig(fleet="f", algorithm="fedbnr", n_inputs=1, n_features=1, kernels=["gaussian:1.0"],
    ...                   secure_aggregation=True)
    >>> SecAggCoordinator(cfg, expected=lambda: {"a", "b"}).tick(0.0)
    ([], None)
    """

    def __init__(self, cfg: FleetConfig, expected: Callable[[], set[str]], *, gather: float = 0.5,
                 timeout: float = 5.0, min_clients: int = 2, summed: Callable[[str], int] = lambda c: 0) -> None:
        self.cfg = cfg
        self.summed = summed  # client → the newest seq already summed into the global (every one up to it is)
        self.expected = expected  # who a stage waits for before its timer (the lock-step roster, or nobody)
        self.gather = float(gather)  # keys are gathered this long after the first (unless all expected are in)
        self.timeout = float(timeout)
        self.min_clients = max(2, int(min_clients))
        self.layout = summed_layout(cfg)
        self.length = sum(math.prod(s) for _, s in self.layout)
        self.frac_bits = frac_bits(cfg)
        self.next_round = 1
        self.rounds = 0
        self.aborted = 0
        self.rejected: dict[str, int] = {}
        self._reset()

    def _reset(self) -> None:
        self.stage = "keys"
        self._keys: dict[str, Keys] = {}
        self._since: float | None = None
        self._srv: SecAggServer | None = None
        self._names: tuple[str, ...] = ()
        self._index: dict[str, int] = {}
        self._meta: dict[str, tuple[int, int, int]] = {}  # client → (seq, n_samples, epoch) of its masked input
        self._last = -math.inf  # when the stage under way last took an answer

    def progress(self) -> tuple[int, int, int, int, int]:
        """How far the round under way has come: keys, shares, masked inputs and unmaskings in, and rounds
        dropped so far."""
        srv = self._srv
        if srv is None:
            return len(self._keys), 0, 0, 0, self.aborted
        return len(srv.keys), len(srv.shares), len(srv.masked), len(srv.unmasking), self.aborted

    def _reject(self, reason: str, detail: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1
        log.debug("secure aggregation: refused (%s) %s", reason, detail)

    def on_message(self, msg: Message, now: float) -> tuple[list[Message], Any]:
        """One `secagg.*` message from an agent (decoded and validated by the codec)."""
        try:
            self._take(msg, now)
        except SecAggError as e:
            self._reject(e.reason, str(e))
            return [], None
        self._last = now
        return self.tick(now)

    def _take(self, msg: Message, now: float) -> None:
        c = msg.client
        if msg.kind == KEYS:
            if self.stage != "keys":
                raise SecAggError("busy", f"keys of {c!r} while a round is under way (it retries)")
            self._keys[c] = Keys(c, bytes(msg.arrays["c_pk"]), bytes(msg.arrays["s_pk"]))
            if self._since is None:
                self._since = now
            return
        if self._srv is None or _round_of(msg) != self._srv.settings.round_id:
            raise SecAggError("wrong_round", f"{msg.kind} of {c!r} for round {msg.meta.get('round')!r}")
        names = self._names
        if msg.kind == SHARES:
            if self.stage != "shares":
                raise SecAggError("out_of_order", f"shares of {c!r} in stage {self.stage}")
            to = msg.arrays["to"].tolist()
            if any(i >= len(names) for i in to):
                raise SecAggError("bad_index", f"shares of {c!r} to a client outside the roster")
            self._srv.add_shares(c, {names[i]: ct for i, ct in zip(to, _row_bytes(msg.arrays["ct"], len(to)),
                                                                         strict=True)})
        elif msg.kind == MASKED:
            if self.stage != "masked":
                raise SecAggError("out_of_order", f"masked input of {c!r} in stage {self.stage}")
            first, mark = int(msg.meta.get("first", 0)), self.summed(c)
            if msg.n_samples and first <= mark:
                # an agent that gave up on a round whose global it has not seen adds updates summed already: left
                # out of this round (a dropout: its masks cancel), its newer updates come in the next
                raise SecAggError("already_summed", f"masked input of {c!r} sums seqs {first}..{msg.seq}, "
                                  f"but every seq up to {mark} is in the global already")
            self._srv.add_masked(c, np.array(msg.arrays["y"], dtype=np.uint64))
            self._meta[c] = (int(msg.seq), int(msg.n_samples), int(msg.epoch))
        elif msg.kind == UNMASK:
            if self.stage != "unmask":
                raise SecAggError("out_of_order", f"unmasking of {c!r} in stage {self.stage}")
            of, which, share = msg.arrays["of"].tolist(), msg.arrays["which"].tolist(), msg.arrays["share"]
            if any(i >= len(names) for i in of):
                raise SecAggError("bad_index", f"unmasking of {c!r} names a client outside the roster")
            self._srv.add_unmasking(c, {names[i]: ("b" if w == 0 else "s", sh)
                                        for i, w, sh in zip(of, which, _row_bytes(share, len(of)), strict=True)})
        else:
            raise SecAggError("unknown_kind", msg.kind)

    def _down(self, kind: str, client: str, arrays: dict[str, np.ndarray],
              included: Mapping[str, int] | None = None, **meta: int) -> Message:
        assert self._srv is not None
        return Message(self.cfg.fleet, client, kind, self._srv.settings.round_id, 0, "", 0, time.time(), arrays,
                       {"round": self._srv.settings.round_id, **meta}, dict(included or {}))

    def _indices(self, names: Sequence[str]) -> np.ndarray:
        return np.array(sorted(self._index[c] for c in names), dtype=np.int64)

    def stage_wait(self) -> float:
        """The longest a stage of the round under way waits for its last answers: `timeout` plus
        `STAGE_PER_MEMBER` a member, so that it grows with the round as the time its members need to answer does.

        >>> from streamfed.fleet.config import FleetConfig
        >>> cfg = FleetConfig(fleet="f", algorithm="fedbnr", n_inputs=1, n_features=1, kernels=["gaussian:1.0"],
        ...                   secure_aggregation=True)
        >>> c = SecAggCoordinator(cfg, expected=set, timeout=5.0)
        >>> c._names = tuple(f"c{i}" for i in range(1000)); round(c.stage_wait(), 6)
        45.0
        """
        return self.timeout + STAGE_PER_MEMBER * len(self._names)

    def _ready(self, got: AbstractSet[str], want: AbstractSet[str], now: float) -> bool:
        """A stage closes when everyone it waits for answered; or, with some answers in, after :meth:`stage_wait`
        seconds, or once no answer came for `timeout` seconds (the rest dropped out). Views, not copies: this runs
        on every message, and `<=` stops at the sizes until the last answer is in."""
        if not got:
            return False
        if want <= got:
            return True
        since = now if self._since is None else self._since
        return now - since >= self.stage_wait() or now - max(since, self._last) >= self.timeout

    def tick(self, now: float) -> tuple[list[Message], Any]:
        """Close whatever stage is due; abort a round that cannot finish."""
        try:
            return self._tick(now)
        except SecAggError as e:
            self.aborted += 1
            log.warning("secure aggregation: round %s dropped in stage %s: %s", self.next_round - 1, self.stage, e)
            self._reset()
            return [], None

    def _tick(self, now: float) -> tuple[list[Message], Any]:
        if self.stage == "keys":
            want = self.expected() or set(self._keys)
            if not (len(self._keys) >= self.min_clients and self._ready_keys(want, now)):
                return [], None
            names = tuple(sorted(self._keys))
            settings = SecAggSettings(self.next_round, names, self.length, graph_seed=roster_seed(
                self.next_round, {c: (self._keys[c].c_pk, self._keys[c].s_pk) for c in names}))
            self.next_round += 1
            self._srv = SecAggServer(settings)
            for k in self._keys.values():
                self._srv.add_keys(k)
            self._names, self.stage, self._since = names, "shares", now
            self._index = {c: i for i, c in enumerate(names)}
            self._srv.roster()  # refuses a round below the threshold
            # each member gets its own neighbourhood's keys on its own acks topic: O(k) bytes, not O(n)
            c_pk = _rows([self._keys[c].c_pk for c in names], KEY_BYTES)
            s_pk = _rows([self._keys[c].s_pk for c in names], KEY_BYTES)
            out = []
            for c in names:
                rows = self._indices(self._srv.roster_for(c))
                out.append(self._down(ROSTER, c, {"c_pk": c_pk[rows], "s_pk": s_pk[rows]},
                                      {names[i]: int(i) for i in rows}, members=len(names)))
            return out, None
        assert self._srv is not None
        srv = self._srv
        if self.stage == "shares":
            if not self._ready(srv.shares.keys(), srv.keys.keys(), now):
                return self._stalled(now)
            self.stage, self._since = "masked", now
            out = []
            for c in sorted(srv.shares):
                fwd = srv.forwarded(c)
                frm = sorted(fwd, key=self._index.__getitem__)
                out.append(self._down(FORWARD, c, {
                    "from": np.array([self._index[u] for u in frm], dtype=np.int64),
                    "ct": _rows([fwd[u] for u in frm], CIPHERTEXT_BYTES)}))
            return out, None
        if self.stage == "masked":
            if not self._ready(srv.masked.keys(), srv.shares.keys(), now):
                return self._stalled(now)
            alive = srv.survivors()
            if len(alive) < self.min_clients:  # never unmasked: with distributed DP its noise would fall short
                raise SecAggError("too_few_survivors", f"{len(alive)} masked inputs, at least {self.min_clients} "
                                  "needed (dp_round_clients)")
            self.stage, self._since = "unmask", now
            # each survivor hears only which of its neighbours survived (it reveals shares of those alone)
            return [self._down(SURVIVORS, c, {"alive": self._indices(srv.survivors_for(c))})
                    for c in sorted(alive)], None
        # unmask
        if not self._ready(srv.unmasking.keys(), srv.masked.keys(), now):
            return self._stalled(now)
        total = fixed_point.decode(srv.result(), self.frac_bits)
        meta = dict(self._meta)
        epochs = {m[2] for m in meta.values()}
        if len(epochs) != 1:
            raise SecAggError("mixed_epochs", f"survivors computed against epochs {sorted(epochs)}")
        arrays, pos = {}, 0
        for k, shape in self.layout:
            size = math.prod(shape)
            arrays[k] = total[pos:pos + size].reshape(shape)
            pos += size
        if not np.all(np.isfinite(total)):
            raise SecAggError("non_finite", "the unmasked sum")
        included = {c: s for c, (s, _, _) in meta.items() if s > 0}
        samples = sum(n for _, n, _ in meta.values())
        self.rounds += 1
        self._reset()
        return [], (arrays, len(meta), included, samples, epochs.pop())

    def _ready_keys(self, want: AbstractSet[str], now: float) -> bool:
        # keys are gathered for `gather` seconds after the first, unless every expected client's are in already
        got = self._keys.keys()
        return bool(got) and (want <= got or (self._since is not None and now - self._since >= self.gather))

    def _stalled(self, now: float) -> tuple[list[Message], Any]:
        # reached only while a stage has no answer at all
        wait = max(2 * self.timeout, self.stage_wait())
        if self._since is not None and now - self._since >= wait:
            raise SecAggError("stalled", f"no answer for {wait:g} s")
        return [], None


def run_in_process(agents: Sequence[SecAggAgent], coordinator: SecAggCoordinator, now: float = 0.0) -> Any:
    """Route one round's messages between `agents` and `coordinator` directly (tests): returns the result."""
    box = {a.client: a for a in agents}
    queue = [m for a in agents for m in a.tick(now)]
    result = None
    while queue:
        m = queue.pop(0)
        if m.kind in UP_KINDS:
            out, res = coordinator.on_message(m, now)
            result = res or result
        else:
            out = box[m.client].on_message(m, now)
        queue += out
        if not queue and result is None:
            out, res = coordinator.tick(now + coordinator.gather)
            queue += out
            result = res or result
    return result
