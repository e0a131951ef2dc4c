"""What a PVI aggregator, shard or reducer runs (docs/algorithms.md, "PVI"): the server half
(:class:`~.server.PVIServer`) behind the :class:`~streamfed.algorithms.base.Aggregation` contract.

A factor replaces its client's previous one, so a shard's partial is the newest factor per client it
holds, and partials add by keeping each client's newest (:class:`FactorSet`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from streamfed.algorithms.pvi.factors import Factor
from streamfed.algorithms.pvi.server import PVIServer
from streamfed.algorithms.pvi.wire import global_message, read_factor, read_table, table_arrays
from streamfed.fleet.protocol import Message

__all__ = ["FactorSet", "PVIAggregation"]


@dataclass(frozen=True)
class FactorSet:
    """The newest factor per client; `+` keeps the newer of two.

    >>> f = Factor("a", 1, 1.0, None, np.zeros(1), np.zeros(1))
    >>> g = Factor("a", 2, 2.0, None, np.zeros(1), np.zeros(1))
    >>> (FactorSet({"a": g}) + FactorSet({"a": f})).factors["a"].seq
    2
    """

    factors: Mapping[str, Factor]

    def __add__(self, other: FactorSet) -> FactorSet:
        out = dict(self.factors)
        for c, f in other.factors.items():
            if c not in out or out[c].seq < f.seq:
                out[c] = f
        return FactorSet(out)


class PVIAggregation:
    """The :class:`~streamfed.algorithms.base.Aggregation` of PVI (`params`: the fleet's PVI parameters).

    >>> from streamfed.algorithms.pvi.state import GlobalQ
    >>> g = GlobalQ.initial("se", np.zeros((2, 1)), np.zeros(3), "fixed")
    >>> agg = PVIAggregation(PVIServer(g, n_pseudo=1), params=None)
    >>> agg.take("a", 1, Factor("a", 1, 3.0, np.zeros((1, 1)), np.ones(1), np.zeros(1)))
    >>> agg.close_window({}, lambda c: 0), agg.version, agg.included()
    (True, 1, {'a': 1})
    """

    def __init__(self, server: PVIServer, params: Any) -> None:
        self.server = server
        self.params = params

    @property
    def version(self) -> int:
        return self.server.version

    def included(self) -> dict[str, int]:
        return dict(self.server.included)

    def diagnostics(self) -> dict[str, float]:
        s = self.server
        out = {"factors": float(len(s.state.factors)), "superseded": float(s.superseded)}
        q = s.phi_summary()
        if q is not None and q.proper:
            out["mean_phi_sd"] = float(np.mean(np.sqrt(q.var)))
        return out

    # ---------------------------------------------------------------- updates
    def check(self, msg: Message) -> Factor:
        f = read_factor(msg)
        if not 1 <= msg.n_samples <= f.n:
            raise ValueError(f"n_samples {msg.n_samples} but the factor summarises {f.n:g}")
        self.server.validate(f)
        return f

    def take(self, client: str, seq: int, item: Factor) -> None:
        self.server.receive(item)

    def pending(self) -> bool:
        return self.server.pending()

    def close_window(self, order: Mapping[str, int], mark: Callable[[str], int]) -> bool:
        return self.server.close_window()

    def apply_round(self, round: int, items: Sequence[tuple[str, Factor]]) -> None:
        for c, item in items:
            self.take(c, item.seq, item)
        self.close_window({}, lambda c: 0)

    # ---------------------------------------------------------------- shards and reducer
    def partial(self, items: Sequence[Factor]) -> tuple[dict[str, np.ndarray], int, int]:
        newest = FactorSet({})
        for f in items:
            newest = newest + FactorSet({f.client: f})
        names = sorted({f.client for f in items})
        fs = [newest.factors[c] for c in names]
        g = self.server.state
        arrays = table_arrays(fs, names, self.params, g.d, local_z=g.inducing == "fedavg")
        arrays["fslot"] = arrays.pop("slot")
        arrays["fseq"] = np.array([f.seq for f in fs], dtype=np.int64)
        return arrays, int(sum(f.n for f in fs)), 0

    def read_partial(self, msg: Message) -> FactorSet:
        names = sorted(msg.included)
        fs = read_table(msg.arrays, names, np.asarray(msg.arrays["fseq"]).tolist(), slot="fslot")
        for f in fs:
            self.server.validate(f)
        return FactorSet({f.client: f for f in fs})

    def apply_partial(self, total: FactorSet, n_clients: int, included: Mapping[str, int]) -> None:
        for c in sorted(total.factors):
            self.server.receive(total.factors[c])
        self.server.close_window()

    # ---------------------------------------------------------------- output
    def global_message(self, fleet: str, sender: str, kernel_version: str) -> Message:
        return global_message(fleet, sender, self.server.state, self.server.included, self.params, kernel_version)

    def warm_up(self) -> None:
        pass
