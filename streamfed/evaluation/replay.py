"""In-process, transport-free fleet replay: every registered algorithm's learners and aggregation driven
in time, through the same plug-in contract the MQTT runtime uses (:mod:`streamfed.algorithms.base`).

Each client of a :class:`~streamfed.evaluation.datasets.Fleet` streams its samples one at a time: at step
`t` every client that still has data predicts, learns and may produce an upload; how uploads reach the
aggregation and globals reach the clients is the *schedule*:

* ``Schedule.every_step()`` — the paper's lock-step protocol: every step's uploads are one round, applied
  in the fleet's client order, and the global is broadcast after it;
* ``Schedule.every(k)`` — the aggregation still takes each step's uploads as one round, but clients
  receive the new global only every `k` steps (they work on a stale global in between);
* ``Schedule.asynchronous(window, max_delay)`` — every upload and every broadcast takes a random
  number of steps to arrive (per-client mean delay drawn once, in `[0, max_delay]`); the aggregation
  closes a window every `window` steps, and the staleness of what it applies is recorded.

The arrangement comes from the algorithm's replay variants: ``federated`` (one aggregation), ``local``
(each client its own aggregation) or ``centralised`` (one learner takes every client's samples; each
step's samples are one round). Uploads are wrapped in the same :class:`~streamfed.wire.message.Message`
the network carries and checked by the aggregation (not encoded: nothing crosses a wire here).
Deterministic for a given seed.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from streamfed import algorithms
from streamfed.algorithms.base import Aggregation, Algorithm, Learner, Update
from streamfed.core.features import KernelSpec, gaussian_dictionary
from streamfed.evaluation.datasets import Fleet
from streamfed.fleet.config import FleetConfig
from streamfed.fleet.robustness import Robustness
from streamfed.fleet.telemetry import Z95
from streamfed.wire.message import Message

__all__ = ["AlgorithmConfig", "Arrangement", "ReplayResult", "Schedule", "algorithm_titles", "build_arrangement",
           "checkpoint_count", "replay", "time_stamps"]

_FLEET = "replay"
# a replay under differential privacy without declared scales would normalise with the data's own statistics,
# outside the privacy boundary the agent keeps (docs/privacy.md § The privacy boundary)
NEEDS_DECLARED_SCALES = ("differential privacy in a replay needs declared public scales (privacy={'public_scales': "
                         "...}: the agents standardise with them, as deployed agents do)")


@dataclass(frozen=True)
class Schedule:
    """When uploads are aggregated and globals delivered (see the module docstring).

    >>> Schedule.every(5).kind, Schedule.asynchronous(window=3, max_delay=4).window
    ('every', 3)
    """

    kind: str = "step"  # "step" | "every" | "async"
    k: int = 1
    window: int = 1
    max_delay: int = 0

    @classmethod
    def every_step(cls) -> Schedule:
        return cls("step", 1)

    @classmethod
    def every(cls, k: int) -> Schedule:
        if k < 1:
            raise ValueError("k must be >= 1")
        return cls("every", k)

    @classmethod
    def asynchronous(cls, window: int = 1, max_delay: int = 5) -> Schedule:
        if window < 1 or max_delay < 0:
            raise ValueError("window must be >= 1 and max_delay >= 0")
        return cls("async", 1, window, max_delay)

    @classmethod
    def parse(cls, text: str) -> Schedule:
        """`"step"`, `"every:K"` or `"async:WINDOW:MAX_DELAY"`."""
        parts = text.split(":")
        if parts[0] == "step":
            return cls.every_step()
        if parts[0] == "every" and len(parts) == 2:
            return cls.every(int(parts[1]))
        if parts[0] == "async" and len(parts) == 3:
            return cls.asynchronous(int(parts[1]), int(parts[2]))
        raise ValueError(f"unknown schedule {text!r}: use step, every:K or async:WINDOW:MAX_DELAY")


class AlgorithmConfig:
    """The fleet a replay builds: the kernel dictionary and its sizes, shared by every algorithm compared
    (the paper's Air setting by default: 16 Gaussian kernels with bandwidths over `[0.05, 5]`, D = 100,
    M = 1), and hyperparameters. A keyword such as ``eta=0.05`` applies to every algorithm whose parameters
    have that field; ``params={"fedbnr": {"lam": 2.0}}`` sets one algorithm's (or one variant's) own.

    >>> cfg = AlgorithmConfig(n_kernels=4, eta=0.05)
    >>> cfg.fleet_config("pofmkl", n_inputs=3, seed=0).params.eta
    0.05
    >>> cfg.fleet_config("fedbnr", n_inputs=3, seed=0).params.lam  # FedBNR has no eta; its own lam stays
    1.0
    """

    def __init__(self, n_kernels: int = 16, n_features: int = 100, bandwidth_low: float = 0.05,
                 bandwidth_high: float = 5.0, kernels: tuple[str, ...] | None = None, bin_size: int = 1,
                 params: Mapping[str, Mapping[str, Any]] | None = None,
                 privacy: Mapping[str, Any] | None = None, **shared: Any) -> None:
        self.n_kernels, self.n_features = int(n_kernels), int(n_features)
        self.bandwidth_low, self.bandwidth_high = float(bandwidth_low), float(bandwidth_high)
        self.kernels = tuple(kernels) if kernels else None
        self.bin_size = int(bin_size)
        self.params = {k: dict(v) for k, v in (params or {}).items()}
        self.shared = {k: v for k, v in shared.items() if v is not None}
        # FleetConfig's differential-privacy fields (dp_epsilon, dp_delta, clip_label, ...): docs/privacy.md
        self.privacy = {k: v for k, v in (privacy or {}).items() if v is not None}

    def as_dict(self) -> dict[str, Any]:
        """Plain, JSON-able: what a report records."""
        return {"n_kernels": self.n_kernels, "n_features": self.n_features, "bandwidth_low": self.bandwidth_low,
                "bandwidth_high": self.bandwidth_high, "kernels": list(self.kernels) if self.kernels else None,
                "bin_size": self.bin_size, "shared": dict(self.shared), "params": dict(self.params),
                **({"privacy": dict(self.privacy)} if self.privacy else {})}

    def specs(self) -> list[KernelSpec]:
        if self.kernels:
            return [KernelSpec.parse(k) for k in self.kernels]
        return gaussian_dictionary(self.n_kernels, self.bandwidth_low, self.bandwidth_high)

    def params_for(self, alg: Algorithm, variant: str | None = None) -> dict[str, Any]:
        """The hyperparameters `alg` gets: the dictionary and the shared ones it has a field for, then its own,
        then the variant's. Unknown names in its own section are refused by its model."""
        fields = alg.Params.model_fields
        dictionary = {"kernels": tuple(s.key for s in self.specs()), "n_features": self.n_features,
                      "bin_size": self.bin_size}
        out = {k: v for k, v in (dictionary | self.shared).items() if k in fields}
        out.update(self.params.get(alg.name, {}))
        if variant is not None and variant != alg.name:
            out.update(self.params.get(variant, {}))
        return out

    def fleet_config(self, algorithm: str, n_inputs: int, seed: int, variant: str | None = None,
                     label_bound: float | None = None) -> FleetConfig:
        """The fleet the replay simulates. `label_bound`: the largest |label| of the data replayed — the
        replay's streams are normalised at the dataset layer (or not at all), so the fleet's declared label bound
        is set to cover them rather than clip them (docs/reliability.md § Bounded influence)."""
        alg = algorithms.get(algorithm)
        robust = Robustness() if label_bound is None else Robustness(
            label_bound=max(Robustness().label_bound, float(label_bound) * (1 + 1e-9)))
        # declared scales (`public_scales` among the privacy settings) are applied by each agent, as a private
        # agent must; otherwise the streams come normalised at the dataset layer
        scaling = {"standardise": "online" if "public_scales" in self.privacy else "none", **self.privacy}
        return FleetConfig(fleet=_FLEET, algorithm=algorithm, n_inputs=n_inputs, seed=seed, max_clients=100_000,
                           params=alg.Params(**self.params_for(alg, variant)), robust=robust, **scaling)


@dataclass
class Arrangement:
    """Learners, aggregations, and which aggregation each client reports to."""

    name: str
    algorithm: Algorithm
    cfg: FleetConfig
    learners: list[Learner]
    aggregations: list[Aggregation]
    aggregation_of: list[int]
    federated: bool = True  # False: local-only / centralised (nothing crosses a network)
    centralised: bool = False
    kernel_names: list[str] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    kernel_version: str = ""
    # under differential privacy, each client's private learner (its public schedule counts every arrival)
    privates: list[Any] = field(default_factory=list)

    def message(self, c: int, seq: int, up: Update) -> Message:
        """Client `c`'s upload in the envelope the network carries (not encoded)."""
        return Message(_FLEET, self.names[c], self.cfg.update_kind, seq, int(up.global_version), self.kernel_version,
                       int(up.n_samples), 0.0, dict(up.arrays), epoch=int(up.epoch))

    def global_message(self, agg: Aggregation) -> Message:
        return agg.global_message(_FLEET, "aggregator", self.kernel_version)

    def broadcast(self, agg: Aggregation, clients: list[int]) -> None:
        """Install `agg`'s global in each of `clients` (a learner refusing it keeps its model)."""
        msg = self.global_message(agg)
        for c in clients:
            self.learners[c].install_global(msg)


def build_arrangement(name: str, fleet_size: int, n_inputs: int, cfg: AlgorithmConfig, seed: int,
                      names: list[str] | None = None, label_bound: float | None = None) -> Arrangement:
    """The arrangement of the replay variant `name` (an algorithm, or one of its variants such as
    ``local-only``) for a fleet of `fleet_size` clients. Client `c`'s learner is the one agent `c` of a real
    fleet would run (same seed, same index)."""
    try:
        alg, v = algorithms.variant(name)
    except KeyError as e:
        raise ValueError(e.args[0]) from None
    fcfg = cfg.fleet_config(alg.name, n_inputs, seed, v.name, label_bound=label_bound)
    names = names or [f"c{c}" for c in range(fleet_size)]
    mode = "lockstep" if alg.lockstep else "async"
    n = fleet_size
    make = alg.learner
    if fcfg.public_scales is not None:  # the agent's standardisation with declared scales (no DP: nothing leaves)
        from streamfed.fleet.agent import AgentCore

        plain = fcfg.model_copy(update={"dp_epsilon": None})

        def make(_: FleetConfig, name: str, index: int, mode: str) -> Learner:  # type: ignore[misc]
            return AgentCore(plain, name, index, mode).learner  # type: ignore[arg-type]
    if v.arrangement == "centralised":
        one = make(fcfg, names[0], 0, mode)
        learners, aggs, of = [one] * n, [alg.aggregation(fcfg)], [0] * n
    elif v.arrangement == "local":
        learners = [make(fcfg, names[c], c, mode) for c in range(n)]
        aggs, of = [alg.aggregation(fcfg) for _ in range(n)], list(range(n))
    else:
        learners = [make(fcfg, names[c], c, mode) for c in range(n)]
        aggs, of = [alg.aggregation(fcfg)], [0] * n
    privates: list[Any] = []
    if fcfg.dp_epsilon is not None and v.arrangement == "federated":
        # what an agent of the fleet runs, built by AgentCore itself: declared scales, labels bounded and clipped,
        # the private learner on the public schedule of dp_window arrivals with its dummies (docs/privacy.md § The
        # privacy boundary); the server checks bounds only
        if fcfg.public_scales is None:
            raise ValueError(NEEDS_DECLARED_SCALES)
        from streamfed.fleet.agent import AgentCore

        cores = [AgentCore(fcfg, names[c], c, mode) for c in range(n)]
        for c, core in enumerate(cores):
            core.privacy.rng = np.random.default_rng([seed, c])  # type: ignore[union-attr]
        learners, privates = [core.learner for core in cores], [core.privacy for core in cores]
        aggs = [alg.aggregation(fcfg, check_stats=False)]
    arr = Arrangement(v.name, alg, fcfg, learners, aggs, of, federated=v.arrangement == "federated",
                      centralised=v.arrangement == "centralised", kernel_names=list(learners[0].kernel_names),
                      names=names, kernel_version=alg.kernel_version(fcfg), privates=privates)
    for a, agg in enumerate(aggs):  # the initial global (eM-KOFL: the server's first kernel choice)
        arr.broadcast(agg, sorted({c for c in range(n) if of[c] == a}) if not arr.centralised else [0])
    return arr


def algorithm_titles() -> dict[str, str]:
    """Every replay variant with its description, in registry order."""
    return {v.name: v.title for n in algorithms.names() for v in algorithms.get(n).replay_variants()}


@dataclass
class ReplayResult:
    """Per-client traces and summary figures of one replay."""

    algorithm: str
    clients: list[str]
    lengths: np.ndarray  # samples per client
    sq_errors: list[np.ndarray]  # per client, (ŷ_t - y_t)²
    checkpoints: np.ndarray  # step indices where curves were sampled
    regret: np.ndarray  # (n_checkpoints, C): R_c(t) (centralised: the single learner's, repeated)
    weights: np.ndarray  # (n_checkpoints, N): kernel weights of client 0
    kernel_names: list[str]
    uploaded_numbers: np.ndarray  # per client, total numbers uploaded
    wall_s: float
    staleness_mean: float = 0.0
    rounds: int = 0
    rejected: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # per client
    centralised: bool = False  # one learner took every client's samples
    arrangement: Arrangement | None = field(default=None, repr=False)  # the learners and aggregations, at the end
    # per client, the predictive mean and variance of each step (NaN where not scored / no variance)
    means: list[np.ndarray] = field(default_factory=list, repr=False)
    variances: list[np.ndarray] = field(default_factory=list, repr=False)
    starts: np.ndarray | None = None  # per client, the step it joined the fleet at (None: all at 0)
    ys: list[np.ndarray] = field(default_factory=list, repr=False)  # per client, the targets
    # per client, each target's scale back to the stream's units (`ClientStream.y_scale`; empty: unknown)
    y_scales: list[np.ndarray] = field(default_factory=list, repr=False)
    # per client, a classifier's class probabilities of each step (rows of NaN where not scored; empty: none)
    probas: list[np.ndarray] = field(default_factory=list, repr=False)

    def first(self, client: int, n: int | None = None) -> dict[str, float]:
        """The figures of `client`'s first `n` scored samples from the step it joined (all with `n=None`):
        MSE, and for Bayesian learners the mean negative log predictive density and the share of targets
        inside the central 95% interval (NaN without variances).

        >>> import numpy as np
        >>> r = ReplayResult("x", ["a"], np.array([3]), [np.array([np.nan, 1.0, 4.0])], np.array([2]),
        ...                  np.zeros((1, 1)), np.zeros((1, 0)), [], np.zeros(1), 0.0,
        ...                  variances=[np.array([np.nan, 1.0, 1.0])], starts=np.array([1]))
        >>> r.first(0, 1)["mse"], r.first(0)["coverage"]
        (1.0, 0.5)
        """
        start = 0 if self.starts is None else int(self.starts[client])
        e2 = self.sq_errors[client][start:]
        var = self.variances[client][start:] if self.variances else np.full(e2.shape, np.nan)
        ok = ~np.isnan(e2)
        e2, var = e2[ok][:n], var[ok][:n]
        out = {"n": float(e2.size), "mse": float(e2.mean()) if e2.size else float("nan"),
               "nlpd": float("nan"), "coverage": float("nan")}
        if e2.size and not np.isnan(var).any():
            out["nlpd"] = float(np.mean(0.5 * np.log(2 * np.pi * var) + 0.5 * e2 / var))
            out["coverage"] = float(np.mean(e2 <= Z95**2 * var))
        return out

    @property
    def mse(self) -> float:
        """Mean of `(ŷ - y)²` over every client step (rejected steps excluded, see `rejected`)."""
        return float(np.nanmean(np.concatenate(self.sq_errors)))

    @property
    def mse_stream(self) -> float:
        """The MSE in the stream's own units: each error times its target's scale (`y_scale`, which the
        normalisation divided it by), squared; NaN when the scales are unknown.

        >>> r = ReplayResult("x", ["a"], np.array([2]), [np.array([1.0, 4.0])], np.array([1]), np.zeros((1, 1)),
        ...                  np.zeros((1, 0)), [], np.zeros(1), 0.0, y_scales=[np.array([10.0, 0.5])])
        >>> r.mse, r.mse_stream
        (2.5, 50.5)
        """
        if not self.y_scales:
            return float("nan")
        return float(np.nanmean(np.concatenate([e * s * s for e, s in zip(self.sq_errors, self.y_scales,
                                                                             strict=True)])))

    def classification(self) -> dict[str, float] | None:
        """A classifier's prequential accuracy, log loss and expected calibration error over every scored
        step (the agents' :class:`~streamfed.fleet.telemetry.ClassificationStats`), and its average regret in
        log loss, `log_loss_regret`: mean over clients of `R_c(T)/T_c`, the client's log loss minus that of
        the best constant class probabilities in hindsight (its class frequencies `f`, whose log loss is the
        entropy `−Σ f log f`) — the same yardstick for every classifier, where the learners' own regrets
        use different losses. None for a regressor.

        >>> r = ReplayResult("x", ["a"], np.array([2]), [np.zeros(2)], np.array([1]), np.zeros((1, 1)),
        ...                  np.zeros((1, 0)), [], np.zeros(1), 0.0, ys=[np.array([0.0, 1.0])],
        ...                  probas=[np.array([[0.5, 0.5], [0.5, 0.5]])])
        >>> c = r.classification()
        >>> round(c["log_loss"], 6), round(c["log_loss_regret"], 6)  # ½ each: the class frequencies' own loss
        (0.693147, 0.0)
        """
        if not self.probas:
            return None
        from streamfed.fleet.telemetry import ClassificationStats

        stats = ClassificationStats()
        regrets = []
        for p, y in zip(self.probas, self.ys, strict=True):
            own = ClassificationStats()
            scored = np.flatnonzero(~np.isnan(p[:, 0]))
            for t in scored:
                stats.observe(int(y[t]), p[t])
                own.observe(int(y[t]), p[t])
            if own.n:
                _, counts = np.unique(y[scored], return_counts=True)
                f = counts / own.n
                regrets.append(own.log_loss + float(np.sum(f * np.log(f))))
        return {"accuracy": stats.accuracy, "log_loss": stats.log_loss,
                "ece": stats.expected_calibration_error, "n": float(stats.n),
                "log_loss_regret": float(np.mean(regrets)) if regrets else float("nan")}

    @property
    def mse_per_client(self) -> np.ndarray:
        return np.array([np.nanmean(e) for e in self.sq_errors])

    @property
    def active(self) -> np.ndarray:
        """Per client, the steps it streamed (its length minus the steps before it joined)."""
        return self.lengths - (0 if self.starts is None else self.starts)

    @property
    def avg_regret(self) -> float:
        """Mean over clients of `R_c(T)/T_c` (centralised: `R(T)/T` of the one learner)."""
        if self.regret.shape[0] == 0:
            return float("nan")
        final = self.regret[-1]
        if self.centralised:
            return float(final[0] / self.active.sum())
        return float(np.mean(final / np.maximum(self.active, 1)))

    @property
    def uploaded_per_client_step(self) -> float:
        return float(self.uploaded_numbers.sum() / self.active.sum())

    def mse_curve(self) -> np.ndarray:
        """Fleet MSE of all samples up to each checkpoint."""
        out = []
        for t in self.checkpoints:
            tot = sum(float(np.nansum(e[: t + 1])) for e in self.sq_errors)
            cnt = sum(int(np.count_nonzero(~np.isnan(e[: t + 1]))) for e in self.sq_errors)
            out.append(tot / cnt)
        return np.array(out)

    def regret_rate_curve(self) -> np.ndarray:
        """Mean over clients of `R_c(t)/t` at each checkpoint."""
        start = np.zeros_like(self.lengths) if self.starts is None else self.starts
        t = np.clip(self.checkpoints[:, None] + 1 - start[None, :], 1, np.maximum(self.active, 1)[None, :])
        if self.centralised:
            return self.regret[:, 0] / t.sum(axis=1)
        return (self.regret / t).mean(axis=1)

    def summary(self) -> dict[str, float]:
        return {"mse": self.mse, "mse_stream": self.mse_stream, "avg_regret": self.avg_regret,
                "uploaded_per_client_step": self.uploaded_per_client_step, "wall_s": self.wall_s,
                "staleness_mean": self.staleness_mean, "rejected_steps": int(self.rejected.sum())}



def time_stamps(times: np.ndarray | None, n: int) -> np.ndarray:
    """The first `n` rows' times in seconds since the epoch (`datetime64`), or the step index when the stream has
    no times (or a missing one: a gap in a clock would forget everything before it).

    >>> time_stamps(np.array(["2013-03-01T00", "2013-03-01T01"], dtype="datetime64[h]"), 2).tolist()
    [1362096000.0, 1362099600.0]
    >>> time_stamps(None, 3).tolist()
    [0.0, 1.0, 2.0]
    """
    if times is None or np.isnat(np.asarray(times[:n])).any():
        return np.arange(n, dtype=np.float64)
    return np.asarray(times[:n]).astype("datetime64[s]").astype(np.int64).astype(np.float64)

CHECKPOINTS = 200  # the most points a replay's curves are sampled at
CHECKPOINT_SPACING = 4  # and at least this many steps apart (besides the last)


def checkpoint_count(steps: int) -> int:
    """How many checkpoints a replay of `steps` steps samples its curves at by default: `CHECKPOINTS`, but at most one
    every `CHECKPOINT_SPACING` steps (and at least two: the first step and the last). Each checkpoint reads every
    client's regret (a solve per kernel against the best fixed comparator): in a short replay, one every step or
    two would cost as much as a quarter of the replay itself.

    >>> checkpoint_count(383585), checkpoint_count(300), checkpoint_count(3)
    (200, 75, 2)
    """
    return max(2, min(CHECKPOINTS, int(steps) // CHECKPOINT_SPACING))


def replay(
    fleet: Fleet,
    algorithm: str,
    cfg: AlgorithmConfig | None = None,
    schedule: Schedule | None = None,
    seed: int = 0,
    steps: int | None = None,
    n_checkpoints: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    join: Mapping[str, int] | None = None,
    align_times: bool = False,
) -> ReplayResult:
    """Run one algorithm (or replay variant) over a fleet's streams and return its traces
    (see :class:`ReplayResult`).

    `join` maps a client (its stream's name) to the step it joins the fleet at: before it, the client takes
    no sample (its rows of those steps are not used) but receives the globals like everyone, so when it
    joins it starts from the fleet's current global — a late agent reading the retained global. From that
    step on it streams its own rows of the same steps.

    The curves (regret, MSE, kernel weights) are sampled at `n_checkpoints` steps spread evenly up to the last
    (always included: the summary figures are read there); by default :func:`checkpoint_count` of them.

    `align_times`: a step is one of the fleet's distinct row times (:func:`time_stamps`), and a client takes a
    sample at a step only if it has a row at that time — every client's clock and the globals it receives then
    stay on one time base. Without it, step `t` is every client's `t`-th row: streams whose rows have gaps
    (readings skipped for a missing value) drift apart in time, and a client behind the fleet learns from
    statistics of later times (forgetting, which discounts by the readings' times, then barely acts on it). Per
    client results (`lengths`, errors, means) stay indexed by the client's own rows; `join` counts rows too."""
    cfg = cfg or AlgorithmConfig()
    schedule = schedule or Schedule.every_step()
    streams = list(fleet.streams)
    n = len(streams)
    xs = [np.ascontiguousarray(s.X[:steps]) for s in streams]
    ys = [np.asarray(s.y[:steps], dtype=np.float64) for s in streams]
    # the fleet's one time base (Learner.observe_time): the rows' own times where the stream has them (seconds
    # since the epoch), else the step (one second a step, as a live agent without timestamps would see)
    stamps = [time_stamps(s.time, y.size) for s, y in zip(streams, ys, strict=True)]
    lengths = np.array([y.size for y in ys])
    t_max = int(lengths.max())
    rows_at: list[np.ndarray] | None = None  # aligned: the row each client takes at each step (−1: none)
    if align_times:
        grid = np.unique(np.concatenate(stamps)) if stamps else np.zeros(0)
        t_max = int(grid.size)
        rows_at = []
        for st in stamps:
            at = np.full(t_max, -1, dtype=np.int64)
            pos = np.searchsorted(grid, st)
            if np.unique(pos).size != pos.size:
                raise ValueError("align_times: a client has two rows with one time")
            at[pos] = np.arange(st.size)
            rows_at.append(at)
    names = [st.name for st in streams]
    unknown = sorted(set(join or {}) - set(names))
    if unknown:
        raise ValueError(f"join: no client named {', '.join(unknown)}; clients: {', '.join(names)}")
    starts = np.array([int((join or {}).get(name, 0)) for name in names], dtype=np.int64)
    if (starts < 0).any() or (starts >= lengths).any():
        raise ValueError("join: a client must join at a step within its stream")
    finite = [np.abs(y[np.isfinite(y)]) for y in ys]
    label_bound = max((float(a.max()) for a in finite if a.size), default=None)
    arr = build_arrangement(algorithm, n, xs[0].shape[1], cfg, seed, names=[f"c{c}" for c in range(n)],
                            label_bound=label_bound)
    learners, aggs, agg_of = arr.learners, arr.aggregations, arr.aggregation_of
    order = {name: c for c, name in enumerate(arr.names)}
    count = checkpoint_count(t_max) if n_checkpoints is None else min(int(n_checkpoints), t_max)
    checkpoints = np.unique(np.linspace(0, t_max - 1, count).astype(int))
    regret = np.zeros((checkpoints.size, n))
    weights = np.zeros((checkpoints.size, len(arr.kernel_names)))
    sq = [np.full(lengths[c], np.nan) for c in range(n)]  # NaN: not scored (before joining, or rejected)
    var_trace = [np.full(lengths[c], np.nan) for c in range(n)]
    mean_trace = [np.full(lengths[c], np.nan) for c in range(n)]
    # a classifier's probabilities: its own vector, or (a binary likelihood such as PVI's Bernoulli) [1 − m, m]
    classify = arr.algorithm.task_of(arr.cfg) == "classification"
    n_classes = (arr.algorithm.n_classes(arr.cfg) or 2) if classify else 0
    probas = [np.full((lengths[c], n_classes), np.nan) for c in range(n)] if n_classes else []
    uploaded = np.zeros(n)
    seqs = np.zeros(n, dtype=np.int64)
    rng = np.random.default_rng([seed, 0xA5])
    mean_delay = rng.uniform(0, schedule.max_delay, n) if schedule.kind == "async" else np.zeros(n)
    arrivals: dict[int, list[tuple[int, Any, int]]] = defaultdict(list)  # time → (client, item, version)
    deliveries: dict[int, list[tuple[int, Message]]] = defaultdict(list)  # time → (client, global)
    staleness: list[int] = []
    rounds = 0
    ci = 0
    start = time.perf_counter()
    rejected = np.zeros(n, dtype=np.int64)
    msg, msg_version = arr.global_message(aggs[0]), aggs[0].version  # the global of the latest version, as sent

    def step(c: int, t: int) -> Any:
        """One client step: its upload, checked by its aggregation (None when it has none). A rejected step
        (a ValueError: divergence, bad input; an ArithmeticError: a value whose square overflows) is counted,
        not fatal."""
        learner = learners[c]
        if rows_at is not None:
            t = int(rows_at[c][t])  # the client's own row at this step
        try:
            learner.observe_time(stamps[c][t])
            yhat, var = learner.learn(xs[c][t], ys[c][t])
        except (ValueError, ArithmeticError):
            rejected[c] += 1
            yhat = None
        if arr.privates:  # DP's public schedule: every labelled reading is an arrival, learned or refused
            arr.privates[c].arrival()
        if yhat is None:
            return None
        e = yhat - ys[c][t]
        sq[c][t] = e * e
        mean_trace[c][t] = yhat
        if var is not None:
            var_trace[c][t] = var
        if probas:
            p = learner.last_probabilities if learner.classifier else None
            probas[c][t] = p if p is not None else (1.0 - min(max(yhat, 0.0), 1.0), min(max(yhat, 0.0), 1.0))
        up = learner.take_update()
        if up is None:
            return None
        seqs[c] = seqs[c] + 1 if up.seq is None else up.seq
        if arr.federated:
            uploaded[c] += up.n_numbers
        try:
            return aggs[agg_of[c]].check(arr.message(c, int(seqs[c]), up))
        except (ValueError, ArithmeticError):  # refused as the aggregator would (beyond its bound): learned, not shared
            rejected[c] += 1
            return None

    for t in range(t_max):
        if rows_at is None:
            live = [c for c in range(n) if starts[c] <= t < lengths[c]]  # the clients streaming at step t
        else:  # (rows_at is −1 where a client has no row: never ≥ its start)
            live = [c for c in range(n) if rows_at[c][t] >= starts[c]]
        live_set = set(live)
        if arr.centralised:  # one learner: the fleet's samples of step t form one round
            agg = aggs[0]
            items = [(arr.names[c], item) for c in live if (item := step(c, t)) is not None]
            version = agg.version
            agg.apply_round(t + 1, items)
            rounds += 1
            if agg.version != version:
                arr.broadcast(agg, [0])
        elif not arr.federated:  # local-only: each client is its own server
            for c in range(n):
                if c in live_set and (item := step(c, t)) is not None:
                    agg = aggs[agg_of[c]]
                    agg.apply_round(t + 1, [(arr.names[c], item)])
                    arr.broadcast(agg, [c])
            rounds += 1
        elif schedule.kind in ("step", "every"):
            agg = aggs[0]
            items = [(arr.names[c], item) for c in live if (item := step(c, t)) is not None]
            agg.apply_round(t + 1, items)
            rounds += 1
            if (t + 1) % schedule.k == 0 or t == t_max - 1:
                if agg.version != msg_version:  # a global is only rebuilt (packed) when there is a new one
                    msg, msg_version = arr.global_message(agg), agg.version
                for c in range(n):
                    if learners[c].global_version < msg.global_version:
                        learners[c].install_global(msg)
        else:  # asynchronous
            agg = aggs[0]
            for c in range(n):
                if c in live_set and (item := step(c, t)) is not None:
                    arrive = t + int(rng.poisson(mean_delay[c]))
                    arrivals[arrive].append((c, item, learners[c].global_version))
            if (t + 1) % schedule.window == 0 or t == t_max - 1:
                last = t == t_max - 1  # at the end, everything still in flight is delivered
                heard = False
                for tau in [k for k in arrivals if k <= t or last]:
                    for c, item, v in arrivals.pop(tau):
                        agg.take(arr.names[c], int(seqs[c]), item)
                        staleness.append(agg.version - v)
                        heard = True
                if heard and agg.close_window(order, lambda name: int(seqs[order[name]])):
                    rounds += 1
                    msg = arr.global_message(agg)
                    for c in range(n):
                        deliveries[t + int(rng.poisson(mean_delay[c]))].append((c, msg))
            for c, msg in deliveries.pop(t, []):
                if msg.global_version > learners[c].global_version:  # an older global arriving late is ignored
                    learners[c].install_global(msg)
        if ci < checkpoints.size and t == checkpoints[ci]:
            regret[ci] = [learners[c].regret().regret for c in range(n)]
            w = learners[0].kernel_weights
            if w is not None:
                weights[ci] = w
            ci += 1
            if progress is not None:
                progress(t + 1, t_max)
    wall = time.perf_counter() - start
    return ReplayResult(
        algorithm=arr.name, clients=[s.name for s in streams], lengths=lengths, sq_errors=sq,
        checkpoints=checkpoints, regret=regret, weights=weights, kernel_names=arr.kernel_names,
        uploaded_numbers=uploaded, wall_s=wall,
        staleness_mean=float(np.mean(staleness)) if staleness else 0.0, rounds=rounds,
        rejected=rejected, centralised=arr.centralised, arrangement=arr, means=mean_trace, variances=var_trace,
        starts=starts if join else None, ys=ys,
        y_scales=[np.ones(y.size) if s.y_scale is None else np.asarray(s.y_scale[:steps], dtype=np.float64)
                  for s, y in zip(streams, ys, strict=True)],
        probas=probas,
    )
