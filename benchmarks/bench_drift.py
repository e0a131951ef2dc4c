"""Streams drift: the federated defaults, with and without forgetting, against River's KNN and ARF on whole
Beijing streams (issue 32's first figure).

    PYTHONPATH=$PWD OPENBLAS_NUM_THREADS=1 .venv/bin/python benchmarks/bench_drift.py --jobs 2 \
        --out benchmarks/results/drift.md
    PYTHONPATH=$PWD OPENBLAS_NUM_THREADS=1 .venv/bin/python benchmarks/bench_drift.py --steps 2000 --out /tmp/d.md

Not a test: the figures go to `benchmarks/results/drift.{md,json}`.

Data: the 12 Beijing stations, target CO from the 10 other pollutant and weather columns, every station's valid
rows in time order (`load_beijing(split="station")`). streamfed's learners see `online` normalisation (each
station standardises inputs and target with its own past only: causal) and their predictions are mapped back to
raw units (`ClientStream.to_original`); River's models see the *same rows* in raw units (aligned by their row in
the station's file, `ClientStream.row`) in the River recipe, `preprocessing.StandardScaler() | model`. Scored on
every sample (prequential: predict, then learn), in raw units (µg/m³ of CO): MAE, RMSE and, for the Bayesian
models, the share of samples inside the central 95% predictive interval.

Models:

* `fedbnr` — the federated FedBNR replay on its defaults (`streamfed replay -a fedbnr`: `AlgorithmConfig()`, every
  station a client, every global installed), `fedbnr h=<hours>` the same with `half_life_s` (forgetting on the
  rows' times, docs/algorithms.md §4.14);
* `fedbnr mix(<hours>)` — `fedbnr-halflives` (docs/algorithms.md §4.15): one FedBNR fleet per half-life of the
  list (`none`: no forgetting), every agent predicting with the fixed-share mixture of their predictives
  (`--mixture`; its weights at station 0 and its cost per sample are reported);
* `fsgp` — the federated FSGP replay on its defaults;
* `River KNN` — `preprocessing.StandardScaler() | neighbors.KNNRegressor()`;
* `River ARF` — `preprocessing.StandardScaler() | forest.ARFRegressor(seed=0)`.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
BAND = (0.90, 0.98)


STATIONS = 12  # how many of the stations (the first ones) are run: --stations


def _fleets(steps: int | None, stations: int = STATIONS, first: int = 0) -> tuple[Any, Any]:
    from dataclasses import replace

    from streamfed.evaluation.datasets import load_beijing

    online = load_beijing(normalisation="online", split="station", steps=steps)
    raw = load_beijing(normalisation="none", split="station",
                       steps=None if steps is None else steps + online[0].warmup)
    pick = slice(first, first + stations)
    return replace(online, streams=online.streams[pick]), replace(raw, streams=raw.streams[pick])


def _scores(y: np.ndarray, mean: np.ndarray, var: np.ndarray | None) -> dict[str, float]:
    err = mean - y
    out = {"n": int(y.size), "mae": float(np.mean(np.abs(err))), "rmse": float(np.sqrt(np.mean(err**2)))}
    if var is not None and np.all(np.isfinite(var)):
        out["coverage"] = float(np.mean(np.abs(err) <= 1.96 * np.sqrt(var)))
    return out


def run_streamfed(name: str, alg: str, params: dict[str, Any], steps: int | None,
                  stations: int = STATIONS, first: int = 0) -> dict[str, Any]:
    from streamfed.evaluation.replay import AlgorithmConfig, replay

    online, _ = _fleets(steps, stations, first)
    t0 = time.perf_counter()
    res = replay(online, alg, AlgorithmConfig(params={alg: params} if params else None))
    wall = time.perf_counter() - t0
    stations = {}
    for c, s in enumerate(online.streams):
        m, v = np.asarray(res.means[c]), np.asarray(res.variances[c])
        ok = np.isfinite(m)
        y = s.to_original(s.y)[ok]
        mean = s.to_original(m)[ok]
        var = (v * np.asarray(s.y_scale) ** 2)[ok] if np.isfinite(v).any() else None
        stations[s.name] = _scores(y, mean, var) | {"rejected": int((~ok).sum())}
    out = {"model": name, "stations": stations, "seconds": wall,
           "samples": int(sum(np.isfinite(np.asarray(m)).sum() for m in res.means))}
    if alg == "fedbnr-halflives":  # the mixture's weights at station 0, at the replay's checkpoints
        out["weights"] = {"names": list(res.kernel_names), "mean": np.mean(res.weights, axis=0).tolist(),
                          "last": res.weights[-1].tolist()}
    return out


def run_river(name: str, station: int, steps: int | None, stations: int = STATIONS, first: int = 0
              ) -> dict[str, Any]:
    from river import forest, neighbors, preprocessing

    online, raw = _fleets(steps, stations, first)
    s, r = online.streams[station], raw.streams[station]
    pos = {int(row): i for i, row in enumerate(np.asarray(r.row))}
    idx = np.array([pos[int(row)] for row in np.asarray(s.row)])
    X, y = np.asarray(r.X)[idx], np.asarray(r.y)[idx]
    keys = list(r.feature_names)
    model = (preprocessing.StandardScaler() | (neighbors.KNNRegressor() if name == "River KNN"
                                                else forest.ARFRegressor(seed=0)))
    pred = np.empty(y.size)
    t0 = time.perf_counter()
    for i in range(y.size):
        x = dict(zip(keys, X[i].tolist(), strict=True))
        pred[i] = float(model.predict_one(x) or 0.0)
        model.learn_one(x, float(y[i]))
    y_check = s.to_original(s.y)
    if not np.allclose(y, y_check, rtol=1e-9, atol=1e-6):
        raise RuntimeError(f"{s.name}: the raw rows do not match the normalised stream's targets")
    return {"model": name, "station": s.name, "scores": _scores(y, pred, None), "seconds": time.perf_counter() - t0}


def agent_cost(steps: int, mixture: list[float | None], half_life_h: float = 24.0, repeats: int = 3
               ) -> dict[str, float]:
    """Microseconds per sample of one agent's learner alone (predict, learn, take_update; no globals), on station 0's
    first `steps` rows and their times, side by side: FedBNR's defaults, FedBNR with one half-life, and the half-life
    mixture — the best of `repeats` passes each, interleaved (a loaded machine slows all alike)."""
    from streamfed.algorithms import get
    from streamfed.evaluation.replay import AlgorithmConfig, time_stamps

    online, _ = _fleets(steps, 1)
    s = online.streams[0]
    xs, ys = np.ascontiguousarray(s.X[:steps]), np.asarray(s.y[:steps], dtype=np.float64)
    ts = time_stamps(s.time, ys.size)
    models = {"fedbnr": ("fedbnr", {}), f"fedbnr h={half_life_h:g}": ("fedbnr", {"half_life_s": half_life_h * 3600}),
              "fedbnr mix": ("fedbnr-halflives", {"half_lives_s": mixture})}
    best = dict.fromkeys(models, np.inf)
    for _ in range(repeats):
        for name, (alg, params) in models.items():
            # the replay's fleet (16 kernels, D = 100: F = 201), on the already normalised stream
            cfg = AlgorithmConfig(params={alg: params}).fleet_config(alg, n_inputs=xs.shape[1], seed=0)
            lr = get(alg).learner(cfg, "c0", 0)
            lr.warm_up(xs[0])
            t0 = time.perf_counter()
            for x, y, t in zip(xs, ys, ts, strict=True):
                lr.observe_time(float(t))
                lr.learn(x, float(y))
                lr.take_update()
            best[name] = min(best[name], 1e6 * (time.perf_counter() - t0) / ys.size)
    return best


def _git() -> str:
    try:
        return subprocess.run(["git", "-C", str(REPO), "log", "-1", "--format=%h (\"%s\")"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def markdown(results: list[dict[str, Any]], args: argparse.Namespace, wall: float) -> str:
    table: dict[str, dict[str, dict[str, float]]] = {}
    for r in results:
        if "stations" in r:
            table[r["model"]] = r["stations"]
        else:
            table.setdefault(r["model"], {})[r["station"]] = r["scores"]
    models = [m for m in [*args.streamfed_names, "River KNN", "River ARF"] if m in table]
    stations = list(next(iter(table.values())).keys())
    river = [m for m in ("River KNN", "River ARF") if m in table]
    lines = ["# Streams drift: federated defaults with and without forgetting, against River's KNN and ARF", "",
             f"Command: `PYTHONPATH=$PWD OPENBLAS_NUM_THREADS=1 .venv/bin/python benchmarks/bench_drift.py "
             f"{' '.join(sys.argv[1:])}` ({wall:.0f} s wall, {args.jobs} worker(s)). Code: {_git()}. Machine: "
             f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; load average at the "
             f"end {', '.join(f'{x:.2f}' for x in os.getloadavg())}.", "",
             "Protocol: benchmarks/bench_drift.py's docstring. MAE and RMSE in raw units (CO, µg/m³), every sample "
             "scored before it is learned; coverage: share inside the central 95% predictive interval.", "",
             "## Mean over the stations", "", "| model | MAE | RMSE | 95% coverage | stations with MAE below River's "
             "best | stations with coverage in [0.90, 0.98] |", "|---|---|---|---|---|---|"]
    best_river = {st: min(table[m][st]["mae"] for m in river) for st in stations} if river else {}
    for m in models:
        rows = [table[m][st] for st in stations]
        cov = [r.get("coverage") for r in rows]
        cov_s = f"{np.mean([c for c in cov if c is not None]):.3f}" if all(c is not None for c in cov) else "—"
        wins = f"{sum(table[m][st]['mae'] < best_river[st] for st in stations)}/{len(stations)}" if river else "—"
        band = (f"{sum(BAND[0] <= c <= BAND[1] for c in cov)}/{len(stations)}"
                if all(c is not None for c in cov) else "—")
        lines.append(f"| {m} | {np.mean([r['mae'] for r in rows]):.1f} | {np.mean([r['rmse'] for r in rows]):.1f} "
                     f"| {cov_s} | {wins if m not in river else '—'} | {band} |")
    lines += ["", "## MAE per station", "", "| station | " + " | ".join(models) + " |",
              "|---|" + "---|" * len(models)]
    for st in stations:
        lines.append(f"| {st} | " + " | ".join(f"{table[m][st]['mae']:.1f}" for m in models) + " |")
    lines += ["", "## 95% coverage per station (Bayesian models)", "",
              "| station | " + " | ".join(m for m in models if m not in river) + " |",
              "|---|" + "---|" * len([m for m in models if m not in river])]
    for st in stations:
        lines.append(f"| {st} | " + " | ".join(f"{table[m][st].get('coverage', float('nan')):.3f}"
                                               for m in models if m not in river) + " |")
    secs = {r["model"]: r["seconds"] for r in results if "stations" in r}
    for r in results:
        if "station" in r:
            secs[r["model"]] = secs.get(r["model"], 0.0) + r["seconds"]
    lines += ["", "Seconds (one process each; River summed over the stations): " +
              ", ".join(f"{m} {s:.0f}" for m, s in secs.items()), ""]
    per = {r["model"]: 1e3 * r["seconds"] / r["samples"] for r in results if r.get("samples")}
    if per:
        lines += ["Milliseconds per sample (a whole federated replay's wall time over its samples, each model alone "
                  "in its process): " + ", ".join(f"{m} {v:.2f}" for m, v in per.items()), ""]
    for r in results:
        if "weights" in r:
            w = r["weights"]
            lines += [f"{r['model']}: mixture weights at station 0, mean over the replay's checkpoints " +
                      ", ".join(f"{n} {v:.3f}" for n, v in zip(w["names"], w["mean"], strict=True)) +
                      "; at the end " + ", ".join(f"{n} {v:.3f}" for n, v in zip(w["names"], w["last"], strict=True)),
                      ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=None, help="cut every stream (default: whole streams)")
    ap.add_argument("--half-lives", default="24,168", help="FedBNR half-lives in hours (comma-separated; '' none)")
    ap.add_argument("--mixture", default="",
                    help="fedbnr-halflives' half-lives in hours, 'none' for no forgetting (e.g. none,168,24; several "
                         "dictionaries separated by ';'; '' skip)")
    ap.add_argument("--no-default", action="store_true", help="leave out FedBNR without forgetting")
    ap.add_argument("--stations", type=int, default=STATIONS, help="run N stations only")
    ap.add_argument("--first-station", type=int, default=0, help="... from this one (0: Aotizhongxin)")
    ap.add_argument("--cost-only", action="store_true",
                    help="only time one agent's learner per sample (FedBNR, FedBNR h=24, the --mixture dictionary)")
    ap.add_argument("--no-river", action="store_true")
    ap.add_argument("--no-fsgp", action="store_true")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "drift.md")
    args = ap.parse_args()
    if args.cost_only:
        first = args.mixture.split(";")[0] or "none,168,24"
        mix = [None if v.strip() == "none" else float(v) * 3600.0 for v in first.split(",") if v.strip()]
        cost = agent_cost(args.steps or 2000, mix)
        print(f"µs per sample, one agent's learner alone (station 0, mixture {first}, best of 3; load average "
              f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}): " +
              ", ".join(f"{m} {v:.0f}" for m, v in cost.items()))
        return
    jobs: list[tuple[Any, ...]] = [] if args.no_default else [("sf", "fedbnr", "fedbnr", {})]
    for h in [float(v) for v in args.half_lives.split(",") if v.strip()]:
        jobs.append(("sf", f"fedbnr h={h:g}", "fedbnr", {"half_life_s": h * 3600.0}))
    for group in args.mixture.split(";"):
        mix = [v.strip() for v in group.split(",") if v.strip()]
        if mix:
            jobs.append(("sf", f"fedbnr mix({','.join(mix)})", "fedbnr-halflives",
                         {"half_lives_s": [None if v == "none" else float(v) * 3600.0 for v in mix]}))
    if not args.no_fsgp:
        jobs.append(("sf", "fsgp", "fsgp", {}))
    args.streamfed_names = [j[1] for j in jobs]
    if not args.no_river:
        jobs += [("river", m, c) for m in ("River KNN", "River ARF") for c in range(args.stations)]
    t0 = time.perf_counter()
    results = []
    with ProcessPoolExecutor(args.jobs) as pool:
        where = (args.steps, args.stations, args.first_station)
        futs = [pool.submit(run_streamfed, j[1], j[2], j[3], *where) if j[0] == "sf"
                else pool.submit(run_river, j[1], j[2], *where) for j in jobs]
        for f in as_completed(futs):
            r = f.result()
            results.append(r)
            print(r["model"], r.get("station", ""), f"{r['seconds']:.0f} s", flush=True)
    wall = time.perf_counter() - t0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(markdown(results, args, wall))
    args.out.with_suffix(".json").write_text(json.dumps(results, indent=1))
    print(args.out.read_text())


if __name__ == "__main__":
    main()
