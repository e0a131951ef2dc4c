"""Cold start: what a client joining a running fleet gets from it (docs/algorithms.md §5.8).

Leave one client out: the others stream from step 0; the held-out client joins at `join_step` — it has
received the fleet's globals like a late agent reading the retained global — and streams its own rows
from that step on. Its first `window` samples are scored (MSE, and for Bayesian learners the mean negative
log predictive density and the 95% coverage), for every client in turn, every algorithm (or replay
variant: e.g. ``fedbnr-local`` / ``local-only`` are the from-scratch baselines), every seed.

A held-out learner that keeps its experts' predictions (personalised FedBNR's experts' mixture with
`trace_experts`: :meth:`~streamfed.algorithms.fedbnr_personal.learner.PersonalLearner.expert_predictions`) adds one
row per expert, named ``<algorithm>:<expert>`` — what that expert alone predicted on the same samples (exact: the
mixture never feeds back into its experts; their raw variances, not recalibrated).

>>> from streamfed.evaluation.datasets import synthetic_fleet
>>> from streamfed.evaluation.replay import AlgorithmConfig
>>> fleet = synthetic_fleet(n_clients=3, n_steps=60, n_inputs=2, seed=0)
>>> res = leave_one_out(fleet, ["pofmkl"], AlgorithmConfig(n_kernels=2, n_features=4), join_step=40,
...                     windows=(10,), seeds=(0,))
>>> [(row.client, row.algorithm, row.window, row.n) for row in res.rows][:2]
[('client-0', 'pofmkl', 10, 10), ('client-1', 'pofmkl', 10, 10)]
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from streamfed.evaluation.datasets import Fleet
from streamfed.evaluation.replay import (
    AlgorithmConfig,
    Arrangement,
    ReplayResult,
    Schedule,
    build_arrangement,
    replay,
    time_stamps,
)
from streamfed.fleet.telemetry import Z95
from streamfed.wire.message import Message

__all__ = ["ColdStartResult", "ColdStartRow", "UploadRecording", "leave_one_out", "leave_one_out_recorded",
           "record_uploads"]


@dataclass(frozen=True)
class ColdStartRow:
    """One held-out client's figures over its first `window` samples, for one algorithm and seed."""

    client: str
    algorithm: str
    seed: int
    window: int
    n: int
    mse: float
    nlpd: float
    coverage: float


@dataclass
class ColdStartResult:
    """Every row, and per (client, algorithm, seed) the held-out client's MSE-to-date after it joined."""

    join_step: int
    windows: tuple[int, ...]
    rows: list[ColdStartRow] = field(default_factory=list)
    curves: dict[tuple[str, str, int], np.ndarray] = field(default_factory=dict)

    def table(self, window: int) -> dict[str, dict[str, dict[str, float]]]:
        """client → algorithm → mean over seeds of mse, nlpd, coverage (over its first `window` samples)."""
        out: dict[str, dict[str, dict[str, float]]] = {}
        for r in self.rows:
            if r.window != window:
                continue
            cell = out.setdefault(r.client, {}).setdefault(r.algorithm, {"mse": 0.0, "nlpd": 0.0, "coverage": 0.0,
                                                                          "seeds": 0.0})
            for k in ("mse", "nlpd", "coverage"):
                cell[k] += getattr(r, k)
            cell["seeds"] += 1
        for algs in out.values():
            for cell in algs.values():
                for k in ("mse", "nlpd", "coverage"):
                    cell[k] /= cell["seeds"]
        return out

    def wins(self, window: int, algorithm: str, baseline: str, metric: str = "mse") -> tuple[int, int]:
        """On how many clients `algorithm` has a lower `metric` than `baseline` (seed means), of how many."""
        tab = self.table(window)
        pairs = [(a[algorithm][metric], a[baseline][metric]) for a in tab.values() if algorithm in a and baseline in a]
        pairs = [(x, y) for x, y in pairs if not (math.isnan(x) or math.isnan(y))]
        return sum(x < y for x, y in pairs), len(pairs)

    def markdown(self, command: str | None = None) -> str:
        lines = [f"Leave-one-client-out cold start: the held-out client joins at step {self.join_step} and is scored "
                 "over its first samples (mean over seeds; NLPD and coverage for Bayesian learners).", ""]
        if command:
            lines += [f"Command: `{command}`", ""]
        for w in self.windows:
            tab = self.table(w)
            algs = sorted({a for row in tab.values() for a in row})
            lines += [f"### First {w} samples", "",
                      "| client | " + " | ".join(f"{a} MSE | {a} NLPD | {a} cov95" for a in algs) + " |",
                      "|---|" + "---|" * (3 * len(algs))]
            for client, row in tab.items():
                cells = []
                for a in algs:
                    c = row.get(a)
                    cells += ["—"] * 3 if c is None else [f"{c['mse']:.4f}", _fmt(c["nlpd"]), _fmt(c["coverage"])]
                lines.append(f"| {client} | " + " | ".join(cells) + " |")
            lines.append("")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {"join_step": self.join_step, "windows": list(self.windows), "rows": [asdict(r) for r in self.rows],
                "tables": {str(w): self.table(w) for w in self.windows}}

    def write(self, out_dir: Path, command: str | None = None, plots: bool = True) -> list[Path]:
        out_dir.mkdir(parents=True, exist_ok=True)
        written = [out_dir / "coldstart.json", out_dir / "coldstart.md"]
        written[0].write_text(json.dumps(self.to_json(), indent=2))
        written[1].write_text(self.markdown(command))
        if plots and self.curves:
            written.append(self._plot(out_dir / "coldstart.png"))
        return written

    def _plot(self, path: Path) -> Path:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        algs = sorted({a for _, a, _ in self.curves})
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for a in algs:  # the mean over held-out clients and seeds of the MSE-to-date
            curves = [c for (_, alg, _), c in self.curves.items() if alg == a]
            m = min(len(c) for c in curves)
            ax.plot(np.arange(1, m + 1), np.mean([c[:m] for c in curves], axis=0), label=a)
        ax.set_xscale("log")
        ax.set_xlabel("samples since joining")
        ax.set_ylabel("MSE to date (mean over held-out clients)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path


def _fmt(v: float) -> str:
    return "—" if math.isnan(v) else f"{v:.3f}"


def _held_out_clients(fleet: Fleet, join_step: int, windows: Sequence[int], clients: Sequence[str] | None
                      ) -> tuple[list[str], list[str], int]:
    """The fleet's client names, the ones held out in turn (default: all) and the steps each replay runs;
    `ValueError` for a join step or window below 1 or an unknown client."""
    if join_step < 1 or not windows or min(windows) < 1:
        raise ValueError("join_step and every window must be >= 1")
    names = [s.name for s in fleet.streams]
    held = list(clients or names)
    unknown = sorted(set(held) - set(names))
    if unknown:
        raise ValueError(f"no client named {', '.join(unknown)}; clients: {', '.join(names)}")
    return names, held, join_step + max(windows)


def leave_one_out(fleet: Fleet, algorithms: Sequence[str], cfg: AlgorithmConfig, join_step: int,
                  windows: Sequence[int] = (336, 2000), seeds: Sequence[int] = (0, 1, 2),
                  clients: Sequence[str] | None = None, schedule: Schedule | None = None,
                  progress: Callable[[str], None] | None = None) -> ColdStartResult:
    """Hold out each client of `clients` (default: all) in turn: see the module docstring. Each replay runs
    the fleet up to `join_step + max(windows)` steps only."""
    names, held, steps = _held_out_clients(fleet, join_step, windows, clients)
    result = ColdStartResult(join_step, tuple(int(w) for w in windows))
    for client in held:
        c = names.index(client)
        for alg in algorithms:
            for seed in seeds:
                if progress is not None:
                    progress(f"{client} {alg} seed {seed}")
                r = replay(fleet, alg, cfg, schedule, seed=seed, steps=steps, join={client: join_step})
                _add_rows(result, r, c, client, alg, int(seed))
    return result


def _add_rows(result: ColdStartResult, r: ReplayResult, c: int, client: str, alg: str, seed: int) -> None:
    """The held-out client `c`'s rows and curves (and its experts') of one replay."""
    join_step = result.join_step
    for w in result.windows:
        f = r.first(c, w)
        result.rows.append(ColdStartRow(client, alg, seed, w, int(f["n"]), f["mse"], f["nlpd"], f["coverage"]))
    e2 = r.sq_errors[c][join_step:]
    e2 = e2[~np.isnan(e2)]
    result.curves[(client, alg, seed)] = np.cumsum(e2) / np.arange(1, e2.size + 1)
    for name, (e2x, var) in expert_errors(r, c).items():
        label = f"{alg}:{name}"
        for w in result.windows:
            a, v = e2x[:w], var[:w]
            result.rows.append(ColdStartRow(
                client, label, seed, w, int(a.size), float(a.mean()),
                float(np.mean(0.5 * np.log(2 * np.pi * v) + 0.5 * a / v)), float(np.mean(a <= Z95**2 * v))))
        result.curves[(client, label, seed)] = np.cumsum(e2x) / np.arange(1, e2x.size + 1)


@dataclass
class UploadRecording:
    """Every client's uploads, per step, when each streams its own rows from step 0 (`record_uploads`): what
    the others send in any leave-one-out replay of an algorithm whose uploads depend on a client's own
    samples only (summed statistics without forgetting: FedBNR, personalised FedBNR), so one run serves
    every held-out client. `rejected`: per client, the steps its learner refused (none, for the shortcut to
    be exact)."""

    algorithm: str
    seed: int
    steps: int
    uploads: list[list[tuple[int, Message]]]  # per step, (client index, its upload) in client order
    rejected: np.ndarray


def _replay_inputs(fleet: Fleet, steps: int) -> tuple[list[np.ndarray], list[np.ndarray], float | None,
                                                     list[np.ndarray]]:
    """The rows, targets and time stamps a replay of `steps` steps uses, and the label bound it declares (as
    `replay`)."""
    xs = [np.ascontiguousarray(s.X[:steps]) for s in fleet.streams]
    ys = [np.asarray(s.y[:steps], dtype=np.float64) for s in fleet.streams]
    finite = [np.abs(y[np.isfinite(y)]) for y in ys]
    stamps = [time_stamps(s.time, y.size) for s, y in zip(fleet.streams, ys, strict=True)]
    return xs, ys, max((float(a.max()) for a in finite if a.size), default=None), stamps


def _arrangement(fleet: Fleet, algorithm: str, cfg: AlgorithmConfig, seed: int, xs: list[np.ndarray],
                 label_bound: float | None) -> Arrangement:
    n = len(xs)
    arr = build_arrangement(algorithm, n, xs[0].shape[1], cfg, seed, names=[f"c{c}" for c in range(n)],
                            label_bound=label_bound)
    if not arr.federated or arr.centralised or arr.privates:
        raise ValueError(f"{algorithm}: the recorded leave-one-out needs one federated aggregation without "
                         "differential privacy (use leave_one_out)")
    return arr


def record_uploads(fleet: Fleet, algorithm: str, cfg: AlgorithmConfig, seed: int, steps: int) -> UploadRecording:
    """Every client learns its own rows from step 0 (no global installed: the uploads do not depend on it, for
    the algorithms this serves) and each upload is kept, in the envelope the aggregation checks."""
    xs, ys, bound, stamps = _replay_inputs(fleet, steps)
    arr = _arrangement(fleet, algorithm, cfg, seed, xs, bound)
    n = len(xs)
    lengths = [y.size for y in ys]
    seqs = np.zeros(n, dtype=np.int64)
    rejected = np.zeros(n, dtype=np.int64)
    uploads: list[list[tuple[int, Message]]] = []
    for t in range(max(lengths)):
        here = []
        for c in range(n):
            if t >= lengths[c]:
                continue
            learner = arr.learners[c]
            try:
                learner.observe_time(stamps[c][t])
                learner.learn(xs[c][t], ys[c][t])
            except (ValueError, ArithmeticError):
                rejected[c] += 1
                continue
            up = learner.take_update()
            if up is not None:
                seqs[c] = seqs[c] + 1 if up.seq is None else up.seq
                here.append((c, arr.message(c, int(seqs[c]), up)))
        uploads.append(here)
    return UploadRecording(algorithm, int(seed), int(steps), uploads, rejected)


def leave_one_out_recorded(fleet: Fleet, algorithm: str, cfg: AlgorithmConfig, join_step: int,
                           windows: Sequence[int] = (336, 2000), seed: int = 0,
                           clients: Sequence[str] | None = None, recording: UploadRecording | None = None,
                           progress: Callable[[str], None] | None = None) -> ColdStartResult:
    """`leave_one_out` under the lock-step schedule for an algorithm whose uploads depend on a client's own
    samples only (FedBNR and personalised FedBNR without forgetting), at the cost of one fleet run plus, per
    held-out client, its aggregation and its own learner: the other clients' uploads come from `recording`
    (`record_uploads`, made here when None) — the same messages they send in the plain replay, applied in the
    same rounds and client order, so the aggregation publishes the same globals and the held-out learner sees
    the same ones (tests/test_coldstart_recorded.py checks the figures equal `leave_one_out`'s bit for bit). Before
    it joins, the held-out learner installs only the last global (the one it joins with): it has learned nothing,
    so what it holds is the latest global it installed (both families' state before any sample is the installed
    global's)."""
    names, held, steps = _held_out_clients(fleet, join_step, windows, clients)
    if recording is None:
        recording = record_uploads(fleet, algorithm, cfg, seed, steps)
    if (recording.algorithm, recording.seed) != (algorithm, seed) or recording.steps < steps:
        raise ValueError("the recording is of another algorithm, seed or a shorter run")
    if recording.rejected.any():
        raise ValueError("a learner refused samples in the recorded run: its uploads may depend on the global "
                         "(use leave_one_out)")
    result = ColdStartResult(join_step, tuple(int(w) for w in windows))
    for client in held:
        if progress is not None:
            progress(f"{client} {algorithm} seed {seed}")
        c = names.index(client)
        _add_rows(result, _held_out_replay(fleet, algorithm, cfg, seed, steps, c, join_step, recording), c, client,
                  algorithm, int(seed))
    return result


def _held_out_replay(fleet: Fleet, algorithm: str, cfg: AlgorithmConfig, seed: int, steps: int, held: int,
                     join_step: int, recording: UploadRecording) -> ReplayResult:
    """`replay(..., join={held: join_step})` with the other clients' uploads from `recording`: only the held-out
    learner runs; its traces are filled, the others' left NaN."""
    t0 = time.perf_counter()
    xs, ys, bound, stamps = _replay_inputs(fleet, steps)
    arr = _arrangement(fleet, algorithm, cfg, seed, xs, bound)
    n = len(xs)
    lengths = np.array([y.size for y in ys])
    if not join_step < lengths[held]:
        raise ValueError("join: a client must join at a step within its stream")
    agg, learner = arr.aggregations[0], arr.learners[held]
    sq, mean_trace, var_trace = (np.full(lengths[held], np.nan) for _ in range(3))
    seq, rejected, rounds = 0, 0, 0
    x, y = xs[held], ys[held]
    for t in range(int(lengths.max())):
        items = []
        mine = None
        if join_step <= t < lengths[held]:
            try:
                learner.observe_time(stamps[held][t])
                yhat, var = learner.learn(x[t], y[t])
            except (ValueError, ArithmeticError):
                rejected += 1
            else:
                e = yhat - y[t]
                sq[t], mean_trace[t] = e * e, yhat
                if var is not None:
                    var_trace[t] = var
                up = learner.take_update()
                if up is not None:
                    seq = seq + 1 if up.seq is None else up.seq
                    try:
                        mine = agg.check(arr.message(held, seq, up))
                    except (ValueError, ArithmeticError):
                        rejected += 1
        done = False
        for c, msg in recording.uploads[t]:
            if c > held and not done:
                done = True
                if mine is not None:
                    items.append((arr.names[held], mine))
            if c != held:
                items.append((arr.names[c], agg.check(msg)))
        if not done and mine is not None:
            items.append((arr.names[held], mine))
        agg.apply_round(t + 1, items)
        rounds += 1
        # before it joins, the held-out learner has learned nothing: what it holds is the latest global it installed,
        # so it installs only the one it joins with (the globals before it would be replaced unused)
        if t >= join_step - 1 and learner.global_version < agg.version:
            learner.install_global(arr.global_message(agg))
    nan = [np.full(int(k), np.nan) for k in lengths]
    starts = np.zeros(n, dtype=np.int64)
    starts[held] = join_step
    rej = np.zeros(n, dtype=np.int64)
    rej[held] = rejected

    def own(a: np.ndarray) -> list[np.ndarray]:
        return [a if c == held else nan[c] for c in range(n)]

    return ReplayResult(
        algorithm=arr.name, clients=[s.name for s in fleet.streams], lengths=lengths, sq_errors=own(sq),
        checkpoints=np.zeros(0, dtype=np.int64), regret=np.zeros((0, n)), weights=np.zeros((0, len(arr.kernel_names))),
        kernel_names=arr.kernel_names, uploaded_numbers=np.zeros(n), wall_s=time.perf_counter() - t0, rounds=rounds,
        rejected=rej, arrangement=arr, means=own(mean_trace), variances=own(var_trace), starts=starts, ys=ys)


def expert_errors(r: ReplayResult, client: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per expert of client `client`'s learner (where it keeps their predictions: module docstring), the squared
    errors and variances of its scored samples from the step it joined, in order; `{}` for other learners."""
    if r.arrangement is None:
        return {}
    learner: Any = r.arrangement.learners[client]
    while not hasattr(learner, "expert_predictions") and hasattr(learner, "inner"):  # through wrappers
        learner = learner.inner
    preds = learner.expert_predictions() if hasattr(learner, "expert_predictions") else None
    if not preds:
        return {}
    start = 0 if r.starts is None else int(r.starts[client])
    e2 = r.sq_errors[client][start:]
    ys = r.ys[client][start:][~np.isnan(e2)]
    out = {}
    for name, (mu, var) in preds.items():
        if mu.shape != ys.shape:
            raise ValueError(f"{name}: {mu.size} expert predictions for {ys.size} scored samples")
        out[name] = ((ys - mu) ** 2, var)
    return out
