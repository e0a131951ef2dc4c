"""POF-MKL on the wire: its message kinds and their builders (docs/algorithms.md §3).

* ``pofmkl.update`` — `Δ_p` for the (at most `M`) kernels of the sampled bin: `kernels (m,)`, `delta (m, 2D)`.
* ``pofmkl.global`` — the global `θ (N, 2D)`, with `included` (per client, every seq up to it is in `θ`).
* ``pofmkl.partial`` — a shard's dense `Σ Δ (N, 2D)` over the updates it took in, with their `(client, seq)`
  pairs (see :mod:`streamfed.fleet.sharding`): asynchronous windows, and what secure aggregation sums.
* ``pofmkl.round`` — a lock-step shard's round: its clients' updates themselves, `rows (c,)` rows each (in the
  order of the `(client, seq)` pairs), stacked in `kernels (r,)` and `delta (r, 2D)` — the reducer adds them
  in the fleet's client order, as the single aggregator does, so the global is the same bit for bit. At most
  :data:`ROUND_BYTES` of rows: a shard sends a larger round as several.

>>> from streamfed.fleet.config import FleetConfig
>>> cfg = FleetConfig(fleet="f", algorithm="pofmkl", n_inputs=3, n_kernels=5, n_features=4, bin_size=2)
>>> cfg.array_shapes("pofmkl.update")
{'kernels': ('int64', ('m',)), 'delta': ('float64', ('m', 8))}
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from streamfed.algorithms.base import params_of
from streamfed.algorithms.pofmkl import POFMKLParams
from streamfed.wire.schema import ArraySpec, MessageSchema, MetaSpec, contributor_arrays, contributor_dims
from streamfed.wire.topics import Channel

if TYPE_CHECKING:
    from streamfed.fleet.config import FleetConfig

from streamfed.wire.message import Message, writable_copy

__all__ = ["UPDATE", "GLOBAL", "PARTIAL", "ROUND", "ROUND_BYTES", "round_clients", "schemas", "update_message",
           "global_message", "global_theta", "to_kernel_update"]

UPDATE, GLOBAL, PARTIAL, ROUND = "pofmkl.update", "pofmkl.global", "pofmkl.partial", "pofmkl.round"
# the rows one `pofmkl.round` message may carry, in bytes: well below a broker's packet limit (16 MiB)
ROUND_BYTES = 1 << 20


def round_clients(cfg: FleetConfig) -> int:
    """The most updates (clients) one `pofmkl.round` carries: `M` rows of `2D` float64 each within
    :data:`ROUND_BYTES`, at least one, at most `max_clients`.

    >>> from streamfed.fleet.config import FleetConfig
    >>> round_clients(FleetConfig(fleet="f", algorithm="pofmkl", n_inputs=3, n_kernels=16, n_features=100))
    655
    """
    p = params_of(cfg, POFMKLParams)
    return max(1, min(cfg.max_clients, ROUND_BYTES // (p.bin_size * p.dim * 8)))  # type: ignore[attr-defined]


def schemas(cfg: FleetConfig) -> list[MessageSchema]:
    p = params_of(cfg, POFMKLParams)
    n, dim, m = p.n_kernels, p.dim, p.bin_size  # type: ignore[attr-defined]
    return [
        MessageSchema(UPDATE, Channel.UPDATES, (
            ArraySpec("kernels", "int64", ("m",), index_bound=n, distinct=True),
            ArraySpec("delta", "float64", ("m", dim)),
        ), {"m": (1, m)}),
        MessageSchema(GLOBAL, Channel.GLOBAL, (
            ArraySpec("theta", "float64", (n, dim)),
        ), max_included=cfg.max_clients),
        MessageSchema(PARTIAL, Channel.PARTIALS, (
            ArraySpec("sum", "float64", (n, dim)),
            *contributor_arrays(),
        ), contributor_dims(cfg), meta=(MetaSpec("round"),), max_included=cfg.max_clients),
        # after PARTIAL: the fleet's partial kind (and what secure aggregation sums) is the first on PARTIALS
        MessageSchema(ROUND, Channel.PARTIALS, (
            ArraySpec("rows", "int64", ("c",), positive=True),
            ArraySpec("kernels", "int64", ("r",), index_bound=n),
            ArraySpec("delta", "float64", ("r", dim)),
            *contributor_arrays(),
        ), {"c": (1, round_clients(cfg)), "r": (1, round_clients(cfg) * m)}, meta=(MetaSpec("round"),),
            max_included=round_clients(cfg)),
    ]


def update_message(
    fleet: str, client: str, seq: int, kernels: np.ndarray, delta: np.ndarray, *,
    global_version: int, kernel_version: str, n_samples: int = 1, created: float | None = None,
) -> Message:
    """A `pofmkl.update` from a `KernelUpdate`'s arrays (`kernels` int64 `(m,)`, `delta` `(m, 2D)`).

    >>> m = update_message("f", "a1", 3, np.array([1]), np.zeros((1, 4)), global_version=2,
    ...                    kernel_version="k", created=0.0)
    >>> m.kind, m.arrays["kernels"].dtype
    ('pofmkl.update', dtype('int64'))
    """
    return Message(fleet, client, UPDATE, seq, global_version, kernel_version, int(n_samples),
                   time.time() if created is None else float(created),
                   {"kernels": np.asarray(kernels, dtype=np.int64), "delta": np.asarray(delta, dtype=np.float64)})


def to_kernel_update(msg: Message) -> Any:
    """The :class:`~streamfed.algorithms.pofmkl.messages.KernelUpdate` of a decoded update (writable copies)."""
    from streamfed.algorithms.pofmkl.messages import KernelUpdate  # lazy: the codec does not need numba

    _expect(msg, UPDATE)
    return KernelUpdate(writable_copy(msg.arrays["kernels"], "int64"), writable_copy(msg.arrays["delta"], "float64"),
                        msg.n_samples)


def global_message(
    fleet: str, sender: str, theta: np.ndarray, version: int, *, kernel_version: str,
    included: Mapping[str, int] | None = None, created: float | None = None,
) -> Message:
    """A `pofmkl.global` carrying `θ (N, 2D)`; `seq` and `global_version` are both `version`."""
    return Message(fleet, sender, GLOBAL, version, version, kernel_version, 0,
                   time.time() if created is None else float(created),
                   {"theta": np.asarray(theta, dtype=np.float64)}, {}, dict(included or {}))


def global_theta(msg: Message) -> tuple[np.ndarray, int]:
    """`(θ, version)` of a decoded `pofmkl.global` (`θ` a writable copy)."""
    _expect(msg, GLOBAL)
    return writable_copy(msg.arrays["theta"], "float64"), msg.global_version


def _expect(msg: Message, kind: str) -> None:
    if msg.kind != kind:
        raise ValueError(f"expected a {kind!r} message, got {msg.kind!r}")
