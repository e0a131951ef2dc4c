"""The server half of online FedBNR (docs/algorithms.md §4.6–3.7): it sums uploads idempotently (a
`(client, seq)` pair is applied once; out-of-order ones wait for the gap to fill), fits `σ, λ` per kernel by
maximising the exact log evidence of the global sums (:func:`~.evidence.fit_hyperparameters`) and publishes
versioned globals. What aggregators, shards and the reducer run around it: :mod:`.aggregation`."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from streamfed.algorithms.fedbnr.checks import check_positive
from streamfed.algorithms.fedbnr.discount import Discount
from streamfed.algorithms.fedbnr.evidence import SEARCHES, fit_hyperparameters, log_evidence
from streamfed.algorithms.fedbnr.messages import GlobalModel, Upload
from streamfed.algorithms.in_order import apply_in_order
from streamfed.core.discount import check_time_base
from streamfed.core.durable import durable
from streamfed.core.stats import SufficientStats

if TYPE_CHECKING:
    from streamfed.algorithms.fedbnr.client import FedBNRClient

__all__ = ["FedBNRServer"]


@durable("fedbnr.FedBNRServer")
class FedBNRServer:
    """The server half: idempotent summation of uploads, evidence-fitted hyperparameters, versioned globals.

    >>> server = FedBNRServer(dim=2, kernel_version="v", min_samples=1, fit_hyperparameters=False)
    >>> d = SufficientStats.from_samples(np.ones((3, 1, 2)), np.ones(3), kernel_version="v")
    >>> server.apply(Upload("a", 2, 0, d)), server.apply(Upload("a", 1, 0, d))  # out of order
    (True, True)
    >>> server.apply(Upload("a", 1, 0, d))  # duplicate
    False
    >>> g = server.publish()
    >>> g.version, g.stats.n, g.included
    (1, 6.0, {'a': 2})
    """

    def __init__(
        self,
        dim: int,
        n_kernels: int = 1,
        kernel_version: str = "",
        epoch: int = 0,
        *,
        sigma: float = 1.0,
        lam: float = 1.0,
        fit_hyperparameters: bool = True,
        min_samples: int = 32,
        max_buffered: int = 256,
        refit_growth: float = 0.0,
        half_life_s: float | None = None,
        search: str = "grid",
    ) -> None:
        self.dim, self.n_kernels = int(dim), int(n_kernels)
        self.kernel_version, self.epoch = str(kernel_version), int(epoch)
        self.sigma = np.full(self.n_kernels, check_positive("sigma", sigma))
        self.lam = np.full(self.n_kernels, check_positive("lam", lam))
        self.fit = bool(fit_hyperparameters)
        if not (float(refit_growth) >= 0.0 and np.isfinite(refit_growth)):
            raise ValueError(f"refit_growth must be a finite fraction >= 0, got {refit_growth!r}")
        self.refit_growth = float(refit_growth)
        if search not in SEARCHES:
            raise ValueError(f"search must be one of {SEARCHES}, got {search!r}")
        self.search = search  # how refit maximises the evidence (fit_hyperparameters)
        self.min_samples = int(min_samples)
        self.max_buffered = int(max_buffered)
        self.stats = SufficientStats.zeros(self.dim, (self.n_kernels,), self.kernel_version, self.epoch)
        self.included: dict[str, int] = {}
        self._buffer: dict[str, dict[int, Upload]] = {}
        self.version = 0
        self.log_evidence = np.zeros(self.n_kernels)
        self.discount = None if half_life_s is None else Discount(half_life_s)
        self.time = 0.0  # with forgetting: the reference time of `stats` (the latest upload time summed)

    # class defaults: a server pickled before forgetting on a time base existed restores without it
    discount: Discount | None = None
    time = 0.0

    @classmethod
    def for_client(cls, client: FedBNRClient, **kwargs: Any) -> FedBNRServer:
        """A server matching a client's feature map (dim, kernels, kernel version, privacy floor, σ, λ)."""
        kwargs.setdefault("min_samples", client.min_upload)
        kwargs.setdefault("sigma", float(client.sigma[0]))
        kwargs.setdefault("lam", float(client.lam[0]))
        kwargs.setdefault("half_life_s", client.half_life_s)
        return cls(client.dim, client.n_kernels, client.kernel_version, client.epoch, **kwargs)

    def validate(self, up: Upload) -> None:
        st = up.stats
        if st.tag != (self.kernel_version, self.epoch):
            raise ValueError(f"upload from {up.client!r} is for kernel version/epoch {st.tag}, "
                             f"server is at {(self.kernel_version, self.epoch)}")
        if st.S.shape != (self.n_kernels, self.dim, self.dim):
            raise ValueError(f"upload statistics have shape {st.S.shape}, expected "
                             f"{(self.n_kernels, self.dim, self.dim)}")
        if not st.is_finite():
            raise ValueError(f"upload from {up.client!r} seq {up.seq} contains a non-finite value")
        check_time_base(up.client, self.discount is not None, up.time, st.n, up.count)
        if up.n_samples < self.min_samples:
            raise ValueError(f"upload summarises {up.n_samples:g} samples, below the privacy floor "
                             f"{self.min_samples}")
        if up.seq < 1:
            raise ValueError(f"sequence numbers start at 1, got {up.seq}")

    def apply(self, up: Upload, *, validated: bool = False) -> bool:
        """Sum an upload once. Returns `False` for a duplicate (already summed or already waiting).
        An upload whose predecessor has not arrived waits in a buffer and is summed when the gap fills,
        so `included[client]` always means "every seq up to here". `validated`: the caller has just run
        :meth:`validate` on this very upload and nothing changed this server since (an aggregation's `check`
        followed by its `take`), so it is not run twice."""
        if not validated:
            self.validate(up)
        return apply_in_order(self.included, self._buffer, up.client, up.seq, up, self._sum, self.max_buffered)

    def _sum(self, up: Upload) -> None:
        self._add(up.stats, up.time)

    def _add(self, st: SufficientStats, time: float) -> None:
        """Add statistics held at `time`: with forgetting, both terms are first brought to the later of `time`
        and the server's reference time (a scalar each), which becomes the reference time."""
        d = self.discount
        if d is None:
            self.stats += st
        elif time > self.time:
            self.stats = d.shift(self.stats, self.time, time)
            self.stats += st
            self.time = float(time)
        else:
            self.stats += d.shift(st, time, self.time)

    def waiting(self) -> dict[str, list[int]]:
        """Sequence numbers received out of order and not summed yet, per client."""
        return {c: sorted(w) for c, w in self._buffer.items() if w}

    # the sample count of the sums σ, λ were last fitted on (class defaults: a server pickled before them refits
    # at every publish, as it did)
    refit_growth = 0.0
    _n_fitted = 0.0
    search = "grid"

    def refit_due(self) -> bool:
        """Whether :meth:`publish` refits `σ, λ`: fitting is on and the sums hold at least `1 + refit_growth`
        times the samples of the last fit (`refit_growth = 0`: at every publish)."""
        return self.samples_until_refit() <= 0.0

    def samples_until_refit(self) -> float:
        """How many samples the sums still need before :meth:`publish` refits `σ, λ` (≤ 0: due now; `inf`:
        never, fitting is off). A caller that owns every sample (the River estimator) syncs only then."""
        if not self.fit:
            return math.inf
        if self.discount is not None and self.refit_growth == 0.0:
            return 0.0  # discounted sums can shrink: "as many samples as last time" would skip refits
        return self._n_fitted * (1.0 + self.refit_growth) - self.stats.n

    def refit(self) -> bool:
        """Fit `σ_k, λ_k` per kernel by maximising the exact evidence of the current sums (and keep the
        maximised evidence). `False` when there is nothing to fit yet."""
        st = self.stats
        if st.n <= 0 or st.q <= 0:
            return False
        for k in range(self.n_kernels):
            sig, lam, value = fit_hyperparameters(st.S[k], st.b[k], st.n, st.q, search=self.search)
            self.sigma[k], self.lam[k], self.log_evidence[k] = sig, lam, value
        self._n_fitted = st.n
        return True

    def rebase(self, version: int, epoch: int) -> None:
        """Start over after the state was lost (docs/reliability.md § Lost state): empty sums of epoch `epoch`,
        nothing included, and the next :meth:`publish` is version `version` — above every version the clients
        have seen, so they install it, join the epoch and upload their totals again (`FedBNRClient.rebase`)."""
        if int(epoch) <= self.epoch or int(version) <= self.version:
            raise ValueError(f"rebase to version {version}/epoch {epoch} from {self.version}/{self.epoch}")
        self.epoch = int(epoch)
        self.stats = SufficientStats.zeros(self.dim, (self.n_kernels,), self.kernel_version, self.epoch)
        self.included, self._buffer = {}, {}
        self._n_fitted = 0.0
        self.time = 0.0
        self.version = int(version) - 1

    def publish(self) -> GlobalModel:
        """A new :class:`GlobalModel` (version + 1), hyperparameters refitted first when due
        (:meth:`refit_due`)."""
        fitted = self.refit_due() and self.refit()
        if self.stats.n > 0 and not fitted:
            self.log_evidence = np.atleast_1d(log_evidence(self.stats, self.sigma, self.lam))
        self.version += 1
        return GlobalModel(self.version, self.kernel_version, self.epoch, self.stats.copy(),
                           self.sigma.copy(), self.lam.copy(), self.log_evidence.copy(), dict(self.included),
                           self.time)
