"""FedBNR over half-lives on the wire (docs/algorithms.md §4.15): FedBNR's messages stacked along a leading axis,
one row per half-life, and split back into FedBNR's own messages for each component.

* ``fedbnr-halflives.update`` — `S_upper (J, K, F(F+1)/2)`, `b (J, K, F)`, `n (J,)`, `q (J,)` and, when some
  half-life forgets, `time (J,)` (the time each component's statistics are discounted to; 0 for no forgetting);
  `n_samples` is the raw sample count, the same for every component (they learn the same samples).
* ``fedbnr-halflives.global`` — the same stacked sums plus `σ, λ, log evidence (J, K)`, and `included`.
* ``fedbnr-halflives.partial`` — declared for the contract; the family does not shard (discounted sums carry a time
  a partial has no room for, as FedBNR with a half-life).

>>> from streamfed.fleet.config import FleetConfig
>>> cfg = FleetConfig(fleet="f", algorithm="fedbnr-halflives", n_inputs=3, n_features=2, kernels=["gaussian:1.0"])
>>> cfg.array_shapes("fedbnr-halflives.update")["S_upper"], cfg.array_shapes("fedbnr-halflives.update")["time"]
(('float64', (4, 1, 15)), ('float64', (4,)))
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from streamfed.algorithms.base import params_of
from streamfed.algorithms.fedbnr import wire as fedbnr_wire
from streamfed.algorithms.fedbnr_halflives import HalfLivesParams
from streamfed.wire.message import Message
from streamfed.wire.schema import ArraySpec, MessageSchema, MetaSpec, contributor_arrays, contributor_dims
from streamfed.wire.topics import Channel

if TYPE_CHECKING:
    from streamfed.fleet.config import FleetConfig

__all__ = ["UPDATE", "GLOBAL", "PARTIAL", "schemas", "stack_updates", "split_update", "stack_globals",
           "split_global"]

UPDATE, GLOBAL, PARTIAL = "fedbnr-halflives.update", "fedbnr-halflives.global", "fedbnr-halflives.partial"
_STATS = ("S_upper", "b", "n", "q")


def schemas(cfg: FleetConfig) -> list[MessageSchema]:
    p = params_of(cfg, HalfLivesParams)
    j, k, f = len(p.half_lives_s), p.n_kernels, cfg.feature_dim
    stats = (ArraySpec("S_upper", "float64", (j, k, f * (f + 1) // 2)), ArraySpec("b", "float64", (j, k, f)),
             ArraySpec("n", "float64", (j,)), ArraySpec("q", "float64", (j,)))
    timed = (ArraySpec("time", "float64", (j,)),) if any(h is not None for h in p.half_lives_s) else ()
    return [
        MessageSchema(UPDATE, Channel.UPDATES, stats + timed),
        MessageSchema(GLOBAL, Channel.GLOBAL, stats + timed + (
            ArraySpec("sigma", "float64", (j, k), positive=True),
            ArraySpec("lam", "float64", (j, k), positive=True),
            ArraySpec("log_evidence", "float64", (j, k)),
        ), max_included=cfg.max_clients),
        MessageSchema(PARTIAL, Channel.PARTIALS, stats + contributor_arrays(), contributor_dims(cfg),
                      meta=(MetaSpec("round"),), max_included=cfg.max_clients),
    ]


def _stacked(parts: Sequence[Mapping[str, np.ndarray]], names: Sequence[str],
             half_lives: Sequence[float | None]) -> dict[str, np.ndarray]:
    out = {k: np.stack([np.asarray(a[k], dtype=np.float64) for a in parts]) for k in names}
    if any(h is not None for h in half_lives):
        out["time"] = np.array([float(a["time"]) if h is not None else 0.0
                                for a, h in zip(parts, half_lives, strict=True)])
    return out


def stack_updates(parts: Sequence[Mapping[str, np.ndarray]], half_lives: Sequence[float | None]
                  ) -> dict[str, np.ndarray]:
    """The arrays of one update from each component's FedBNR update arrays (in the order of `half_lives`).

    >>> a = {"S_upper": np.ones((1, 3)), "b": np.ones((1, 2)), "n": np.array(2.0), "q": np.array(1.0)}
    >>> t = a | {"n": np.array(1.5), "time": np.array(7.0)}
    >>> out = stack_updates([a, t], (None, 60.0))
    >>> out["n"].tolist(), out["time"].tolist(), out["S_upper"].shape
    ([2.0, 1.5], [0.0, 7.0], (2, 1, 3))
    """
    return _stacked(parts, _STATS, half_lives)


def split_update(msg: Message, half_lives: Sequence[float | None]) -> list[Message]:
    """One ``fedbnr.update`` per component (what its FedBNR aggregation checks), from a stacked update: row `j` of
    every statistic, and `time[j]` when component `j` forgets. `ValueError` for a message of another kind."""
    if msg.kind != UPDATE:
        raise ValueError(f"expected a {UPDATE!r} message, got {msg.kind!r}")
    out = []
    for j, h in enumerate(half_lives):
        arrays = {k: msg.arrays[k][j] for k in _STATS}
        if h is not None:
            arrays["time"] = msg.arrays["time"][j]
        out.append(Message(msg.fleet, msg.client, fedbnr_wire.UPDATE, msg.seq, msg.global_version,
                           msg.kernel_version, msg.n_samples, msg.created, arrays, epoch=msg.epoch))
    return out


def stack_globals(parts: Sequence[Message], half_lives: Sequence[float | None], *, fleet: str, sender: str,
                  version: int, included: Mapping[str, int], created: float | None = None) -> Message:
    """One global from each component's ``fedbnr.global`` (in the order of `half_lives`), at `version` with
    `included` (what every component holds)."""
    first = parts[0]
    arrays = _stacked([p.arrays for p in parts], (*_STATS, "sigma", "lam", "log_evidence"), half_lives)
    return Message(fleet, sender, GLOBAL, version, version, first.kernel_version, first.n_samples,
                   first.created if created is None else float(created), arrays, {}, dict(included), first.epoch)


# the components' globals of a stacked global, per message: a fleet replayed in one process installs one message in
# every learner, and FedBNR decodes each component message once (fedbnr.learner.decoded_global) when it is the same
# object. Keyed by the message's id while it is alive (a Message is not hashable).
_split: dict[int, tuple[weakref.ref, list[Message]]] = {}


def split_global(msg: Message, half_lives: Sequence[float | None]) -> list[Message]:
    """One ``fedbnr.global`` per component from a stacked global (its version and `included` are the stacked one's),
    made once per message object."""
    if msg.kind != GLOBAL:
        raise ValueError(f"expected a {GLOBAL!r} message, got {msg.kind!r}")
    key = id(msg)
    hit = _split.get(key)
    if hit is not None and hit[0]() is msg:
        return hit[1]
    a = msg.arrays
    out = [fedbnr_wire.global_message(
        msg.fleet, msg.client, msg.global_version, a["S_upper"][j], a["b"][j], float(a["n"][j]), float(a["q"][j]),
        a["sigma"][j], a["lam"][j], a["log_evidence"][j], msg.included, kernel_version=msg.kernel_version,
        epoch=msg.epoch, created=msg.created, time_base=None if h is None else float(a["time"][j]))
        for j, h in enumerate(half_lives)]
    def forget(_ref: object) -> None:  # the message is gone: so is its entry
        _split.pop(key, None)

    _split[key] = (weakref.ref(msg, forget), out)
    return out
