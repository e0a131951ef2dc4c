"""Online FedBNR on the wire: additive sufficient statistics (docs/algorithms.md §4).

* ``fedbnr.update`` — a client's delta statistics: `S_upper (K, F(F+1)/2)` (the packed upper triangle of
  `S`, numpy.triu_indices order), `b (K, F)`, `n`, `q`; one row per kernel of the dictionary.
* ``fedbnr.global`` — the summed statistics plus `σ, λ, log evidence (K,)` and `included`.
* ``fedbnr.partial`` — a shard's summed statistics with their `(client, seq)` pairs.

With a half-life (forgetting on the time base, :mod:`.discount`) updates and globals also carry `time ()`, the
time their statistics are discounted to; an update's `n_samples` is then its raw sample count (`n` is discounted).

>>> from streamfed.fleet.config import FleetConfig
>>> cfg = FleetConfig(fleet="f", algorithm="fedbnr", n_inputs=3, n_features=2, kernels=["gaussian:1.0"])
>>> cfg.array_shapes("fedbnr.update")
{'S_upper': ('float64', (1, 15)), 'b': ('float64', (1, 5)), 'n': ('float64', ()), 'q': ('float64', ())}
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from streamfed.algorithms.base import params_of
from streamfed.algorithms.fedbnr import FedBNRParams
from streamfed.wire.message import Message, writable_copy
from streamfed.wire.schema import ArraySpec, MessageSchema, MetaSpec, contributor_arrays, contributor_dims
from streamfed.wire.topics import Channel

if TYPE_CHECKING:
    from streamfed.fleet.config import FleetConfig

__all__ = ["UPDATE", "GLOBAL", "PARTIAL", "schemas", "stats_arrays", "stats_update_message", "stats_fields",
           "global_message", "global_fields"]

UPDATE, GLOBAL, PARTIAL = "fedbnr.update", "fedbnr.global", "fedbnr.partial"


def stats_arrays(k: int, f: int) -> tuple[ArraySpec, ...]:
    """ΔS as its packed upper triangle, Δb, Δn, Δq; one row per kernel (shared with later additive learners)."""
    return (ArraySpec("S_upper", "float64", (k, f * (f + 1) // 2)), ArraySpec("b", "float64", (k, f)),
            ArraySpec("n", "float64", ()), ArraySpec("q", "float64", ()))


def schemas(cfg: FleetConfig) -> list[MessageSchema]:
    p = params_of(cfg, FedBNRParams)
    k = p.n_kernels  # type: ignore[attr-defined]
    stats = stats_arrays(k, cfg.feature_dim)
    timed = (ArraySpec("time", "float64", ()),) if p.half_life_s is not None else ()
    return [
        MessageSchema(UPDATE, Channel.UPDATES, stats + timed),
        MessageSchema(GLOBAL, Channel.GLOBAL, stats + timed + (
            ArraySpec("sigma", "float64", (k,), positive=True),
            ArraySpec("lam", "float64", (k,), positive=True),
            ArraySpec("log_evidence", "float64", (k,)),
        ), max_included=cfg.max_clients),
        MessageSchema(PARTIAL, Channel.PARTIALS, stats + contributor_arrays(), contributor_dims(cfg),
                      meta=(MetaSpec("round"),), max_included=cfg.max_clients),
    ]


def stats_update_message(
    fleet: str, client: str, seq: int, S_upper: np.ndarray, b: np.ndarray, n: float, q: float, *,
    global_version: int, kernel_version: str, epoch: int = 0, n_samples: int | None = None,
    created: float | None = None, kind: str = UPDATE,
) -> Message:
    """A sufficient-statistics delta (`S_upper (K, F(F+1)/2)`, `b (K, F)`, `n`, `q`) as an update.

    `n_samples` defaults to `round(n)`. `kind` lets another additive-statistics learner reuse it.

    >>> m = stats_update_message("f", "a1", 1, np.zeros((1, 3)), np.zeros((1, 2)), 32.0, 1.0,
    ...                          global_version=0, kernel_version="k", created=0.0)
    >>> m.n_samples, m.arrays["n"].shape
    (32, ())
    """
    arrays = {"S_upper": np.asarray(S_upper, dtype=np.float64), "b": np.asarray(b, dtype=np.float64),
              "n": np.asarray(float(n)), "q": np.asarray(float(q))}
    ns = int(round(float(n))) if n_samples is None else int(n_samples)
    return Message(fleet, client, kind, seq, global_version, kernel_version, max(ns, 0),
                   time.time() if created is None else float(created), arrays, epoch=epoch)


def stats_fields(msg: Message) -> dict[str, Any]:
    """A decoded statistics update as plain fields, in the layout `Upload.from_message` reads:
    `client, seq, base_version, S_upper, b` (writable copies), `n, q` (floats), `kernel_version, epoch`."""
    return {
        "client": msg.client, "seq": msg.seq, "base_version": msg.global_version,
        "S_upper": writable_copy(msg.arrays["S_upper"], "float64"), "b": writable_copy(msg.arrays["b"], "float64"),
        "n": float(msg.arrays["n"]), "q": float(msg.arrays["q"]),
        "kernel_version": msg.kernel_version, "epoch": msg.epoch,
    } | ({"time": float(msg.arrays["time"]), "count": int(msg.n_samples)} if "time" in msg.arrays else {})


def global_message(
    fleet: str, sender: str, version: int, S_upper: np.ndarray, b: np.ndarray, n: float, q: float,
    sigma: np.ndarray, lam: np.ndarray, log_evidence: np.ndarray, included: Mapping[str, int], *,
    kernel_version: str, epoch: int = 0, created: float | None = None, time_base: float | None = None,
) -> Message:
    """A `fedbnr.global`: the summed statistics, `σ, λ, log evidence (K,)`, and `included` (with a half-life, the
    reference time `time_base` of the discounted statistics as the array `time`)."""
    arrays = {"S_upper": np.asarray(S_upper, dtype=np.float64), "b": np.asarray(b, dtype=np.float64),
              "n": np.asarray(float(n)), "q": np.asarray(float(q)),
              "sigma": np.asarray(sigma, dtype=np.float64), "lam": np.asarray(lam, dtype=np.float64),
              "log_evidence": np.asarray(log_evidence, dtype=np.float64)}
    if time_base is not None:
        arrays["time"] = np.asarray(float(time_base))
    return Message(fleet, sender, GLOBAL, version, version, kernel_version,
                   max(int(round(float(n))), 0), time.time() if created is None else float(created), arrays, {},
                   dict(included), epoch)


def global_fields(msg: Message) -> dict[str, Any]:
    """A decoded `fedbnr.global` as plain fields, in the layout `GlobalModel.from_message` reads."""
    if msg.kind != GLOBAL:
        raise ValueError(f"expected a {GLOBAL!r} message, got {msg.kind!r}")
    out = {k: writable_copy(msg.arrays[k], "float64") for k in ("S_upper", "b", "sigma", "lam", "log_evidence")}
    out.update(version=msg.global_version, n=float(msg.arrays["n"]), q=float(msg.arrays["q"]),
               kernel_version=msg.kernel_version, epoch=msg.epoch, included=dict(msg.included))
    if "time" in msg.arrays:
        out["time"] = float(msg.arrays["time"])
    return out
