"""In-process, transport-free fleet replay: the learners' client and server halves driven in time.

Each client of a :class:`~streamfed.evaluation.datasets.Fleet` streams its samples one at a time: at step `t`
every client that still has data predicts, learns and produces an upload; how uploads reach the
server and globals reach the clients is the *schedule*:

* ``Schedule.every_step()`` — the paper's lock-step protocol: aggregate and broadcast every step;
* ``Schedule.every(k)`` — the server still aggregates each step's uploads as one round, but clients
  receive the new global only every `k` steps (they work on a stale global in between);
* ``Schedule.asynchronous(window, max_delay)`` — every upload and every broadcast takes a random
  number of steps to arrive (per-client mean delay drawn once, in `[0, max_delay]`); the server
  aggregates in windows of `window` steps, `C` = the clients heard in the window (each client's
  uploads within a window are summed), and records the staleness of what it applies.

Deterministic for a given seed. The same client/server objects run in the MQTT runtime.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from streamfed.algorithms.kofl.learner import (
    EMKOFLClient,
    KOFLServer,
    KOFLUpdate,
    OFMKLAvgClient,
    OFSKLClient,
    VMKOFLClient,
)
from streamfed.algorithms.pofmkl.learner import KernelUpdate, POFMKLClient, POFMKLServer, merge_updates
from streamfed.core.features import KernelSpec, RFFBank, gaussian_dictionary
from streamfed.evaluation.datasets import Fleet

__all__ = ["ALGORITHMS", "AlgorithmConfig", "ReplayResult", "Schedule", "build_algorithm", "replay"]


class ClientHalf(Protocol):
    def step(self, x: np.ndarray, y: float) -> tuple[float, Any]: ...
    def set_global(self, params: Any, version: int) -> None: ...
    @property
    def regret(self) -> float: ...
    @property
    def kernel_weights(self) -> np.ndarray: ...


class ServerHalf(Protocol):
    def add(self, update: Any) -> None: ...
    def finish_round(self) -> int: ...
    def global_params(self) -> Any: ...


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


@dataclass(frozen=True)
class AlgorithmConfig:
    """Hyperparameters shared by POF-MKL and the baselines (the paper's Air setting by default:
    16 Gaussian kernels, D = 100, M = 1)."""

    n_kernels: int = 16
    n_features: int = 100
    bandwidth_low: float = 0.05
    bandwidth_high: float = 5.0
    kernels: tuple[str, ...] | None = None
    eta: float = 0.005
    lam: float = 1e-4
    xi: float = 0.1
    bin_size: int = 1
    ofskl_kernel: int | None = None  # index into the dictionary; default: the middle bandwidth

    def specs(self) -> list[KernelSpec]:
        if self.kernels:
            return [KernelSpec.parse(k) for k in self.kernels]
        return gaussian_dictionary(self.n_kernels, self.bandwidth_low, self.bandwidth_high)


@dataclass
class Arrangement:
    """Clients, servers, and which server each client reports to."""

    name: str
    clients: list[ClientHalf]
    servers: list[ServerHalf]
    server_of: list[int]
    federated: bool = True  # False: local-only / centralised (nothing crosses a network)
    centralised: bool = False
    kernel_names: list[str] = field(default_factory=list)


def _pofmkl_fleet(bank: RFFBank, cfg: AlgorithmConfig, n: int, seed: int, mode: str) -> Arrangement:
    def client(c: int) -> POFMKLClient:
        return POFMKLClient(bank, cfg.eta, cfg.lam, cfg.xi, cfg.bin_size, rng=np.random.default_rng([seed, c]))

    names = bank.kernel_names
    if mode == "federated":
        return Arrangement("pofmkl", [client(c) for c in range(n)],
                           [POFMKLServer(bank.n_kernels, bank.dim)], [0] * n, kernel_names=names)
    if mode == "local":
        return Arrangement("local-only", [client(c) for c in range(n)],
                           [POFMKLServer(bank.n_kernels, bank.dim) for _ in range(n)], list(range(n)),
                           federated=False, kernel_names=names)
    one = client(0)
    return Arrangement("centralised", [one] * n, [POFMKLServer(bank.n_kernels, bank.dim)], [0] * n,
                       federated=False, centralised=True, kernel_names=names)


def build_algorithm(name: str, fleet_size: int, n_inputs: int, cfg: AlgorithmConfig, seed: int) -> Arrangement:
    """The client/server arrangement of one algorithm for a fleet of `fleet_size` clients."""
    bank = RFFBank(cfg.specs(), cfg.n_features, n_inputs, seed=seed)
    n = fleet_size
    if name == "pofmkl":
        return _pofmkl_fleet(bank, cfg, n, seed, "federated")
    if name == "local-only":
        return _pofmkl_fleet(bank, cfg, n, seed, "local")
    if name == "centralised":
        return _pofmkl_fleet(bank, cfg, n, seed, "centralised")
    if name == "ofskl":
        p0 = bank.n_kernels // 2 if cfg.ofskl_kernel is None else cfg.ofskl_kernel
        single = bank.kernel(p0).bank
        return Arrangement("ofskl", [OFSKLClient(single, cfg.eta, cfg.lam) for _ in range(n)],
                           [POFMKLServer(1, bank.dim)], [0] * n, kernel_names=single.kernel_names)
    if name == "ofmkl-avg":
        return Arrangement("ofmkl-avg", [OFMKLAvgClient(bank, cfg.eta, cfg.lam) for _ in range(n)],
                           [POFMKLServer(bank.n_kernels, bank.dim)], [0] * n, kernel_names=bank.kernel_names)
    if name in ("vm-kofl", "em-kofl"):
        sample = name == "em-kofl"
        cls = EMKOFLClient if sample else VMKOFLClient
        server = KOFLServer(bank.n_kernels, bank.dim, cfg.eta, sample=sample,
                            rng=np.random.default_rng([seed, 0xE3]))
        arr = Arrangement(name, [cls(bank, cfg.eta, cfg.lam) for _ in range(n)], [server], [0] * n,
                          kernel_names=bank.kernel_names)
        for c in arr.clients:  # eM-KOFL's first kernel choice comes from the server
            c.set_global(server.global_params(), 0)
        return arr
    raise ValueError(f"unknown algorithm {name!r}; choose from {sorted(ALGORITHMS)}")


ALGORITHMS: dict[str, str] = {
    "pofmkl": "POF-MKL (personal kernel weights, one sampled bin of M kernels uploaded)",
    "ofskl": "OFSKL (one pre-selected Gaussian kernel, Fed-OMD)",
    "ofmkl-avg": "OFMKL-Avg (all kernels learned independently, plain average)",
    "vm-kofl": "vM-KOFL (all kernels uploaded, fleet-wide exponential weights)",
    "em-kofl": "eM-KOFL (one server-sampled kernel per step)",
    "local-only": "POF-MKL without federation (each client its own server)",
    "centralised": "POF-MKL as one learner on all data (each step's fleet samples one mini-batch)",
}


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

    @property
    def mse(self) -> float:
        """Mean of `(ŷ - y)²` over every client step (rejected steps excluded, see `rejected`)."""
        return float(np.nanmean(np.concatenate(self.sq_errors)))

    @property
    def mse_per_client(self) -> np.ndarray:
        return np.array([np.nanmean(e) for e in self.sq_errors])

    @property
    def avg_regret(self) -> float:
        """Mean over clients of `R_c(T)/T_c` (centralised: `R(T)/T` of the one learner)."""
        if self.regret.shape[0] == 0:
            return float("nan")
        final = self.regret[-1]
        if self.algorithm == "centralised":
            return float(final[0] / self.lengths.sum())
        return float(np.mean(final / self.lengths))

    @property
    def uploaded_per_client_step(self) -> float:
        return float(self.uploaded_numbers.sum() / self.lengths.sum())

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
        t = np.minimum(self.checkpoints[:, None] + 1, self.lengths[None, :])
        if self.algorithm == "centralised":
            return self.regret[:, 0] / t.sum(axis=1)
        return (self.regret / t).mean(axis=1)

    def summary(self) -> dict[str, float]:
        return {"mse": self.mse, "avg_regret": self.avg_regret,
                "uploaded_per_client_step": self.uploaded_per_client_step, "wall_s": self.wall_s,
                "staleness_mean": self.staleness_mean, "rejected_steps": int(self.rejected.sum())}


def _merge(updates: Sequence[Any]) -> Any:
    if len(updates) == 1:
        return updates[0]
    if isinstance(updates[0], KOFLUpdate):
        m = merge_updates([KernelUpdate(u.kernels, u.delta, u.n_samples) for u in updates])
        losses = np.sum([u.losses for u in updates], axis=0)
        return KOFLUpdate(m.kernels, m.delta, losses, m.n_samples)
    return merge_updates(updates)


def replay(
    fleet: Fleet,
    algorithm: str,
    cfg: AlgorithmConfig | None = None,
    schedule: Schedule | None = None,
    seed: int = 0,
    steps: int | None = None,
    n_checkpoints: int = 200,
    progress: Callable[[int, int], None] | None = None,
) -> ReplayResult:
    """Run one algorithm over a fleet's streams and return its traces (see :class:`ReplayResult`)."""
    cfg = cfg or AlgorithmConfig()
    schedule = schedule or Schedule.every_step()
    streams = list(fleet.streams)
    n = len(streams)
    xs = [np.ascontiguousarray(s.X[:steps]) for s in streams]
    ys = [np.asarray(s.y[:steps], dtype=np.float64) for s in streams]
    lengths = np.array([y.size for y in ys])
    t_max = int(lengths.max())
    arr = build_algorithm(algorithm, n, xs[0].shape[1], cfg, seed)
    clients, servers, server_of = arr.clients, arr.servers, arr.server_of
    checkpoints = np.unique(np.linspace(0, t_max - 1, min(n_checkpoints, t_max)).astype(int))
    regret = np.zeros((checkpoints.size, n))
    weights = np.zeros((checkpoints.size, len(arr.kernel_names)))
    sq = [np.zeros(lengths[c]) for c in range(n)]
    uploaded = np.zeros(n)
    rng = np.random.default_rng([seed, 0xA5])
    mean_delay = rng.uniform(0, schedule.max_delay, n) if schedule.kind == "async" else np.zeros(n)
    arrivals: dict[int, list[tuple[int, Any, int]]] = defaultdict(list)  # time → (client, upd, version)
    deliveries: dict[int, list[tuple[int, Any, int]]] = defaultdict(list)  # time → (client, params, v)
    staleness: list[int] = []
    rounds = 0
    ci = 0
    start = time.perf_counter()
    rejected = np.zeros(n, dtype=np.int64)

    def step(c: int, t: int) -> Any:
        """One client step; a rejected step (NonFiniteError: divergence) is counted, not fatal."""
        try:
            yhat, upd = clients[c].step(xs[c][t], ys[c][t])
        except ValueError:
            rejected[c] += 1
            sq[c][t] = np.nan
            return None
        e = yhat - ys[c][t]
        sq[c][t] = e * e
        return upd

    for t in range(t_max):
        if arr.centralised:  # one learner: the fleet's samples of step t form one mini-batch
            server = servers[0]
            for c in range(n):
                if t < lengths[c] and (upd := step(c, t)) is not None:
                    server.add(upd)
            version = server.finish_round()
            rounds += 1
            clients[0].set_global(server.global_params(), version)
        elif not arr.federated:  # local-only: each client is its own server
            for c in range(n):
                if t < lengths[c] and (upd := step(c, t)) is not None:
                    srv = servers[server_of[c]]
                    srv.add(upd)
                    clients[c].set_global(srv.global_params(), srv.finish_round())
            rounds += 1
        elif schedule.kind in ("step", "every"):
            server = servers[0]
            for c in range(n):
                if t < lengths[c] and (upd := step(c, t)) is not None:
                    uploaded[c] += upd.n_numbers
                    server.add(upd)
            version = server.finish_round()
            rounds += 1
            if (t + 1) % schedule.k == 0 or t == t_max - 1:
                params = server.global_params()
                for c in range(n):
                    clients[c].set_global(params, version)
        else:  # asynchronous
            server = servers[0]
            for c in range(n):
                if t < lengths[c] and (upd := step(c, t)) is not None:
                    uploaded[c] += upd.n_numbers
                    arrive = t + int(rng.poisson(mean_delay[c]))
                    arrivals[arrive].append((c, upd, clients[c].global_version))
            if (t + 1) % schedule.window == 0 or t == t_max - 1:
                heard: dict[int, list[Any]] = defaultdict(list)
                last = t == t_max - 1  # at the end, everything still in flight is delivered
                for tau in [k for k in arrivals if k <= t or last]:
                    for c, upd, v in arrivals.pop(tau):
                        heard[c].append(upd)
                        staleness.append(server_version(server) - v)
                if heard:
                    for c in sorted(heard):
                        server.add(_merge(heard[c]))
                    version = server.finish_round()
                    rounds += 1
                    params = server.global_params()
                    for c in range(n):
                        deliveries[t + int(rng.poisson(mean_delay[c]))].append((c, params, version))
            for c, params, v in deliveries.pop(t, []):
                if v > clients[c].global_version:  # an older global arriving late is ignored
                    clients[c].set_global(params, v)
        if ci < checkpoints.size and t == checkpoints[ci]:
            regret[ci] = [clients[c].regret for c in range(n)]
            weights[ci] = clients[0].kernel_weights
            ci += 1
            if progress is not None:
                progress(t + 1, t_max)
    wall = time.perf_counter() - start
    return ReplayResult(
        algorithm=arr.name, clients=[s.name for s in streams], lengths=lengths, sq_errors=sq,
        checkpoints=checkpoints, regret=regret, weights=weights, kernel_names=arr.kernel_names,
        uploaded_numbers=uploaded, wall_s=wall,
        staleness_mean=float(np.mean(staleness)) if staleness else 0.0, rounds=rounds,
        rejected=rejected,
    )


def server_version(server: ServerHalf) -> int:
    return int(getattr(server, "version", 0))
