"""The :class:`~streamfed.algorithms.base.Learner` of FedBNR — what an agent runs (docs/algorithms.md §4): the
client half, publishing its delta statistics whenever at least `min_upload` samples are pending (the privacy
floor). Order-free: it never waits for a round, and the learner numbers its own uploads (it keeps them until
a global includes them)."""

from __future__ import annotations

import copy
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from streamfed.algorithms.base import BaseLearner, ObservedClock, Regret, Update, UploadSensitivity
from streamfed.algorithms.fedbnr.messages import GlobalModel
from streamfed.algorithms.fedbnr.wire import global_fields
from streamfed.core.durable import durable
from streamfed.wire.message import Message

__all__ = ["StatsLearner", "decoded_global"]

# Globals decoded, per message: a fleet replayed in one process installs one message in every learner, and the
# decode (the unpacked scatter, K·F² numbers) is the same for all; a GlobalModel is only read by the clients.
# Keyed by the message's id while it is alive (a Message compares by value, so it is not hashable).
_decoded: dict[int, tuple[weakref.ref, GlobalModel]] = {}


def decoded_global(msg: Message) -> GlobalModel:
    """The :class:`GlobalModel` of a `fedbnr.global` message, decoded once per message object."""
    key = id(msg)
    hit = _decoded.get(key)
    if hit is not None and hit[0]() is msg:
        return hit[1]
    g = GlobalModel.from_message(global_fields(msg))
    _decoded[key] = (weakref.ref(msg, lambda _ref, key=key: _decoded.pop(key, None)), g)
    return g

@durable("fedbnr.StatsLearner")
class StatsLearner(ObservedClock, BaseLearner):
    """The :class:`~streamfed.algorithms.base.Learner` of FedBNR: `predict` gives the posterior predictive
    mean and variance, `begin_learn` predicts, `end_learn` makes the rank-one update (so the prediction is
    published before the O(F²) work).

    >>> from streamfed.algorithms.fedbnr.client import FedBNRClient
    >>> learner = StatsLearner(FedBNRClient(n_inputs=1, n_features=4, min_upload=2))
    >>> learner.learn(np.array([0.1]), 1.0), learner.take_update()
    ((0.0, 3.0), None)
    >>> _ = learner.learn(np.array([0.2]), 1.0)
    >>> up = learner.take_update()
    >>> up.seq, up.n_samples, float(up.arrays["n"])
    (1, 2, 2.0)
    """

    sample_sensitivity = True  # upload_sensitivity: a per-sample bound on (S_upper, b, q)
    noise_aware = True  # noise_variance: what the global's DP noise adds to the predictive variance

    def __init__(self, client: Any, phi_sq: float | None = None) -> None:
        self.client = client
        self.phi_sq = phi_sq  # max ‖φ(x)‖² over inputs, where the feature map bounds it (differential privacy)
        self._posteriors: tuple[int, list[tuple[np.ndarray, np.ndarray]]] | None = None  # (global version, (m, A⁻¹))
        self._pending: tuple[np.ndarray, float] | None = None

    @property
    def global_version(self) -> int:
        return int(self.client.global_version)

    @property
    def kernel_names(self) -> Sequence[str]:
        return self.client.kernel_names

    @property
    def kernel_weights(self) -> np.ndarray | None:
        return self.client.kernel_weights()

    def regret(self) -> Regret:
        d = self.client.regret()
        return Regret(float(d["n"]), float(d["loss"]), float(d["ridge_loss"]), int(d.get("best_ridge_kernel", -1)))

    def diagnostics(self) -> dict[str, float]:
        """The log evidence of the best kernel's working posterior (O(K·F³): read it per upload)."""
        return {"log_evidence": float(np.max(self.client.log_evidence()))}

    def predict(self, x: np.ndarray) -> tuple[float, float | None]:
        mean, var = self.client.predict(x)
        return float(mean), float(var)

    def begin_learn(self, x: np.ndarray, y: float) -> tuple[float, float | None]:
        if getattr(self.client, "discount", None) is not None:
            self.client.advance(self.now())
        out = self.predict(x)
        self._pending = (x, y)
        return out

    def end_learn(self) -> None:
        if self._pending is not None:
            x, y = self._pending
            self._pending = None
            self.client.learn(x, y)

    def take_update(self) -> Update | None:
        up = self.client.make_upload()
        if up is None:
            return None
        fields = up.to_message()
        arrays = {k: np.asarray(fields[k], dtype=np.float64) for k in ("S_upper", "b", "n", "q")}
        if up.count:  # discounted: the time travels, and n_samples is the raw count
            arrays["time"] = np.asarray(float(up.time))
        count = up.count if up.count else max(int(round(float(fields["n"]))), 0)
        return Update(arrays, count, int(up.base_version), seq=int(up.seq),
                      epoch=int(fields.get("epoch", 0)))

    @property
    def pending_samples(self) -> int:
        """Samples learned but not yet uploadable: below the privacy floor `min_upload`."""
        return int(self.client.n_pending)

    def upload_sensitivity(self, label_bound: float) -> UploadSensitivity:
        """One sample (`‖φ‖² <= P` for every kernel, `|y| <= label_bound`) moves `(S_upper, b, q)` by at most
        `sqrt(K·(P² + P·C²) + C⁴)`; `n` is the upload's size, set by DP's public schedule (docs/privacy.md)."""
        from streamfed.privacy.dp import stats_sensitivity

        if getattr(self, "phi_sq", None) is None:  # (also a state pickled before phi_sq existed)
            raise ValueError("this FedBNR learner was built without a bound on ‖φ‖²: its sensitivity is unknown")
        k, f = int(self.client.n_kernels), int(self.client.dim)
        return UploadSensitivity(("S_upper", "b", "q"), stats_sensitivity(float(self.phi_sq), label_bound, k),
                                 {"S_upper": f}, count="n")

    def noise_variance(self, x: np.ndarray, noise_std: float) -> float:
        """The variance that noise of per-entry scale `noise_std` on the global's `S_upper` and `b` adds to the
        predictive mean at `x`, to first order (`privacy.dp.noise_variance_of_mean`, kernels mixed with their
        weights squared: their noises are independent). The posteriors are taken once per global (`O(K·F³)`),
        then `O(K·F²)` per call."""
        from streamfed.privacy.dp import noise_variance_of_mean

        c = self.client
        cached = getattr(self, "_posteriors", None)
        if cached is None or cached[0] != c.global_version:
            cached = self._posteriors = (c.global_version, [c.posterior(k) for k in range(c.n_kernels)])
        phi = c.features(x)
        w = c.kernel_weights()
        return float(sum(w[k] ** 2 * noise_variance_of_mean(cov @ phi[k], m, float(c.sigma[k]), noise_std, noise_std)
                         for k, (m, cov) in enumerate(cached[1])))

    def install_global(self, msg: Message) -> bool:
        g = decoded_global(msg)
        if g.kernel_version == self.client.kernel_version and g.epoch > self.client.epoch:
            # an aggregator that lost its state started a new epoch: send everything learned again (on a copy,
            # so that a global refused below changes nothing)
            twin = copy.deepcopy(self.client)
            twin.rebase(g.epoch)
            installed = bool(twin.apply_global(g))
            self.client = twin
            return installed
        return bool(self.client.apply_global(g))

    def warm_up(self, x: np.ndarray) -> None:
        twin = copy.deepcopy(self.client)
        twin.predict(x)
        twin.learn(x, 0.0)
        twin.own_stats()  # folds the staged rows, as every upload does
        twin.regret()  # makes the regret's comparator (the agent reads the regret once per upload) ...
        twin.learn(x, 0.0)
        twin.own_stats()  # ... which then takes the staged rows at every flush (fold_rows)
        twin.log_evidence()  # what diagnostics() reads
