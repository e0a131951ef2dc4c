"""FedBNR's evidence refit amortised (`refit_growth`): what it saves and what it moves, same run (issue 29).

    .venv/bin/python benchmarks/bench_fedbnr_refit.py --out benchmarks/results/fedbnr_refit.md

Not a test: the figures go to `benchmarks/results/fedbnr_refit.{md,json}` and docs/benchmarks.md.

The server refits `σ, λ` by the evidence at every global (`refit_growth = 0`, the fleet's server default); with
`refit_growth = g > 0` only once its sums hold `(1 + g)×` the samples of the last fit (docs/algorithms.md §4.7).
`FedBNRRegressor`'s default is `g = 0.5` (issue 29: a refit whenever the samples have grown by half; it syncs with
its private server only then). Two places it shows:

1. `FedBNRRegressor(refit_growth=g)`, otherwise on its defaults (8 bandwidths, D = 50, lazy kernels at 50 nats,
   the profile evidence search), River's progressive validation (predict, then learn) on TrumpApproval,
   ChickWeights and Friedman (first 2,000): MAE and CPU time per sample, next to River's
   `StandardScaler | LinearRegression` in the same run (its ratio); `g = 0.5` with the lazy kernels off
   (`lazy_gap=0`: every kernel updated at every sample); and `g = 0.5` with the 2-d grid search
   (`evidence_search="grid"`: the estimator's refits before issue 29 part 2, and the fleet server's).
   Then the grid and the profile search on every stream of `benchmarks/bench_progressive.py` (its defaults:
   TrumpApproval, ChickWeights, Friedman seeds 0–2 × 5,000, Beijing's first 3 stations × 5,000 rows through the
   CSV path): MAE and CPU µs per sample of both (`--no-progressive` skips it).
2. The replay `streamfed replay --dataset beijing-air -a fedbnr --steps 300` runs (same defaults, no plots), in
   this process with the aggregation's server set to the value (`refit_growth` is a server and estimator
   parameter, not a fleet one): CPU seconds of the replay, MSE and average regret.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # small matrices: one BLAS thread (set before numpy loads)

import argparse  # noqa: E402
import json
import platform
import resource
import sys
from pathlib import Path
from typing import Any

import bench_progressive
from river import datasets, linear_model, metrics, preprocessing

from streamfed.algorithms.fedbnr import FedBNR
from streamfed.algorithms.fedbnr.estimator import FedBNRRegressor
from streamfed.evaluation.datasets.beijing import load_beijing
from streamfed.evaluation.replay import replay
from streamfed.fleet.config import FleetConfig

STREAMS = {
    "TrumpApproval": lambda: datasets.TrumpApproval(),
    "ChickWeights": lambda: datasets.ChickWeights(),
    "Friedman (2,000)": lambda: datasets.synth.Friedman(seed=42).take(2000),
}


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def progressive(make_model, stream) -> tuple[float, float]:
    """`(MAE, CPU µs per sample)` of predict-then-learn over `stream`."""
    model, mae, n = make_model(), metrics.MAE(), 0
    start = cpu()
    for x, y in stream():
        mae.update(y, model.predict_one(x))
        model.learn_one(x, y)
        n += 1
    return mae.get(), (cpu() - start) / n * 1e6


def replay_with_growth(growth: float, steps: int) -> dict:
    """The replay `streamfed replay --dataset beijing-air -a fedbnr --steps STEPS` runs (same defaults), in this
    process, its aggregation's server set to `refit_growth = growth` (not a fleet parameter: a what-if)."""
    fleet = load_beijing("paper", steps=steps)
    original = FedBNR.aggregation

    def aggregation(self: FedBNR, cfg: FleetConfig, **kwargs: Any) -> Any:
        agg = original(self, cfg, **kwargs)
        agg.server.refit_growth = growth
        return agg

    FedBNR.aggregation = aggregation  # type: ignore[method-assign]
    try:
        start = cpu()
        r = replay(fleet, "fedbnr", steps=steps)
        spent = cpu() - start
    finally:
        FedBNR.aggregation = original  # type: ignore[method-assign]
    return {"cpu_s": spent, "mse": r.mse, "avg_regret": r.avg_regret}


def searches_on_progressive_streams() -> list[dict]:
    """Grid vs profile evidence search, every stream of bench_progressive (its defaults), in this process."""
    ns = argparse.Namespace(limit=None, friedman_n=5000, seeds=[0, 1, 2],
                            stations=list(bench_progressive.BEIJING_STATIONS[:3]), beijing_rows=5000)
    rows = []
    for st in bench_progressive.all_streams(ns):
        row: dict[str, Any] = {"dataset": st.dataset, "stream": st.name, "n": len(st.ys)}
        for search in ("grid", "profile"):
            row[search] = progressive(lambda search=search: FedBNRRegressor(evidence_search=search),
                                      lambda st=st: zip(st.xs, st.ys, strict=True))
        rows.append(row)
        print(row, file=sys.stderr)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--growth", default="0,0.5,1.0,2.0", help="refit_growth values (0.5 = the estimator's default)")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--no-progressive", action="store_true", help="skip grid vs profile on bench_progressive's streams")
    args = ap.parse_args()
    growths = [float(g) for g in args.growth.split(",")]
    load0 = os.getloadavg()
    est: dict[str, dict] = {}
    for name, stream in STREAMS.items():
        peer = progressive(lambda: preprocessing.StandardScaler() | linear_model.LinearRegression(), stream)
        est[name] = {"river_linear": peer, "fedbnr": {g: progressive(lambda g=g: FedBNRRegressor(refit_growth=g),
                                                                     stream) for g in growths}}
        est[name]["eager"] = progressive(lambda: FedBNRRegressor(refit_growth=0.5, lazy_gap=0.0), stream)
        est[name]["grid"] = progressive(lambda: FedBNRRegressor(refit_growth=0.5, evidence_search="grid"), stream)
        print(name, est[name], file=sys.stderr)
    searches = [] if args.no_progressive else searches_on_progressive_streams()
    if args.steps <= 0:
        rep: dict[float, dict] = {}
    else:
        replay_with_growth(growths[0], 2)  # compiled kernels loaded, imports done: not in the first timing
        rep = {g: replay_with_growth(g, args.steps) for g in growths}
    load1 = os.getloadavg()
    cmd = " ".join(["benchmarks/bench_fedbnr_refit.py"] + sys.argv[1:])
    lines = [
        "## FedBNR: the evidence refit amortised (`refit_growth`)",
        "",
        "What refitting `σ, λ` only once the server's sums have grown by the fraction `g` since the last fit saves "
        "and what it moves: `FedBNRRegressor(refit_growth=g)` (progressive validation, CPU µs per sample, next to "
        "River's `StandardScaler | LinearRegression` in the same run; `g = 0.5` is the estimator's default since "
        "issue 29, `g = 0` its earlier one — a refit every 32 samples; ΔMAE is against `g = 0`; *lazy off*: "
        "`g = 0.5` with `lazy_gap=0`, every kernel updated at every sample)"
        + ("." if not rep else f" and the `streamfed replay --dataset beijing-air -a fedbnr --steps {args.steps}` "
           "command (the fleet's server default stays `g = 0`)."),
        "",
        f"Command: `.venv/bin/python {cmd}`",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores (shared), Python {platform.python_version()}, "
        f"OPENBLAS_NUM_THREADS=1; load average {load0[0]:.2f} at the start, {load1[0]:.2f} at the end.",
        "",
        "| stream | refit_growth | MAE | ΔMAE vs g = 0 | µs / sample (CPU) | × River LinearRegression |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in est.items():
        base = r["fedbnr"][0.0][0] if 0.0 in r["fedbnr"] else None
        for g, (mae, us) in r["fedbnr"].items():
            delta = f"{(mae / base - 1) * 100:+.2f}%" if base else "—"
            lines.append(f"| {name} | {g:g} | {mae:.6f} | {delta} | {us:.0f} | {us / r['river_linear'][1]:.1f} |")
        mae, us = r["eager"]
        delta = f"{(mae / base - 1) * 100:+.2f}%" if base else "—"
        lines.append(f"| {name} | 0.5, lazy off | {mae:.6f} | {delta} | {us:.0f} | {us / r['river_linear'][1]:.1f} |")
        mae, us = r["grid"]
        delta = f"{(mae / base - 1) * 100:+.2f}%" if base else "—"
        lines.append(f"| {name} | 0.5, grid search | {mae:.6f} | {delta} | {us:.0f} | "
                     f"{us / r['river_linear'][1]:.1f} |")
        lines.append(f"| {name} | River LinearRegression | {r['river_linear'][0]:.6f} | | {r['river_linear'][1]:.0f} "
                     "| 1 |")
    if searches:
        lines += ["", "The evidence search, grid (before) vs profile (the default), `FedBNRRegressor()` otherwise on "
                  "its defaults, on every stream of `benchmarks/bench_progressive.py` (its defaults):", "",
                  "| dataset | stream | samples | MAE grid | MAE profile | ΔMAE | µs / sample grid "
                  "| µs / sample profile | profile / grid time |", "|---|---|---|---|---|---|---|---|---|"]
    for r in searches:
        (mg, ug), (mp, up) = r["grid"], r["profile"]
        lines.append(f"| {r['dataset']} | {r['stream']} | {r['n']} | {mg:.6f} | {mp:.6f} | {(mp / mg - 1) * 100:+.3f}% "
                     f"| {ug:.0f} | {up:.0f} | {up / ug:.2f} |")
    if rep:
        lines += ["", f"Replay (`--steps {args.steps}`, defaults: 16 kernels, D = 100; the replay alone, no start-up):",
                  "", "| refit_growth | CPU s | MSE | avg R/T |", "|---|---|---|---|"]
    for g, r in rep.items():
        lines.append(f"| {g:g} | {r['cpu_s']:.1f} | {r['mse']:.6f} | {r['avg_regret']:.3e} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
        args.out.with_suffix(".json").write_text(json.dumps(
            {"command": cmd, "load": [load0, load1], "estimator": {k: {"river_linear": v["river_linear"],
                                                                       "lazy_off": v["eager"],
                                                                       "grid_search": v["grid"],
                                                                       "fedbnr": {str(g): x for g, x in
                                                                                  v["fedbnr"].items()}}
                                                                   for k, v in est.items()},
             "searches": searches, "replay": {str(g): r for g, r in rep.items()}}, indent=1))


if __name__ == "__main__":
    main()
