"""The client half of URK-FedBNR.

Phase 2 is FedBNR's client itself (:class:`~streamfed.algorithms.fedbnr.client.FedBNRClient`) over the frozen
network of the current kernel version (a :class:`~.network.URKFeatureMap`, numpy only): prequential
predictions, rank-one updates, delta statistics above the privacy floor. One FedBNR client serves one kernel
version; a global of a newer version replaces it by a new one over the new network, into which the client
re-embeds its reservoir exactly and carries every other sample it learned by a projection fitted on the
reservoir (:mod:`.carry`; `carry=False`: the reservoir alone, as before). Nothing of an old version is summed
with a new one: the carried statistics are new-version statistics, uploaded as any others.

Phase 1 (where torch is installed and `learn_kernel`): a bounded reservoir of raw samples (Vitter's algorithm
R, never uploaded); every `fit_every` samples, `fit_steps` Adam steps on the log evidence of the reservoir
from the current global network (FedAvg's local update, :func:`~.training.fit_local`); the delta to the
global's vector is split into chunks of at most `max_chunk_numbers` and queued. `take_update` hands out one
upload per call: pending statistics first, else the next chunk. Uploads (statistics and chunks) share one
numbering, `seq`; a map from it to the FedBNR client's own numbering of its statistics tells that client which
of its uploads a global includes.
"""

from __future__ import annotations

import importlib.util
import math
import zlib
from collections import deque

import numpy as np

from streamfed.algorithms.base import NonFiniteError, Update
from streamfed.algorithms.chunks import split_vector
from streamfed.algorithms.fedbnr.client import FedBNRClient
from streamfed.algorithms.fedbnr.messages import GlobalModel
from streamfed.algorithms.fedbnr.metrics import ridge_loss
from streamfed.algorithms.urk.carry import carry as carry_stats
from streamfed.algorithms.urk.carry import projection, sample_stats
from streamfed.algorithms.urk.messages import URKGlobal
from streamfed.algorithms.urk.network import URKFeatureMap, URKWeights
from streamfed.algorithms.urk.wire import chunk_update, stats_update
from streamfed.core.durable import durable
from streamfed.core.stats import SufficientStats

__all__ = ["URKClient", "torch_available"]


def torch_available() -> bool:
    """Whether this process can train (phase 1): torch importable."""
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):  # hidden on purpose (a blocking import hook, `sys.modules["torch"] = None`)
        return False


@durable("urk.URKClient")
class URKClient:
    """One client: predictions and statistics under the current network, a reservoir, local fits, chunks.

    >>> from streamfed.algorithms.urk.network import URKArch, initial_weights, omega
    >>> arch = URKArch(n_inputs=1, widths=(), n_omega=4)
    >>> c = URKClient(initial_weights(arch, 0), omega(arch, 0), "v", min_upload=2, learn_kernel=False)
    >>> c.learn(np.array([0.1]), 1.0), c.take_update()  # the prior predictive σ² + λ²·m/(m−1)
    ((0.0, 1.5833333333333337), None)
    >>> _ = c.learn(np.array([0.2]), 1.0)
    >>> up = c.take_update()
    >>> up.seq, up.n_samples, up.epoch, up.arrays["chunk"].size
    (1, 2, 0, 0)
    """

    # class-level defaults: a client stored before statistics were carried across versions loads with them on
    carry = True
    n_carried = 0
    half_life_s: float | None = None  # forgetting on the time base (phase 2's, FedBNR's; fixed networks)

    def __init__(self, weights: URKWeights, om: np.ndarray, kernel_version: str, *, client_id: str = "client",
                 min_upload: int = 32, learn_kernel: bool = True, reservoir: int = 256, fit_every: int = 128,
                 fit_steps: int = 10, learning_rate: float = 0.01, max_chunk_numbers: int = 512,
                 seed: int = 0, carry: bool = True, half_life_s: float | None = None) -> None:
        if min(min_upload, reservoir, fit_every, fit_steps, max_chunk_numbers) < 1:
            raise ValueError("min_upload, reservoir, fit_every, fit_steps and max_chunk_numbers must be >= 1")
        self.kernel_version = str(kernel_version)
        self.client_id = str(client_id)
        self.carry = bool(carry)  # carry every sample's statistics to a new kernel version (not only the reservoir's)
        self.n_carried = 0  # samples carried by a projection so far (counted once per version they crossed)
        self.omega = np.asarray(om, dtype=np.float64)
        self.min_upload = int(min_upload)
        self.trains = bool(learn_kernel) and torch_available()
        self.fit_every, self.fit_steps, self.learning_rate = int(fit_every), int(fit_steps), float(learning_rate)
        self.max_chunk_numbers = int(max_chunk_numbers)
        if half_life_s is not None and self.trains:
            raise ValueError("half_life_s needs learn_kernel = false: a new kernel version re-embeds the reservoir, "
                             "whose samples' times are not kept")
        self.half_life_s = None if half_life_s is None else float(half_life_s)
        self.weights = weights
        self.epoch = 0
        self.global_version = 0
        # the regret's comparator: ridge on the *initial* network's features, a fixed class whatever versions come;
        # until the first new version phase 2 uses the same map (one feature evaluation per sample)
        self._map0 = URKFeatureMap(weights, self.omega, self.kernel_version)
        self.phase2 = self._phase2(self._map0, weights.sigma, weights.lam)
        self.next_seq = 1
        self._stats_seq: dict[int, int] = {}  # upload seq → the FedBNR client's seq, this epoch's statistics
        self.queue: deque[Update] = deque()  # chunks of the proposal being sent
        self.next_proposal = 1
        self.n_fits = self.n_proposals = 0
        f = weights.arch.dim
        self._sigma0, self._lam0 = weights.sigma, weights.lam
        self._S0, self._b0, self._q0 = np.zeros((f, f)), np.zeros(f), 0.0
        # the comparator's rows wait here and are folded 32 at a time (one matrix product, not 32 outer products)
        self._stage0, self._stage_n = np.zeros((32, f)), 0
        self.n, self.loss = 0, 0.0
        self._res_x = np.zeros((int(reservoir), weights.arch.n_inputs))
        self._res_y = np.zeros(int(reservoir))
        self._res_n = self._seen = 0
        self._rng = np.random.default_rng([int(seed), zlib.crc32(self.client_id.encode())])

    def _phase2(self, fmap: URKFeatureMap, sigma: float, lam: float) -> FedBNRClient:
        return FedBNRClient(fmap, sigma=sigma, lam=lam, min_upload=self.min_upload, client_id=self.client_id,
                            half_life_s=self.half_life_s)

    @property
    def discount(self) -> object | None:
        """Phase 2's forgetting on the time base (None: off)."""
        return self.phase2.discount

    def advance(self, time: float) -> None:
        """Move phase 2's clock to `time` (:meth:`FedBNRClient.advance`; a no-op without a half-life). The regret's
        comparator is not discounted: the best fixed predictor on every own sample."""
        self.phase2.advance(time)

    # ------------------------------------------------------------------ reading
    @property
    def n_pending(self) -> int:
        return int(self.phase2.n_pending)

    @property
    def reservoir(self) -> tuple[np.ndarray, np.ndarray]:
        """The samples the local fit sees (copies)."""
        return self._res_x[: self._res_n].copy(), self._res_y[: self._res_n].copy()

    def predict(self, x: np.ndarray) -> tuple[float, float]:
        mean, var = self.phase2.predict(np.asarray(x, dtype=np.float64))
        return float(mean), float(var)

    # ------------------------------------------------------------------ learning
    def learn(self, x: np.ndarray, y: float, prediction: tuple[float, float] | None = None) -> tuple[float, float]:
        """Learn one sample (phase 2 now; phase 1 every `fit_every` samples); returns the prediction made before
        it. A `ValueError` leaves everything unchanged."""
        x = np.asarray(x, dtype=np.float64).reshape(-1)
        if x.shape != (self.weights.arch.n_inputs,) or not np.all(np.isfinite(x)):
            raise NonFiniteError(f"expected a finite input of {self.weights.arch.n_inputs} values")
        y = float(y)
        pred = self.predict(x) if prediction is None else prediction
        phi0 = self._map0.transform_one(x)
        with np.errstate(over="ignore", invalid="ignore"):
            grown = (self._q0 + y * y, self.loss + (pred[0] - y) ** 2)
        if not all(math.isfinite(g) for g in grown):
            raise NonFiniteError("a running sum would overflow")
        self.phase2.learn(x, y)  # raises before changing anything
        self._stage0[self._stage_n] = phi0
        self._stage_n += 1
        if self._stage_n == self._stage0.shape[0]:
            self._fold0()
        self._b0 += phi0 * y
        self._q0 += y * y
        self.n += 1
        self.loss += (pred[0] - y) ** 2
        self._keep(x, y)
        if self.trains and self.n % self.fit_every == 0:
            self.fit()
        return pred

    def _fold0(self) -> None:
        rows = self._stage0[: self._stage_n]
        self._S0 += rows.T @ rows
        self._stage_n = 0

    def _keep(self, x: np.ndarray, y: float) -> None:
        self._seen += 1
        cap = self._res_y.size
        if self._res_n < cap:
            i = self._res_n
            self._res_n += 1
        else:
            i = int(self._rng.integers(self._seen))
            if i >= cap:
                return
        self._res_x[i], self._res_y[i] = x, y

    def fit(self) -> bool:
        """Phase 1's local update on the reservoir; its delta, chunked, joins the upload queue. Skipped while
        the previous proposal is still being sent (a half-sent proposal would never count)."""
        if self.queue or self._res_n < 2:
            return False
        from streamfed.algorithms.urk.training import fit_local

        X, y = self.reservoir
        new = fit_local(self.weights, self.omega, X, y, steps=self.fit_steps, learning_rate=self.learning_rate)
        self.n_fits += 1
        if new is None:
            return False
        delta = new.to_vector() - self.weights.to_vector()
        for c in split_vector(self.next_proposal, delta, self.max_chunk_numbers):
            self.queue.append(chunk_update(c, float(self._res_n), 0, 0, self.epoch,
                                           self.half_life_s is not None))  # seq set when taken
        self.next_proposal += 1
        self.n_proposals += 1
        return True

    def take_update(self) -> Update | None:
        """The next upload: pending statistics (at least `min_upload` samples), else the next chunk, else None."""
        up = self.phase2.make_upload()
        seq = self.next_seq
        if up is not None:
            self._stats_seq[seq] = int(up.seq)
            if up.count:  # discounted: its time and raw count travel
                out = stats_update(up.stats, seq, self.global_version, self.epoch, up.time, up.count)
            else:
                out = stats_update(up.stats, seq, self.global_version, self.epoch)
        elif self.queue:
            c = self.queue.popleft()
            out = Update(c.arrays, 0, self.global_version, seq=seq, epoch=c.epoch)
        else:
            return None
        self.next_seq += 1
        return out

    # ------------------------------------------------------------------ globals
    def apply_global(self, g: URKGlobal) -> bool:
        """Install a global; `False` (nothing changed) for one not newer than the installed one or of an older
        kernel version. A newer kernel version replaces the network and re-embeds the reservoir."""
        if g.version <= self.global_version or g.epoch < self.epoch:
            return False
        if not (np.all(np.isfinite(g.theta)) and g.stats.is_finite() and math.isfinite(g.sigma)
                and math.isfinite(g.lam) and g.sigma > 0 and g.lam > 0):
            raise ValueError("global contains a non-finite value or a non-positive σ, λ")
        weights = URKWeights.from_vector(self.weights.arch, g.theta)
        if g.epoch == self.epoch and not np.array_equal(g.theta, self.weights.to_vector()):
            raise ValueError(f"global version {g.version} changes the network without a new kernel version")
        inc = int(g.included.get(self.client_id, 0))
        phase2 = self.phase2
        stats_seq = dict(self._stats_seq)
        if g.epoch > self.epoch:
            phase2 = self._next_phase2(weights, g.sigma, g.lam)
            stats_seq = {}
        mine = max([s2 for s, s2 in stats_seq.items() if s <= inc], default=0)
        st = g.stats
        local = GlobalModel(g.version, self.kernel_version, 0,
                            SufficientStats(st.S, st.b, st.n, st.q, self.kernel_version, 0),
                            np.array([g.sigma]), np.array([g.lam]), np.array([g.log_evidence]), {self.client_id: mine},
                            g.time)
        phase2.apply_global(local)  # raises before anything here changes
        if g.epoch > self.epoch:
            self.queue.clear()  # deltas relative to the old network: void
        self.weights, self.epoch, self.phase2 = weights, int(g.epoch), phase2
        self._stats_seq = {s: s2 for s, s2 in stats_seq.items() if s > inc}
        self.global_version = int(g.version)
        self.next_seq = max(self.next_seq, inc + 1)
        return True

    def _next_phase2(self, weights: URKWeights, sigma: float, lam: float) -> FedBNRClient:
        """Phase 2 under a new network: the reservoir embedded again exactly and, with `carry`, every other sample
        this client learned under the current network carried by the reservoir's projection (:mod:`.carry`)."""
        new_map = URKFeatureMap(weights, self.omega, self.kernel_version)
        phase2 = self._phase2(new_map, sigma, lam)
        X, y = self.reservoir
        for xi, yi in zip(X, y, strict=True):  # re-embed: the reservoir's statistics under the new network
            phase2.learn(xi, float(yi))
        if not self.carry or len(y) == 0:
            return phase2
        own = self.phase2.own_stats()
        phi_old = URKFeatureMap(self.weights, self.omega, self.kernel_version).transform_many(X)
        rest = own - sample_stats(phi_old, y, own)
        n_rest = round(float(rest.n))
        if n_rest <= 0:
            return phase2
        T, R = projection(phi_old, new_map.transform_many(X), y)
        rest = SufficientStats(rest.S, rest.b, float(n_rest), max(float(rest.q), 0.0), own.kernel_version, own.epoch)
        carried = carry_stats(rest, T, R, weights.arch.phi_sq)
        phase2.add_pending(carried)
        self.n_carried += n_rest
        return phase2

    # ------------------------------------------------------------------ regret
    def regret(self) -> dict[str, float]:
        """Prequential loss, and that of the best fixed ridge predictor in hindsight on this client's samples
        over the *initial* network's features (at the initial `σ, λ`)."""
        if self.n == 0:
            return {"n": 0.0, "loss": 0.0, "best_loss": 0.0}
        self._fold0()
        own = SufficientStats(self._S0, self._b0, float(self.n), self._q0)
        try:
            best = max(float(ridge_loss(own, self._sigma0, self._lam0)), 0.0)
        except np.linalg.LinAlgError:
            best = 0.0
        return {"n": float(self.n), "loss": float(self.loss), "best_loss": best}
