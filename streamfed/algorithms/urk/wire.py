"""URK-FedBNR on the wire. The envelope's `epoch` is the kernel version (the network).

* ``urk.update`` — either phase-2 statistics `S_upper (F(F+1)/2)`, `b (F)`, `n ≥ 1`, `q` (and an empty
  `chunk`), or one chunk of a phase-1 proposal: `chunk (≤ max_chunk_bytes / 8)`, `part = (proposal seq,
  chunk index, chunk count, whole length)`, `weight` (and empty `S_upper`, `b`, `n = q = 0`). One kind for
  both because an agent sends every upload of a fleet under the fleet's one update kind; the arrays say which.
* ``urk.global`` — the network's flat vector `theta`, the summed statistics of its version, `σ, λ` of the
  last layer and its log evidence.
* ``urk.partial`` — a shard's summed statistics with their `(client, seq)` pairs (proposals do not travel
  through shards: with kernel learning, run one aggregator).

With a half-life (`half_life_s`) updates and globals also carry `time ()`, the time their statistics are
discounted to (a chunk update: 0); a statistics update's `n_samples` is then its raw sample count. Without one the
schemas are unchanged.

>>> from streamfed.fleet.config import FleetConfig
>>> cfg = FleetConfig(fleet="f", algorithm="urk-fedbnr", n_inputs=2,
...                   params={"widths": [3], "n_omega": 2, "max_chunk_bytes": 64})
>>> {k: s for k, (_, s) in cfg.array_shapes("urk.update").items()}
{'S_upper': ('s',), 'b': ('f',), 'n': (), 'q': (), 'chunk': ('p',), 'part': (4,), 'weight': ()}
>>> cfg.message_schema("urk.update").dims["p"], cfg.message_schema("urk.update").dims["s"]
((0, 8), (0, 10))
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

from streamfed.algorithms.base import Update, params_of
from streamfed.algorithms.chunks import Chunk
from streamfed.algorithms.urk import URKParams
from streamfed.algorithms.urk.messages import ChunkItem, StatsItem, URKGlobal
from streamfed.core.stats import SufficientStats, pack_upper, unpack_upper
from streamfed.wire.message import Message
from streamfed.wire.schema import ArraySpec, MessageSchema, MetaSpec, contributor_arrays, contributor_dims
from streamfed.wire.topics import Channel

if TYPE_CHECKING:
    from streamfed.algorithms.urk.network import URKArch
    from streamfed.fleet.config import FleetConfig

__all__ = ["GLOBAL", "PARTIAL", "UPDATE", "chunk_update", "global_message", "read_global", "read_update",
           "schemas", "stats_update"]

UPDATE, GLOBAL, PARTIAL = "urk.update", "urk.global", "urk.partial"
_EMPTY = np.zeros(0)


def max_chunk_numbers(max_chunk_bytes: int) -> int:
    """Float64 numbers a chunk may carry."""
    return max(1, int(max_chunk_bytes) // 8)


def schemas(cfg: FleetConfig) -> list[MessageSchema]:
    from streamfed.algorithms.urk import arch_of

    arch = arch_of(cfg)
    f = arch.dim
    s = f * (f + 1) // 2
    scal = (ArraySpec("n", "float64", (), nonnegative=True), ArraySpec("q", "float64", (), nonnegative=True))
    fixed = (ArraySpec("S_upper", "float64", (s,)), ArraySpec("b", "float64", (f,)), *scal)
    params = params_of(cfg, URKParams)
    p = min(max_chunk_numbers(params.max_chunk_bytes), arch.n_params)
    timed = (ArraySpec("time", "float64", ()),) if params.half_life_s is not None else ()
    return [
        MessageSchema(UPDATE, Channel.UPDATES, (
            ArraySpec("S_upper", "float64", ("s",)), ArraySpec("b", "float64", ("f",)), *scal,
            ArraySpec("chunk", "float64", ("p",)), ArraySpec("part", "int64", (4,), nonnegative=True),
            ArraySpec("weight", "float64", (), nonnegative=True), *timed), {"s": (0, s), "f": (0, f), "p": (0, p)}),
        MessageSchema(GLOBAL, Channel.GLOBAL, fixed + (
            ArraySpec("sigma", "float64", (), positive=True), ArraySpec("lam", "float64", (), positive=True),
            ArraySpec("log_evidence", "float64", ()), ArraySpec("theta", "float64", (arch.n_params,)), *timed),
            max_included=cfg.max_clients),
        MessageSchema(PARTIAL, Channel.PARTIALS, fixed + contributor_arrays(), contributor_dims(cfg),
                      meta=(MetaSpec("round"),), max_included=cfg.max_clients),
    ]


def stats_update(stats: SufficientStats, seq: int, base_version: int, epoch: int, time: float | None = None,
                 count: int = 0) -> Update:
    """A phase-2 upload (statistics of one feature map: batch shape `(1,)` or `()`); with forgetting, discounted
    to `time`, of `count` raw samples (its `n_samples`)."""
    arrays = {"S_upper": pack_upper(stats.S.reshape(stats.dim, stats.dim)), "b": stats.b.reshape(-1).copy(),
              "n": np.asarray(stats.n), "q": np.asarray(stats.q), "chunk": _EMPTY,
              "part": np.zeros(4, dtype=np.int64), "weight": np.asarray(0.0)}
    if time is not None:
        arrays["time"] = np.asarray(float(time))
    return Update(arrays, int(count) if time is not None else int(round(stats.n)), int(base_version), seq=int(seq),
                  epoch=int(epoch))


def chunk_update(chunk: Chunk, weight: float, seq: int, base_version: int, epoch: int, timed: bool = False
                 ) -> Update:
    """One chunk of a phase-1 proposal (it summarises no samples of the statistics: `n_samples = 0`; `timed`: the
    fleet forgets, the schema has a `time`, 0 here)."""
    part = np.array([chunk.seq, chunk.index, chunk.count, chunk.total], dtype=np.int64)
    arrays = {"S_upper": _EMPTY, "b": _EMPTY, "n": np.asarray(0.0), "q": np.asarray(0.0),
              "chunk": np.array(chunk.data, dtype=np.float64), "part": part, "weight": np.asarray(float(weight))}
    if timed:
        arrays["time"] = np.asarray(0.0)
    return Update(arrays, 0, int(base_version), seq=int(seq), epoch=int(epoch))


def read_update(msg: Message, arch: URKArch, kernel_version: str) -> StatsItem | ChunkItem:
    """A decoded `urk.update` as the item it carries (`ValueError` for one that is neither or both)."""
    if msg.kind != UPDATE:
        raise ValueError(f"expected a {UPDATE!r} message, got {msg.kind!r}")
    a = msg.arrays
    f = arch.dim
    has_stats, has_chunk = a["b"].size > 0 or a["S_upper"].size > 0, a["chunk"].size > 0
    if has_stats == has_chunk:
        raise ValueError("an update carries either statistics or one chunk of a proposal")
    if has_chunk:
        if float(a["n"]) != 0.0 or float(a["q"]) != 0.0 or msg.n_samples != 0:
            raise ValueError("a chunk update counts no samples")
        seq, index, count, total = (int(v) for v in a["part"])
        chunk = Chunk(seq, index, count, total, np.array(a["chunk"], dtype=np.float64))
        return ChunkItem(msg.client, int(msg.seq), int(msg.global_version), int(msg.epoch), chunk, float(a["weight"]))
    if a["b"].shape != (f,) or a["S_upper"].shape != (f * (f + 1) // 2,):
        raise ValueError(f"statistics of F = {a['b'].size}, expected {f}")
    if np.any(a["part"] != 0) or float(a["weight"]) != 0.0:
        raise ValueError("a statistics update carries no chunk header")
    # tagged with this fleet's kernel version and the client's epoch: the server compares the epoch
    stats = SufficientStats(unpack_upper(np.array(a["S_upper"], dtype=np.float64), f)[None],
                            np.array(a["b"], dtype=np.float64)[None], float(a["n"]), float(a["q"]),
                            kernel_version, int(msg.epoch))
    if "time" in a:  # with forgetting: the reference time, and n_samples the raw count (n ≤ it: the server checks)
        return StatsItem(msg.client, int(msg.seq), int(msg.global_version), int(msg.epoch), stats,
                         float(a["time"]), int(msg.n_samples))
    if msg.n_samples != int(round(stats.n)):
        raise ValueError(f"n_samples {msg.n_samples} but n = {stats.n:g}")
    return StatsItem(msg.client, int(msg.seq), int(msg.global_version), int(msg.epoch), stats)


def global_message(fleet: str, sender: str, g: URKGlobal, kernel_version: str, created: float | None = None,
                   timed: bool = False) -> Message:
    """The `urk.global` of `g` (`timed`: with forgetting, its reference time as the array `time`)."""
    st = g.stats
    f = st.dim
    arrays = {"S_upper": pack_upper(st.S.reshape(f, f)), "b": st.b.reshape(-1).copy(), "n": np.asarray(st.n),
              "q": np.asarray(st.q), "sigma": np.asarray(float(g.sigma)), "lam": np.asarray(float(g.lam)),
              "log_evidence": np.asarray(float(g.log_evidence)), "theta": np.array(g.theta, dtype=np.float64)}
    if timed:
        arrays["time"] = np.asarray(float(g.time))
    return Message(fleet, sender, GLOBAL, g.version, g.version, kernel_version, max(int(round(st.n)), 0),
                   time.time() if created is None else float(created), arrays, {}, dict(g.included), int(g.epoch))


def read_global(msg: Message) -> URKGlobal:
    if msg.kind != GLOBAL:
        raise ValueError(f"expected a {GLOBAL!r} message, got {msg.kind!r}")
    a = msg.arrays
    f = a["b"].size
    stats = SufficientStats(unpack_upper(np.array(a["S_upper"], dtype=np.float64), f)[None],
                            np.array(a["b"], dtype=np.float64)[None], float(a["n"]), float(a["q"]),
                            msg.kernel_version, int(msg.epoch))
    return URKGlobal(int(msg.global_version), int(msg.epoch), np.array(a["theta"], dtype=np.float64), stats,
                     float(a["sigma"]), float(a["lam"]), float(a["log_evidence"]), dict(msg.included),
                     float(a["time"]) if "time" in a else 0.0)
