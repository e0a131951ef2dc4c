"""The server half of URK-FedBNR: phase-2 statistics summed exactly under the current network (FedBNR's sums
and evidence fit of `σ, λ`), phase-1 proposals reassembled from their chunks and averaged — FedAvg weighted by
the samples each was fitted on, or knowledge distillation on a small server-held set (thesis eq. 3.4) — and a
new kernel version adopted once enough proposals came (the quorum rule of FSGP).

Versions never mix. A new network starts a new epoch with empty sums (the clients re-embed their reservoirs
and upload them again). Uploads are applied once and in each client's seq order (statistics and chunks share
the numbering); one computed under an older epoch is not summed — it is counted (`stale_stats`,
`stale_chunks`) and logged with its reason — but its seq is marked applied, so the client is not asked to send
it again forever (its statistics belong to a network that is gone).

Robust aggregation (docs/algorithms.md §10.3, §8.11, `robust` and `share` set by the factory from `[fleet.robust]`):
a new network is `θ + robust_delta(one delta per client)` (clipping, then a coordinate-wise trimmed mean;
distillation starts from it and aims at the entrywise trimmed mean of the clients' Gram matrices), and no
client's samples may exceed `share_cap` of the statistics of a version (FedBNR's share cap: an upload that
would put its client over it is summed with the fraction that fits).

Forgetting (`half_life_s`, fixed networks): the sums are held at `time`, the latest upload time summed, and an
upload is brought to the later of the two times before it is added (FedBNR's `_add`); each client's held samples
(robust mode) are discounted with the sums.
"""

from __future__ import annotations

import logging
import math

import numpy as np

from streamfed.algorithms.chunks import Reassembly
from streamfed.algorithms.fedbnr.evidence import fit_hyperparameters, log_evidence
from streamfed.algorithms.in_order import apply_in_order
from streamfed.algorithms.shares import share_allowance
from streamfed.algorithms.urk.messages import ChunkItem, StatsItem, URKGlobal
from streamfed.algorithms.urk.network import URKWeights
from streamfed.algorithms.urk.robust_proposals import RobustProposals, per_client_rows, robust_delta
from streamfed.core.discount import Discount
from streamfed.core.durable import durable
from streamfed.core.stats import SufficientStats

__all__ = ["LOG_BOUNDS", "URKServer"]

log = logging.getLogger(__name__)

#: The range the local fits keep `log σ`, `log λ` and the log-lengthscales in (see `training.LOG_BOUNDS`).
LOG_BOUNDS = (math.log(1e-3), math.log(1e3))


def _log_entries(w: URKWeights) -> np.ndarray:
    return np.concatenate([w.arrays["log_ls"], [w.log_sigma, w.log_lam]])


@durable("urk.URKServer")
class URKServer:
    """Idempotent sums per kernel version, averaged (or distilled) proposals, versioned globals.

    >>> from streamfed.algorithms.urk.network import URKArch, initial_weights, omega
    >>> arch = URKArch(n_inputs=1, widths=(), n_omega=2)
    >>> server = URKServer(initial_weights(arch, 0), omega(arch, 0), "v", min_samples=1, fit=False)
    >>> st = SufficientStats.from_samples(np.full((2, 1, 4), 0.5), np.ones(2), "v")
    >>> server.apply(StatsItem("a", 2, 0, 0, st)), server.apply(StatsItem("a", 1, 0, 0, st))  # out of order
    (True, True)
    >>> server.apply(StatsItem("a", 1, 0, 0, st))  # a duplicate
    False
    >>> g = server.publish()
    >>> g.version, g.epoch, g.stats.n, g.included
    (1, 0, 4.0, {'a': 2})
    """

    # class-level defaults: a server pickled before robust aggregation existed restores as the exact one
    robust: RobustProposals | None = None
    heard_before: set[str] = frozenset()  # type: ignore[assignment]
    share: tuple[float, float] | None = None  # (share_cap, floor): robust mode's cap on a client's samples
    proposal_clients: list[str] | None = None
    held: dict[str, float] | None = None
    tempered = 0
    discount: Discount | None = None  # forgetting (a server stored before it existed restores without)
    time = 0.0

    def __init__(self, weights: URKWeights, om: np.ndarray, kernel_version: str, *, min_samples: int = 32,
                 fit: bool = True, learn_kernel: bool = True, aggregation: str = "fedavg",
                 distill_set: tuple[np.ndarray, np.ndarray] | None = None, distill_alpha: float = 1.0,
                 distill_steps: int = 20, distill_learning_rate: float = 0.01, min_proposal_weight: float = 256.0,
                 proposal_quorum: float = 0.5, max_proposal_weight: float = 256.0, max_buffered: int = 256,
                 robust: RobustProposals | None = None, share: tuple[float, float] | None = None,
                 half_life_s: float | None = None) -> None:
        if aggregation not in ("fedavg", "distill"):
            raise ValueError(f"aggregation must be 'fedavg' or 'distill', got {aggregation!r}")
        if aggregation == "distill" and learn_kernel and distill_set is None:
            raise ValueError("knowledge distillation needs a server-held set (distill_inputs, distill_targets)")
        if not 0.0 < proposal_quorum <= 1.0:
            raise ValueError(f"proposal_quorum must be in (0, 1], got {proposal_quorum!r}")
        self.weights = weights
        self.omega = np.asarray(om, dtype=np.float64)
        self.kernel_version = str(kernel_version)
        self.min_samples, self.fit, self.learn = int(min_samples), bool(fit), bool(learn_kernel)
        self.aggregation = aggregation
        self.distill_set = distill_set
        self.distill_alpha, self.distill_steps = float(distill_alpha), int(distill_steps)
        self.distill_learning_rate = float(distill_learning_rate)
        self.min_proposal_weight, self.proposal_quorum = float(min_proposal_weight), float(proposal_quorum)
        self.max_proposal_weight = float(max_proposal_weight)
        self.max_buffered = int(max_buffered)
        self.robust, self.share = robust, share
        self.held = {}  # robust mode: per client, its (weighted) samples in this version's statistics
        self.tempered = 0  # robust mode: statistics summed with a weight below 1 (the share cap)
        self.epoch = 0
        self.version = 0
        self.sigma, self.lam = weights.sigma, weights.lam
        self.log_ev = 0.0
        self.stats = self._zeros()
        self.included: dict[str, int] = {}
        self._buffer: dict[str, dict[int, StatsItem | ChunkItem]] = {}
        self.chunks = Reassembly()
        self.theta = weights.to_vector()
        self._reset_proposals()
        self.stale_stats = self.stale_chunks = self.refused_proposals = self.failed_moves = self.failed_fits = 0
        self.discount = None if half_life_s is None else Discount(half_life_s)
        self.time = 0.0  # with forgetting: the reference time of `stats`

    def _zeros(self) -> SufficientStats:
        return SufficientStats.zeros(self.weights.arch.dim, (1,), self.kernel_version, self.epoch)

    def _reset_proposals(self) -> None:
        self.prop_sum = np.zeros(self.weights.arch.n_params)
        self.prop_weight = 0.0
        self.proposals: list[np.ndarray] = []  # whole proposed vectors, for distillation
        self.proposal_clients = []  # who proposed each (robust mode: one row per client)
        self.proposers: set[str] = set()
        # the clients heard in the version before count towards the quorum too: right after a new version
        # nobody has been heard, and a hostile client proposing first would meet the quorum alone, version
        # after version — each move within the bound, but as many moves as it likes (docs/algorithms.md §10.3)
        self.heard_before: set[str] = set(getattr(self, "heard", ()))
        self.heard: set[str] = set()

    # ------------------------------------------------------------------ uploads
    def validate(self, item: StatsItem | ChunkItem) -> None:
        """`ValueError` for an item that can never be applied (changes nothing). An item of an older epoch
        passes: it is applied as "stale" (counted, not summed)."""
        if item.seq < 1:
            raise ValueError(f"sequence numbers start at 1, got {item.seq}")
        if item.epoch > self.epoch or item.epoch < 0:
            raise ValueError(f"upload of kernel version {item.epoch}; the server is at {self.epoch}")
        if isinstance(item, StatsItem):
            st = item.stats
            if st.S.shape != (1, self.weights.arch.dim, self.weights.arch.dim):
                raise ValueError(f"statistics of shape {st.S.shape}")
            if not st.is_finite():
                raise ValueError(f"upload from {item.client!r} seq {item.seq} contains a non-finite value")
            if (self.discount is None) != (item.count == 0):
                raise ValueError(f"upload from {item.client!r} is {'not ' if item.count == 0 else ''}time-discounted, "
                                 f"the server {'forgets' if self.discount else 'does not forget'}")
            if item.count and not (math.isfinite(item.time) and 0.0 < st.n <= item.count):
                raise ValueError(f"upload from {item.client!r}: time {item.time!r} is not finite or its discounted "
                                 f"count {st.n:g} is not in (0, {item.count}]")
            if item.n_samples < self.min_samples:  # the raw count, with forgetting too
                raise ValueError(f"upload summarises {item.n_samples:g} samples, below the privacy floor "
                                 f"{self.min_samples}")
            return
        c = item.chunk
        if c.total != self.weights.arch.n_params:
            raise ValueError(f"a proposal of {c.total} numbers; the network has {self.weights.arch.n_params}")
        if not (math.isfinite(item.weight) and item.weight >= 0):
            raise ValueError(f"proposal weight {item.weight!r}")
        if item.epoch == self.epoch:
            self.chunks.check(item.client, c)

    def apply(self, item: StatsItem | ChunkItem) -> bool:
        """Apply an item once, in its client's seq order (`False` for a duplicate)."""
        self.validate(item)
        return apply_in_order(self.included, self._buffer, item.client, item.seq, item, self._apply, self.max_buffered)

    def waiting(self) -> dict[str, list[int]]:
        return {c: sorted(w) for c, w in self._buffer.items() if w}

    def _apply(self, item: StatsItem | ChunkItem) -> None:
        if item.epoch != self.epoch:
            if isinstance(item, StatsItem):
                self.stale_stats += 1
            else:
                self.stale_chunks += 1
            log.info("upload %s/%d of kernel version %d not used: the server is at %d", item.client, item.seq,
                     item.epoch, self.epoch)
            return
        self.heard.add(item.client)
        if isinstance(item, StatsItem):
            st = SufficientStats(item.stats.S, item.stats.b, item.stats.n, item.stats.q, self.kernel_version,
                                 self.epoch)
            d = self.discount
            if d is not None:  # both to the later time (a scalar each), the shares held with the sums
                if item.time > self.time:
                    g = d.factor(self.time, item.time)
                    self.stats = self.stats.scaled(g)
                    if self.held:
                        self.held = {c: h * g for c, h in self.held.items()}
                    self.time = float(item.time)
                else:
                    st = d.shift(st, item.time, self.time)
            if self.share is not None:
                st = self._capped(item.client, st)
            self.stats += st
            return
        delta = self.chunks.add(item.client, item.chunk)
        if delta is None or item.weight <= 0 or not self.learn:
            return
        try:
            proposed = URKWeights.from_vector(self.weights.arch, self.theta + delta)
        except ValueError:
            proposed = None
        logs = None if proposed is None else _log_entries(proposed)
        if logs is None or np.any(logs < LOG_BOUNDS[0] - 1e-9) or np.any(logs > LOG_BOUNDS[1] + 1e-9):
            self.refused_proposals += 1  # what no local fit produces (the fits clamp these logs)
            return
        # a reservoir holds at most max_proposal_weight samples: no client outweighs the fleet by claiming more
        w = min(float(item.weight), self.max_proposal_weight)
        self.prop_sum += w * delta
        self.prop_weight += w
        self.proposals.append(self.theta + delta)
        if self.proposal_clients is not None:
            self.proposal_clients.append(item.client)
        self.proposers.add(item.client)

    def _capped(self, client: str, st: SufficientStats) -> SufficientStats:
        """Robust mode: `st` scaled so that `client` holds at most `share_cap` of this version's samples
        (or `floor`), FedBNR's rule (:func:`~streamfed.algorithms.shares.share_allowance`)."""
        assert self.share is not None and self.held is not None
        cap, floor = self.share
        total = sum(self.held.values())
        allowed = share_allowance(self.held.get(client, 0.0), total, cap, floor)
        n = float(st.n)
        w = 1.0 if n <= allowed else allowed / n
        self.held[client] = self.held.get(client, 0.0) + w * n
        if w < 1.0:
            self.tempered += 1
            return st.scaled(w)
        return st

    def client_shares(self) -> dict[str, float]:
        """Robust mode: each client's share of this version's samples (empty in exact mode)."""
        total = sum(self.held.values()) if self.held else 0.0
        return {c: h / total for c, h in self.held.items()} if total > 0 else {}

    # ------------------------------------------------------------------ versions
    def ready_to_move(self) -> bool:
        voters = self.heard | self.proposers | self.heard_before
        quorum = max(1, math.ceil(self.proposal_quorum * len(voters) - 1e-9))
        return self.learn and self.prop_weight >= self.min_proposal_weight and len(self.proposers) >= quorum

    def move(self) -> bool:
        """Adopt the average of the proposals (FedAvg), or distil it (KD), as kernel version `epoch + 1`: empty
        sums, open chunks dropped. `False` (nothing but the proposals changes) if the result is unusable."""
        proposals = self.proposals
        trim = None
        if self.robust is None:
            mean = self.theta + self.prop_sum / self.prop_weight
        else:  # one row per client, clipped, trimmed (docs/algorithms.md §10.3)
            _, rows = per_client_rows(list(self.proposal_clients or []), [p - self.theta for p in proposals])
            mean = self.theta + robust_delta(rows, self.robust)
            proposals = [self.theta + r for r in rows]
            trim = self.robust.trim
        self._reset_proposals()
        try:
            new = URKWeights.from_vector(self.weights.arch, mean)
            if self.aggregation == "distill":
                from streamfed.algorithms.urk.training import distill

                assert self.distill_set is not None
                clients = [URKWeights.from_vector(self.weights.arch, p) for p in proposals]
                out = distill(new, clients, self.omega, *self.distill_set, alpha=self.distill_alpha,
                              steps=self.distill_steps, learning_rate=self.distill_learning_rate, trim=trim)
                if out is None:
                    raise ValueError("distillation left finite numbers")
                new = out
        except ValueError as e:
            self.failed_moves += 1
            log.warning("new kernel version not adopted: %s", e)
            return False
        self.epoch += 1
        self.weights, self.theta = new, new.to_vector()
        self.sigma, self.lam = new.sigma, new.lam
        self.stats = self._zeros()
        self.held = {}
        self.chunks.drop_open()
        return True

    def publish(self) -> URKGlobal:
        """The next global (version + 1): a new kernel version first when the proposals are ready, then `σ, λ`
        of the last layer refitted on the sums by the exact evidence (FedBNR's type-II maximum likelihood)."""
        if self.ready_to_move():
            self.move()
        st = self.stats
        fitted: tuple[float, float, float] = (self.sigma, self.lam, 0.0)
        if st.n > 0 and st.q > 0:
            try:
                with np.errstate(all="ignore"):  # a non-finite result is handled below
                    if self.fit:
                        fitted = fit_hyperparameters(st.S[0], st.b[0], st.n, st.q)
                    else:
                        ev = float(np.atleast_1d(log_evidence(st, self.sigma, self.lam))[0])
                        fitted = (self.sigma, self.lam, ev)
            except np.linalg.LinAlgError:
                fitted = (self.sigma, self.lam, math.nan)
        if all(math.isfinite(v) for v in fitted) and fitted[0] > 0 and fitted[1] > 0:
            self.sigma, self.lam, self.log_ev = fitted
        else:  # no non-finite value leaves the server: keep σ, λ, say nothing of the evidence
            self.failed_fits += 1
            self.log_ev = 0.0
        self.version += 1
        return self.global_model()

    def global_model(self) -> URKGlobal:
        return URKGlobal(self.version, self.epoch, self.theta.copy(), self.stats.copy(), float(self.sigma),
                         float(self.lam), float(self.log_ev), dict(self.included), self.time)
