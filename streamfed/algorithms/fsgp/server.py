"""The server half of FSGP (docs/algorithms.md, "FSGP"): every upload summed exactly once under the
current `(θ, σ, Z)`, proposals averaged (FedAvg, weighted by the samples they were fitted on), versioned
globals. A new version is adopted at a window's end once the proposals of the current one weigh at least
`min_proposal_weight` samples and come from at least `proposal_quorum` of the clients heard from since the
last version (so a version is an average over the active clients, not one client's local fit, and clients
that have stopped streaming do not hold the fleet back).

Versions: the global carries `epoch`, the version of its `(θ, σ, Z)`. An upload computed under an older
epoch is carried forward through every later version by the same linear projection the global went
through (:mod:`.projection`) before it is summed, so the sum only ever holds statistics of one version;
one older than the kept history is counted in `included` (it must not be resent forever) but its
statistics are dropped and counted (`stale_dropped`). Proposals count only for the epoch they were
fitted from.
"""

from __future__ import annotations

import math

import numpy as np

from streamfed.algorithms.fsgp.elbo import LOG_BOUNDS
from streamfed.algorithms.fsgp.kernels import Hyper, cov
from streamfed.algorithms.fsgp.messages import GlobalModel, Upload
from streamfed.algorithms.fsgp.posterior import Stats, cholesky
from streamfed.algorithms.fsgp.projection import ProjectionMap
from streamfed.algorithms.in_order import apply_in_order
from streamfed.core.discount import Discount, check_time_base
from streamfed.core.durable import durable

__all__ = ["FSGPServer", "RobustFSGPServer"]


@durable("fsgp.FSGPServer")
class FSGPServer:
    """Idempotent sums, FedAvg of proposals, versioned globals.

    >>> h = Hyper.initial("se", np.zeros((2, 1)))
    >>> server = FSGPServer(h, min_samples=1, learn_hyperparameters=False)
    >>> s = Stats.zeros(2); s.add(np.ones(2), 1.0)
    >>> server.apply(Upload("a", 2, 0, s)), server.apply(Upload("a", 1, 0, s))  # out of order
    (True, True)
    >>> server.apply(Upload("a", 1, 0, s))  # a duplicate
    False
    >>> g = server.publish()
    >>> g.version, g.stats.n, g.included
    (1, 2.0, {'a': 2})
    """

    def __init__(self, hyper: Hyper, *, jitter: float = 1e-6, min_samples: int = 32,
                 learn_hyperparameters: bool = True, min_proposal_weight: float = 64.0,
                 proposal_quorum: float = 0.5, max_buffered: int = 256, history: int = 16,
                 half_life_s: float | None = None) -> None:
        self.hyper = hyper
        self.jitter = float(jitter)
        self.min_samples = int(min_samples)
        self.learn = bool(learn_hyperparameters)
        self.min_proposal_weight = float(min_proposal_weight)
        if not 0.0 < proposal_quorum <= 1.0:
            raise ValueError(f"proposal_quorum must be in (0, 1], got {proposal_quorum!r}")
        self.proposal_quorum = float(proposal_quorum)
        self.proposers: set[str] = set()
        self.heard: set[str] = set()  # clients whose uploads were summed since the last version change
        self.samples: dict[str, float] = {}  # per client: samples of every upload summed (or dropped as stale)
        self.max_buffered, self.history = int(max_buffered), int(history)
        self.epoch = 0
        self.version = 0
        self.stats = Stats.zeros(hyper.m, 0)
        self.included: dict[str, int] = {}
        self._buffer: dict[str, dict[int, Upload]] = {}
        self._hyper_of: dict[int, Hyper] = {0: hyper}
        self._maps: dict[int, ProjectionMap] = {}  # epoch e → the map from e - 1 to e
        self.prop_sum = np.zeros(hyper.n_numbers)
        self.prop_weight = 0.0
        self.stale_dropped = 0
        self.stale_proposals = 0
        self.discount = None if half_life_s is None else Discount(half_life_s)
        self.time = 0.0  # with forgetting: the reference time of `stats` (the latest upload time summed)

    # class defaults: a server stored before forgetting existed restores without it
    discount: Discount | None = None
    time = 0.0

    def hyper_of(self, epoch: int) -> Hyper | None:
        """The `(θ, σ, Z)` of a kept epoch (None if unknown or forgotten)."""
        return self._hyper_of.get(int(epoch))

    # ------------------------------------------------------------------ uploads
    def validate(self, up: Upload) -> None:
        st = up.stats
        if st.m != self.hyper.m:
            raise ValueError(f"upload has M = {st.m}, the server {self.hyper.m}")
        if up.epoch > self.epoch or up.epoch < 0:
            raise ValueError(f"upload of (θ, Z) version {up.epoch}; the server is at {self.epoch}")
        if not st.is_finite():
            raise ValueError(f"upload from {up.client!r} seq {up.seq} contains a non-finite value")
        check_time_base(up.client, self.discount is not None, up.time, st.n, up.count)
        if up.n_samples < self.min_samples:  # the raw count: a discounted n is no count of people's samples
            raise ValueError(f"upload summarises {up.n_samples:g} samples, below the privacy floor "
                             f"{self.min_samples}")
        if up.seq < 1:
            raise ValueError(f"sequence numbers start at 1, got {up.seq}")
        if up.proposal is not None:
            p = up.proposal
            if (p.m, p.d, p.kind) != (self.hyper.m, self.hyper.d, self.hyper.kind):
                raise ValueError("proposal of another shape or covariance")
            if not (math.isfinite(up.weight) and up.weight >= 0):
                raise ValueError(f"proposal weight {up.weight!r}")
            logs = np.concatenate(([p.log_amp], p.log_ls, [p.log_sigma]))
            if np.any(logs < LOG_BOUNDS[0]) or np.any(logs > LOG_BOUNDS[1]):
                raise ValueError("proposed a, ℓ or σ outside [1e-3, 1e3] (where every local fit keeps them)")

    def apply(self, up: Upload) -> bool:
        """Sum an upload once (`False` for a duplicate). One whose predecessor is missing waits, so that
        `included[client]` always means "every seq up to here"."""
        self.validate(up)
        return apply_in_order(self.included, self._buffer, up.client, up.seq, up, self._sum, self.max_buffered)

    def waiting(self) -> dict[str, list[int]]:
        return {c: sorted(w) for c, w in self._buffer.items() if w}

    def to_current(self, stats: Stats) -> Stats | None:
        """`stats` carried to the current epoch through every version since its own (None when one of
        those versions is no longer kept)."""
        for e in range(stats.epoch + 1, self.epoch + 1):
            step = self._maps.get(e)
            if step is None:
                return None
            stats = step(stats)
        return stats

    def _add(self, st: Stats, time: float) -> None:
        """Add statistics of the current epoch held at `time`: with forgetting, both terms are first brought to the
        later of `time` and the server's reference time (a scalar each), which becomes the reference time."""
        d = self.discount
        if d is None:
            self.stats = self.stats + st
        elif time > self.time:
            self.stats = d.shift(self.stats, self.time, time) + st
            self.time = float(time)
        else:
            self.stats = self.stats + d.shift(st, time, self.time)

    def stats_at(self, time: float) -> Stats:
        """The sums as held at `time` (moved forward only; without forgetting, the sums)."""
        return self.stats.copy() if self.discount is None else self.discount.shift(self.stats, self.time, time)

    def _sum(self, up: Upload) -> None:
        self.heard.add(up.client)
        # raw samples (the proposal weight's cap: a reservoir holds at most the samples its client has seen)
        self.samples[up.client] = self.samples.get(up.client, 0.0) + up.n_samples
        # the projection is linear and a discount a scalar: carrying then discounting is discounting then carrying
        st = self.to_current(up.stats)
        if st is None:
            self.stale_dropped += 1
        else:
            self._add(st, up.time)
        if up.proposal is not None and up.weight > 0:
            if up.epoch == self.epoch:
                # a reservoir holds at most the samples its client has seen, all of them uploaded by now
                # (an upload takes every pending sample): a larger claimed weight counts for no more
                w = min(float(up.weight), self.samples[up.client])
                self.prop_sum += w * up.proposal.to_vector()
                self.prop_weight += w
                self.proposers.add(up.client)
            else:
                self.stale_proposals += 1

    def add_sums(self, stats: Stats, prop_sum: np.ndarray, prop_weight: float, proposers: set[str],
                 time: float = 0.0) -> None:
        """Fold already-summed statistics and proposals of the current epoch (a reducer's partials; with forgetting
        held at `time`, brought to one reference time as an upload is)."""
        self._add(stats, time)
        if prop_weight > 0:
            self.prop_sum += prop_sum
            self.prop_weight += prop_weight
            self.proposers |= proposers
            self.heard |= proposers

    # ------------------------------------------------------------------ versions
    def ready_to_move(self) -> bool:
        heard = len(self.heard | self.proposers)
        quorum = max(1, math.ceil(self.proposal_quorum * heard - 1e-9))
        return self.learn and self.prop_weight >= self.min_proposal_weight and len(self.proposers) >= quorum

    def move(self) -> bool:
        """Adopt the weighted average of the proposals as version `epoch + 1`, carrying the global's
        statistics over. `False` if the average is unusable: the version and the sums stay, the proposals
        are discarded (the clients' next fits propose again)."""
        mean = self.prop_sum / self.prop_weight
        self.prop_sum = np.zeros_like(self.prop_sum)
        self.prop_weight = 0.0
        self.proposers = set()
        self.heard = set()
        try:
            new = Hyper.from_vector(self.hyper.kind, mean, self.hyper.m, self.hyper.d)
            cholesky(cov(new, new.Z, new.Z) + self.jitter * new.amplitude ** 2 * np.eye(new.m), "new c(Z, Z)")
            step = ProjectionMap(self.hyper, new, self.epoch + 1, self.jitter)
            # with forgetting the sums stay at their reference time `time`: the map is linear, so it commutes with
            # the scalar discount — an upload discounted later and carried equals one carried and discounted
            stats = step(self.stats)
        except ValueError:
            return False
        if not stats.is_finite():
            return False
        self.epoch += 1
        self.hyper, self.stats = new, stats
        self._hyper_of[self.epoch] = new
        self._maps[self.epoch] = step
        for old in [e for e in self._hyper_of if e < self.epoch - self.history]:
            del self._hyper_of[old]
            self._maps.pop(old, None)
        self._maps.pop(min(self._hyper_of), None)  # the oldest kept epoch has no way in from before it
        return True

    def publish(self) -> GlobalModel:
        """The next global (version + 1), after adopting new hyperparameters when enough proposals came."""
        if self.ready_to_move():
            self.move()
        self.version += 1
        return self.global_model()

    def global_model(self) -> GlobalModel:
        return GlobalModel(self.version, self.epoch, self.hyper, self.stats.copy(), dict(self.included), self.time)


@durable("fsgp.RobustFSGPServer")
class RobustFSGPServer(FSGPServer):
    """A :class:`FSGPServer` that sums a :class:`TemperedUpload` as `share · stats` with its proposal weighing
    `share · weight` (everything else as the exact server: validation, order, duplicates, versions).

    >>> h = Hyper.initial("se", np.zeros((2, 1)))
    >>> from streamfed.algorithms.fsgp.messages import TemperedUpload
    >>> server = RobustFSGPServer(h, min_samples=1, learn_hyperparameters=False)
    >>> s = Stats.zeros(2); s.add(np.ones(2), 1.0); s.add(np.ones(2), 1.0)
    >>> server.apply(TemperedUpload("a", 1, 0, s, share=0.25)), server.stats.n, server.stats.q
    (True, 0.5, 0.5)
    """

    def _sum(self, up: Upload) -> None:
        w = float(getattr(up, "share", 1.0))
        if w == 1.0:
            super()._sum(up)
            return
        # a share-0 upload proposes nothing; a tempered one weighs its share (and at most the samples it holds);
        # with forgetting its time stays, so the tempered statistics are discounted as the upload's would be
        proposal = up.proposal if w > 0 else None
        super()._sum(Upload(up.client, up.seq, up.base_version, up.stats.scaled(w), proposal, up.weight * w,
                            up.time, up.count))
