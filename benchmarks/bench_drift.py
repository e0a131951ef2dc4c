"""Streams drift: the federated defaults, with and without forgetting, against River's KNN and ARF on whole
Beijing streams (issue 32's first figure).

    PYTHONPATH=$PWD OPENBLAS_NUM_THREADS=1 nice -n 15 .venv/bin/python benchmarks/bench_drift.py --seeds 0,1,2 \
        --half-lives 24 --fsgp-half-lives 12,24 --jobs 2 --out benchmarks/results/drift_whole.md   # whole streams
    PYTHONPATH=$PWD OPENBLAS_NUM_THREADS=1 .venv/bin/python benchmarks/bench_drift.py --steps 2000 --out /tmp/d.md

Not a test: the figures go to `benchmarks/results/drift*.{md,json}` (a run writes `<out>.partial.json` as its
jobs finish, seed by seed; `--render` writes the markdown of one).

Data: the 12 Beijing stations, target CO from the 10 other pollutant and weather columns, every station's valid
rows in time order (`load_beijing(split="station")`; `--steps` keeps each station's first rows). streamfed's
learners see `online` normalisation (each station standardises inputs and target with its own past only: causal)
and their predictions are mapped back to raw units (`ClientStream.to_original`; variances times the target's
scale squared); River's models see the *same rows* in raw units (aligned by their row in the station's file,
`ClientStream.row`) in the River recipe, `preprocessing.StandardScaler() | model`. Scored on every sample
(prequential: predict, then learn), in raw units (µg/m³ of CO): MAE, RMSE and, for the Bayesian models, the share
of samples inside the central 95% predictive interval.

The fleet: the 12 stations replayed together (`streamfed.evaluation.replay`, the objects the live fleet runs),
aligned on the rows' times (`replay(align_times=True)`: a step is one hour of the fleet, a station takes a sample
when it has a row then) — stations skip different hours (missing values), so step `t` as every station's `t`-th
row would put them up to 128 days apart within a year, each learning from the others' future. The aggregator
closes a window of uploads once a day of readings and every agent installs the new global at once (schedule
`async:24:0`); between globals each agent learns from its own samples. `--unaligned` (with `--schedule step`)
is the protocol of the earlier runs (benchmarks/results/drift.md).

Models:

* `fedbnr` — the federated FedBNR replay on its defaults (`AlgorithmConfig()`: 16 Gaussian kernels, D = 100),
  `fedbnr h=<hours>` the same with `half_life_s` (forgetting on the rows' times, docs/algorithms.md §4.14);
* `fedbnr mix(<hours>)` — `fedbnr-halflives` (docs/algorithms.md §4.15): one FedBNR fleet per half-life of the
  list (`none`: no forgetting; `default`: its defaults), every agent predicting with the fixed-share mixture of
  their predictives (`--mixture`; its weights at station 0 are reported);
* `fsgp`, `fsgp h=<hours>` — the federated FSGP replay on its defaults, and with `half_life_s`;
* `River KNN` — `preprocessing.StandardScaler() | neighbors.KNNRegressor()` (deterministic: one run);
* `River ARF` — `preprocessing.StandardScaler() | forest.ARFRegressor(seed=<seed>)`.

Seeds (`--seeds`): the replay's seed (random features, FSGP's inducing inputs) and ARF's.
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
                  stations: int = STATIONS, first: int = 0, seed: int = 0, align: bool = True,
                  schedule: str = "async:24:0") -> dict[str, Any]:
    from streamfed.evaluation.replay import AlgorithmConfig, Schedule, replay

    online, _ = _fleets(steps, stations, first)
    t0 = time.perf_counter()
    res = replay(online, alg, AlgorithmConfig(params={alg: params} if params else None), seed=seed,
                 align_times=align, schedule=Schedule.parse(schedule))
    wall = time.perf_counter() - t0
    stations = {}
    for c, s in enumerate(online.streams):
        m, v = np.asarray(res.means[c]), np.asarray(res.variances[c])
        ok = np.isfinite(m)
        y = s.to_original(s.y)[ok]
        mean = s.to_original(m)[ok]
        var = (v * np.asarray(s.y_scale) ** 2)[ok] if np.isfinite(v).any() else None
        stations[s.name] = _scores(y, mean, var) | {"rejected": int((~ok).sum()),
                                                   "rejected_steps": int(res.rejected[c])}
    out = {"model": name, "seed": seed, "stations": stations, "seconds": wall,
           "samples": int(sum(np.isfinite(np.asarray(m)).sum() for m in res.means))}
    if alg == "fedbnr-halflives":  # the mixture's weights at station 0, at the replay's checkpoints
        out["weights"] = {"names": list(res.kernel_names), "mean": np.mean(res.weights, axis=0).tolist(),
                          "last": res.weights[-1].tolist()}
    return out


def run_river(name: str, station: int, steps: int | None, stations: int = STATIONS, first: int = 0,
              seed: int = 0) -> dict[str, Any]:
    from river import forest, neighbors, preprocessing

    online, raw = _fleets(steps, stations, first)
    s, r = online.streams[station], raw.streams[station]
    pos = {int(row): i for i, row in enumerate(np.asarray(r.row))}
    idx = np.array([pos[int(row)] for row in np.asarray(s.row)])
    X, y = np.asarray(r.X)[idx], np.asarray(r.y)[idx]
    keys = list(r.feature_names)
    model = (preprocessing.StandardScaler() | (neighbors.KNNRegressor() if name == "River KNN"
                                                else forest.ARFRegressor(seed=seed)))
    pred = np.empty(y.size)
    t0 = time.perf_counter()
    for i in range(y.size):
        x = dict(zip(keys, X[i].tolist(), strict=True))
        pred[i] = float(model.predict_one(x) or 0.0)
        model.learn_one(x, float(y[i]))
    y_check = s.to_original(s.y)
    if not np.allclose(y, y_check, rtol=1e-9, atol=1e-6):
        raise RuntimeError(f"{s.name}: the raw rows do not match the normalised stream's targets")
    return {"model": name, "seed": seed, "station": s.name, "scores": _scores(y, pred, None),
            "seconds": time.perf_counter() - t0, "samples": int(y.size)}


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


def _by_model(results: list[dict[str, Any]]) -> dict[str, dict[int, dict[str, dict[str, float]]]]:
    """model -> seed -> station -> scores."""
    table: dict[str, dict[int, dict[str, dict[str, float]]]] = {}
    for r in results:
        per = table.setdefault(r["model"], {}).setdefault(int(r.get("seed", 0)), {})
        if "stations" in r:
            per.update(r["stations"])
        else:
            per[r["station"]] = r["scores"]
    return table


def summary(results: list[dict[str, Any]], river: tuple[str, ...] = ("River KNN", "River ARF")
            ) -> dict[str, Any]:
    """Per model: every station's scores averaged over the seeds, the counts of stations whose seed-mean MAE is
    below River's best (the lower seed-mean MAE of KNN and ARF at that station) — also seed by seed, each seed
    against River's same-seed runs (KNN is deterministic: its one run serves every seed) — and the coverage's
    range over stations and seeds."""
    table = _by_model(results)
    models = list(table)
    stations = list(next(iter(next(iter(table.values())).values())).keys())
    seeds = sorted({s for m in table.values() for s in m})

    def mean_over_seeds(m: str, st: str, key: str) -> float | None:
        vals = [table[m][s][st].get(key) for s in table[m]]
        return None if any(v is None for v in vals) else float(np.mean(vals))

    rows: dict[str, Any] = {}
    for m in models:
        rows[m] = {st: {k: mean_over_seeds(m, st, k) for k in ("mae", "rmse", "coverage")} for st in stations}
        rows[m] = {st: {k: v for k, v in d.items() if v is not None} for st, d in rows[m].items()}
    present = [m for m in river if m in table]
    out: dict[str, Any] = {"stations": stations, "seeds": seeds, "models": {}}
    best = {st: min(rows[m][st]["mae"] for m in present) for st in stations} if present else {}

    def river_best_seed(st: str, seed: int) -> float:
        return min(table[m].get(seed, table[m][min(table[m])])[st]["mae"] for m in present)

    for m in models:
        cov = [table[m][s][st].get("coverage") for s in table[m] for st in stations]
        d: dict[str, Any] = {
            "per_station": rows[m],
            "mae": float(np.mean([rows[m][st]["mae"] for st in stations])),
            "rmse": float(np.mean([rows[m][st]["rmse"] for st in stations])),
            "seeds": sorted(table[m]),
        }
        if all(c is not None for c in cov):
            d["coverage"] = float(np.mean(cov))
            d["coverage_range"] = [float(np.min(cov)), float(np.max(cov))]
            d["coverage_in_band"] = int(sum(BAND[0] <= rows[m][st]["coverage"] <= BAND[1] for st in stations))
        if present and m not in present:
            d["wins_vs_river_best"] = int(sum(rows[m][st]["mae"] < best[st] for st in stations))
            d["wins_by_seed"] = {str(s): int(sum(table[m][s][st]["mae"] < river_best_seed(st, s) for st in stations))
                                 for s in sorted(table[m])}
        out["models"][m] = d
    out["river_best"] = best
    return out


def costs(results: list[dict[str, Any]]) -> dict[str, float]:
    """Milliseconds per sample of each model: a federated replay's wall time over every station's samples (the
    aggregator's work included), River's per-station runs summed; mean over the seeds' runs."""
    secs: dict[str, float] = {}
    samples: dict[str, int] = {}
    for r in results:
        secs[r["model"]] = secs.get(r["model"], 0.0) + r["seconds"]
        samples[r["model"]] = samples.get(r["model"], 0) + int(r.get("samples", 0))
    return {m: 1e3 * secs[m] / samples[m] for m in secs if samples[m]}


def markdown(results: list[dict[str, Any]], args: argparse.Namespace, wall: float) -> str:
    summ = summary(results)
    stations, models = summ["stations"], [m for m in [*args.streamfed_names, "River KNN", "River ARF"]
                                          if m in summ["models"]]
    river = [m for m in ("River KNN", "River ARF") if m in summ["models"]]
    ours = [m for m in models if m not in river]
    M = summ["models"]
    n_rows = {st: max(int(r["stations"][st]["n"]) for r in results if "stations" in r) for st in stations} \
        if any("stations" in r for r in results) else {}
    lines = ["# Streams drift: federated defaults with and without forgetting, against River's KNN and ARF", "",
             f"Command: `PYTHONPATH=$PWD OPENBLAS_NUM_THREADS=1 nice -n {os.nice(0)} .venv/bin/python "
             "benchmarks/bench_drift.py "
             f"{' '.join(sys.argv[1:])}` ({wall:.0f} s wall, {args.jobs} worker(s)). Code: {_git()}. Machine: "
             f"{platform.machine()}, {os.cpu_count()} cores (shared with other jobs), Python "
             f"{platform.python_version()}; load average at the end "
             f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}.", "",
             "Protocol: benchmarks/bench_drift.py's docstring. MAE and RMSE in raw units (CO, µg/m³), every sample "
             "scored before it is learned; coverage: share inside the central 95% predictive interval. Seeds "
             f"{', '.join(map(str, summ['seeds']))} (the replay's seed: random features; ARF's seed; KNN is "
             "deterministic, one run). Every figure per station is the mean over the seeds; \"River's best\" at a "
             "station is the lower of KNN's and ARF's seed-mean MAE there.", ""]
    if n_rows:
        lines += ["Samples per station: " + ", ".join(f"{st} {n}" for st, n in n_rows.items()), ""]
    lines += ["## Mean over the stations", "",
              "| model | MAE | RMSE | 95% coverage (range over stations × seeds) | stations with MAE below River's "
              "best (mean over seeds; per seed) | stations with coverage in [0.90, 0.98] | ms per sample |",
              "|---|---|---|---|---|---|---|"]
    per = costs(results)
    for m in models:
        d = M[m]
        cov = (f"{d['coverage']:.3f} ({d['coverage_range'][0]:.3f}–{d['coverage_range'][1]:.3f})"
               if "coverage" in d else "—")
        wins = (f"{d['wins_vs_river_best']}/{len(stations)} ({', '.join(map(str, d['wins_by_seed'].values()))})"
                if "wins_vs_river_best" in d else "—")
        band = f"{d['coverage_in_band']}/{len(stations)}" if "coverage_in_band" in d else "—"
        ms = per.get(m, float("nan"))
        lines.append(f"| {m} | {d['mae']:.1f} | {d['rmse']:.1f} | {cov} | {wins} | {band} | {ms:.2f} |")
    for title, key, fmt in (("MAE per station (mean over seeds)", "mae", ".1f"),
                            ("RMSE per station (mean over seeds)", "rmse", ".1f")):
        lines += ["", f"## {title}", "", "| station | " + " | ".join(models) + " | River's best |",
                  "|---|" + "---|" * (len(models) + 1)]
        for st in stations:
            best = min(M[m]["per_station"][st][key] for m in river) if river else float("nan")
            lines.append(f"| {st} | " + " | ".join(f"{M[m]['per_station'][st][key]:{fmt}}" for m in models)
                         + f" | {best:{fmt}} |")
    bayes = [m for m in ours if "coverage" in M[m]]
    lines += ["", "## 95% coverage per station (mean over seeds)", "", "| station | " + " | ".join(bayes) + " |",
              "|---|" + "---|" * len(bayes)]
    for st in stations:
        lines.append(f"| {st} | " + " | ".join(f"{M[m]['per_station'][st]['coverage']:.3f}" for m in bayes) + " |")
    lines += ["", "Milliseconds per sample: a federated replay's wall time over all its stations' samples (each "
              "replay one process; the aggregator's work and every global included), River's per-station runs "
              f"summed; mean over the seeds' runs, at niceness {os.nice(0)} with {args.jobs} worker(s) on a shared "
              "machine (ratios within this run are what counts).", ""]
    for r in results:
        if "weights" in r:
            w = r["weights"]
            lines += [f"{r['model']} (seed {r.get('seed', 0)}): mixture weights at station 0, mean over the replay's "
                      "checkpoints " + ", ".join(f"{n} {v:.3f}" for n, v in zip(w["names"], w["mean"], strict=True)) +
                      "; at the end " + ", ".join(f"{n} {v:.3f}" for n, v in zip(w["names"], w["last"], strict=True)),
                      ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=None, help="cut every stream (default: whole streams)")
    ap.add_argument("--seeds", default="0", help="replay / ARF seeds, comma-separated (e.g. 0,1,2)")
    ap.add_argument("--half-lives", default="24,168", help="FedBNR half-lives in hours (comma-separated; '' none)")
    ap.add_argument("--fsgp-half-lives", default="", help="FSGP half-lives in hours (comma-separated; '' none)")
    ap.add_argument("--mixture", default="",
                    help="fedbnr-halflives' half-lives in hours, 'none' for no forgetting (e.g. none,168,24; several "
                         "dictionaries separated by ';'; 'default': its defaults; '' skip)")
    ap.add_argument("--mixture-seeds", default=None, help="seeds for the mixture (default: --seeds)")
    ap.add_argument("--no-default", action="store_true", help="leave out FedBNR without forgetting")
    ap.add_argument("--stations", type=int, default=STATIONS, help="run N stations only")
    ap.add_argument("--first-station", type=int, default=0, help="... from this one (0: Aotizhongxin)")
    ap.add_argument("--cost-only", action="store_true",
                    help="only time one agent's learner per sample (FedBNR, FedBNR h=24, the --mixture dictionary)")
    ap.add_argument("--unaligned", action="store_true",
                    help="replay step t as every station's t-th row (the protocol before: stations drift apart in "
                         "time); default: aligned on the rows' times (replay(align_times=True))")
    ap.add_argument("--schedule", default=None,
                    help="the replay's schedule (default: async:24:0 aligned — the aggregator closes a window and "
                         "every agent installs the global once a day of readings; step unaligned)")
    ap.add_argument("--no-river", action="store_true")
    ap.add_argument("--no-arf", action="store_true")
    ap.add_argument("--no-fsgp", action="store_true")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--render", type=Path, default=None,
                    help="only write the markdown from a results JSON (a finished or a .partial.json run)")
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
    seeds = [int(v) for v in args.seeds.split(",") if v.strip()]
    mix_seeds = seeds if args.mixture_seeds is None else [int(v) for v in args.mixture_seeds.split(",") if v.strip()]
    # the most expensive first, so the pool's workers end together
    sf: list[tuple[Any, ...]] = []
    for group in args.mixture.split(";"):
        mix = [v.strip() for v in group.split(",") if v.strip()]
        if mix == ["default"]:
            sf += [("sf", "fedbnr mix(default)", "fedbnr-halflives", {}, s) for s in mix_seeds]
        elif mix:
            sf += [("sf", f"fedbnr mix({','.join(mix)})", "fedbnr-halflives",
                    {"half_lives_s": [None if v == "none" else float(v) * 3600.0 for v in mix]}, s)
                   for s in mix_seeds]
    for h in [float(v) for v in args.half_lives.split(",") if v.strip()]:
        sf += [("sf", f"fedbnr h={h:g}", "fedbnr", {"half_life_s": h * 3600.0}, s) for s in seeds]
    if not args.no_default:
        sf += [("sf", "fedbnr", "fedbnr", {}, s) for s in seeds]
    if not args.no_fsgp:
        sf += [("sf", "fsgp", "fsgp", {}, s) for s in seeds]
        for h in [float(v) for v in args.fsgp_half_lives.split(",") if v.strip()]:
            sf += [("sf", f"fsgp h={h:g}", "fsgp", {"half_life_s": h * 3600.0}, s) for s in seeds]
    names = []
    for j in sf:
        if j[1] not in names:
            names.append(j[1])
    args.streamfed_names = names
    # seed by seed (a run stopped early leaves whole seeds), the most expensive first within a seed
    jobs: list[tuple[Any, ...]] = []
    for seed in sorted({j[4] for j in sf} | set(seeds)):
        mine = [j for j in sf if j[4] == seed]
        jobs += mine[:1]
        if not args.no_river and not args.no_arf and seed in seeds:
            jobs += [("river", "River ARF", c, seed) for c in range(args.stations)]
        jobs += mine[1:]
    if not args.no_river:  # KNN is deterministic: one run per station serves every seed
        jobs += [("river", "River KNN", c, seeds[0]) for c in range(args.stations)]
    if args.render:
        results = json.loads(args.render.read_text())
        results = results["runs"] if isinstance(results, dict) else results
        args.out.write_text(markdown(results, args, float("nan")))
        print(args.out.read_text())
        return
    sched = args.schedule or ("step" if args.unaligned else "async:24:0")
    t0 = time.perf_counter()
    results = []
    with ProcessPoolExecutor(args.jobs) as pool:
        where = (args.steps, args.stations, args.first_station)
        futs = [pool.submit(run_streamfed, j[1], j[2], j[3], *where, j[4], not args.unaligned, sched)
                if j[0] == "sf"
                else pool.submit(run_river, j[1], j[2], *where, j[3]) for j in jobs]
        for f in as_completed(futs):
            r = f.result()
            results.append(r)
            print(r["model"], r.get("seed", ""), r.get("station", ""), f"{r['seconds']:.0f} s", flush=True)
            # partial results as they come: a long run stopped early still leaves its figures
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.with_suffix(".partial.json").write_text(json.dumps(results, indent=1))
    wall = time.perf_counter() - t0
    args.out.write_text(markdown(results, args, wall))
    args.out.with_suffix(".json").write_text(json.dumps({"argv": sys.argv[1:], "wall_s": wall,
                                                         "load_average": os.getloadavg(),
                                                         "summary": summary(results), "ms_per_sample": costs(results),
                                                         "runs": results}, indent=1))
    args.out.with_suffix(".partial.json").unlink(missing_ok=True)
    print(args.out.read_text())


if __name__ == "__main__":
    main()
