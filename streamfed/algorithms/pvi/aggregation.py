"""What a PVI aggregator, shard or reducer runs (docs/algorithms.md, "PVI"): the server half
(:class:`~.server.PVIServer`) behind the :class:`~streamfed.algorithms.base.Aggregation` contract.

A factor replaces its client's previous one, so a shard's partial is the newest factor per client it
holds, and partials add by keeping each client's newest (:class:`FactorSet`).

Bounded influence (docs/algorithms.md §7.4; issue 15). Always: a factor's FedAvg weight on
`Z` counts at most the samples its client was charged for (`n_samples`, which the core's token bucket
charges), not the `n` it claims. With `[fleet.robust] aggregation = "robust"`, a factor's *information*
`I_k = tr(K Λ_k) = Σ_j [K_{V_k Z} K⁻¹ K_{Z V_k}]_jj / s_{k,j}` (:func:`factor_information`; `n a²/σ²` for the exact
likelihood of `n` samples) may be at most `share_cap` of the global's: a factor beyond is taken as the power
`t_k^w` (:func:`temper`: every precision × `w`), the largest `w` that fits, with a cold-start floor of the
information of `floor` exact samples.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from streamfed.algorithms.base import BaseAggregation
from streamfed.algorithms.fsgp.kernels import cov
from streamfed.algorithms.pvi.factors import Factor
from streamfed.algorithms.pvi.posterior import beta_hyper
from streamfed.algorithms.pvi.server import PVIServer
from streamfed.algorithms.pvi.wire import global_message, read_factor, read_table, table_arrays
from streamfed.algorithms.shares import share_allowance
from streamfed.core.durable import durable
from streamfed.wire.message import Message

__all__ = ["FactorSet", "PVIAggregation", "RobustPVI", "factor_information", "temper"]


def factor_information(f: Factor, kind: str, Z: np.ndarray, beta: np.ndarray, jitter: float = 1e-6) -> float:
    """`tr(K Λ)` of a factor's precision on `u = f(Z)`, `Λ = K⁻¹ K_{ZV} S⁻¹ K_{VZ} K⁻¹`: `Σ_j κ_j / s_j` with
    `κ_j = [K_{VZ} K⁻¹ K_{ZV}]_jj ≤ a²` (CPO: `V = Z`). For the exact likelihood of `n` samples with noise `σ²`
    (`V = X`, `m = y`, `s = σ²`) it is `tr(K⁻¹P)/σ² ≤ n a²/σ²`.

    >>> f = Factor("a", 1, 1.0, np.zeros((1, 1)), np.zeros(1), np.log([0.25]))
    >>> round(factor_information(f, "se", np.zeros((1, 1)), np.zeros(3)), 4)  # κ = a²/(1 + ε) ≈ 1, s = 1/4
    4.0
    """
    h = beta_hyper(kind, beta, Z)
    K = cov(h, h.Z, h.Z) + jitter * h.amplitude ** 2 * np.eye(h.m)
    Kzv = K if f.V is None else cov(h, h.Z, f.V)
    kappa = np.sum(Kzv * np.linalg.solve(K, Kzv), axis=0)
    return float(np.sum(np.maximum(kappa, 0.0) * np.exp(-f.log_s)))


def temper(f: Factor, w: float) -> Factor:
    """The factor `t^w` (`0 < w ≤ 1`): every precision × `w` — pseudo-variances `s/w`, `t(φ)`'s natural
    parameters × `w` — and its count `w·n`. A power of one Gaussian factor is a factor of the same form (unlike
    damping, which mixes two DPO factors' pseudo-inputs).

    >>> g = temper(Factor("a", 1, 8.0, None, np.ones(2), np.zeros(2)), 0.5)
    >>> np.exp(g.log_s).tolist(), g.n
    ([2.0, 2.0], 4.0)
    """
    if w >= 1.0:
        return f
    return replace(f, n=f.n * w, log_s=f.log_s - np.log(w), phi=None if f.phi is None else f.phi.power(w))


@durable("pvi.RobustPVI")
@dataclass(frozen=True)
class RobustPVI:
    """Robust PVI aggregation: a factor's information at most `share_cap` of the global's, and at least
    `floor_information` allowed whatever the others hold (the cold start).

    >>> RobustPVI(0.25, 100.0).share_cap
    0.25
    """

    share_cap: float
    floor_information: float


@durable("pvi.FactorSet")
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


@durable("pvi.PVIAggregation")
class PVIAggregation(BaseAggregation):
    """The :class:`~streamfed.algorithms.base.Aggregation` of PVI (`params`: the fleet's PVI parameters).

    >>> from streamfed.algorithms.pvi.state import GlobalQ
    >>> g = GlobalQ.initial("se", np.zeros((2, 1)), np.zeros(3), "fixed")
    >>> agg = PVIAggregation(PVIServer(g, n_pseudo=1), params=None)
    >>> agg.take("a", 1, Factor("a", 1, 3.0, np.zeros((1, 1)), np.ones(1), np.zeros(1)))
    >>> agg.close_window({}, lambda c: 0), agg.version, agg.included()
    (True, 1, {'a': 1})
    """

    robust: RobustPVI | None = None  # class default: an aggregation pickled before it existed is the exact one
    tempered = 0

    def __init__(self, server: PVIServer, params: Any, robust: RobustPVI | None = None) -> None:
        self.server = server
        self.params = params
        self.robust = robust
        self.charged: dict[str, float] = {}  # per client: Σ n_samples of its factors taken (the token bucket's)
        self.tempered = 0

    @property
    def version(self) -> int:
        return self.server.version

    def included(self) -> dict[str, int]:
        return dict(self.server.included)

    def diagnostics(self) -> dict[str, float]:
        s = self.server
        out = {"factors": float(len(s.state.factors)), "superseded": float(s.superseded)}
        if getattr(self, "robust", None) is not None:
            out["tempered_factors"] = float(self.tempered)
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
        # a factor's n weighs its Z in FedAvg: it counts for at most what its client was charged (the samples of
        # every factor of it taken so far and this one's), so a claim of 1e100 samples weighs no more
        charged = getattr(self, "charged", {})
        if f.seq > self.server.included.get(f.client, 0):
            total = charged.get(f.client, 0.0) + float(msg.n_samples)
            if f.n > total:
                f = replace(f, n=total)
            self._charge = (f.client, f.seq, total)
        return f

    def take(self, client: str, seq: int, item: Factor) -> None:
        charge = getattr(self, "_charge", None)
        if charge is not None and charge[:2] == (client, seq):
            self.__dict__.setdefault("charged", {})[client] = charge[2]  # (absent in a state saved before it)
        robust = getattr(self, "robust", None)
        if robust is not None and seq > self.server.included.get(client, 0):
            item = self._capped(item, robust)
        self.server.receive(item)

    def _capped(self, f: Factor, robust: RobustPVI) -> Factor:
        """`f` tempered so that its information is at most `share_cap` of the global's with it (replacing the
        client's previous factor), or the floor."""
        g = self.server.state
        Z, beta = g.points(0)[0]
        jitter = float(getattr(self.params, "jitter", 1e-6))
        others = sum(factor_information(o, g.kind, Z, beta, jitter) for o in g.others(f.client))
        mine = factor_information(f, g.kind, Z, beta, jitter)
        allowed = share_allowance(0.0, others, robust.share_cap, robust.floor_information)
        if mine <= allowed:
            return f
        self.tempered += 1
        return temper(f, allowed / mine)

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
