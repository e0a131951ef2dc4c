"""Calibration of every Bayesian learner's 95% interval, with and without the online conformal variance scale.

    .venv/bin/python benchmarks/bench_calibration.py --out benchmarks/results/calibration.md
    .venv/bin/python benchmarks/bench_calibration.py --quick          # smoke run (short slices), writes to /tmp

Two parts, each learner run twice — `calibrate=False` (the model's own variance) and `calibrate=True` (the default:
the variance scaled by `(q·c / 1.96)²`, `q` split conformal's 95% quantile (the ⌈(n + 1)·0.95⌉-th smallest) of
the last 256 prequential |residual| / predictive sd, `c` a quantile-tracking correction,
:mod:`streamfed.algorithms.calibration`):

* **Estimators** (a fleet of one): every stream of `benchmarks/bench_progressive.py` — TrumpApproval,
  ChickWeights, synth.Friedman seeds 0–2 (5,000 samples), the first 5,000 rows of Beijing's Aotizhongxin,
  Changping and Dingling through the CSV path — by that benchmark's own protocol (`predict_one(x, with_dist=True)`
  then `learn_one(x, y)`; covered when |y − μ| ≤ 1.96 σ), each learner's `algorithms.get(name).estimator(
  calibrate=…)` on its other defaults.
* **Federated** (the replay): the 12 Beijing stations of `load_beijing()` (the paper's normalisation, `--steps`
  per station), each algorithm's replay on `AlgorithmConfig(params={name: {"calibrate": …}})` — what each agent of a
  fleet reports; coverage per station over every scored step.

Coverage must be in [0.90, 0.98]; the MSE with and without must be equal (the mean is never changed).
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import bench_progressive as bp  # noqa: E402

from streamfed import algorithms  # noqa: E402
from streamfed.evaluation.bench import load_average, machine, write_section  # noqa: E402
from streamfed.evaluation.datasets import load_beijing  # noqa: E402
from streamfed.evaluation.replay import AlgorithmConfig, replay  # noqa: E402

LEARNERS = ("fedbnr", "fedbnr-personal", "fsgp", "urk-fedbnr", "pvi")
LOW, HIGH = 0.90, 0.98


def cell(cov: float | None) -> str:
    if cov is None or not math.isfinite(cov):
        return "—"
    s = f"{cov:.3f}"
    return s if LOW <= cov <= HIGH else f"**{s}**"


def estimator_runs(names: Sequence[str], args: argparse.Namespace) -> list[dict[str, Any]]:
    ns = argparse.Namespace(limit=args.limit, friedman_n=5000, seeds=[0, 1, 2], stations=list(bp.BEIJING_STATIONS[:3]),
                            beijing_rows=5000)
    if args.quick:
        ns.seeds, ns.stations = [0], ns.stations[:1]
    streams = bp.all_streams(ns)
    runs = []
    for name in names:
        alg = algorithms.get(name)
        for s in streams:
            row: dict[str, Any] = {"learner": name, "dataset": s.dataset, "stream": s.name, "n": len(s.ys)}
            for cal in (False, True):
                r = bp.progressive(lambda alg=alg, cal=cal: alg.estimator(calibrate=cal), s.xs, s.ys)
                key = "on" if cal else "off"
                row[key] = {k: r[k] for k in ("coverage", "rmse", "mae", "us_per_sample", "error")}
            print(f"{name:>16} {s.name:>13} coverage {cell(row['off']['coverage'])} -> {cell(row['on']['coverage'])}"
                  f"  rmse {row['off']['rmse']} / {row['on']['rmse']}", flush=True)
            runs.append(row)
    return runs


def replay_runs(names: Sequence[str], args: argparse.Namespace) -> tuple[list[str], list[dict[str, Any]]]:
    fleet = load_beijing(steps=args.steps)
    stations = list(fleet.names)
    runs = []
    for name in names:
        row: dict[str, Any] = {"learner": name}
        for cal in (False, True):
            t0 = time.perf_counter()
            r = replay(fleet, name, AlgorithmConfig(params={name: {"calibrate": cal}}))
            covs = [r.first(c)["coverage"] for c in range(len(stations))]
            row["on" if cal else "off"] = {"coverage": covs, "mse": r.mse, "seconds": time.perf_counter() - t0}
        print(f"{name:>16} replay coverage {min(row['off']['coverage']):.3f}–{max(row['off']['coverage']):.3f} -> "
              f"{min(row['on']['coverage']):.3f}–{max(row['on']['coverage']):.3f}  mse {row['off']['mse']} / "
              f"{row['on']['mse']}", flush=True)
        runs.append(row)
    return stations, runs


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--quick", action="store_true", help="smoke run: 300 samples per stream, 1 seed, 1 station")
    ap.add_argument("--learners", default=",".join(LEARNERS))
    ap.add_argument("--steps", type=int, default=2000, help="replay steps per Beijing station")
    ap.add_argument("--limit", type=int, default=None, help="cut every estimator stream to its first N samples")
    ap.add_argument("--skip-replay", action="store_true")
    args = ap.parse_args(argv)
    if args.quick:
        args.limit, args.steps = args.limit or 300, min(args.steps, 300)
        args.out = args.out or Path("/tmp/calibration-quick.md")
    names = [n.strip() for n in args.learners.split(",") if n.strip()]
    t0 = time.perf_counter()
    est = estimator_runs(names, args)
    stations, rep = ([], []) if args.skip_replay else replay_runs(names, args)
    wall = time.perf_counter() - t0
    cmd = ".venv/bin/python benchmarks/bench_calibration.py" + (" --quick" if args.quick else
                                                                 f" --out {args.out}" if args.out else "")
    lines = [
        "# Calibration: 95% intervals with and without the conformal variance scale",
        "",
        "Every Bayesian learner's prequential 95% coverage (share of samples with |y − μ| ≤ 1.96 σ, σ from the "
        "prediction made before the sample was learned), with `calibrate=False` (the model's own variance) → "
        "`calibrate=True` (the default: the variance scaled by `(q·c / 1.96)²`, `q` split conformal's 95% quantile "
        "(the ⌈(n + 1)·0.95⌉-th smallest) of the last 256 "
        "studentised prequential residuals, `c` a quantile-tracking correction, "
        "`streamfed/algorithms/calibration.py`). In bold: outside "
        f"[{LOW:.2f}, {HIGH:.2f}]. The mean is never changed: RMSE / MSE are the same with and without.",
        "",
        f"Command: `{cmd}` ({wall:.0f} s wall, one process). Code: {bp.git_state()}. Machine: {machine()}; "
        f"load average at the end {load_average()}.",
        "",
        "## Estimators on the streams of `bench_progressive` (a fleet of one)",
        "",
        "Protocol of `benchmarks/bench_progressive.py` (its streams and sizes"
        + (f", every stream cut to {args.limit} samples" if args.limit else "") + "); `algorithms.get(name)."
        "estimator(calibrate=…)` on its other defaults.",
        "",
    ]
    streams = list(dict.fromkeys(r["stream"] for r in est))
    lines += ["| learner | " + " | ".join(streams) + " | RMSE equal | µs/sample off → on |",
              "|---|" + "---|" * (len(streams) + 2)]
    for name in names:
        rows = [r for r in est if r["learner"] == name]
        if not rows:
            continue
        cells = [f"{cell(r['off']['coverage'])} → {cell(r['on']['coverage'])}" for r in rows]
        same = all(r["off"]["rmse"] == r["on"]["rmse"] for r in rows)
        us = [(r["off"]["us_per_sample"] or 0, r["on"]["us_per_sample"] or 0) for r in rows]
        n = [r["n"] for r in rows]
        off = sum(u[0] * k for u, k in zip(us, n, strict=True)) / sum(n)
        on = sum(u[1] * k for u, k in zip(us, n, strict=True)) / sum(n)
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {'yes' if same else '**no**'} | {off:.0f} → {on:.0f} |")
    if rep:
        lines += ["", f"## Federated: the 12 Beijing stations (replay, {args.steps} steps per station)", "",
                  "`replay(load_beijing(steps=…), name, AlgorithmConfig(params={name: {\"calibrate\": …}}))`: every "
                  "station one agent of one federated fleet, the defaults otherwise.", "",
                  "| learner | " + " | ".join(stations) + " | MSE off / on |", "|---|" + "---|" * (len(stations) + 1)]
        for r in rep:
            cells = [f"{cell(a)} → {cell(b)}" for a, b in zip(r["off"]["coverage"], r["on"]["coverage"], strict=True)]
            mse = f"{r['off']['mse']:.4g} / {r['on']['mse']:.4g}"
            lines.append(f"| {r['learner']} | " + " | ".join(cells) + f" | {mse} |")
    write_section(args.out, lines, {"estimators": est, "replay": {"stations": stations, "runs": rep},
                                    "config": {"learners": names, "steps": args.steps, "limit": args.limit,
                                               "command": cmd}}, quick=args.quick)


if __name__ == "__main__":
    main()
