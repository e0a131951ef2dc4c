"""A user's own stream: progressive validation (predict, then learn) of streamfed's estimators on their defaults.

    .venv/bin/python benchmarks/bench_progressive.py --out benchmarks/results/progressive.md
    .venv/bin/python benchmarks/bench_progressive.py --quick          # smoke run (short slices), writes to /tmp

Every registered algorithm whose `streamfed.algorithms.get(name).estimator()` works (a River regressor, a fleet of
one) runs **on its defaults** — no scaler in front, no parameter given — on River's bundled streams and on the
Beijing stations read through streamfed's CSV path, next to River's own regressors in the recipe a River user
would write:

* `LinearRegression`: `preprocessing.TargetStandardScaler(regressor=preprocessing.StandardScaler() |
  linear_model.LinearRegression())` — the time reference (1.00×); also without the target scaler
  (`preprocessing.StandardScaler() | linear_model.LinearRegression()`);
* `preprocessing.StandardScaler() | neighbors.KNNRegressor()`;
* `preprocessing.StandardScaler() | tree.HoeffdingAdaptiveTreeRegressor(seed=0)`;
* `preprocessing.StandardScaler() | forest.ARFRegressor(seed=0)`;
* the running mean, `dummy.StatisticRegressor(stats.Mean())`.

Streams: `datasets.TrumpApproval()` (1,001 samples), `datasets.ChickWeights()` (578),
`datasets.synth.Friedman(seed=s).take(--friedman-n)` for each of `--seeds`, and Beijing: for each of `--stations`,
its vendored file `streamfed/data/beijing-air/PRSA_Data_<station>_20130301-20170228.csv.gz` read by
`streamfed.evaluation.datasets.csv_fleet(path, "CO", features=BEIJING_INPUTS, normalisation="none",
max_rows=--beijing-rows)` — the project's task (target CO from the 10 other pollutant and weather columns), raw
values, the first `--beijing-rows` rows of the file (rows with a missing value skipped, as the CSV path does),
each station its own stream.

Protocol, per stream and model (a fresh model each stream; models one after another, in one process): for each
sample `predict_one(x)` then `learn_one(x, y)`. A model whose `predict_one` takes `with_dist` (FedBNR) is asked
for its predictive distribution; its point prediction is the mean and the sample is covered when
`|y − μ| ≤ 1.96 σ`. MAE and RMSE over every sample of the stream (the first prediction, before any learning,
included). Diverged: any non-finite prediction, or an exception in `predict_one` / `learn_one` / the
constructor — the exception is recorded with its message and the model stops on that stream (the benchmark goes
on). Time per sample: `predict_one` + `learn_one`, timed around each call pair with `perf_counter_ns`, summed over
the dataset's streams and given as a ratio to the LinearRegression recipe's sum in the same run (before the
measured runs, each model runs once, untimed and unscored, on the first `--warmup` samples of the first stream:
JIT compilation and caches stay out of the times). "≤ running
mean": the model's MAE **and** RMSE are at most the running mean's on that stream.
"""

from __future__ import annotations

import os

# Small matrices: one BLAS thread is several times faster than two fighting over 2 cores. Set before numpy loads.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import argparse  # noqa: E402
import inspect  # noqa: E402
import math  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from importlib import resources  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import river  # noqa: E402
from river import datasets, dummy, forest, linear_model, neighbors, preprocessing, stats, tree  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from streamfed import algorithms  # noqa: E402
from streamfed.core import compiled  # noqa: E402
from streamfed.evaluation.bench import load_average, machine, write_section  # noqa: E402
from streamfed.evaluation.datasets import csv_fleet  # noqa: E402
from streamfed.evaluation.datasets.beijing import BEIJING_INPUTS, BEIJING_STATIONS, station_file  # noqa: E402

Z95 = 1.959963984540054  # two-sided 95% normal quantile
MEAN = "running mean"
REFERENCE = "River LinearRegression"
clock = time.perf_counter_ns


# ----------------------------------------------------------------------------- models
@dataclass(frozen=True)
class Model:
    """A model of the comparison: its row label, who makes it, the exact recipe (for the docs) and a factory."""

    label: str
    source: str  # "streamfed" or "river"
    recipe: str
    make: Callable[[], Any]


def river_models() -> list[Model]:
    def scaled(model: Callable[[], Any]) -> Callable[[], Any]:
        return lambda: preprocessing.StandardScaler() | model()

    return [
        Model(REFERENCE, "river", "preprocessing.TargetStandardScaler(regressor=preprocessing.StandardScaler() | "
              "linear_model.LinearRegression())",
              lambda: preprocessing.TargetStandardScaler(
                  regressor=preprocessing.StandardScaler() | linear_model.LinearRegression())),
        Model("River LinearRegression, no target scaler", "river",
              "preprocessing.StandardScaler() | linear_model.LinearRegression()",
              scaled(linear_model.LinearRegression)),
        Model("River KNNRegressor", "river", "preprocessing.StandardScaler() | neighbors.KNNRegressor()",
              scaled(neighbors.KNNRegressor)),
        Model("River HoeffdingAdaptiveTreeRegressor", "river",
              "preprocessing.StandardScaler() | tree.HoeffdingAdaptiveTreeRegressor(seed=0)",
              scaled(lambda: tree.HoeffdingAdaptiveTreeRegressor(seed=0))),
        Model("River ARFRegressor", "river", "preprocessing.StandardScaler() | forest.ARFRegressor(seed=0)",
              scaled(lambda: forest.ARFRegressor(seed=0))),
        Model(MEAN, "river", "dummy.StatisticRegressor(stats.Mean())", lambda: dummy.StatisticRegressor(stats.Mean())),
    ]


def streamfed_models() -> tuple[list[Model], dict[str, str]]:
    """Every registered algorithm whose `estimator()` works, on its defaults; the others with the reason."""
    models, skipped = [], {}
    for name in algorithms.names():
        try:
            alg = algorithms.get(name)
        except Exception as e:  # noqa: BLE001 — a registered family that does not import is a finding too
            skipped[name] = f"algorithms.get() raised {type(e).__name__}: {e}"
            continue
        if alg.task != "regression":
            skipped[name] = f"a {alg.task} algorithm (these streams are regression)"
            continue
        try:
            est = alg.estimator()
        except NotImplementedError:
            skipped[name] = "no River estimator (estimator() raises NotImplementedError)"
            continue
        except Exception as e:  # noqa: BLE001 — a broken estimator is a finding, not a crash
            skipped[name] = f"estimator() raised {type(e).__name__}: {e}"
            continue
        models.append(Model(f"streamfed {name}", "streamfed",
                            f"streamfed.algorithms.get({name!r}).estimator()  # {type(est).__name__}, defaults",
                            lambda alg=alg: alg.estimator()))
    return models, skipped


def takes_dist(model: Any) -> bool:
    """Whether `model.predict_one` accepts `with_dist` (a predictive distribution)."""
    try:
        return "with_dist" in inspect.signature(model.predict_one).parameters
    except (TypeError, ValueError):
        return False


# ----------------------------------------------------------------------------- one model on one stream
def progressive(make: Callable[[], Any], xs: Sequence[dict], ys: Sequence[float]) -> dict[str, Any]:
    """Predict, then learn, on every sample; metrics, coverage (when the model gives a distribution), divergence
    and time. Never raises for the model's sake: an exception is recorded (`error`) and the stream stops there."""
    n = len(ys)
    out: dict[str, Any] = {"n": n, "seen": 0, "mae": None, "rmse": None, "coverage": None, "diverged": False,
                           "nonfinite": 0, "first_nonfinite": None, "error": None, "error_at": None,
                           "time_ns": 0, "us_per_sample": None, "max_abs_error": None}
    try:
        model = make()
    except Exception as e:  # noqa: BLE001
        out.update(diverged=True, error=f"constructor: {type(e).__name__}: {e}", error_at=0)
        return out
    dist = takes_dist(model)
    abs_sum = sq_sum = 0.0
    max_err = 0.0
    covered = 0
    total = 0
    for i in range(n):
        x, y = xs[i], ys[i]
        stage = "predict_one"
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # overflow in a baseline shows up as non-finite
                t0 = clock()
                if dist:
                    g = model.predict_one(x, with_dist=True)
                    pred, sd = float(g.mu), float(g.sigma)
                else:
                    pred, sd = float(model.predict_one(x)), None
                stage = "learn_one"
                model.learn_one(x, y)
                total += clock() - t0
        except Exception as e:  # noqa: BLE001
            out.update(diverged=True, error=f"{stage}: {type(e).__name__}: {e}", error_at=i)
            break
        out["seen"] = i + 1
        if not math.isfinite(pred) or (sd is not None and not math.isfinite(sd)):
            out["nonfinite"] += 1
            if out["first_nonfinite"] is None:
                out["first_nonfinite"] = i
            continue
        err = abs(y - pred)
        abs_sum += err
        sq_sum += err * err
        if i:  # the first prediction precedes any learning (0 for every model here): not a blow-up
            max_err = max(max_err, err)
        if sd is not None and err <= Z95 * sd:
            covered += 1
    out["time_ns"] = total
    try:  # a POF-MKL estimator counts the kernels whose loss overflowed (taken at weight ~0, not a NaN out)
        overflows = model.client.kernel_overflows
        out["kernel_overflows"] = int(overflows)
    except Exception:  # noqa: BLE001 — any model without that counter
        pass
    if out["seen"]:
        out["us_per_sample"] = total / out["seen"] / 1e3
    if out["nonfinite"]:
        out["diverged"] = True
    if not out["diverged"]:
        out["mae"], out["rmse"], out["max_abs_error"] = abs_sum / n, math.sqrt(sq_sum / n), max_err
        if dist:
            out["coverage"] = covered / n
    return out


# ----------------------------------------------------------------------------- the streams
@dataclass(frozen=True)
class Stream:
    dataset: str
    name: str
    xs: list[dict]
    ys: list[float]
    note: str = ""


def river_stream(dataset: str, name: str, ds: Any, limit: int | None) -> Stream:
    xs, ys = [], []
    for x, y in ds:
        if limit is not None and len(ys) >= limit:
            break
        xs.append(dict(x))
        ys.append(float(y))
    return Stream(dataset, name, xs, ys)


def beijing_path(station: str) -> Path:
    return Path(str(resources.files("streamfed").joinpath("data", "beijing-air", station_file(station))))


def beijing_stream(station: str, rows: int, limit: int | None) -> Stream:
    fleet = csv_fleet(beijing_path(station), "CO", features=BEIJING_INPUTS, normalisation="none", max_rows=rows)
    s = fleet[0]
    n = len(s.y) if limit is None else min(len(s.y), limit)
    names = list(fleet.feature_names)
    xs = [{k: float(v) for k, v in zip(names, row, strict=True)} for row in s.X[:n]]
    return Stream("Beijing (CSV path)", station, xs, [float(v) for v in s.y[:n]],
                  note=f"{rows} rows read, {len(s.y)} samples, {s.skipped} skipped (missing value)")


def all_streams(args: argparse.Namespace) -> list[Stream]:
    lim = args.limit
    out = [river_stream("TrumpApproval", "TrumpApproval", datasets.TrumpApproval(), lim),
           river_stream("ChickWeights", "ChickWeights", datasets.ChickWeights(), lim)]
    n = args.friedman_n if lim is None else min(args.friedman_n, lim)
    out += [river_stream("Friedman", f"seed {s}", datasets.synth.Friedman(seed=s).take(n), None) for s in args.seeds]
    out += [beijing_stream(st, args.beijing_rows, lim) for st in args.stations]
    return out


# ----------------------------------------------------------------------------- the tables
def fmt(v: float | None, digits: int = 4) -> str:
    if v is None:
        return "—"
    if v == 0 or 1e-3 <= abs(v) < 1e5:
        return f"{v:.{digits}g}"
    return f"{v:.3g}"


def beats_mean(r: dict, m: dict) -> str | None:
    """'yes', or what is worse than the running mean ('MAE', 'RMSE', 'MAE, RMSE'); None when not comparable."""
    if r["diverged"] or m["diverged"] or r["mae"] is None or m["mae"] is None:
        return None
    worse = [k.upper() for k in ("mae", "rmse") if r[k] > m[k]]
    return "yes" if not worse else ", ".join(worse)


def summarise(dataset: str, runs: list[dict], labels: list[str]) -> list[dict]:
    """One row per model over the dataset's streams: mean (± std) metrics, divergences, ≤ mean, time ratio."""
    streams = list(dict.fromkeys(r["stream"] for r in runs))
    by = {(r["stream"], r["model"]): r for r in runs}
    ref_ns = sum(by[(s, REFERENCE)]["time_ns"] for s in streams)
    ref_seen = sum(by[(s, REFERENCE)]["seen"] for s in streams)
    rows = []
    for lab in labels:
        rs = [by[(s, lab)] for s in streams]
        ok = [r for r in rs if not r["diverged"]]
        row: dict[str, Any] = {"dataset": dataset, "model": lab, "streams": len(rs), "diverged": len(rs) - len(ok),
                               "errors": [f"{r['stream']}: {r['error']}" for r in rs if r["error"]],
                               "nonfinite": sum(r["nonfinite"] for r in rs)}
        for k in ("mae", "rmse", "coverage"):
            vals = [r[k] for r in ok if r[k] is not None]
            row[k] = statistics.fmean(vals) if vals and len(vals) == len(rs) else None
            row[k + "_std"] = statistics.stdev(vals) if len(vals) > 1 and len(vals) == len(rs) else None
        verdicts = [beats_mean(r, by[(r["stream"], MEAN)]) for r in rs]
        row["le_mean"] = sum(v == "yes" for v in verdicts)
        row["le_mean_detail"] = {r["stream"]: v for r, v in zip(rs, verdicts, strict=True)}
        worst = [r["max_abs_error"] / r["y_sd"] for r in ok if r["max_abs_error"] is not None and r.get("y_sd")]
        row["worst_error_sd"] = max(worst) if worst and len(worst) == len(rs) else None
        seen = sum(r["seen"] for r in rs)
        ns = sum(r["time_ns"] for r in rs)
        row["us_per_sample"] = ns / seen / 1e3 if seen else None
        row["time_ratio"] = (ns / seen) / (ref_ns / ref_seen) if seen and ref_seen and ref_ns else None
        rows.append(row)
    return rows


def table(rows: list[dict], multi: bool) -> list[str]:
    lines = ["| model | MAE | RMSE | 95% coverage | diverged | worst \\|error\\| / sd(y) | ≤ running mean? "
             "| µs/sample | time vs LinearRegression |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        def cell(k: str, r: dict = r) -> str:
            if r[k] is None:
                return "—"
            return fmt(r[k]) + (f" ± {fmt(r[k + '_std'], 2)}" if multi and r.get(k + "_std") is not None else "")

        if r["model"] == MEAN:
            le = "(reference)"
        elif r["le_mean"] == r["streams"]:
            le = "yes" if not multi else f"yes ({r['le_mean']}/{r['streams']})"
        else:
            bad = [f"{s}: {v or 'diverged'}" for s, v in r["le_mean_detail"].items() if v != "yes"]
            le = f"**no** ({r['le_mean']}/{r['streams']}; worse: {'; '.join(bad)})"
        div = "no" if not r["diverged"] else f"**yes** ({r['diverged']}/{r['streams']})"
        name = f"**{r['model']}**" if r["model"].startswith("streamfed") else r["model"]
        ratio = "—" if r["time_ratio"] is None else ("1.00× (ref.)" if r["model"] == REFERENCE
                                                     else f"{r['time_ratio']:.2f}×")
        lines.append(f"| {name} | {cell('mae')} | {cell('rmse')} | {cell('coverage')} | {div} | "
                     f"{fmt(r['worst_error_sd'], 3)} | {le} | "
                     f"{fmt(r['us_per_sample'], 3)} | {ratio} |")
    return lines


def per_stream_table(runs: list[dict], labels: list[str]) -> list[str]:
    streams = list(dict.fromkeys(r["stream"] for r in runs))
    by = {(r["stream"], r["model"]): r for r in runs}
    lines = ["| model | " + " | ".join(f"{s} MAE / RMSE" for s in streams) + " |",
             "|---|" + "---|" * len(streams)]
    for lab in labels:
        cells = []
        for s in streams:
            r = by[(s, lab)]
            cells.append("diverged" if r["diverged"] else f"{fmt(r['mae'])} / {fmt(r['rmse'])}")
        lines.append(f"| {lab} | " + " | ".join(cells) + " |")
    return lines


def failure_text(dataset: str, r: dict) -> str:
    bad = [f"{s} ({v or 'diverged'})" for s, v in r["le_mean_detail"].items() if v != "yes"]
    return f"{r['model']} on {dataset}: " + ", ".join(bad)


def git_state() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.strip()
        subject = subprocess.run(["git", "log", "-1", "--format=%s"], cwd=REPO, capture_output=True, text=True,
                                 check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", "streamfed"], cwd=REPO,
                               capture_output=True, text=True, check=True).stdout.strip()
        return (f"{head} (\"{subject[:70]}{'…' if len(subject) > 70 else ''}\")"
                + (" with uncommitted changes under streamfed/" if dirty else ""))
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


# ----------------------------------------------------------------------------- the run
def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=None, help="markdown section (and .json beside it)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 200 samples per stream, 1 seed, 1 station")
    ap.add_argument("--friedman-n", type=int, default=5000, help="samples of each synth.Friedman stream")
    ap.add_argument("--seeds", type=lambda s: [int(v) for v in s.split(",")], default=[0, 1, 2],
                    help="synth.Friedman seeds, comma-separated")
    ap.add_argument("--stations", type=lambda s: list(BEIJING_STATIONS) if s == "all" else s.split(","),
                    default=list(BEIJING_STATIONS[:3]), help="Beijing stations, comma-separated, or all (each its "
                    "own stream)")
    ap.add_argument("--warmup", type=int, default=50, help="untimed, unscored samples each model runs once on the "
                    "first stream before the measured runs (JIT compilation, caches)")
    ap.add_argument("--beijing-rows", type=int, default=5000, help="rows read from the top of each station's file")
    ap.add_argument("--limit", type=int, default=None, help="cut every stream to its first N samples")
    ap.add_argument("--models", default=None, help="only models whose label contains one of these (comma-separated; "
                    "the LinearRegression reference and the running mean are always run)")
    args = ap.parse_args(argv)
    if args.quick:
        args.limit, args.seeds, args.stations = args.limit or 200, args.seeds[:1], args.stations[:1]
        if args.out is None:
            args.out = Path("/tmp/progressive-quick.md")
    for st in args.stations:
        station_file(st)  # unknown station: ValueError now, not after the other datasets
    t_start = time.perf_counter()
    sf_models, skipped = streamfed_models()
    models = sf_models + river_models()
    if args.models:
        keep = [k.strip() for k in args.models.split(",") if k.strip()]
        models = [m for m in models if m.label in (REFERENCE, MEAN) or any(k in m.label for k in keep)]
    labels = [m.label for m in models]
    for name, why in skipped.items():
        print(f"note: streamfed {name} skipped: {why}", flush=True)
    streams = all_streams(args)
    print(f"{len(streams)} streams × {len(models)} models, {sum(len(s.ys) for s in streams)} samples per model",
          flush=True)

    for m in models:  # a throw-away pass each: numba dispatch, caches, first-touch allocations
        progressive(m.make, streams[0].xs[: args.warmup], streams[0].ys[: args.warmup])

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    runs: list[dict] = []
    total = sum(len(s.ys) for s in streams) * len(models)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()) as prog:
        bar = prog.add_task("progressive validation", total=total)
        for s in streams:
            for m in models:
                prog.update(bar, description=f"{s.dataset} {s.name}: {m.label}")
                r = progressive(m.make, s.xs, s.ys)
                r.update(dataset=s.dataset, stream=s.name, model=m.label, y_sd=float(np.std(s.ys)))
                runs.append(r)
                prog.advance(bar, len(s.ys))
                line = (f"{s.dataset:>18} {s.name:>13} {m.label:<42} MAE {fmt(r['mae']):>8} RMSE {fmt(r['rmse']):>8}"
                        f" {fmt(r['us_per_sample'], 3):>7} µs" + (f" DIVERGED {r['error'] or ''}" if r["diverged"]
                                                                   else ""))
                if prog.console.is_terminal:
                    prog.console.print(line)
                else:
                    print(line, flush=True)
    wall = time.perf_counter() - t_start

    datasets_order = list(dict.fromkeys(s.dataset for s in streams))
    summary = {d: summarise(d, [r for r in runs if r["dataset"] == d], labels) for d in datasets_order}
    sf_labels = [m.label for m in models if m.source == "streamfed"]
    failures = [(d, r) for d, rows in summary.items() for r in rows
                if r["model"] in sf_labels and (r["diverged"] or r["le_mean"] < r["streams"])]

    cmd = ".venv/bin/python benchmarks/bench_progressive.py" + ("" if args.out is None else f" --out {args.out}")
    if args.quick:
        cmd = ".venv/bin/python benchmarks/bench_progressive.py --quick"
    sizes = (f"TrumpApproval 1,001 samples, ChickWeights 578, synth.Friedman {args.friedman_n:,} samples × seeds "
             f"{', '.join(map(str, args.seeds))}, Beijing stations {', '.join(args.stations)}: the first "
             f"{args.beijing_rows:,} rows of each file")
    if args.limit:
        sizes += f"; every stream cut to its first {args.limit} samples"
    recipes = [f"`{m.recipe}`" for m in models]
    lines = [
        "## A user's own stream: progressive validation on the defaults",
        "",
        f"Command: `{cmd}` ({sizes}; {wall:.0f} s wall, one process). Code: {git_state()}. River {river.__version__}, "
        f"numpy {np.__version__}, kernels: {'ahead-of-time build' if compiled.BACKEND == 'aot' else 'numba JIT'}. "
        f"Machine: {machine()}; OPENBLAS_NUM_THREADS={os.environ['OPENBLAS_NUM_THREADS']}; "
        f"load average at the end {load_average()} (shared machine: the times are indicative, the ratios are "
        "within one run).",
        "",
        "Protocol: for each sample `predict_one(x)` then `learn_one(x, y)`, a fresh model per stream, MAE and RMSE "
        "over every sample (the first, untrained prediction included). streamfed's estimators run **on their "
        "defaults** (no scaler in front, no parameter); River's in the River-idiomatic recipe. 95% coverage (models "
        "with a predictive distribution, `predict_one(x, with_dist=True)`): share of samples with "
        "|y − μ| ≤ 1.96 σ. Diverged: a non-finite prediction or an exception (recorded, the model stops on that "
        "stream). Worst |error| / sd(y): the largest absolute error of any prediction but the first (made before any "
        "learning), in standard deviations of the stream's target (the largest over the streams): a finite blow-up "
        "shows here. ≤ running mean: MAE *and* "
        "RMSE at most the running mean's on the stream. Time: `predict_one` + "
        "`learn_one` per sample, summed over the dataset's streams, as a ratio to the River LinearRegression recipe "
        f"in the same run; before the measured runs each model runs once, untimed and unscored, on the first "
        f"{args.warmup} samples of the first stream (JIT compilation, caches). Several streams (Friedman seeds, "
        "Beijing stations): mean ± std over the streams.",
        "",
        "Beijing through the CSV path: `csv_fleet(path, \"CO\", features=BEIJING_INPUTS, normalisation=\"none\", "
        f"max_rows={args.beijing_rows})` on `streamfed/data/beijing-air/PRSA_Data_<station>_20130301-20170228.csv.gz`"
        " — target CO from PM2.5, PM10, SO2, NO2, O3, TEMP, PRES, DEWP, RAIN, WSPM at the same hour (the project's "
        "task), raw units, rows with a missing value skipped: "
        + "; ".join(f"{s.name} {s.note}" for s in streams if s.note) + ".",
        "",
        "Recipes: " + "; ".join(recipes) + ".",
    ]
    if skipped:
        lines += ["", "Registered algorithms skipped: " + "; ".join(f"`{n}` ({why})" for n, why in skipped.items())
                  + "."]
    if failures:
        lines += ["", "**A streamfed default diverged or is worse than the running mean:** "
                  + "; ".join(failure_text(d, r) for d, r in failures) + "."]
    for d in datasets_order:
        multi = summary[d][0]["streams"] > 1
        lines += ["", f"### {d}", ""] + table(summary[d], multi)
        if multi:
            lines += ["", "Per stream:", ""] + per_stream_table([r for r in runs if r["dataset"] == d], labels)
    overflows = [(r["dataset"], r["stream"], r["model"], r["kernel_overflows"]) for r in runs
                 if r.get("kernel_overflows")]
    if overflows:
        lines += ["", "Kernel overflows counted by POF-MKL (a kernel's loss overflowed and was taken at weight ~0; "
                  "the prediction stays finite): " + "; ".join(f"{m} on {d} {s}: {k}" for d, s, m, k in overflows)
                  + "."]
    errors = [(r["dataset"], r["stream"], r["model"], r["error"]) for r in runs if r["error"]]
    if errors:
        lines += ["", "Exceptions (model stopped on that stream):", ""]
        lines += [f"- {m} on {d} {s}: `{e}`" for d, s, m, e in errors]
    config = {"command": cmd, "wall_s": wall, "friedman_n": args.friedman_n, "seeds": args.seeds,
              "stations": args.stations, "beijing_rows": args.beijing_rows, "limit": args.limit,
              "models": {m.label: {"source": m.source, "recipe": m.recipe} for m in models},
              "skipped_algorithms": skipped, "code": git_state(), "river": river.__version__,
              "numpy": np.__version__, "backend": compiled.BACKEND,
              "openblas_threads": os.environ["OPENBLAS_NUM_THREADS"],
              "streams": [{"dataset": s.dataset, "stream": s.name, "samples": len(s.ys), "note": s.note}
                          for s in streams]}
    write_section(args.out, lines, {"config": config, "summary": summary, "runs": runs,
                                    "streamfed_failures": [f"{r['model']} on {d}" for d, r in failures]},
                  quick=args.quick)


if __name__ == "__main__":
    main()
