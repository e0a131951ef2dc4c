"""PVI as a streaming learner (issue 34, part 4): every sample absorbed into the local factor between
refinements, against refinements alone, FSGP and the running mean.

    .venv/bin/python benchmarks/bench_pvi_streaming.py --out benchmarks/results/pvi_streaming.md
    .venv/bin/python benchmarks/bench_pvi_streaming.py --parts cd --out benchmarks/results/pvi_streaming_more.md
    .venv/bin/python benchmarks/bench_pvi_streaming.py --quick        # smoke run (short slices), prints only

* (a) The federated plug-in on the Beijing streams, the protocol of `bench_pvi.py` part (e), where the issue's
  figures come from: `streamfed.evaluation.replay` over the 12 stations, the first `--steps` steps (500),
  online standardisation, `M = 32`, `σ = 0.5`; PVI with `M_k = 32`, a refinement of 30 Adam steps every 64
  samples, predictions from 8 draws of `φ`; FSGP with `min_upload = 32` (exact sums, FedAvg-learned
  `θ, σ, Z`). Prequential MSE, NLPD and 95% coverage (`|y − μ| ≤ 1.96 σ`) pooled over every station's stream,
  for each of `--seeds`; the running mean is each station's mean of its past targets (0 before any).
* (b) The River estimators on their defaults on `bench_progressive.py`'s streams (TrumpApproval,
  ChickWeights, Friedman seeds 0–2 × 5,000, Beijing CO at 3 stations × the first 5,000 rows, raw units):
  `PVIRegressor()` (streaming), `PVIRegressor(streaming=False)` (refinements alone, the previous behaviour),
  `FSGPRegressor()` and River's running mean, `predict_one(x, with_dist=True)` then `learn_one(x, y)` on every
  sample. RMSE as a ratio to the running mean's, coverage, and time per sample in the same run: the median,
  the mean over the samples without a refinement (PVI) and the mean over all, each as a ratio to FSGP's.
* (c) (`--parts cd`: the second result file) A Bernoulli PVI through `streamfed replay` on River's SEA stream (seed 1,
  600 samples over 3 clients, tests/test_own_data.py's configuration): accuracy, log loss and ECE, streaming
  (one Newton step per sample) against refinements alone.
* (d) Cost: the three models of (b) but the running mean interleaved sample by sample on Friedman seed 0 (3,000
  samples), so that they share the machine's load: per-sample µs, median as a ratio to FSGP, 90th percentile,
  mean between refinements and mean over all.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from river import datasets, dummy, stats  # noqa: E402

from streamfed.algorithms.fsgp.estimator import FSGPRegressor  # noqa: E402
from streamfed.algorithms.pvi.estimator import PVIRegressor  # noqa: E402
from streamfed.evaluation.bench import load_average, machine, write_section  # noqa: E402
from streamfed.evaluation.datasets.beijing import BEIJING_STATIONS, load_beijing  # noqa: E402
from streamfed.evaluation.replay import AlgorithmConfig, replay  # noqa: E402

Z95 = 1.959963984540054
clock = time.perf_counter_ns


def fmt(v: float | None, digits: int = 3) -> str:
    return "—" if v is None else f"{v:.{digits}f}"


# =========================================================================== (a) Beijing, federated


def running_mean_mse(ys: Sequence[np.ndarray]) -> float:
    """Each stream's prequential running mean (0 before its first target), pooled squared error."""
    errs = []
    for y in ys:
        past = np.concatenate(([0.0], np.cumsum(y)[:-1] / np.arange(1, y.size)))
        errs.append((y - past) ** 2)
    return float(np.mean(np.concatenate(errs)))


def part_a(steps: int, seeds: Sequence[int]) -> tuple[list[str], dict[str, Any]]:
    fleet = load_beijing(normalisation="online", split="station", steps=steps)
    common = {"n_inducing": 32, "sigma": 0.5}
    rows = [("pvi", "PVI defaults (q(Z) HVM, β fixed), streaming", {**common, "n_pseudo": 32}),
            ("pvi", "PVI defaults, refinements alone (streaming = false)", {**common, "n_pseudo": 32,
                                                                            "streaming": False}),
            ("pvi", "PVI q(Z), β learned, streaming", {**common, "n_pseudo": 32, "learn_beta": True}),
            ("pvi", "PVI fixed Z, β fixed, streaming", {**common, "n_pseudo": 32, "inducing": "fixed"}),
            ("fsgp", "FSGP (exact sums, FedAvg-learned θ, σ, Z)", {**common, "min_upload": 32})]
    out: dict[str, Any] = {}
    for seed in seeds:
        for name, title, params in rows:
            t0 = time.perf_counter()
            r = replay(fleet, name, AlgorithmConfig(params={name: params}), seed=seed)
            wall = time.perf_counter() - t0
            m, v, y = (np.concatenate(a) for a in (r.means, r.variances, r.ys))
            rec = out.setdefault(title, {"mse": [], "nlpd": [], "coverage": [], "wall_s": [], "mean_mse": []})
            rec["mse"].append(float(np.mean((m - y) ** 2)))
            rec["nlpd"].append(float(np.mean(0.5 * np.log(2 * np.pi * v) + 0.5 * (y - m) ** 2 / v)))
            rec["coverage"].append(float(np.mean(np.abs(y - m) <= Z95 * np.sqrt(v))))
            rec["wall_s"].append(wall)
            rec["mean_mse"].append(running_mean_mse([np.asarray(a) for a in r.ys]))
            print(f"  (a) seed {seed} {title}: MSE {rec['mse'][-1]:.3f} coverage {rec['coverage'][-1]:.3f} "
                  f"{wall:.1f} s", flush=True)
    fsgp = out["FSGP (exact sums, FedAvg-learned θ, σ, Z)"]["mse"]
    lines = [f"## (a) Beijing, federated: the replay over 12 stations, first {steps} steps (seeds "
             f"{', '.join(map(str, seeds))})", "",
             "`bench_pvi.py` part (e)'s protocol. Mean over seeds (± sd when more than one); \"× FSGP\" is the mean "
             "of the per-seed ratios of MSE; the running mean's MSE is "
             f"{np.mean(out[next(iter(out))]['mean_mse']):.3f}.", "",
             "| algorithm | MSE | × FSGP | × running mean | NLPD | 95% coverage | replay wall s |",
             "|---|---|---|---|---|---|---|"]
    for title, rec in out.items():
        def ms(key: str, digits: int = 3, rec: dict = rec) -> str:
            a = np.asarray(rec[key])
            return f"{a.mean():.{digits}f}" + (f" ± {a.std(ddof=1):.{digits}f}" if a.size > 1 else "")
        ratio = float(np.mean(np.asarray(rec["mse"]) / np.asarray(fsgp)))
        mean_ratio = float(np.mean(np.asarray(rec["mse"]) / np.asarray(rec["mean_mse"])))
        rec.update(ratio_fsgp=ratio, ratio_mean=mean_ratio)
        lines.append(f"| {title} | {ms('mse')} | {ratio:.2f}× | {mean_ratio:.2f}× | {ms('nlpd')} | "
                     f"{ms('coverage')} | {ms('wall_s', 1)} |")
    return [*lines, ""], out


# =========================================================================== (b) the River estimators


def progressive(make: Callable[[], Any], xs: Sequence[dict], ys: Sequence[float]) -> dict[str, Any]:
    model = make()
    n = len(ys)
    err = np.zeros(n)
    covered = np.zeros(n, dtype=bool)
    times = np.zeros(n)
    refined = np.zeros(n, dtype=bool)
    dist = not isinstance(model, dummy.StatisticRegressor)

    def events() -> int:
        c = getattr(model, "client", None)
        return 0 if c is None or not hasattr(c, "n_refined") else c.n_refined + c.n_failed + model.n_skipped

    for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
        before = events()
        t0 = clock()
        if dist:
            g = model.predict_one(x, with_dist=True)
            mu, sd = float(g.mu), float(g.sigma)
        else:
            mu, sd = float(model.predict_one(x)), math.nan
        model.learn_one(x, y)
        times[i] = (clock() - t0) / 1e3
        refined[i] = events() != before
        err[i] = y - mu
        covered[i] = abs(y - mu) <= Z95 * sd
    warm = slice(50, None)  # the first samples build the model (and import torch): untimed, as bench_progressive
    t, r = times[warm], refined[warm]
    return {"rmse": float(np.sqrt(np.mean(err ** 2))), "mae": float(np.mean(np.abs(err))),
            "coverage": float(np.mean(covered)) if dist else None,
            "us_median": float(np.median(t)), "us_mean": float(np.mean(t)),
            "us_between": float(np.mean(t[~r])) if np.any(~r) else None, "refinements": int(np.sum(refined))}


def streams(quick: bool) -> list[tuple[str, list[dict], list[float]]]:
    import bench_progressive as bp  # its stream readers: the same streams, read the same way

    lim = 300 if quick else None
    out = [bp.river_stream("TrumpApproval", "TrumpApproval", datasets.TrumpApproval(), lim),
           bp.river_stream("ChickWeights", "ChickWeights", datasets.ChickWeights(), lim)]
    n = 300 if quick else 5000
    out += [bp.river_stream("Friedman", f"seed {s}", datasets.synth.Friedman(seed=s).take(n), None)
            for s in (0, 1, 2)]
    out += [bp.beijing_stream(st, 5000, lim) for st in BEIJING_STATIONS[:3]]
    return [(f"{s.dataset} {s.name}" if s.dataset != s.name else s.name, s.xs, s.ys) for s in out]


MODELS: list[tuple[str, Callable[[], Any]]] = [
    ("PVIRegressor() (streaming)", PVIRegressor),
    ("PVIRegressor(streaming=False)", lambda: PVIRegressor(streaming=False)),
    ("FSGPRegressor()", FSGPRegressor),
    ("running mean", lambda: dummy.StatisticRegressor(stats.Mean())),
]


def part_b(quick: bool) -> tuple[list[str], dict[str, Any]]:
    res: dict[str, dict[str, Any]] = {}
    for name, xs, ys in streams(quick):
        for label, make in MODELS:
            res.setdefault(name, {})[label] = progressive(make, xs, ys)
            r = res[name][label]
            print(f"  (b) {name} {label}: RMSE {r['rmse']:.4g} coverage {r['coverage']} "
                  f"median {r['us_median']:.0f} µs", flush=True)
    lines = ["## (b) The River estimators on their defaults (bench_progressive's streams)", "",
             "RMSE as a ratio to the running mean's on the same stream (< 1: better); 95% coverage; µs per sample "
             "(`predict_one` + `learn_one`, after 50 untimed samples): the median, the mean over samples without a "
             "refinement and the mean over all, with the ratio to `FSGPRegressor()` in the same run.", "",
             "| stream | model | RMSE | × running mean | 95% coverage | µs median (× FSGP) | µs mean between "
             "refinements | µs mean, all (× FSGP) |", "|---|---|---|---|---|---|---|---|"]
    for name, by in res.items():
        mean_rmse = by["running mean"]["rmse"]
        fs = by["FSGPRegressor()"]
        for label, r in by.items():
            r["ratio_mean"] = r["rmse"] / mean_rmse
            if label == "running mean":
                continue
            lines.append(f"| {name} | {label} | {r['rmse']:.4g} | {r['ratio_mean']:.3f} | {fmt(r['coverage'])} | "
                         f"{r['us_median']:.0f} ({r['us_median'] / fs['us_median']:.2f}×) | "
                         f"{fmt(r['us_between'], 0) if label.startswith('PVI') else '—'} | "
                         f"{r['us_mean']:.0f} ({r['us_mean'] / fs['us_mean']:.2f}×) |")
    return [*lines, ""], res


# =========================================================================== (c) Bernoulli, through the replay


SEA_PARAMS = ["--param", "pvi.likelihood=bernoulli", "--param", "pvi.n_inducing=8", "--param", "pvi.n_pseudo=8",
              "--param", "pvi.refine_every=32", "--param", "pvi.steps=10"]


def part_c(quick: bool) -> tuple[list[str], dict[str, Any]]:
    """River's SEA (seed 1) as a CSV of 3 clients (round robin), replayed by `streamfed replay` with a Bernoulli
    PVI, streaming and refinements alone (tests/test_own_data.py's configuration)."""
    import json
    import subprocess
    import tempfile

    from river.datasets import synth

    n = 200 if quick else 600
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        csv = Path(tmp) / "sea.csv"
        rows = ["client,a,b,c,y"] + [f"c{i % 3},{x[0]},{x[1]},{x[2]},{int(y)}"
                                     for i, (x, y) in enumerate(synth.SEA(seed=1).take(n))]
        csv.write_text("\n".join(rows) + "\n")
        for label, extra in (("PVI Bernoulli, streaming (Newton step per sample)", []),
                             ("PVI Bernoulli, refinements alone (streaming = false)",
                              ["--param", "pvi.streaming=false"])):
            dest = Path(tmp) / f"out{len(out)}"
            cmd = [sys.executable, "-m", "streamfed.cli", "replay", "--dataset", str(csv), "--target", "y",
                   "--client-column", "client", "--out", str(dest), "--no-plots", "-a", "pvi", *SEA_PARAMS, *extra]
            subprocess.run(cmd, check=True, capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
            out[label] = json.loads((dest / "results.json").read_text())["algorithms"]["pvi"]["classification"]
            print(f"  (c) {label}: {out[label]}", flush=True)
    lines = [f"## (c) Bernoulli: River's SEA (seed 1, {n} samples, 3 clients) through `streamfed replay`", "",
             "`streamfed replay --dataset sea.csv --target y --client-column client -a pvi "
             + " ".join(SEA_PARAMS) + "` (prequential, the agents' figures):", "",
             "| configuration | accuracy | log loss | ECE |", "|---|---|---|---|"]
    for label, r in out.items():
        lines.append(f"| {label} | {r['accuracy']:.3f} | {r['log_loss']:.3f} | {r['ece']:.3f} |")
    return [*lines, ""], out


# =========================================================================== (d) cost, interleaved


def part_d(quick: bool) -> tuple[list[str], dict[str, Any]]:
    """Per-sample cost with the models interleaved sample by sample (each sample goes to every model in turn, the
    order rotating), so that all of them run under the same load of the shared machine."""
    n = 400 if quick else 3000
    rows = list(datasets.synth.Friedman(seed=0).take(n))
    makers = MODELS[:3]
    models = [make() for _, make in makers]
    times = np.zeros((len(models), n))
    refined = np.zeros((len(models), n), dtype=bool)

    def events(m: Any) -> int:
        c = getattr(m, "client", None)
        return 0 if c is None or not hasattr(c, "n_refined") else c.n_refined + c.n_failed + m.n_skipped

    for i, (x, y) in enumerate(rows):
        for j in np.roll(np.arange(len(models)), i):
            m = models[j]
            before = events(m)
            t0 = clock()
            m.predict_one(x, with_dist=True)
            m.learn_one(x, y)
            times[j, i] = (clock() - t0) / 1e3
            refined[j, i] = events(m) != before
    out: dict[str, Any] = {}
    fs_median = float(np.median(times[2, 50:]))
    lines = [f"## (d) Cost per sample, the models interleaved (Friedman seed 0, {n} samples)", "",
             "Each sample goes to the three models in turn (the order rotating), so they share the machine's load; "
             "`predict_one(x, with_dist=True)` + `learn_one(x, y)`, after 50 untimed samples. \"between "
             "refinements\": the samples on which no refinement ran (FSGP: every sample; its local fits every 128 "
             "samples are in its figures).", "",
             "| model | µs median (× FSGP) | 90th percentile | mean between refinements | mean, all |",
             "|---|---|---|---|---|"]
    for j, (label, _) in enumerate(makers):
        t, r = times[j, 50:], refined[j, 50:]
        between = t[~r]
        rec = {"median": float(np.median(between)), "p90": float(np.percentile(between, 90)),
               "mean_between": float(between.mean()), "mean": float(t.mean()), "refinements": int(r.sum())}
        out[label] = rec
        lines.append(f"| {label} | {rec['median']:.0f} ({rec['median'] / fs_median:.2f}×) | {rec['p90']:.0f} | "
                     f"{rec['mean_between']:.0f} | {rec['mean']:.0f} |")
    return [*lines, ""], out


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--parts", default="ab")
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--seeds", default="0,1,2")
    args = ap.parse_args(argv)
    seeds = [0] if args.quick else [int(s) for s in args.seeds.split(",")]
    steps = 100 if args.quick else args.steps
    t0 = time.perf_counter()
    more = args.parts == "cd"  # the second result file: the Bernoulli replay and the interleaved cost
    title = "PVI as a streaming learner: Bernoulli and cost" if more else "PVI as a streaming learner"
    intro = ("A Bernoulli PVI client takes one Newton step per sample on its local factor between refinements "
             "(streamfed/algorithms/pvi/streaming.py): prequential accuracy, log loss and ECE through `streamfed "
             "replay`, against refinements alone; and the cost per sample of `PVIRegressor`, streaming and not, "
             "beside `FSGPRegressor` with the three interleaved sample by sample." if more else
             "PVI's client absorbs every sample into its local factor between refinements (the exact conjugate "
             "update for a Gaussian likelihood; streamfed/algorithms/pvi/streaming.py) instead of waiting for the "
             "next refinement: prequential accuracy, calibration and cost against refinements alone, FSGP and the "
             "running mean.")
    lines = [f"# {title}", "", f"{intro} Machine: {machine()}; load average at the start {load_average()}.", ""]
    data: dict[str, Any] = {}
    if "a" in args.parts:
        part, data["a"] = part_a(steps, seeds)
        lines += part
    if "b" in args.parts:
        part, data["b"] = part_b(args.quick)
        lines += part
    if "c" in args.parts:
        part, data["c"] = part_c(args.quick)
        lines += part
    if "d" in args.parts:
        part, data["d"] = part_d(args.quick)
        lines += part
    cmd = "benchmarks/bench_pvi_streaming.py" + (" --quick" if args.quick else "") + \
        ("" if args.parts == "ab" else f" --parts {args.parts}")
    lines.append(f"Command: `.venv/bin/python {cmd}` ({time.perf_counter() - t0:.0f} s; load average at the end "
                 f"{load_average()}).")
    write_section(None if args.quick else args.out, lines, data, quick=args.quick)


if __name__ == "__main__":
    main()
