"""Personalised (hierarchical) FedBNR on the wire (docs/algorithms.md §5).

* ``fedbnr-personal.update`` — one upload's time-weighted delta statistics: `S_upper (F(F+1)/2,)`, `b (F,)`,
  `n`, `q` and the client's clock `time`; `n_samples` is the raw count (the privacy floor).
* ``fedbnr-personal.global`` — the shared posterior `(A_upper, h)`, `σ, λ, τ`, its `time`, the forgetting and
  the log evidence; one row per model: `J = len(tau_grid)` models with the prequential `τ`-mixture, else one.
* ``fedbnr-personal.partial`` — a shard's per-client sums (the server keeps statistics per client): row `i`
  of each array belongs to the `i`-th client of the sorted `included` names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from streamfed.algorithms.base import params_of
from streamfed.algorithms.fedbnr_personal import PersonalParams
from streamfed.wire.schema import ArraySpec, MessageSchema, MetaSpec, contributor_arrays, contributor_dims
from streamfed.wire.topics import Channel

if TYPE_CHECKING:
    from streamfed.fleet.config import FleetConfig

__all__ = ["UPDATE", "GLOBAL", "PARTIAL", "n_models", "schemas"]

UPDATE, GLOBAL, PARTIAL = "fedbnr-personal.update", "fedbnr-personal.global", "fedbnr-personal.partial"
SCALARS = ("sigma", "lam", "tau", "time", "forgetting", "log_evidence")


def n_models(cfg: FleetConfig) -> int:
    """The models a global carries: one per `τ` of the grid, or one (τ by evidence)."""
    return len(params_of(cfg, PersonalParams).tau_grid) if params_of(cfg, PersonalParams).tau_grid else 1


def schemas(cfg: FleetConfig) -> list[MessageSchema]:
    f = cfg.feature_dim
    p = f * (f + 1) // 2
    j = n_models(cfg)
    one = (ArraySpec("S_upper", "float64", (p,)), ArraySpec("b", "float64", (f,)), ArraySpec("n", "float64", ()),
           ArraySpec("q", "float64", ()), ArraySpec("time", "float64", ()))
    per_client = (ArraySpec("S_upper", "float64", ("k", p)), ArraySpec("b", "float64", ("k", f)),
                  ArraySpec("n", "float64", ("k",)), ArraySpec("q", "float64", ("k",)),
                  ArraySpec("time", "float64", ("k",)), ArraySpec("count", "int64", ("k",), nonnegative=True))
    dims = {**contributor_dims(cfg), "k": (1, cfg.max_clients)}
    return [
        MessageSchema(UPDATE, Channel.UPDATES, one),
        MessageSchema(GLOBAL, Channel.GLOBAL, (
            ArraySpec("A_upper", "float64", (j, p)), ArraySpec("h", "float64", (j, f)),
            *(ArraySpec(s, "float64", (j,)) for s in SCALARS),
        ), max_included=cfg.max_clients),
        MessageSchema(PARTIAL, Channel.PARTIALS, per_client + contributor_arrays(), dims,
                      meta=(MetaSpec("round"),), max_included=cfg.max_clients),
    ]
