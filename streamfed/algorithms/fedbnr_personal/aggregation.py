"""The :class:`~streamfed.algorithms.base.Aggregation` of personalised FedBNR — what aggregators, shards and the
reducer run (docs/algorithms.md §5.4): the aggregation around `FedBNRHierServer` (statistics kept per client,
the shared posterior and `σ, λ, τ` by the exact evidence at each window's end)."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence

import numpy as np

from streamfed.algorithms.fedbnr.aggregation import check_statistics
from streamfed.algorithms.fedbnr_personal.messages import HierUpload
from streamfed.algorithms.fedbnr_personal.mixture import FedBNRHierMixServer
from streamfed.algorithms.fedbnr_personal.server import FedBNRHierServer
from streamfed.algorithms.fedbnr_personal.wire import GLOBAL, SCALARS
from streamfed.algorithms.summing_window import SummingWindow
from streamfed.core.discount import MAX_CLOCK_SKEW_S
from streamfed.core.durable import durable
from streamfed.core.stats import SufficientStats, pack_upper, unpack_upper
from streamfed.wire.message import Message

__all__ = ["ClientSums", "PersonalAggregation"]


@durable("fedbnr-personal.PersonalAggregation")
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

    # a state pickled before the readings' time base: clients' times count samples
    clock_time = False

    def __init__(self, server: FedBNRHierServer | FedBNRHierMixServer, *, phi_sq: float, max_abs: float = 1e100,
                 check_stats: bool = True, label_bound: float | None = None, phi_sq_min: float | None = None,
                 clock_time: bool = False) -> None:
        self.server = server
        # clock_time: uploads are stamped with their readings' time (`half_life_s`); one stamped far ahead of this
        # aggregator's clock would discount every client's statistics when the global moves to its time
        self.clock_time = bool(clock_time)
        self.phi_sq = float(phi_sq)
        # the declared bounds of an honest upload (docs/algorithms.md §4.11): labels within ±label_bound, and
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
        if self.clock_time and math.isfinite(t) and t > self.now() + MAX_CLOCK_SKEW_S:  # (∞: validate says)
            raise ValueError(f"upload time {t:.0f} is more than {MAX_CLOCK_SKEW_S:g} s ahead of this aggregator's "
                             f"clock")
        up = HierUpload(msg.client, msg.seq, t, int(msg.n_samples), st)
        self.server.validate(up)
        return up

    def now(self) -> float:
        """The aggregator's clock (seconds since the epoch): with `clock_time`, no upload may be stamped far
        beyond it."""
        return time.time()

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


@durable("fedbnr-personal.ClientSums")
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

