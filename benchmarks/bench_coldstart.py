"""Where federation pays: cold start and whole-stream personalisation of FedBNR on the Beijing streams.

    .venv/bin/python benchmarks/bench_coldstart.py                  # full evaluation (see docs/benchmarks.md)
    .venv/bin/python benchmarks/bench_coldstart.py --quick          # smoke run, < 20 s, writes to /tmp
    .venv/bin/python benchmarks/bench_coldstart.py --seeds 3 --join 8760 --windows 336,2000 \
        --out-dir benchmarks/results

Not a test: the figures go to `benchmarks/results/coldstart*.{md,json,png}`,
`benchmarks/results/personalisation.{md,json}` and `docs/results.md`.

**1. Cold start, leave one station out** (docs/algorithms.md §10.8): the other 11 stations stream from step 0;
the held-out station joins at `--join` (8,760 = one year of hourly steps) — before it, it takes no sample but
installs every global the fleet publishes, so it starts from the fleet's current global — and streams its own
rows from that step on. Scored: MSE, mean NLPD and 95% coverage of its first `--windows` samples
(`streamfed.evaluation.coldstart.leave_one_out`, `ReplayResult.first`), for

* `fedbnr-local` — FedBNR from scratch (a private server: σ, λ by its own evidence);
* `fedbnr` — pooled FedBNR: the joining station's prior is the fleet's global statistics;
* `fedbnr-personal` — shared + personal weights, σ, λ, τ by the exact evidence: its prior is the shared
  posterior widened by τ;
* `local-only` / `pofmkl` — POF-MKL from scratch / from the fleet's global θ (MSE only).

A from-scratch learner (`fedbnr-local`, `local-only`) never hears from the other stations, so its figures do not
depend on them: it is run once per seed with every station joining at `--join` (each station's learner is the
one it has in the leave-one-out replay: same seed, same index), and the script checks on one station and seed
that this equals `leave_one_out` exactly.

The summed-statistics families (`fedbnr`, `fedbnr-personal`: no forgetting here) upload their own samples'
statistics, whatever globals they installed, so the other 11 stations send the same uploads whichever station is
held out: one recorded fleet run per seed (`record_uploads`) serves all 12 held-out stations, each of which then
replays only the aggregation (fed the recorded uploads in the same rounds and order) and its own learner
(`leave_one_out_recorded`; tests/test_coldstart_recorded.py: personalised FedBNR's figures equal `leave_one_out`'s
bit for bit, pooled FedBNR's to 1e-12). Personalised FedBNR's recording runs its learner without the experts'
mixture (`recording_config`: only the personal expert uploads, so the messages are the same bytes), a sixth of the
work. What remains per held-out station is the aggregation's evidence refit at
every global (~460 warm-started fits per held-out station at D = 50, since issue 29 by Newton steps on the evidence's
gradient: ~1,600 evaluations of value and gradient, where Nelder-Mead took ~29,000 values). That chain is not
thinned: refitting only once the fleet's samples grew by 1% (`PersonalParams.refit_growth`) changes printed digits
of the station's rows (`benchmarks/bench_coldstart_cost.py --growth`, `--thin`). `--plain` runs the plain protocol
instead.

**1b. The experts' mixture** (`--mixture`, docs/algorithms.md §5.9): the default personalised learner (fixed share
over its local, pooled and personal experts) per held-out station, with each expert's own figures on the same samples
from the learner's trace (`trace_experts`), against `fedbnr-local`; `--with-pooled` adds pooled FedBNR, `--partial`
rewrites the tables after every finished run. Writes `coldstart_mixture.{md,json}` (and, without `--skip-whole`,
`personalisation_mixture.{md,json}`: the mixture over whole streams against `fedbnr-local`).

**2. Whole-stream personalisation**: all 12 stations from step 0 over their full streams; per station MSE,
NLPD and coverage (`ReplayResult.first(c)`) of `fedbnr-local`, `fedbnr` and `fedbnr-personal`.

Data and configuration (as in `examples/fedbnr_beijing.py` / `benchmarks/results/fedbnr_beijing.md`): target
CO, 10 inputs, `online` normalisation (each station standardises inputs and target with its own past samples
only: causal), metrics in those standardised units; the FedBNR families share one Gaussian RFF map
(`--bandwidth` 2, `--n-features` D = 50, F = 101 with the bias), uploads of ≥ 32 samples, σ, λ (and τ) refitted
by the evidence at every global (the personalised server's defaults: `refit_growth` 0, the `newton` search), no
forgetting (see the markdown for why); POF-MKL keeps its own default dictionary (the paper's Air setting: 16
Gaussian kernels over [0.05, 5], D = 100, M = 1). Replay schedule: lock-step, one step = one row of every station's
stream, globals broadcast every step (uploads arrive every 32).
The runs are spread over `--jobs` processes.
"""

from __future__ import annotations

import os
import pickle

# Small matrices: one BLAS thread is several times faster than two fighting over 2 cores. Set before numpy loads.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import json
import math
import multiprocessing as mp
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from streamfed.evaluation.coldstart import (
    ColdStartResult,
    ColdStartRow,
    UploadRecording,
    expert_errors,
    leave_one_out,
    leave_one_out_recorded,
    record_uploads,
)
from streamfed.evaluation.datasets import load_beijing
from streamfed.evaluation.replay import AlgorithmConfig, replay

REPO = Path(__file__).resolve().parents[1]
BAYES = ("fedbnr-local", "fedbnr", "fedbnr-personal")  # the FedBNR families: same map, same F
POFMKL = ("local-only", "pofmkl")
FROM_SCRATCH = {"fedbnr-local", "local-only"}  # never hear from the other stations
ALL = BAYES + POFMKL
BAND = (0.90, 0.98)  # the coverage target
CURVE_AT = (1, 6, 12, 24, 48, 96, 168, 336, 1000, 2000)  # the MSE-to-date points kept in the JSON

# the families whose uploads are their own summed statistics (no forgetting here): one recorded fleet run per seed
# serves every held-out station (`leave_one_out_recorded`; tests/test_coldstart_recorded.py: equal to leave_one_out)
RECORDED = {"fedbnr", "fedbnr-personal"}

# ------------------------------------------------------------------ worker side (one process per job)
_FLEET: Any = None
_RECORDINGS: dict[str, UploadRecording] = {}  # path → the recording loaded from it (one per seed, kept)


def _init(steps: int | None) -> None:
    global _FLEET
    _FLEET = load_beijing(normalisation="online", split="station", steps=steps)


def configs(args: argparse.Namespace) -> dict[str, AlgorithmConfig]:
    """The FedBNR families' configuration and POF-MKL's."""
    personal: dict[str, Any] = {"min_upload": 32}
    if getattr(args, "mixture", False):  # keep each expert's predictions: their own figures on the same samples
        personal["trace_experts"] = True
    if getattr(args, "personal_alone", False):
        personal["experts"] = False
    fed = AlgorithmConfig(n_kernels=1, n_features=args.n_features, kernels=(f"gaussian:{args.bandwidth:g}",),
                          params={"fedbnr": {"min_upload": 32}, "fedbnr-personal": personal})
    pof = AlgorithmConfig()  # the paper's Air setting
    return {"bayes": fed, "pofmkl": pof}


def recording_config(cfg: AlgorithmConfig) -> AlgorithmConfig:
    """What a recording runs: personalised FedBNR's uploads are its personal expert's alone, so the stations that
    stream from step 0 record them with the personalised learner without the experts' mixture (the same uploads
    bit for bit: tests/test_coldstart_recorded.py), a third of the work; the held-out station runs `cfg` itself."""
    params = {k: dict(v) for k, v in cfg.params.items()}
    if "fedbnr-personal" in params:
        params["fedbnr-personal"].pop("trace_experts", None)
        params["fedbnr-personal"]["experts"] = False
    return AlgorithmConfig(n_kernels=cfg.n_kernels, n_features=cfg.n_features, bandwidth_low=cfg.bandwidth_low,
                           bandwidth_high=cfg.bandwidth_high, kernels=cfg.kernels, bin_size=cfg.bin_size,
                           params=params, privacy=cfg.privacy, **cfg.shared)


def config_for(alg: str, cfgs: dict[str, AlgorithmConfig]) -> AlgorithmConfig:
    return cfgs["bayes"] if alg in BAYES else cfgs["pofmkl"]


def run_task(task: tuple, args: argparse.Namespace) -> dict[str, Any]:
    """One unit of work; returns plain data (rows, curves, per-station figures) and its wall time."""
    kind, alg, seed, station = task
    cfg = config_for(alg, configs(args))
    fleet = _FLEET
    names = list(fleet.names)
    t0, c0 = time.perf_counter(), time.process_time()
    out: dict[str, Any] = {"task": task}
    if kind == "record":  # every station from step 0, its uploads kept: the others' side of every held-out run
        rec = record_uploads(fleet, alg, recording_config(cfg), seed, args.join + max(args.windows))
        path = Path(args.record_dir) / f"{alg}-{seed}.pickle"
        with path.open("wb") as fh:
            pickle.dump(rec, fh, protocol=pickle.HIGHEST_PROTOCOL)
        out["path"], out["rejected"] = str(path), rec.rejected.tolist()
    elif kind == "heldout":  # one held-out station from the seed's recording (`leave_one_out`, faster)
        path = str(Path(args.record_dir) / f"{alg}-{seed}.pickle")
        if path not in _RECORDINGS:
            _RECORDINGS.clear()  # one seed at a time: ~165 MB each at D = 50
            with open(path, "rb") as fh:
                _RECORDINGS[path] = pickle.load(fh)
        res = leave_one_out_recorded(fleet, alg, cfg, args.join, windows=args.windows, seed=seed, clients=(station,),
                                     recording=_RECORDINGS[path])
        out["rows"] = [asdict(r) for r in res.rows]
        out["curves"] = {f"{c}|{a}|{s}": v.tolist() for (c, a, s), v in res.curves.items()}
    elif kind == "loo":  # one held-out station, one algorithm, one seed: the library's protocol as it is
        res = leave_one_out(fleet, [alg], cfg, args.join, windows=args.windows, seeds=(seed,), clients=(station,))
        out["rows"] = [asdict(r) for r in res.rows]
        out["curves"] = {f"{c}|{a}|{s}": v.tolist() for (c, a, s), v in res.curves.items()}
    elif kind == "scratch":  # every station joins at --join, each on its own: the from-scratch baselines
        steps = args.join + max(args.windows)
        r = replay(fleet, alg, cfg, seed=seed, steps=steps, join={n: args.join for n in names})
        rows, curves = [], {}
        for c, name in enumerate(names):
            for w in args.windows:
                f = r.first(c, w)
                rows.append(asdict(ColdStartRow(name, alg, int(seed), int(w), int(f["n"]), f["mse"], f["nlpd"],
                                                f["coverage"])))
            e2 = r.sq_errors[c][args.join:]
            e2 = e2[~np.isnan(e2)]
            curves[f"{name}|{alg}|{seed}"] = (np.cumsum(e2) / np.arange(1, e2.size + 1)).tolist()
        out["rows"], out["curves"] = rows, curves
        out["rejected"] = r.rejected.tolist()
    elif kind == "history":  # diagnostic: every station in the fleet from step 0, scored on the cold-start rows
        r = replay(fleet, alg, cfg, seed=seed, steps=args.join + max(args.windows))
        r.starts = np.full(len(names), args.join)  # score from the join step on, as for a joining station
        out["rows"] = [asdict(ColdStartRow(name, alg, int(seed), int(w), int(f["n"]), f["mse"], f["nlpd"],
                                           f["coverage"]))
                       for c, name in enumerate(names) for w in args.windows for f in [r.first(c, w)]]
        out["curves"] = {}
    elif kind == "whole":  # all stations from step 0, whole streams
        r = replay(fleet, alg, cfg, seed=seed, steps=args.whole_steps)
        out["per_station"] = {name: r.first(c) for c, name in enumerate(names)}
        experts = {name: expert_errors(r, c) for c, name in enumerate(names)}
        out["experts"] = {name: {e: {"mse": float(e2.mean()), "nlpd": float(np.mean(
            0.5 * np.log(2 * np.pi * v) + 0.5 * e2 / v))} for e, (e2, v) in ex.items()}
            for name, ex in experts.items() if ex}
        out["rejected"] = r.rejected.tolist()
        out["rounds"] = int(r.rounds)
    else:
        raise ValueError(kind)
    out["wall_s"] = time.perf_counter() - t0
    out["cpu_s"] = time.process_time() - c0  # what the run cost, whatever else shares the machine
    return out


# ------------------------------------------------------------------ reporting helpers
def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def git_state() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "streamfed"], cwd=REPO, capture_output=True,
                               text=True, check=True).stdout.strip()
        return head + (" (with uncommitted changes under streamfed/)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine() -> str:
    return (f"{platform.machine()}, {os.cpu_count()} cores ({cpu_name()}), Python {platform.python_version()}, "
            f"numpy {np.__version__}, OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS')}")


def f4(v: float) -> str:
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.4f}"


def f3(v: float) -> str:
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3f}"


def in_band(v: float) -> bool:
    return BAND[0] <= v <= BAND[1]


def count(pred: list[bool]) -> str:
    return f"{sum(pred)} / {len(pred)}"


def mark(ok: bool) -> str:
    return "**met**" if ok else "**not met**"


# ------------------------------------------------------------------ cold start report
def coldstart_summary(res: ColdStartResult, stations: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for w in res.windows:
        tab = res.table(w)
        s: dict[str, Any] = {}
        for fam in ("fedbnr", "fedbnr-personal"):
            mse = res.wins(w, fam, "fedbnr-local", "mse")
            nlpd = res.wins(w, fam, "fedbnr-local", "nlpd")
            cov = [in_band(tab[c][fam]["coverage"]) for c in stations if fam in tab.get(c, {})]
            s[fam] = {"mse_wins": mse, "nlpd_wins": nlpd, "coverage_in_band": (sum(cov), len(cov)),
                      "mse_target_met": mse[1] > 0 and mse[0] >= math.ceil(10 * mse[1] / 12),
                      "nlpd_target_met": nlpd[1] > 0 and nlpd[0] == nlpd[1],
                      "coverage_target_met": bool(cov) and all(cov)}
        cov = [in_band(tab[c]["fedbnr-local"]["coverage"]) for c in stations if "fedbnr-local" in tab.get(c, {})]
        s["fedbnr-local"] = {"coverage_in_band": (sum(cov), len(cov))}
        s["pofmkl"] = {"mse_wins": res.wins(w, "pofmkl", "local-only", "mse")}
        # per family, the mean over stations
        present = [a for a in ALL if any(a in tab.get(c, {}) for c in stations)]
        s["mean"] = {a: {k: float(np.mean([tab[c][a][k] for c in stations if a in tab.get(c, {})]))
                         for k in ("mse", "nlpd", "coverage")} for a in present}
        out[str(w)] = s
    return out


def per_seed_wins(res: ColdStartResult, w: int, alg: str, base: str, metric: str) -> list[tuple[int, int]]:
    """Per seed, on how many stations `alg` beats `base` (seed by seed, no averaging)."""
    by: dict[tuple[str, str, int], float] = {(r.client, r.algorithm, r.seed): getattr(r, metric)
                                             for r in res.rows if r.window == w}
    seeds = sorted({r.seed for r in res.rows})
    clients = sorted({r.client for r in res.rows})
    out = []
    for s in seeds:
        pairs = [(by[(c, alg, s)], by[(c, base, s)]) for c in clients if (c, alg, s) in by and (c, base, s) in by]
        out.append((sum(a < b for a, b in pairs), len(pairs)))
    return out


def coldstart_markdown(res: ColdStartResult, stations: list[str], summary: dict[str, Any], head: list[str]) -> str:
    lines = list(head)
    for w in res.windows:
        tab = res.table(w)
        s = summary[str(w)]
        lines += [f"### First {w} samples after joining (mean over seeds)", ""]
        lines += ["| held-out station | MSE local | MSE pooled | MSE personal | MSE POF-MKL scratch | "
                  "MSE POF-MKL global | NLPD local | NLPD pooled | NLPD personal | cov95 local | cov95 pooled | "
                  "cov95 personal |", "|---|" + "---|" * 11]
        for c in stations:
            row = tab.get(c, {})

            def g(a: str, k: str, row: dict = row) -> float:
                return row[a][k] if a in row else float("nan")

            best = min((g(a, "mse"), a) for a in BAYES)[1]
            cells = []
            for a in BAYES:
                v = f4(g(a, "mse"))
                cells.append(f"**{v}**" if a == best else v)
            cells += [f4(g("local-only", "mse")), f4(g("pofmkl", "mse"))]
            cells += [f3(g(a, "nlpd")) for a in BAYES] + [f3(g(a, "coverage")) for a in BAYES]
            lines.append(f"| {c} | " + " | ".join(cells) + " |")
        m = s["mean"]
        lines.append("| **mean** | " + " | ".join(
            [f4(m[a]["mse"]) for a in BAYES] + [f4(m[a]["mse"]) if a in m else "—" for a in POFMKL]
            + [f3(m[a]["nlpd"]) for a in BAYES] + [f3(m[a]["coverage"]) for a in BAYES]) + " |")
        lines += ["", "(local = `fedbnr-local`, FedBNR from scratch; pooled = `fedbnr`, the fleet's global as prior; "
                  "personal = `fedbnr-personal`; bold: the lowest FedBNR MSE of the row.)", ""]
        lines += [f"**Summary, first {w} samples** (target: personalised or pooled-prior FedBNR has lower MSE than "
                  "local-only on ≥ 10 of 12 held-out stations and lower NLPD on 12 of 12; coverage in [0.90, 0.98]):",
                  ""]
        labels = (("fedbnr", "pooled prior (`fedbnr`)"), ("fedbnr-personal", "personalised (`fedbnr-personal`)"))
        for fam, label in labels:
            f = s[fam]
            seedwise = ", ".join(f"{a}/{b}" for a, b in per_seed_wins(res, w, fam, "fedbnr-local", "mse"))
            lines.append(f"- {label} vs local-only: lower MSE on **{f['mse_wins'][0]} / {f['mse_wins'][1]}** "
                         f"({mark(f['mse_target_met'])}; seed by seed {seedwise}), lower NLPD on "
                         f"**{f['nlpd_wins'][0]} / {f['nlpd_wins'][1]}** ({mark(f['nlpd_target_met'])}), coverage in "
                         f"[0.90, 0.98] on **{f['coverage_in_band'][0]} / {f['coverage_in_band'][1]}** "
                         f"({mark(f['coverage_target_met'])}).")
        lc = s["fedbnr-local"]["coverage_in_band"]
        lines.append(f"- local-only FedBNR's own coverage in [0.90, 0.98] on {lc[0]} / {lc[1]}.")
        pw = s["pofmkl"]["mse_wins"]
        if pw[1]:
            lines.append(f"- POF-MKL from the fleet's global θ vs from scratch: lower MSE on **{pw[0]} / {pw[1]}** "
                         f"(mean {f4(m['pofmkl']['mse'])} vs {f4(m['local-only']['mse'])}).")
        lines.append("")
    return "\n".join(lines)


# ------------------------------------------------------------------ whole-stream report
def whole_tables(results: list[dict[str, Any]], stations: list[str]) -> dict[str, dict[str, dict[str, Any]]]:
    """station → algorithm → mean over seeds of mse, nlpd, coverage (and the per-seed values)."""
    acc: dict[str, dict[str, dict[str, list[float]]]] = {}
    for r in results:
        _, alg, seed, _ = r["task"]
        for c, f in r["per_station"].items():
            cell = acc.setdefault(c, {}).setdefault(alg, {"mse": [], "nlpd": [], "coverage": [], "n": []})
            for k in cell:
                cell[k].append(float(f[k]))
    return {c: {a: {**{k: float(np.mean(v)) for k, v in cell.items()}, "per_seed": cell} for a, cell in algs.items()}
            for c, algs in acc.items()}


def whole_summary(tab: dict[str, Any], stations: list[str]) -> dict[str, Any]:
    def rel(c: str, a: str) -> float:
        return tab[c][a]["mse"] / tab[c]["fedbnr-local"]["mse"] - 1.0

    out: dict[str, Any] = {}
    for fam in ("fedbnr", "fedbnr-personal"):
        nlpd = [tab[c][fam]["nlpd"] < tab[c]["fedbnr-local"]["nlpd"] for c in stations]
        mse = [tab[c][fam]["mse"] < tab[c]["fedbnr-local"]["mse"] for c in stations]
        within = [rel(c, fam) <= 0.01 for c in stations]
        cov = [in_band(tab[c][fam]["coverage"]) for c in stations]
        out[fam] = {"nlpd_wins": (sum(nlpd), len(nlpd)), "mse_wins": (sum(mse), len(mse)),
                    "mse_within_1pct": (sum(within), len(within)),
                    "mse_rel_diff": {c: rel(c, fam) for c in stations},
                    "coverage_in_band": (sum(cov), len(cov)),
                    "nlpd_target_met": all(nlpd), "mse_target_met": all(within)}
    out["mean"] = {a: {k: float(np.mean([tab[c][a][k] for c in stations])) for k in ("mse", "nlpd", "coverage")}
                   for a in BAYES}
    return out


def whole_markdown(tab: dict[str, Any], stations: list[str], s: dict[str, Any], head: list[str]) -> str:
    lines = list(head)
    lines += ["| station | samples | MSE local | MSE pooled | MSE personal | personal vs local MSE | NLPD local | "
              "NLPD pooled | NLPD personal | cov95 local | cov95 pooled | cov95 personal |",
              "|---|" + "---|" * 11]
    for c in stations:
        row = tab[c]
        lines.append(f"| {c} | {int(row['fedbnr-local']['n'])} | "
                     + " | ".join([f4(row[a]["mse"]) for a in BAYES]
                                  + [f"{100 * s['fedbnr-personal']['mse_rel_diff'][c]:+.2f} %"]
                                  + [f3(row[a]["nlpd"]) for a in BAYES] + [f3(row[a]["coverage"]) for a in BAYES])
                     + " |")
    m = s["mean"]
    lines.append("| **mean** | | " + " | ".join([f4(m[a]["mse"]) for a in BAYES] + [""]
                                              + [f3(m[a]["nlpd"]) for a in BAYES]
                                              + [f3(m[a]["coverage"]) for a in BAYES]) + " |")
    p, q = s["fedbnr-personal"], s["fedbnr"]
    worst = max(stations, key=lambda c: p["mse_rel_diff"][c])
    lines += ["", "**Summary** (target: personalised FedBNR's NLPD below local-only's on 12 of 12 stations, and its "
              "MSE within 1% of local-only's on every station):", "",
              f"- personalised vs local-only: lower NLPD on **{p['nlpd_wins'][0]} / {p['nlpd_wins'][1]}** "
              f"({mark(p['nlpd_target_met'])}); MSE within 1% (or below) on **{p['mse_within_1pct'][0]} / "
              f"{p['mse_within_1pct'][1]}** ({mark(p['mse_target_met'])}; lower on {p['mse_wins'][0]}; worst "
              f"{worst} {100 * p['mse_rel_diff'][worst]:+.2f} %); coverage in [0.90, 0.98] on "
              f"{p['coverage_in_band'][0]} / {p['coverage_in_band'][1]}.",
              f"- pooled vs local-only: lower NLPD on {q['nlpd_wins'][0]} / {q['nlpd_wins'][1]}, lower MSE on "
              f"{q['mse_wins'][0]} / {q['mse_wins'][1]}, MSE within 1% on {q['mse_within_1pct'][0]} / "
              f"{q['mse_within_1pct'][1]}; coverage in [0.90, 0.98] on {q['coverage_in_band'][0]} / "
              f"{q['coverage_in_band'][1]}.", ""]
    return "\n".join(lines)


def write_history(args: argparse.Namespace, results: list[dict[str, Any]], stations: list[str],
                  head_common: list[str], wall: float, command: str) -> list[Path]:
    """The diagnostic tables: each FedBNR family with the station in the fleet from step 0, on the cold-start rows,
    next to the cold-start figures of the same family when `coldstart.json` is in the output directory."""
    hist = ColdStartResult(args.join, tuple(args.windows))
    for r in results:
        hist.rows += [ColdStartRow(**row) for row in r["rows"] if row["client"] in stations]
    cold: dict[str, Any] = {}
    path = args.out_dir / f"{args.name}.json"
    if path.exists():
        cold = json.loads(path.read_text()).get("tables", {})
    lines = ["## Cold start, diagnostic: the same rows, scored for a station that has been in the fleet all along", "",
             f"Each FedBNR family with every station streaming from step 0 (so at step {args.join} the station's "
             f"model holds its own first {args.join} rows too), scored on the rows the cold start scores (from step "
             f"{args.join} on); next to it, the cold-start figure of the same family (the station joins at "
             f"{args.join} with no history: `coldstart.json`). Mean over seeds "
             f"{sorted({r.seed for r in hist.rows})}.", ""] + head_common + [f"Wall time: {wall:.0f} s.", ""]
    names = {"fedbnr-local": "local", "fedbnr": "pooled", "fedbnr-personal": "personal"}
    for w in hist.windows:
        tab = hist.table(w)
        ct = cold.get(str(w), {})
        lines += [f"### First {w} rows from step {args.join}", "",
                  "| station | " + " | ".join(f"MSE {names[a]}: all year / joining" for a in BAYES) + " | "
                  + " | ".join(f"NLPD {names[a]}: all year / joining" for a in BAYES) + " |",
                  "|---|" + "---|" * 6]
        for c in stations:
            cells = []
            for k, fmt in (("mse", f4), ("nlpd", f3)):
                for a in BAYES:
                    j = ct.get(c, {}).get(a, {}).get(k, float("nan"))
                    cells.append(f"{fmt(tab[c][a][k])} / {fmt(j)}")
            lines.append(f"| {c} | " + " | ".join(cells) + " |")
        means = []
        for k, fmt in (("mse", f4), ("nlpd", f3)):
            for a in BAYES:
                h = float(np.mean([tab[c][a][k] for c in stations]))
                j = float(np.mean([ct[c][a][k] for c in stations])) if ct else float("nan")
                means.append(f"{fmt(h)} / {fmt(j)}")
        lines += ["| **mean** | " + " | ".join(means) + " |", ""]
    md = args.out_dir / "coldstart_history.md"
    md.write_text("\n".join(lines))
    js = args.out_dir / "coldstart_history.json"
    js.write_text(json.dumps({"command": command, "wall_s": wall, **hist.to_json()}, indent=1,
                             default=_json_default))
    return [md, js]


def station_plot(res: ColdStartResult, stations: list[str], path: Path) -> Path:
    """MSE-to-date after joining, per held-out station (mean over seeds), every algorithm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    styles = {"fedbnr-local": ("tab:gray", "-"), "fedbnr": ("tab:blue", "-"), "fedbnr-personal": ("tab:red", "-"),
              "local-only": ("tab:gray", ":"), "pofmkl": ("tab:green", ":"),
              "fedbnr-personal:local": ("tab:gray", "--"), "fedbnr-personal:pooled": ("tab:blue", "--"),
              "fedbnr-personal:personal": ("tab:orange", "--")}
    cols = min(4, len(stations))
    rows = math.ceil(len(stations) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.5 * rows), sharex=True, squeeze=False)
    for ax, c in zip(axes.flat, stations, strict=False):
        for a, (color, ls) in styles.items():
            curves = [v for (cc, aa, _), v in res.curves.items() if cc == c and aa == a]
            if not curves:
                continue
            m = min(len(v) for v in curves)
            ax.plot(np.arange(1, m + 1), np.mean([v[:m] for v in curves], axis=0), color=color, ls=ls, lw=1.2,
                    label=a)
        ax.set_xscale("log")
        ax.set_title(c, fontsize=9)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=7)
    for ax in axes.flat[len(stations):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=6)
    fig.supxlabel("samples since joining (log scale)", fontsize=9)
    fig.supylabel("MSE to date (standardised units)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# ------------------------------------------------------------------ main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 (random features and draws), cold start")
    ap.add_argument("--whole-seeds", type=int, default=None, help="seeds of the whole-stream runs (default: --seeds)")
    ap.add_argument("--join", type=int, default=8760, help="the step the held-out station joins at")
    ap.add_argument("--windows", type=lambda v: tuple(int(x) for x in v.split(",")), default=(336, 2000),
                    help="comma-separated sample counts scored after joining")
    ap.add_argument("--out-dir", type=Path, default=REPO / "benchmarks" / "results")
    ap.add_argument("--n-features", type=int, default=50, help="FedBNR families: D (F = 2D + 1 with the bias)")
    ap.add_argument("--bandwidth", type=float, default=2.0, help="FedBNR families: Gaussian RFF bandwidth")
    ap.add_argument("--whole-steps", type=int, default=None, help="cut the whole-stream runs (default: full)")
    ap.add_argument("--stations", default=None, help="comma-separated held-out stations (default: all 12)")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes")
    ap.add_argument("--skip-whole", action="store_true", help="cold start only")
    ap.add_argument("--skip-coldstart", action="store_true", help="whole-stream personalisation only")
    ap.add_argument("--no-pofmkl", action="store_true", help="cold start of the FedBNR families only")
    ap.add_argument("--name", default="coldstart",
                    help="basename of the cold-start files (default coldstart: coldstart.md, .json, .png)")
    ap.add_argument("--history", action="store_true",
                    help="diagnostic only: each FedBNR family with every station in the fleet from step 0 (its own "
                         "year of history), scored on the same rows as the cold start; writes coldstart_history.*")
    ap.add_argument("--mixture", action="store_true",
                    help="personalisation that never costs: the default personalised learner (the experts' mixture) "
                         "with each expert's own figures on the same samples, against FedBNR from scratch; writes "
                         "<name>.md/.json (default name coldstart_mixture) and, unless --skip-whole, "
                         "personalisation_mixture.md/.json")
    ap.add_argument("--partial", action="store_true",
                    help="--mixture: rewrite the tables after every finished run (the stations done so far)")
    ap.add_argument("--with-pooled", action="store_true", help="--mixture: also pooled FedBNR (`fedbnr`) per station")
    ap.add_argument("--personal-alone", action="store_true",
                    help="personalised FedBNR without the experts' mixture (the learner before it was the default)")
    ap.add_argument("--plain", action="store_true",
                    help="every held-out run as `leave_one_out` (a whole fleet replay each) instead of one recorded "
                         "fleet run per seed and algorithm for the summed-statistics families (the same figures)")
    ap.add_argument("--render", action="store_true",
                    help="--mixture: rewrite <name>.md/.json from the rows in <name>.json (seeds 0..--seeds-1 whose 12 "
                         "held-out runs are all there), without running anything: a run stopped part way")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run (< 20 s): join 200, windows 48,120, 1 seed, 2 held-out stations, 320-step "
                         "whole streams, D = 10, output to /tmp/streamfed-coldstart-quick")
    args = ap.parse_args()
    command = ".venv/bin/python benchmarks/bench_coldstart.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    if args.quick:
        args.join, args.windows, args.seeds, args.whole_steps, args.n_features = 200, (48, 120), 1, 320, 10
        args.stations = args.stations or "Aotizhongxin,Dongsi"
        if args.out_dir == REPO / "benchmarks" / "results":
            args.out_dir = Path("/tmp/streamfed-coldstart-quick")
    if args.render:
        render(args)
        return
    whole_seeds = args.seeds if args.whole_seeds is None else args.whole_seeds
    cut = None
    if args.quick:
        cut = max(args.join + max(args.windows), args.whole_steps)
    t_start = time.perf_counter()
    _init(cut)
    fleet = _FLEET
    stations = list(fleet.names) if not args.stations else args.stations.split(",")
    seeds = list(range(args.seeds))

    tasks: list[tuple] = []
    if args.mixture:
        if args.name == "coldstart":
            args.name = "coldstart_mixture"
        if not args.skip_whole:
            tasks += [("whole", a, s, None) for a in ("fedbnr-personal", "fedbnr-local") for s in range(whole_seeds)]
        if not args.skip_coldstart:
            tasks += [("scratch", "fedbnr-local", s, None) for s in seeds]  # first: every table needs it
            tasks += [("loo", a, s, c) for s in seeds for c in stations
                      for a in ("fedbnr-personal",) + (("fedbnr",) if args.with_pooled else ())]
        args.skip_whole = args.skip_coldstart = True  # the mixture's report, below
    if args.history:
        args.skip_whole = args.skip_coldstart = True
        tasks += [("history", a, s, None) for a in ("fedbnr-personal", "fedbnr", "fedbnr-local") for s in seeds]
    if not args.skip_whole:  # the longest first
        tasks += [("whole", a, s, None) for a in ("fedbnr-personal", "fedbnr", "fedbnr-local")
                  for s in range(whole_seeds)]
    if not args.skip_coldstart:
        fed = ("fedbnr-personal", "fedbnr") + (() if args.no_pofmkl else ("pofmkl",))
        scratch = ("fedbnr-local",) + (() if args.no_pofmkl else ("local-only",))
        tasks += [("loo", a, s, c) for a in fed for s in seeds for c in stations]
        tasks += [("scratch", a, s, None) for a in scratch for s in seeds]
        # the from-scratch shortcut equals the library's protocol: one station, one seed, each baseline
        tasks += [("check", a, 0, stations[0]) for a in scratch]

    # the summed-statistics families: one recorded fleet run per seed, then each held-out station from it
    waiting: dict[tuple[str, int], list[tuple]] = {}
    if not args.plain:
        direct = []
        for t in tasks:
            if t[0] == "loo" and t[1] in RECORDED:
                waiting.setdefault((t[1], t[2]), []).append(("heldout",) + t[1:])
            else:
                direct.append(t)
        # every record is queued at the start, each algorithm's first seed first, then the other tasks, then the other
        # seeds' records: a held-out run waits for its seed's record, and a record queued only after the runs of the
        # seed before it (as it was) left one worker idle for most of a record at every seed. Held-out runs are queued
        # as their record finishes, so seeds still finish in order (a partial run has whole seeds).
        order = sorted(waiting, key=lambda k: (k[1], k[0]))
        firsts = [k for k in order if k[1] == min(s for a, s in waiting if a == k[0])]
        tasks = ([("record", a, s, None) for a, s in firsts] + direct
                 + [("record", a, s, None) for a, s in order if (a, s) not in firsts])
    n_tasks = len(tasks) + sum(len(v) for v in waiting.values())
    args.out_dir.mkdir(parents=True, exist_ok=True)  # --partial writes as it goes
    record_dir = tempfile.TemporaryDirectory(prefix="streamfed-coldstart-")
    args.record_dir = record_dir.name

    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    results: list[dict[str, Any]] = []
    ctx = mp.get_context("spawn")
    with (Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                   TimeElapsedColumn(), TimeRemainingColumn()) as progress,
          ProcessPoolExecutor(max_workers=args.jobs, mp_context=ctx, initializer=_init, initargs=(cut,)) as pool,
          record_dir):
        bar = progress.add_task("cold start + personalisation", total=n_tasks)
        futs = {}

        def submit(t: tuple) -> None:
            real = ("loo",) + t[1:] if t[0] == "check" else t
            futs[pool.submit(run_task, real, args)] = t

        def handled(t: tuple, r: dict[str, Any]) -> None:
            what = f"{t[0]} {t[1]} seed {t[2]}{' ' + t[3] if t[3] else ''} ({r['wall_s']:.0f} s)"
            progress.update(bar, advance=1, description=what)
            if not progress.console.is_terminal:  # a log file: one plain line per finished run
                print(f"[{len(results)}/{n_tasks} {time.perf_counter() - t_start:.0f} s] {what}", flush=True)
            if args.mixture and args.partial:  # the tables so far, over the stations done (a busy machine)
                done = [c for c in stations if any(x["task"][3] == c for x in results if x["kind"] == "loo")]
                if done and any(x["kind"] == "scratch" for x in results):
                    write_mixture(args, results, done, [f"Command: `{command}`", "",
                                                        f"**Partial: {len(done)} of {len(stations)} stations so far.**",
                                                        ""], time.perf_counter() - t_start, command)

        for t in tasks:
            submit(t)
        while futs:
            finished, _ = wait(futs, return_when=FIRST_COMPLETED)
            for fut in finished:
                t = futs.pop(fut)
                r = fut.result()
                r["kind"] = "loo" if t[0] == "heldout" else t[0]
                if t[0] == "record":
                    if any(r["rejected"]):
                        raise SystemExit(f"{t[1]} seed {t[2]}: a learner refused samples in the recorded run; "
                                         "rerun with --plain")
                    for h in waiting.pop((t[1], t[2])):
                        submit(h)
                results.append(r)
                handled(t, r)

    wall = time.perf_counter() - t_start
    cfgs = configs(args)
    machine_s = machine()
    git_s = git_state()
    cpu_s = {k: sum(r["wall_s"] for r in results if r["kind"] == k)
             for k in ("whole", "loo", "scratch", "check", "record")}
    args.out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    setting = (f"Data: 12 Beijing stations, target CO, 10 inputs, `online` normalisation (each station standardises "
               f"inputs and target with the mean and std of its own past samples only — causal), metrics in those "
               f"standardised units. FedBNR families: one Gaussian RFF map, bandwidth {args.bandwidth:g}, "
               f"D = {args.n_features} (F = {2 * args.n_features + 1} with the bias), uploads of ≥ 32 samples, "
               "σ, λ (personalised: σ, λ, τ, by Newton steps on its gradient) refitted by the exact evidence at "
               "every global, initial σ = λ = τ = 1, "
               "no forgetting. POF-MKL: the paper's Air setting (16 Gaussian kernels over [0.05, 5], D = 100, M = 1, "
               "η = 0.005, λ = 1e-4, ξ = 0.1). Replay: lock-step, one step = one row of each station's stream; "
               "globals broadcast every step (uploads arrive every 32).")
    head_common = [f"Command: `{command}`", "", f"Machine: {machine_s}. Code: {git_s}.", "", setting, ""]

    if not args.skip_coldstart:
        res = ColdStartResult(args.join, tuple(args.windows))
        check = {}
        for r in results:
            if r["kind"] in ("loo", "scratch"):
                res.rows += [ColdStartRow(**row) for row in r["rows"]]
                for key, v in r["curves"].items():
                    c, a, s = key.split("|")
                    res.curves[(c, a, int(s))] = np.asarray(v)
            elif r["kind"] == "check":
                check[r["task"][1]] = r
        res.rows = [r for r in res.rows if r.client in stations]
        res.curves = {k: v for k, v in res.curves.items() if k[0] in stations}
        res.rows.sort(key=lambda r: (stations.index(r.client), ALL.index(r.algorithm), r.seed, r.window))
        # the shortcut check: leave_one_out's rows for (station 0, seed 0) vs the from-scratch run's
        diffs = {}
        for a, r in check.items():
            lib = {(row["window"]): row for row in r["rows"]}
            ours = {row.window: row for row in res.rows if row.client == stations[0] and row.algorithm == a
                    and row.seed == 0}
            d = 0.0
            for w, row in lib.items():
                for k in ("mse", "nlpd", "coverage"):
                    x, y = row[k], getattr(ours[w], k)
                    if not (math.isnan(x) and math.isnan(y)):
                        d = max(d, abs(x - y))
            diffs[a] = d
        summary = coldstart_summary(res, stations)
        with tempfile.TemporaryDirectory() as tmp:  # the library's mean-curve plot (its JSON and md: ours below)
            for p in res.write(Path(tmp), command=command):
                if p.suffix == ".png":
                    written.append(Path(shutil.move(p, args.out_dir / f"{args.name}.png")))
        written.append(station_plot(res, stations, args.out_dir / f"{args.name}_stations.png"))
        head = ["## Cold start: a station joining a running fleet (leave one station out)", "",
                f"The other {len(fleet.names) - 1} stations stream from step 0; the held-out station joins at step "
                f"{args.join} (its rows before that are not used; it installs the fleet's globals all along, so it "
                f"starts from the current global) and streams its own rows from that step on. Scored over its first "
                f"{' and '.join(str(w) for w in args.windows)} samples, mean over seeds {seeds}.", ""] + head_common
        head += [f"From-scratch baselines (`fedbnr-local`, `local-only`) are run once per seed with every station "
                 f"joining at step {args.join} (they never hear from the other stations); checked against "
                 f"`leave_one_out` on {stations[0]}, seed 0: max |Δ| of MSE/NLPD/coverage = "
                 + ", ".join(f"{a} {d:.1e}" for a, d in diffs.items()) + ".", "",
                 f"Wall time: {wall:.0f} s for the whole script on {args.jobs} processes (cold-start runs "
                 f"{cpu_s['loo'] + cpu_s['scratch'] + cpu_s['check'] + cpu_s['record']:.0f} s of process time). Plots: "
                 f"`{args.name}.png` (mean over held-out stations and seeds of the MSE to date), "
                 f"`{args.name}_stations.png` (per held-out station).", ""]
        md = coldstart_markdown(res, stations, summary, head)
        (args.out_dir / f"{args.name}.md").write_text(md)
        written.append(args.out_dir / f"{args.name}.md")
        payload = {"command": command, "machine": machine_s, "code": git_s, "wall_s": wall,
                   "config": {"fedbnr_families": cfgs["bayes"].as_dict(), "pofmkl": cfgs["pofmkl"].as_dict(),
                              "normalisation": "online", "join": args.join, "windows": list(args.windows),
                              "seeds": seeds, "stations": stations},
                   "shortcut_check_max_abs_diff": diffs, "summary": summary,
                   # MSE to date after n samples, per (held-out station, algorithm, seed)
                   "mse_to_date": {f"{c}|{a}|{sd}": {str(n): float(v[n - 1]) for n in CURVE_AT if n <= v.size}
                                   for (c, a, sd), v in res.curves.items()},
                   **res.to_json()}
        (args.out_dir / f"{args.name}.json").write_text(json.dumps(payload, indent=1, default=_json_default))
        written.append(args.out_dir / f"{args.name}.json")

    if not args.skip_whole:
        whole = [r for r in results if r["kind"] == "whole"]
        tab = whole_tables(whole, stations)
        ws = whole_summary(tab, stations)
        walls = {a: [r["wall_s"] for r in whole if r["task"][1] == a] for a in BAYES}
        head = ["## Whole-stream personalisation: every station from step 0, full streams", "",
                f"Per station, prequential MSE, NLPD and 95% coverage over its whole stream (`ReplayResult.first(c)`), "
                f"mean over seeds {list(range(whole_seeds))}"
                + (f", first {args.whole_steps} steps" if args.whole_steps else "") + ".", ""] + head_common
        head += ["Wall time per run (mean over seeds): " + ", ".join(
            f"{a} {np.mean(v):.0f} s" for a, v in walls.items() if v) + ".", ""]
        md = whole_markdown(tab, stations, ws, head)
        (args.out_dir / "personalisation.md").write_text(md)
        payload = {"command": command, "machine": machine_s, "code": git_s,
                   "config": {"fedbnr_families": cfgs["bayes"].as_dict(), "normalisation": "online",
                              "seeds": list(range(whole_seeds)), "steps": args.whole_steps},
                   "wall_s": {a: v for a, v in walls.items()}, "summary": ws, "per_station": tab,
                   "rejected": {f"{r['task'][1]}|{r['task'][2]}": r["rejected"] for r in whole}}
        (args.out_dir / "personalisation.json").write_text(json.dumps(payload, indent=1, default=_json_default))
        written += [args.out_dir / "personalisation.md", args.out_dir / "personalisation.json"]

    if args.history:
        written += write_history(args, results, stations, head_common, wall, command)

    if args.mixture:
        written += write_mixture(args, results, stations, head_common, wall, command)

    print(f"wall time {wall:.1f} s; wrote " + ", ".join(str(p) for p in dict.fromkeys(written)))


# ------------------------------------------------------------------ the experts' mixture (--mixture)
MIX = "fedbnr-personal"  # the default personalised learner: the experts' mixture
MIX_COLUMNS = (("fedbnr-local", "local"), ("fedbnr", "pooled FedBNR"), (f"{MIX}:local", "expert local"),
               (f"{MIX}:pooled", "expert pooled"), (f"{MIX}:personal", "expert personal"), (MIX, "mixture"))
REFERENCES = ("fedbnr-local", "fedbnr", f"{MIX}:pooled", f"{MIX}:personal")  # the best of local / pooled / personal


def mixture_summary(res: ColdStartResult, stations: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for w in res.windows:
        tab = res.table(w)
        rows = [tab[c] for c in stations if MIX in tab.get(c, {}) and "fedbnr-local" in tab.get(c, {})]
        best = [min(r[a]["mse"] for a in REFERENCES if a in r) for r in rows]
        within = [r[MIX]["mse"] <= 1.05 * b for r, b in zip(rows, best, strict=True)]
        out[str(w)] = {
            "stations": len(rows),
            "mse_below_local": sum(r[MIX]["mse"] < r["fedbnr-local"]["mse"] for r in rows),
            "nlpd_below_local": sum(r[MIX]["nlpd"] < r["fedbnr-local"]["nlpd"] for r in rows),
            "within_5pct_of_best": sum(within),
            "ratio_to_best": {c: r[MIX]["mse"] / b for c, r, b in zip(stations, rows, best, strict=False)},
            "coverage_in_band": sum(in_band(r[MIX]["coverage"]) for r in rows),
            "mean": {a: {k: float(np.mean([r[a][k] for r in rows if a in r])) for k in ("mse", "nlpd", "coverage")}
                     for a, _ in MIX_COLUMNS if any(a in r for r in rows)}}
    return out


def per_seed_mixture(res: ColdStartResult, stations: list[str]) -> list[str]:
    """The issue's cold-start counts seed by seed (no averaging over seeds), each against its target."""
    lines = ["### Seed by seed", "",
             "Per seed, on how many held-out stations the mixture's MSE is below local-only's (target ≥ 10 of 12 at "
             "24 and 48 samples), within 5% of the best of local / pooled / personal (target ≥ 11 of 12 at every "
             "horizon), and its NLPD below local-only's (target 12 of 12 at 24 and 48).", "",
             "| seed | stations | " + " | ".join(f"{w}: MSE < local / within 5% / NLPD < local" for w in res.windows)
             + " | targets met |", "|---|---|" + "---|" * (len(res.windows) + 1)]
    for seed in sorted({r.seed for r in res.rows if r.algorithm == MIX}):
        one = ColdStartResult(res.join_step, res.windows, [r for r in res.rows if r.seed == seed])
        s = mixture_summary(one, stations)
        n = s[str(res.windows[0])]["stations"]
        met = []
        early = [w for w in res.windows if w in (24, 48)]
        if early:
            met.append("MSE < local at 24, 48: " + ("yes" if all(s[str(w)]["mse_below_local"] >= math.ceil(10 * n / 12)
                                                              for w in early) else "no"))
            met.append("NLPD < local at 24, 48: " + ("yes" if all(s[str(w)]["nlpd_below_local"] == n
                                                               for w in early) else "no"))
        met.append("within 5% at every horizon: " + ("yes" if all(
            s[str(w)]["within_5pct_of_best"] >= math.ceil(11 * n / 12) for w in res.windows) else "no"))
        lines.append(f"| {seed} | {n} | " + " | ".join(
            f"{s[str(w)]['mse_below_local']} / {s[str(w)]['within_5pct_of_best']} / {s[str(w)]['nlpd_below_local']}"
            for w in res.windows) + " | " + "; ".join(met) + " |")
    return lines + [""]


def write_mixture(args: argparse.Namespace, results: list[dict[str, Any]], stations: list[str],
                  head_common: list[str], wall: float, command: str) -> list[Path]:
    """The cold-start and whole-stream tables of the experts' mixture (docs/results.md)."""
    written: list[Path] = []
    seeds = list(range(args.seeds))
    loo = [r for r in results if r["kind"] in ("loo", "scratch")]
    if loo:
        res = ColdStartResult(args.join, tuple(args.windows))
        for r in loo:
            res.rows += [ColdStartRow(**row) for row in r["rows"] if row["client"] in stations]
            for key, v in r["curves"].items():
                c, a, sd = key.split("|")
                if c in stations:
                    res.curves[(c, a, int(sd))] = np.asarray(v)
        summary = mixture_summary(res, stations)
        present = [(a, n) for a, n in MIX_COLUMNS if any(r.algorithm == a for r in res.rows)]
        lines = ["## Cold start with the experts' mixture (leave one station out)", "",
                 f"The held-out station joins at step {args.join} and is scored over its first "
                 f"{', '.join(str(w) for w in args.windows)} samples; mean over seeds {seeds}, "
                 f"stations {len(stations)}. "
                 "`mixture` is the default personalised learner (`fedbnr-personal`: fixed share over its local, pooled "
                 "and personal experts); `expert …` is what that expert alone predicted on the same samples (its MSE "
                 "is exactly the learner's alone: `expert personal` is `fedbnr-personal` with `experts = false`; its "
                 "NLPD uses the expert's raw variance, not recalibrated); `local` is FedBNR from scratch "
                 "(`fedbnr-local`, the baseline).", ""] + head_common
        recs = [r for r in results if r["kind"] == "record"]
        if getattr(args, "render_note", None):
            lines += [args.render_note, ""]
        else:
            lines += [f"Wall time: {wall:.0f} s on {args.jobs} processes (process time: "
                      + ", ".join(f"{a} {sum(r['wall_s'] for r in loo + recs if r['task'][1] == a):.0f} s"
                                  for a in dict.fromkeys(r["task"][1] for r in loo))
                      + (f"; of which recording the fleets' uploads {sum(r['wall_s'] for r in recs):.0f} s — one run "
                         "per seed serves every held-out station, `leave_one_out_recorded`" if recs else "")
                      + f"; CPU time {sum(r.get('cpu_s', 0.0) for r in loo + recs):.0f} s).", ""]
        for w in res.windows:
            tab, s = res.table(w), summary[str(w)]
            lines += [f"### First {w} samples after joining", "",
                      "| held-out station | " + " | ".join(f"MSE {n}" for _, n in present)
                      + " | mixture / best | NLPD local | NLPD mixture | cov95 mixture |",
                      "|---|" + "---|" * (len(present) + 4)]
            for c in stations:
                row = tab.get(c, {})
                if MIX not in row:
                    continue
                cells = [f4(row[a]["mse"]) if a in row else "—" for a, _ in present]
                lines.append(f"| {c} | " + " | ".join(cells) + f" | {s['ratio_to_best'][c]:.3f} | "
                             f"{f3(row['fedbnr-local']['nlpd'])} | {f3(row[MIX]['nlpd'])} | "
                             f"{f3(row[MIX]['coverage'])} |")
            m = s["mean"]
            lines.append("| **mean** | " + " | ".join(f4(m[a]["mse"]) if a in m else "—" for a, _ in present)
                         + f" | | {f3(m['fedbnr-local']['nlpd'])} | {f3(m[MIX]['nlpd'])} | "
                         f"{f3(m[MIX]['coverage'])} |")
            n = s["stations"]
            lines += ["", f"- mixture MSE below local-only's on **{s['mse_below_local']} / {n}**; within 5% of the "
                      f"best of local / pooled / personal on **{s['within_5pct_of_best']} / {n}**; NLPD below "
                      f"local-only's on **{s['nlpd_below_local']} / {n}**; coverage in [0.90, 0.98] on "
                      f"{s['coverage_in_band']} / {n}.",
                      ""]
        lines += per_seed_mixture(res, stations)
        md = args.out_dir / f"{args.name}.md"
        md.write_text("\n".join(lines))
        js = args.out_dir / f"{args.name}.json"
        js.write_text(json.dumps({"command": command, "wall_s": wall, "summary": summary,
                                  "mse_to_date": {f"{c}|{a}|{sd}": {str(k): float(v[k - 1]) for k in CURVE_AT
                                                                    if k <= v.size}
                                                  for (c, a, sd), v in res.curves.items()},
                                  **res.to_json()}, indent=1, default=_json_default))
        written += [md, js]
        if res.curves:  # (--render has the rows only: the plot of the run stays)
            written.append(station_plot(res, stations, args.out_dir / f"{args.name}_stations.png"))
    whole = [r for r in results if r["kind"] == "whole"]
    if whole:
        acc: dict[str, dict[str, list[dict[str, float]]]] = {}
        for r in whole:
            for c, f in r["per_station"].items():
                acc.setdefault(c, {}).setdefault(r["task"][1], []).append(f)
            for c, ex in r.get("experts", {}).items():
                for e, f in ex.items():
                    acc.setdefault(c, {}).setdefault(f"{MIX}:{e}", []).append(f)
        tab = {c: {a: {k: float(np.mean([f[k] for f in fs])) for k in ("mse", "nlpd")} for a, fs in algs.items()}
               for c, algs in acc.items()}
        cov = {c: float(np.mean([f["coverage"] for f in acc[c][MIX]])) for c in stations}
        rel = {c: tab[c][MIX]["mse"] / tab[c]["fedbnr-local"]["mse"] - 1.0 for c in stations}
        nlpd_ok = [tab[c][MIX]["nlpd"] <= tab[c]["fedbnr-local"]["nlpd"] for c in stations]
        lines = ["## Whole-stream personalisation with the experts' mixture", "",
                 "Every station from step 0 over its whole stream"
                 + (f" (first {args.whole_steps} steps)" if args.whole_steps else "")
                 + f", mean over seeds {list(range(args.whole_seeds or args.seeds))}.", ""] + head_common
        lines += ["| station | MSE local | MSE expert personal | MSE mixture | mixture vs local MSE | NLPD local | "
                  "NLPD mixture | cov95 mixture |", "|---|" + "---|" * 7]
        for c in stations:
            t = tab[c]
            pers = t.get(f"{MIX}:personal", {}).get("mse", float("nan"))
            lines.append(f"| {c} | {f4(t['fedbnr-local']['mse'])} | {f4(pers)} | {f4(t[MIX]['mse'])} | "
                         f"{100 * rel[c]:+.2f} % | {f3(t['fedbnr-local']['nlpd'])} | {f3(t[MIX]['nlpd'])} | "
                         f"{f3(cov[c])} |")
        lines += ["", f"- mixture NLPD ≤ local-only's on **{sum(nlpd_ok)} / {len(stations)}**; MSE within 1% (or "
                  f"below) on **{sum(v <= 0.01 for v in rel.values())} / {len(stations)}** (worst "
                  f"{max(rel, key=lambda c: rel[c])} {100 * max(rel.values()):+.2f} %); coverage in [0.90, 0.98] on "
                  f"{sum(in_band(v) for v in cov.values())} / {len(stations)}.", ""]
        md = args.out_dir / "personalisation_mixture.md"
        md.write_text("\n".join(lines))
        js = args.out_dir / "personalisation_mixture.json"
        js.write_text(json.dumps({"command": command, "per_station": tab, "coverage": cov, "mse_rel_diff": rel,
                                  "wall_s": {r["task"][1]: r["wall_s"] for r in whole}}, indent=1,
                                 default=_json_default))
        written += [md, js]
    return written


def render(args: argparse.Namespace) -> None:
    """`--render`: the mixture's tables again from `<name>.json`, over the seeds whose every station is there."""
    if args.name == "coldstart":
        args.name = "coldstart_mixture"
    path = args.out_dir / f"{args.name}.json"
    old = json.loads(path.read_text())
    rows = [ColdStartRow(**r) for r in old["rows"]]
    args.join, args.windows = int(old["join_step"]), tuple(int(w) for w in old["windows"])
    stations = list(load_beijing(normalisation="online", split="station", steps=1).names)  # all 12, in fleet order
    full = [s for s in range(args.seeds)
            if {r.client for r in rows if r.seed == s and r.algorithm == MIX} == set(stations)]
    if not full:
        raise SystemExit(f"{path}: no seed of 0..{args.seeds - 1} has the runs of all {len(stations)} stations")
    dropped = sorted({r.seed for r in rows} - set(full))
    groups: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for r in rows:
        if r.seed in full:
            groups.setdefault((r.client, r.algorithm.split(":")[0], r.seed), []).append(asdict(r))
    results = [{"kind": "scratch" if a in FROM_SCRATCH else "loo", "task": ("loo", a, sd, c), "rows": rs,
                "curves": {}, "wall_s": 0.0} for (c, a, sd), rs in groups.items()]
    args.seeds = len(full)
    args.render_note = (f"Rendered by `--render` from the rows of the run's JSON: seeds {full}, whose 12 held-out runs "
                        "all finished" + (f" (runs of seeds {dropped} left out: unfinished)" if dropped else "") + "; "
                        f"the run's wall time when it last wrote them: {old['wall_s']:.0f} s.")
    head = [f"Command: `{old['command']}` (tables: `... --render`)", ""]
    written = write_mixture(args, results, stations, head, float(old["wall_s"]), old["command"])
    new = json.loads(path.read_text())  # the run's MSE-to-date points (the rows only carry the windows' figures)
    new["mse_to_date"] = {k: v for k, v in old.get("mse_to_date", {}).items() if int(k.rsplit("|", 1)[1]) in full}
    path.write_text(json.dumps(new, indent=1, default=_json_default))
    print("wrote " + ", ".join(str(p) for p in written))


def _json_default(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(type(o))


if __name__ == "__main__":
    main()
