"""The server half of hierarchical (shared + personal) FedBNR (docs/algorithms.md §5.4, §5.6).

The server keeps each client's statistics (it dedupes uploads by `(client, seq)` anyway), computes their
marginalised contributions `P_k, r_k`, publishes the shared posterior `(A, h)` and fits `σ, λ, τ` by maximising
the exact evidence of the hierarchical model (type-II ML, :mod:`.evidence`). Summing per client makes the
result independent of how a client's samples were split into uploads and of the order uploads arrive (to
rounding).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from streamfed.algorithms.fedbnr.checks import check_positive
from streamfed.algorithms.fedbnr_personal.evidence import SEARCHES, fit_hierarchical, hierarchical_log_evidence
from streamfed.algorithms.fedbnr_personal.messages import HierGlobal, HierUpload
from streamfed.algorithms.in_order import apply_in_order
from streamfed.core.durable import durable
from streamfed.core.stats import SufficientStats

if TYPE_CHECKING:
    from streamfed.algorithms.fedbnr_personal.client import FedBNRHierClient

__all__ = ["EVIDENCE_SEARCH", "REFIT_GROWTH", "FedBNRHierServer"]

# The refit schedule's defaults (docs/algorithms.md §5.6, benchmarks/results/coldstart_cost.md)
REFIT_GROWTH = 0.0
EVIDENCE_SEARCH = "newton"


@durable("fedbnr-personal.FedBNRHierServer")
class FedBNRHierServer:
    """Server half: keeps each client's time-weighted statistics (uploads summed once per `(client, seq)`,
    in sequence order), publishes the shared posterior `(A, h)` and fits `σ, λ, τ` by the exact evidence.

    >>> server = FedBNRHierServer(dim=2, min_samples=1, fit_hyperparameters=False)
    >>> up = HierUpload("a", 1, 3.0, 3, SufficientStats.from_samples(np.ones((3, 2)), np.ones(3)))
    >>> server.apply(up), server.apply(up)
    (True, False)
    >>> server.publish().included
    {'a': 1}
    """

    def __init__(
        self,
        dim: int,
        kernel_version: str | None = "",
        epoch: int = 0,
        *,
        forgetting: float = 1.0,
        sigma: float = 1.0,
        lam: float = 1.0,
        tau: float = 1.0,
        fit_hyperparameters: bool = True,
        fit_tau: bool = True,
        min_samples: int = 32,
        max_buffered: int = 256,
        refit_growth: float = REFIT_GROWTH,
        search: str = EVIDENCE_SEARCH,
    ) -> None:
        if not (float(refit_growth) >= 0.0 and math.isfinite(refit_growth)):
            raise ValueError(f"refit_growth must be a finite fraction >= 0, got {refit_growth!r}")
        if search not in SEARCHES:
            raise ValueError(f"search must be one of {SEARCHES}, got {search!r}")
        self.refit_growth = float(refit_growth)
        self.search = search
        self.fit_tau = bool(fit_tau)
        self.dim = int(dim)
        self.kernel_version = kernel_version
        self.epoch = int(epoch)
        self.forgetting = float(forgetting)
        self.sigma = check_positive("sigma", sigma)
        self.lam = check_positive("lam", lam)
        self.tau = check_positive("tau", tau)
        self.fit = bool(fit_hyperparameters)
        self.min_samples = int(min_samples)
        self.max_buffered = int(max_buffered)
        self.clients: dict[str, tuple[SufficientStats, float]] = {}  # statistics at their time
        self.included: dict[str, int] = {}
        self._buffer: dict[str, dict[int, HierUpload]] = {}
        self.version = 0
        self.log_evidence = math.nan
        self._fitted = False
        self._last: HierGlobal | None = None

    @classmethod
    def for_client(cls, client: FedBNRHierClient, **kwargs: Any) -> FedBNRHierServer:
        kwargs.setdefault("min_samples", client.min_upload)
        kwargs.setdefault("forgetting", client.forgetting)
        for name in ("sigma", "lam", "tau"):
            kwargs.setdefault(name, getattr(client, name))
        return cls(client.dim, client.kernel_version, client.epoch, **kwargs)

    def validate(self, up: HierUpload) -> None:
        st = up.stats
        if self.kernel_version is not None and st.tag != (self.kernel_version, self.epoch):
            raise ValueError(f"upload from {up.client!r} is for kernel version/epoch {st.tag}")
        if st.S.shape != (self.dim, self.dim) or not st.is_finite() or not math.isfinite(up.time):
            raise ValueError(f"upload from {up.client!r} has a wrong shape or a non-finite value")
        if up.count < self.min_samples:
            raise ValueError(f"upload summarises {up.count} samples, below the privacy floor {self.min_samples}")
        if up.seq < 1:
            raise ValueError(f"sequence numbers start at 1, got {up.seq}")

    def add_statistics(self, up: HierUpload) -> None:
        """Add a client's statistics (already deduplicated elsewhere, e.g. by a sharded fleet's reducer),
        time-weighted with what is held for that client; `included` is the caller's to set."""
        self._add(up)

    def last_global(self) -> HierGlobal:
        """The latest published global (before any: the prior, version 0)."""
        if self._last is not None:
            return self._last
        return HierGlobal(0, self.kernel_version or "", self.epoch, 0.0, self.forgetting, self.sigma, self.lam,
                          self.tau, np.eye(self.dim) / self.lam**2, np.zeros(self.dim), 0.0, {})

    # the refit schedule (class defaults: a server pickled before it refits at every publish, as it did)
    refit_growth = 0.0
    search = "nelder-mead"
    _n_fitted = 0.0  # the (time-weighted) samples σ, λ, τ were last fitted on
    _added = 0.0  # the samples summed since that fit (uploads' counts: with forgetting the total can shrink)
    _memory: dict[str, Any] | None = None

    def refit_due(self) -> bool:
        """Whether :meth:`publish` refits `σ, λ, τ`: fitting is on, and no fit yet or the samples summed since
        the last fit are at least `refit_growth` times the samples it was fitted on (`0`: at every publish)."""
        return self.fit and (not self._fitted or self._added >= self.refit_growth * self._n_fitted)

    def _search_memory(self) -> dict[str, Any]:
        """What the evidence search carries from one warm-started fit to the next (the Newton search's curvature)."""
        if self._memory is None:
            self._memory = {}
        return self._memory

    def _add(self, up: HierUpload) -> None:
        self._added += float(up.count)
        old = self.clients.get(up.client)
        if old is None:
            self.clients[up.client] = (up.stats.copy(), up.time)
            return
        st, t = old
        g = self.forgetting
        if up.time >= t:
            new = (st.scaled(g ** (up.time - t)) if g != 1.0 else st.copy()) + up.stats
            self.clients[up.client] = (new, up.time)
        else:  # an upload stamped earlier than what is held: add it decayed to the held time
            self.clients[up.client] = (st + (up.stats.scaled(g ** (t - up.time)) if g != 1.0 else up.stats), t)

    def apply(self, up: HierUpload) -> bool:
        """Sum an upload once (`False` for a duplicate); out-of-order ones wait for the gap."""
        self.validate(up)
        return apply_in_order(self.included, self._buffer, up.client, up.seq, up, self._add, self.max_buffered)

    def waiting(self) -> dict[str, list[int]]:
        """Sequence numbers received out of order and not summed yet, per client."""
        return {c: sorted(w) for c, w in self._buffer.items() if w}

    def stats_at(self, time: float) -> dict[str, SufficientStats]:
        """Each client's statistics time-weighted to `time`."""
        g = self.forgetting
        return {c: (st.scaled(g ** (time - t)) if g != 1.0 and time > t else st.copy())
                for c, (st, t) in sorted(self.clients.items())}

    def publish(self, time: float | None = None) -> HierGlobal:
        """The shared posterior at `time` (default: the latest client time), `σ, λ, τ` refitted first."""
        t = max((tc for _, tc in self.clients.values()), default=0.0) if time is None else float(time)
        stats = list(self.stats_at(t).values())
        usable = [st for st in stats if st.n > 0]
        if self.refit_due() and usable and sum(st.q for st in usable) > 0:
            start = (self.sigma, self.lam, self.tau) if self._fitted else None
            self.sigma, self.lam, self.tau, self.log_evidence = fit_hierarchical(
                usable, start, fixed_tau=None if self.fit_tau else self.tau, method=self.search,
                memory=self._search_memory())
            self._fitted = True
            self._n_fitted, self._added = float(sum(st.n for st in usable)), 0.0
        if usable:
            lev, a, h = hierarchical_log_evidence(usable, self.sigma, self.lam, self.tau)
            self.log_evidence = lev
        else:
            a, h = np.eye(self.dim) / self.lam**2, np.zeros(self.dim)
        self.version += 1
        # no evidence before any data: 0 rather than NaN (no non-finite value leaves a process)
        lev = float(self.log_evidence) if math.isfinite(self.log_evidence) else 0.0
        self._last = HierGlobal(self.version, self.kernel_version or "", self.epoch, t, self.forgetting, self.sigma,
                                self.lam, self.tau, a, h, lev, dict(self.included))
        return self._last
