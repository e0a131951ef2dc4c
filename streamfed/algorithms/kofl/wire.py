"""The POF-MKL paper's baselines on the wire: their message kinds (docs/algorithms.md §3.7).

* ``<name>.update`` — `kernels (m,)`, `delta (m, 2D)`, and for vM/eM-KOFL every kernel's `losses (N,)`.
* ``<name>.global`` — `θ (N, 2D)`, and for vM/eM-KOFL the fleet log-weights `logv (N,)` and the `chosen` kernel.
* ``<name>.partial`` — a shard's dense `Σ Δ (N, 2D)`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from streamfed.wire.schema import ArraySpec, MessageSchema
from streamfed.wire.topics import Channel

if TYPE_CHECKING:
    from streamfed.fleet.config import FleetConfig

__all__ = ["schemas"]


def schemas(name: str, n: int, m: int, dim: int, *, losses: bool, cfg: FleetConfig) -> list[MessageSchema]:
    update = [ArraySpec("kernels", "int64", ("m",), index_bound=n, distinct=True),
              ArraySpec("delta", "float64", ("m", dim))]
    glob = [ArraySpec("theta", "float64", (n, dim))]
    if losses:
        update.append(ArraySpec("losses", "float64", (n,)))
        glob += [ArraySpec("logv", "float64", (n,)), ArraySpec("chosen", "int64", ())]
    return [MessageSchema(f"{name}.update", Channel.UPDATES, tuple(update), {"m": (1, m)}),
            MessageSchema(f"{name}.global", Channel.GLOBAL, tuple(glob), max_included=cfg.max_clients),
            MessageSchema(f"{name}.partial", Channel.PARTIALS, (ArraySpec("sum", "float64", (n, dim)),))]
