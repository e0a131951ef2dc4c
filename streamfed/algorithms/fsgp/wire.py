"""FSGP on the wire (docs/algorithms.md, "FSGP"). The envelope's `epoch` is the `(θ, σ, Z)` version.

* ``fsgp.update`` — delta statistics `P_upper (M(M+1)/2)` (numpy.triu_indices order), `r (M)`, `n`, `q`,
  and a proposal: `theta (d+1) = [log a, log ℓ]`, `log_sigma`, `Z (M, d)` with its FedAvg `weight`
  (0: no proposal) — `M·d + d + 2` numbers.
* ``fsgp.global`` — the summed statistics and the version's `theta`, `log_sigma`, `Z`.
* ``fsgp.partial`` — a shard's summed statistics and weighted sums of proposals, with their `(client, seq)`.

With a half-life (`half_life_s`, forgetting on the time base) all three also carry `time ()`, the time their
statistics are discounted to; an update's `n_samples` is then its raw sample count (`n` is discounted). Without
one the schemas are unchanged (an update without `time` decodes as before).

>>> from streamfed.fleet.config import FleetConfig
>>> cfg = FleetConfig(fleet="f", algorithm="fsgp", n_inputs=2, params={"n_inducing": 3})
>>> {k: s for k, (_, s) in cfg.array_shapes("fsgp.update").items()}
{'P_upper': (6,), 'r': (3,), 'n': (), 'q': (), 'theta': (3,), 'log_sigma': (), 'Z': (3, 2), 'weight': ()}
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from streamfed.algorithms.base import params_of
from streamfed.algorithms.fsgp import FSGPParams
from streamfed.algorithms.fsgp.kernels import Hyper
from streamfed.algorithms.fsgp.messages import GlobalModel, Upload
from streamfed.algorithms.fsgp.posterior import Stats
from streamfed.wire.message import Message
from streamfed.wire.schema import ArraySpec, MessageSchema, MetaSpec, contributor_arrays, contributor_dims
from streamfed.wire.topics import Channel

if TYPE_CHECKING:
    from streamfed.fleet.config import FleetConfig

__all__ = ["GLOBAL", "PARTIAL", "UPDATE", "global_message", "read_global", "read_update", "schemas",
           "update_arrays"]

UPDATE, GLOBAL, PARTIAL = "fsgp.update", "fsgp.global", "fsgp.partial"


def _stats_specs(m: int) -> tuple[ArraySpec, ...]:
    return (ArraySpec("P_upper", "float64", (m * (m + 1) // 2,)), ArraySpec("r", "float64", (m,)),
            ArraySpec("n", "float64", (), nonnegative=True), ArraySpec("q", "float64", (), nonnegative=True))


def _hyper_specs(m: int, d: int) -> tuple[ArraySpec, ...]:
    return (ArraySpec("theta", "float64", (d + 1,)), ArraySpec("log_sigma", "float64", ()),
            ArraySpec("Z", "float64", (m, d)))


def schemas(cfg: FleetConfig) -> list[MessageSchema]:
    p = params_of(cfg, FSGPParams)
    m, d = p.n_inducing, cfg.n_inputs
    weight = (ArraySpec("weight", "float64", (), nonnegative=True),)
    timed = (ArraySpec("time", "float64", ()),) if p.half_life_s is not None else ()
    return [
        MessageSchema(UPDATE, Channel.UPDATES, _stats_specs(m) + _hyper_specs(m, d) + weight + timed),
        MessageSchema(GLOBAL, Channel.GLOBAL, _stats_specs(m) + _hyper_specs(m, d) + timed,
                      max_included=cfg.max_clients),
        MessageSchema(PARTIAL, Channel.PARTIALS,
                      _stats_specs(m) + _hyper_specs(m, d) + weight + timed + contributor_arrays(),
                      contributor_dims(cfg), meta=(MetaSpec("round"),), max_included=cfg.max_clients),
    ]


def _hyper_arrays(h: Hyper) -> dict[str, np.ndarray]:
    return {"theta": h.theta(), "log_sigma": np.asarray(h.log_sigma), "Z": np.array(h.Z)}


def update_arrays(up: Upload, d: int) -> dict[str, np.ndarray]:
    """An upload's arrays for `d` inputs (a missing proposal travels as zeros with weight 0)."""
    out = up.stats.packed()
    if up.proposal is None:
        out.update(theta=np.zeros(d + 1), log_sigma=np.asarray(0.0), Z=np.zeros((up.stats.m, d)),
                   weight=np.asarray(0.0))
    else:
        out.update(_hyper_arrays(up.proposal), weight=np.asarray(float(up.weight)))
    if up.count:  # discounted: the time travels (n_samples is then the raw count)
        out["time"] = np.asarray(float(up.time))
    return out


def _hyper(kind: str, arrays: Mapping[str, np.ndarray]) -> Hyper:
    theta = np.asarray(arrays["theta"], dtype=np.float64)
    return Hyper(kind, float(theta[0]), theta[1:], float(arrays["log_sigma"]), np.asarray(arrays["Z"]))


def read_update(msg: Message, kind: str) -> Upload:
    """A decoded `fsgp.update` (the codec has checked shapes and finiteness)."""
    if msg.kind != UPDATE:
        raise ValueError(f"expected a {UPDATE!r} message, got {msg.kind!r}")
    stats = Stats.from_packed(dict(msg.arrays), msg.epoch)
    weight = float(msg.arrays["weight"])
    proposal = _hyper(kind, msg.arrays) if weight > 0 else None
    if "time" in msg.arrays:  # with forgetting: the statistics' reference time and the raw sample count
        return Upload(msg.client, int(msg.seq), int(msg.global_version), stats, proposal, weight,
                      float(msg.arrays["time"]), int(msg.n_samples))
    return Upload(msg.client, int(msg.seq), int(msg.global_version), stats, proposal, weight)


def global_message(fleet: str, sender: str, g: GlobalModel, kernel_version: str,
                   created: float | None = None, timed: bool = False) -> Message:
    """The `fsgp.global` of `g` (`timed`: with forgetting, its reference time as the array `time`)."""
    arrays = g.stats.packed()
    arrays.update(_hyper_arrays(g.hyper))
    if timed:
        arrays["time"] = np.asarray(float(g.time))
    return Message(fleet, sender, GLOBAL, g.version, g.version, kernel_version, max(int(round(g.stats.n)), 0),
                   time.time() if created is None else float(created), arrays, {}, dict(g.included), int(g.epoch))


def read_global(msg: Message, kind: str) -> GlobalModel:
    if msg.kind != GLOBAL:
        raise ValueError(f"expected a {GLOBAL!r} message, got {msg.kind!r}")
    return GlobalModel(int(msg.global_version), int(msg.epoch), _hyper(kind, msg.arrays),
                       Stats.from_packed(dict(msg.arrays), msg.epoch), dict(msg.included),
                       float(msg.arrays["time"]) if "time" in msg.arrays else 0.0)
