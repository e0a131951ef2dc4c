"""Personalised FedBNR in the plug-in contract (docs/algorithms.md §10): the agent's learner around
`FedBNRHierClient`, the aggregation around `FedBNRHierServer` (statistics kept per client, the shared
posterior and `σ, λ, τ` by the exact evidence at each window's end)."""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Mapping, Sequence

import numpy as np

from streamfed.algorithms.base import Regret, Update
from streamfed.algorithms.fedbnr.aggregation import check_statistics
from streamfed.algorithms.fedbnr.metrics import ridge_loss
from streamfed.algorithms.fedbnr_personal.learner import (
    FedBNRHierClient,
    FedBNRHierMixClient,
    FedBNRHierMixServer,
    FedBNRHierServer,
    HierGlobal,
    HierUpload,
)
from streamfed.algorithms.fedbnr_personal.wire import GLOBAL, SCALARS
from streamfed.algorithms.summing_window import SummingWindow
from streamfed.core.stats import SufficientStats, pack_upper, unpack_upper
from streamfed.wire.message import Message, writable_copy

__all__ = ["PersonalAggregation", "PersonalLearner"]


class PersonalLearner:
    """The :class:`~streamfed.algorithms.base.Learner` of personalised FedBNR: the exact posterior of this
    client's own weights `w + δ_k` given the shared posterior and all its own data.

    >>> learner = PersonalLearner(FedBNRHierClient(n_inputs=1, n_features=4, min_upload=2))
    >>> _ = learner.learn(np.array([0.1]), 1.0); _ = learner.learn(np.array([0.2]), 1.0)
    >>> up = learner.take_update()
    >>> up.seq, up.n_samples, float(up.arrays["time"])
    (1, 2, 2.0)
    """

    def __init__(self, client: FedBNRHierClient | FedBNRHierMixClient, kernel_names: Sequence[str] = ()) -> None:
        self.client = client
        self.mixture = isinstance(client, FedBNRHierMixClient)
        # with the τ-mixture its "kernels" are the models of the grid, its weights their mixture weights
        self._names = tuple(f"tau={t:g}" for t in client.tau_grid) if self.mixture else tuple(kernel_names)
        self._version = 0

    @property
    def global_version(self) -> int:
        return self._version

    @property
    def kernel_names(self) -> Sequence[str]:
        return self._names

    @property
    def kernel_weights(self) -> np.ndarray | None:
        return self.client.weights() if self.mixture else None

    def regret(self) -> Regret:
        """Against the best fixed ridge predictor on this client's own samples, at the prior scale of its
        weights without sharing (`√(λ² + τ²)`; with the mixture, the best over its models)."""
        c = self.client
        own = c.own_stats()
        if own.n == 0:
            return Regret(0.0, 0.0, 0.0)
        models = c.models if self.mixture else [c]
        ridge = [float(ridge_loss(own, m.sigma, math.hypot(m.lam, m.tau))) for m in models]
        return Regret(float(own.n), float(c.metrics.sq_loss), min(ridge), int(np.argmin(ridge)))

    def diagnostics(self) -> dict[str, float]:
        """Shared vs personal evidence: the exact log evidence of the whole fleet's hierarchical model (from the
        installed global; the best model of the grid with the mixture) and this client's own prequential log
        evidence, `Σ_t log p(y_t | y_<t)` of the predictions it made."""
        c = self.client
        models = c.models if self.mixture else [c]
        shared = [g.log_evidence for m in models if (g := m.installed_global) is not None]
        out = {"own_log_evidence": -float(c.metrics.nlpd_sum)}
        if shared:
            out["shared_log_evidence"] = float(max(shared))
        return out

    def predict(self, x: np.ndarray) -> tuple[float, float | None]:
        mean, var = self.client.predict(x)
        return float(mean), float(var)

    def begin_learn(self, x: np.ndarray, y: float) -> tuple[float, float | None]:
        # the client's learning step returns the prediction it made before learning: one pass instead of a
        # prediction and a step that predicts again (the published prediction waits for the O(F²) update)
        mean, var = self.client.learn(x, y)
        return float(mean), float(var)

    def end_learn(self) -> None:
        pass

    def learn(self, x: np.ndarray, y: float) -> tuple[float, float | None]:
        return self.begin_learn(x, y)

    def take_update(self) -> Update | None:
        up = self.client.make_upload()
        if up is None:
            return None
        st = up.stats
        arrays = {"S_upper": pack_upper(st.S), "b": np.array(st.b, dtype=np.float64), "n": np.asarray(float(st.n)),
                  "q": np.asarray(float(st.q)), "time": np.asarray(float(up.time))}
        return Update(arrays, int(up.count), self._version, seq=int(up.seq), epoch=int(st.epoch))

    def flush(self) -> list[Update]:
        return []  # pending statistics below the privacy floor never leave the device (see pending_samples)

    @property
    def pending_samples(self) -> int:
        """Samples learned but not yet uploadable: below the privacy floor `min_upload`."""
        return int(self.client.n_pending)

    def install_global(self, msg: Message) -> bool:
        gs = global_from_message(msg)
        expected = len(self.client.models) if self.mixture else 1
        if len(gs) != expected:
            raise ValueError(f"global carries {len(gs)} models, this learner has {expected}")
        installed = bool(self.client.apply_global(gs) if self.mixture else self.client.apply_global(gs[0]))
        if installed:
            self._version = msg.global_version
        return installed

    def warm_up(self, x: np.ndarray) -> None:
        twin = copy.deepcopy(self.client)
        twin.predict(x)
        twin.learn(x, 0.0)


def global_from_message(msg: Message) -> list[HierGlobal]:
    """The :class:`HierGlobal` of each model of a decoded global (writable copies)."""
    if msg.kind != GLOBAL:
        raise ValueError(f"expected a {GLOBAL!r} message, got {msg.kind!r}")
    hs = writable_copy(msg.arrays["h"], "float64")
    a_upper = writable_copy(msg.arrays["A_upper"], "float64")
    scalars = {k: np.asarray(msg.arrays[k], dtype=np.float64).reshape(-1) for k in SCALARS}
    out = []
    for j in range(hs.shape[0]):
        s = {k: float(v[j]) for k, v in scalars.items()}
        out.append(HierGlobal(msg.global_version, msg.kernel_version, msg.epoch, s["time"], s["forgetting"],
                              s["sigma"], s["lam"], s["tau"], unpack_upper(a_upper[j], hs.shape[1]), hs[j],
                              s["log_evidence"], dict(msg.included)))
    return out


class PersonalAggregation(SummingWindow):
    """The :class:`~streamfed.algorithms.base.Aggregation` of personalised FedBNR. Sharded, a partial holds
    per-client sums (each client's uploads in it, time-weighted to the latest), because the server keeps
    statistics per client.

    >>> server = FedBNRHierServer(dim=2, kernel_version="v", min_samples=1, fit_hyperparameters=False)
    >>> agg = PersonalAggregation(server, phi_sq=2.0)
    >>> st = SufficientStats.from_samples(np.ones((3, 2)), np.ones(3), kernel_version="v")
    >>> agg.take("a", 1, HierUpload("a", 1, 3.0, 3, st))
    >>> agg.close_window({}, lambda c: 0), agg.version, agg.included()
    (True, 1, {'a': 1})
    """

    def __init__(self, server: FedBNRHierServer | FedBNRHierMixServer, *, phi_sq: float, max_abs: float = 1e100,
                 check_stats: bool = True, label_bound: float | None = None, phi_sq_min: float | None = None) -> None:
        self.server = server
        self.phi_sq = float(phi_sq)
        # the declared bounds of an honest upload (docs/algorithms.md §3.11): labels within ±label_bound, and
        # ‖φ‖² >= phi_sq_min (RFF features with a bias have a constant norm, which pins n to tr S)
        self.label_bound, self.phi_sq_min = label_bound, phi_sq_min
        self.max_abs = float(max_abs)
        self.check_stats = bool(check_stats)
        self._dirty = False
        self._time = 0.0  # the latest client time seen (the global's time)

    def _stats(self, s_upper: np.ndarray, b: np.ndarray, n: float, q: float, msg: Message) -> SufficientStats:
        b = np.array(b, dtype=np.float64)
        return SufficientStats(unpack_upper(np.array(s_upper, dtype=np.float64), b.shape[0]), b, float(n), float(q),
                               msg.kernel_version, msg.epoch)

    def check(self, msg: Message) -> HierUpload:
        a = msg.arrays
        st = self._stats(a["S_upper"], a["b"], float(a["n"]), float(a["q"]), msg)
        t = float(a["time"])
        checked = self.check_stats
        check_statistics(st, max_abs=self.max_abs, phi_sq=self.phi_sq if checked else None,
                         whole_n=self.server.forgetting == 1.0,
                         label_bound=getattr(self, "label_bound", None) if checked else None,
                         phi_sq_min=getattr(self, "phi_sq_min", None) if checked else None)
        up = HierUpload(msg.client, msg.seq, t, int(msg.n_samples), st)
        self.server.validate(up)
        return up

    # ---------------------------------------------------------------- shards and reducer
    def partial(self, items: Sequence[HierUpload]) -> tuple[dict[str, np.ndarray], int, int]:
        per: dict[str, HierUpload] = {}
        for up in sorted(items, key=lambda u: (u.client, u.seq)):
            held = per.get(up.client)
            per[up.client] = up if held is None else _merge(held, up, self.server.forgetting)
        rows = [per[c] for c in sorted(per)]  # the sorted names of the partial's `included`
        arrays = {"S_upper": np.stack([pack_upper(u.stats.S) for u in rows]),
                  "b": np.stack([u.stats.b for u in rows]), "n": np.array([u.stats.n for u in rows]),
                  "q": np.array([u.stats.q for u in rows]), "time": np.array([u.time for u in rows]),
                  "count": np.array([u.count for u in rows], dtype=np.int64)}
        return arrays, int(sum(u.count for u in rows)), int(self.server.epoch)

    def read_partial(self, msg: Message) -> ClientSums:
        names = sorted(msg.included)
        a = msg.arrays
        if a["n"].shape[0] != len(names):
            raise ValueError(f"{a['n'].shape[0]} rows of statistics for {len(names)} clients")
        out = ClientSums(self.server.forgetting)
        for i, c in enumerate(names):
            st = self._stats(a["S_upper"][i], a["b"][i], float(a["n"][i]), float(a["q"][i]), msg)
            t = float(a["time"][i])
            if st.tag != (self.server.kernel_version, self.server.epoch) or not (st.is_finite() and math.isfinite(t)):
                raise ValueError(f"partial statistics of {c!r}: wrong kernel version/epoch or non-finite")
            out[c] = HierUpload(c, int(msg.included[c]), t, int(a["count"][i]), st)
        return out

    def apply_partial(self, total: ClientSums, n_clients: int, included: Mapping[str, int]) -> None:
        for up in total.values():
            self.server.add_statistics(up)
        self.server.included = dict(included)
        self.server.publish()

    def global_message(self, fleet: str, sender: str, kernel_version: str) -> Message:
        last = self.server.last_global()
        gs = last if isinstance(last, list) else [last]
        g = gs[0]
        arrays = {"A_upper": np.stack([pack_upper(x.A) for x in gs]), "h": np.stack([np.asarray(x.h) for x in gs]),
                  **{k: np.array([float(getattr(x, k)) for x in gs]) for k in SCALARS}}
        return Message(fleet, sender, GLOBAL, g.version, g.version, kernel_version, 0, time.time(), arrays, {},
                       dict(g.included), g.epoch)

    def warm_up(self) -> None:
        pass


class ClientSums(dict):  # type: ignore[type-arg]
    """client → its uploads in one or more partials, merged (time-weighted to the latest); `+` merges two,
    which is how the reducer sums partials within a window or a round.

    >>> st = SufficientStats.from_samples(np.ones((2, 2)), np.ones(2))
    >>> a, b = ClientSums(1.0), ClientSums(1.0)
    >>> a["x"] = HierUpload("x", 1, 1.0, 2, st); b["x"] = HierUpload("x", 2, 2.0, 2, st)
    >>> m = (a + b)["x"]
    >>> m.seq, m.count, m.stats.n, m.time
    (2, 4, 4.0, 2.0)
    """

    def __init__(self, forgetting: float) -> None:
        super().__init__()
        self.forgetting = float(forgetting)

    def __add__(self, other: ClientSums) -> ClientSums:  # type: ignore[override]
        out = ClientSums(self.forgetting)
        out.update(self)
        for c, up in other.items():
            held = out.get(c)
            out[c] = up if held is None else _merge(held, up, self.forgetting)
        return out


def _merge(a: HierUpload, b: HierUpload, forgetting: float) -> HierUpload:
    """Two uploads of one client as one, time-weighted to the later time (as the server would hold them)."""
    (early, late) = (a, b) if a.time <= b.time else (b, a)
    scale = forgetting ** (late.time - early.time) if forgetting != 1.0 else 1.0
    st = late.stats + (early.stats.scaled(scale) if scale != 1.0 else early.stats)
    return HierUpload(a.client, max(a.seq, b.seq), late.time, a.count + b.count, st)


