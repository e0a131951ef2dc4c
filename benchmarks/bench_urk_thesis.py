"""URK-FedBNR against fixed-kernel RFF FedBNR: the FedBNR thesis's Table 3.1 protocol on CCPP, and streams with
inputs of unequal relevance at equal upload bytes (issue 34).

    .venv/bin/python benchmarks/bench_urk_thesis.py [--quick] [--parts ab] [--splits 10] [--seeds 0,1,2]
                                                     [--out benchmarks/results/urk_thesis.md]

* (a) CCPP (`streamfed.evaluation.datasets.ccpp`, 9,568 rows, inputs AT, V, AP, RH, target PE in MW), the
  thesis's Table 3.1 protocol: per split a random 8:1:1 train/validation/test partition
  (`numpy.random.default_rng(split)`), inputs and target standardised with the training rows' mean and
  standard deviation, the training rows sorted by the input most correlated with the target (AT) and cut into
  10 contiguous clients, each client's rows in a random order; every client streams one row per step
  (`streamfed.evaluation.replay.replay`, a global after every step). Test RMSE in MW of client 0's model
  after the last step. RFF FedBNR with D = 100 at the bandwidth of {0.5, 1, 2, 4} with the lowest validation
  RMSE (chosen per split); URK-FedBNR on its defaults (a learned lengthscale per input) with FedAvg, with
  distillation (the server holds the first 96 validation rows), with m = 100 (as many features as RFF); the
  thesis's network `widths = (32, 8)` (URK's defaults before issue 34) with statistics carried across kernel
  versions and without (the behaviour before issue 34); FSGP on its defaults. Also: the samples the last URK
  global sums.
* (b) Streams, prequential MSE pooled over clients (the synthetic streams z-scored with the fleet's constants,
  Beijing with online standardisation), seeds
  `--seeds` (the data's and the fleet's): River's `synth.Friedman` (10 inputs uniform on [0, 1], 5 of them
  irrelevant; 10 clients × `n` samples, one stream of `n·10` cut into consecutive clients); a high-dimensional
  synthetic stream (d = 30 standard normal inputs, 4 relevant: `y = sin(2x₀) + x₁x₂ + 0.5x₃² + N(0, 0.1²)`,
  10 clients); Beijing (12 stations, the first `n` samples of each). URK-FedBNR variants against RFF FedBNR
  at the best of bandwidths {0.5, 1, 2, 4, 8} (chosen on the same run: the oracle's pick) **at equal upload
  bytes**: RFF's D is the smallest of {32, 40, 48, 56, 64, 80, 96} whose upload (numbers sent, 8 bytes
  each, summed over clients) is at least URK's, so RFF never gets fewer bytes.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from streamfed.evaluation.datasets import ClientStream, Fleet, load_beijing  # noqa: E402
from streamfed.evaluation.datasets.ccpp import CCPP_INPUTS, load_ccpp  # noqa: E402
from streamfed.evaluation.replay import AlgorithmConfig, ReplayResult, replay  # noqa: E402

torch.set_num_threads(1)
URK = "urk-fedbnr"
RESULTS: dict[str, Any] = {}
# URK-FedBNR's defaults before issue 34: the thesis's network, Adam at 0.01, a local fit every 128 samples
THESIS = {"widths": [32, 8], "learning_rate": 0.01, "fit_every": 128}


def load() -> str:
    return os.getloadavg().__repr__()


# =========================================================================== (a) CCPP, the thesis's protocol


def thesis_split(split: int, clients: int = 10) -> dict[str, Any]:
    """One split of the thesis's protocol (module docstring): the training fleet and the standardised
    validation and test sets, with the target's scale back to MW."""
    X, y = load_ccpp()
    rng = np.random.default_rng(split)
    perm = rng.permutation(len(y))
    n_tr, n_va = int(0.8 * len(y)), int(0.1 * len(y))
    tr, va, te = perm[:n_tr], perm[n_tr:n_tr + n_va], perm[n_tr + n_va:]
    mx, sx = X[tr].mean(axis=0), X[tr].std(axis=0)
    my, sy = float(y[tr].mean()), float(y[tr].std())
    Z = (X - mx) / sx
    t = (y - my) / sy
    corr = [abs(np.corrcoef(X[tr, j], y[tr])[0, 1]) for j in range(X.shape[1])]
    key = int(np.argmax(corr))
    order = tr[np.argsort(X[tr, key], kind="stable")]
    streams = []
    for c, rows in enumerate(np.array_split(order, clients)):
        rows = rows[rng.permutation(len(rows))]
        streams.append(ClientStream(f"c{c}", Z[rows], t[rows], CCPP_INPUTS))
    fleet = Fleet(tuple(streams), dataset="ccpp", normalisation="none", split="thesis-sorted", seed=split)
    return {"fleet": fleet, "val": (Z[va], t[va]), "test": (Z[te], t[te]), "y_scale": sy, "sort_by": CCPP_INPUTS[key],
            "n_train": len(tr)}


def global_rmse(res: ReplayResult, X: np.ndarray, y: np.ndarray, y_scale: float) -> float:
    """RMSE (in the target's units) of client 0's model after the replay on `(X, y)`."""
    assert res.arrangement is not None
    learner = res.arrangement.learners[0]
    mean = np.array([learner.predict(x)[0] for x in X])
    return float(np.sqrt(np.mean((mean - y) ** 2)) * y_scale)


def global_n(res: ReplayResult) -> float | None:
    assert res.arrangement is not None
    srv = getattr(res.arrangement.aggregations[0], "server", None)
    st = getattr(srv, "stats", None)
    return None if st is None else float(st.n)


def part_a(splits: int, quick: bool) -> list[str]:
    rows: dict[str, list[float]] = {}
    extra: dict[str, list[Any]] = {"rff_bandwidth": [], "urk_global_n": [], "urk_nocarry_global_n": [],
                                   "urk_epochs": []}
    bws = [0.5, 1.0, 2.0, 4.0]
    n_train = 0
    for split in range(splits):
        sp = thesis_split(split)
        fleet, (Xv, yv), (Xt, yt), sy = sp["fleet"], sp["val"], sp["test"], sp["y_scale"]
        n_train = sp["n_train"]
        if quick:
            fleet = Fleet(tuple(ClientStream(s.name, s.X[:150], s.y[:150], s.feature_names) for s in fleet.streams),
                          dataset="ccpp", normalisation="none", split="thesis-sorted", seed=split)
        t0 = time.perf_counter()
        val = {}
        for bw in bws:
            res = replay(fleet, "fedbnr", AlgorithmConfig(kernels=(f"gaussian:{bw}",), n_features=100), seed=split)
            val[bw] = (global_rmse(res, Xv, yv, sy), res)
        best = min(val, key=lambda b: val[b][0])
        extra["rff_bandwidth"].append(best)
        rows.setdefault("RFF FedBNR, D = 100 (bandwidth by validation)", []).append(
            global_rmse(val[best][1], Xt, yt, sy))
        kd = {"aggregation": "distill", "distill_inputs": [list(map(float, r)) for r in Xv[:96]],
              "distill_targets": list(map(float, yv[:96]))}
        for label, params in [("URK-FedBNR (FedAvg)", {}), ("URK-FedBNR (distillation)", kd),
                              ("URK-FedBNR, m = 100 (FedAvg; F = 200 features, as RFF's D = 100)", {"n_omega": 100}),
                              ("URK-FedBNR, the thesis's network (32, 8) (FedAvg)", THESIS),
                              ("URK-FedBNR, the thesis's network (32, 8), statistics not carried (FedAvg; before "
                               "issue 34)", {**THESIS, "carry": False})]:
            res = replay(fleet, URK, AlgorithmConfig(params={URK: params}), seed=split)
            rows.setdefault(label, []).append(global_rmse(res, Xt, yt, sy))
            if label == "URK-FedBNR (FedAvg)":
                extra["urk_global_n"].append(global_n(res))
                extra["urk_epochs"].append(int(res.arrangement.aggregations[0].server.epoch))  # type: ignore[union-attr]
            if "not carried" in label:
                extra["urk_nocarry_global_n"].append(global_n(res))
        res = replay(fleet, "fsgp", AlgorithmConfig(), seed=split)
        rows.setdefault("FSGP (defaults)", []).append(global_rmse(res, Xt, yt, sy))
        print(f"split {split}: " + ", ".join(f"{k[:24]} {v[-1]:.3f}" for k, v in rows.items())
              + f" ({time.perf_counter() - t0:.0f} s, load {load()})", flush=True)
    RESULTS["a"] = {"splits": splits, "rmse": rows, **extra, "n_train": n_train}
    rff = np.array(rows["RFF FedBNR, D = 100 (bandwidth by validation)"])
    lines = ["## (a) CCPP, the FedBNR thesis's Table 3.1 protocol", "",
             f"{splits} random 8:1:1 splits (seeds 0–{splits - 1}), {n_train} training rows sorted by AT and cut into "
             "10 contiguous clients (each client's rows shuffled, one row per client per step, a global every step); "
             "test RMSE (MW) of client 0's model at the end. RFF bandwidths chosen on validation: "
             + ", ".join(f"{b:g}" for b in extra["rff_bandwidth"]) + ".", "",
             "| model | test RMSE (MW) | ± std | better than RFF on splits |", "|---|---|---|---|"]
    for name, v in rows.items():
        a = np.array(v)
        wins = "—" if name.startswith("RFF") else f"{int(np.sum(a < rff))}/{len(a)}"
        lines.append(f"| {name} | {a.mean():.3f} | {a.std():.3f} | {wins} |")
    gn = [g for g in extra["urk_global_n"] if g is not None]
    gn0 = [g for g in extra["urk_nocarry_global_n"] if g is not None]
    lines += ["", f"Samples the last URK global sums (of {n_train} training rows): {np.mean(gn):.0f} with statistics "
              f"carried (mean of the splits; the rest are below a client's `min_upload` = 32), {np.mean(gn0):.0f} "
              f"without (the thesis's network); kernel versions: {np.mean(extra['urk_epochs']):.1f}.", ""]
    return lines


# =========================================================================== (b) streams at equal upload bytes


def standardised(streams: tuple[ClientStream, ...], dataset: str, split: str, seed: int) -> Fleet:
    """The streams z-scored with the whole fleet's mean and standard deviation (per input and of the target):
    declared scales, as a deployment would declare them for a known generator. Online standardisation from a
    stream's first samples (warm-up 2) made single inputs and targets of 60-250 standard deviations on these short
    streams, whose squared errors then decided the pooled MSE."""
    X = np.concatenate([s.X for s in streams])
    y = np.concatenate([s.y for s in streams])
    mx, sx, my, sy = X.mean(axis=0), X.std(axis=0), float(y.mean()), float(y.std())
    return Fleet(tuple(ClientStream(s.name, (s.X - mx) / sx, (s.y - my) / sy, s.feature_names) for s in streams),
                 dataset=dataset, normalisation="none", split=split, seed=seed)


def friedman_fleet(seed: int, n: int, clients: int = 10) -> Fleet:
    from river import datasets

    data = list(datasets.synth.Friedman(seed=seed).take(n * clients))
    X = np.array([[x[k] for k in sorted(x)] for x, _ in data])
    y = np.array([float(t) for _, t in data])
    streams = tuple(ClientStream(f"c{c}", X[c * n:(c + 1) * n], y[c * n:(c + 1) * n], tuple(f"x{j}" for j in range(10)))
                    for c in range(clients))
    return standardised(streams, "friedman", "consecutive", seed)


def highdim_fleet(seed: int, n: int, clients: int = 10, d: int = 30) -> Fleet:
    rng = np.random.default_rng([seed, 30])
    streams = []
    for c in range(clients):
        X = rng.standard_normal((n, d))
        y = np.sin(2 * X[:, 0]) + X[:, 1] * X[:, 2] + 0.5 * X[:, 3] ** 2 + 0.1 * rng.standard_normal(n)
        streams.append(ClientStream(f"c{c}", X, y, tuple(f"x{j}" for j in range(d))))
    return standardised(tuple(streams), "highdim", "iid", seed)


def beijing_fleet(seed: int, n: int) -> Fleet:
    full = load_beijing("online", "station", steps=n)
    return Fleet(tuple(ClientStream(s.name, s.X[:n], s.y[:n], s.feature_names) for s in full.streams),
                 dataset="beijing-air", normalisation="online", split="station", seed=seed)


def prequential_mse(res: ReplayResult) -> float:
    e = np.concatenate(res.sq_errors)
    return float(np.mean(e[np.isfinite(e)]))


def part_b(seeds: list[int], n: int, nb: int, variants: dict[str, dict[str, Any]]) -> list[str]:
    streams = {"Friedman (10 inputs, 5 irrelevant)": friedman_fleet,
               "synthetic, d = 30 (4 relevant)": highdim_fleet,
               "Beijing (12 stations)": beijing_fleet}
    bws = [0.5, 1.0, 2.0, 4.0, 8.0]
    dims = [32, 40, 48, 56, 64, 80, 96]
    out: dict[str, Any] = {}
    lines = ["## (b) Streams: URK-FedBNR against the best fixed-bandwidth RFF FedBNR at equal upload bytes", "",
             f"Prequential MSE pooled over clients (synthetic streams z-scored with the fleet's constants, Beijing "
             f"standardised online); seeds {seeds}; Friedman and the d = 30 "
             f"stream: 10 clients × {n} samples; Beijing: the first {nb} samples of each station. RFF: the best "
             f"bandwidth of {bws} on the same run, with the smallest D of {dims} uploading at least as many bytes "
             "as the URK variant it is compared with.", "",
             "| stream | model | MSE | ± std | upload MB (all clients) | vs best RFF | kernel versions |",
             "|---|---|---|---|---|---|---|"]
    for sname, make in streams.items():
        rec: dict[str, Any] = {}
        for seed in seeds:
            fleet = make(seed, nb if sname.startswith("Beijing") else n)
            t0 = time.perf_counter()
            for vname, params in variants.items():
                res = replay(fleet, URK, AlgorithmConfig(params={URK: params}), seed=seed)
                r = rec.setdefault(vname, {"mse": [], "bytes": [], "epochs": []})
                r["mse"].append(prequential_mse(res))
                r["bytes"].append(8.0 * float(res.uploaded_numbers.sum()))
                r["epochs"].append(int(res.arrangement.aggregations[0].server.epoch))  # type: ignore[union-attr]
            budget = max(rec[v]["bytes"][-1] for v in variants)
            d_eq = None
            for D in dims:  # RFF's D: the smallest whose upload is at least the largest URK variant's
                res = replay(fleet, "fedbnr", AlgorithmConfig(kernels=("gaussian:2",), n_features=D), seed=seed)
                if 8.0 * float(res.uploaded_numbers.sum()) >= budget:
                    d_eq = D
                    break
            d_eq = d_eq or dims[-1]
            probe = {}
            for bw in bws:
                res = replay(fleet, "fedbnr", AlgorithmConfig(kernels=(f"gaussian:{bw}",), n_features=d_eq), seed=seed)
                probe[bw] = (prequential_mse(res), 8.0 * float(res.uploaded_numbers.sum()))
            best = min(probe, key=lambda b: probe[b][0])
            r = rec.setdefault("RFF FedBNR (best bandwidth, equal bytes)", {"mse": [], "bytes": [], "bw": [], "D": []})
            r["mse"].append(probe[best][0])
            r["bytes"].append(probe[best][1])
            r["bw"].append(best)
            r["D"].append(d_eq)
            print(sname, seed, {k: round(v["mse"][-1], 4) for k, v in rec.items()}, f"bw {best} D {d_eq}",
                  f"({time.perf_counter() - t0:.0f} s, load {load()})", flush=True)
        out[sname] = rec
        rff = np.array(rec["RFF FedBNR (best bandwidth, equal bytes)"]["mse"])
        for vname, r in rec.items():
            a = np.array(r["mse"])
            rel = "—" if vname.startswith("RFF") else f"{100 * (np.mean(a) / np.mean(rff) - 1):+.1f}%"
            ep = f"{np.mean(r['epochs']):.1f}" if "epochs" in r else "—"
            name = vname if "bw" not in r else (f"{vname}: bandwidth {', '.join(f'{b:g}' for b in r['bw'])}, "
                                                f"D = {', '.join(str(d) for d in r['D'])}")
            lines.append(f"| {sname} | {name} | {a.mean():.4f} | {a.std():.4f} | {np.mean(r['bytes']) / 1e6:.2f} | "
                         f"{rel} | {ep} |")
    RESULTS["b"] = {"seeds": seeds, "n": n, "n_beijing": nb, "variants": variants, "streams": out}
    return lines + [""]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--parts", default="ab")
    ap.add_argument("--splits", type=int, default=10)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--n", type=int, default=500, help="samples per client of the synthetic streams")
    ap.add_argument("--n-beijing", type=int, default=600)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "urk_thesis.md")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    t0 = time.perf_counter()
    lines = ["# URK-FedBNR against fixed-kernel RFF FedBNR (issue 34)", ""]
    if "a" in args.parts:
        lines += part_a(2 if args.quick else args.splits, args.quick)
    if "b" in args.parts:
        variants = {"URK-FedBNR (defaults: a lengthscale per input)": {},
                    "URK-FedBNR (defaults), statistics not carried": {"carry": False},
                    "URK-FedBNR, the thesis's network (32, 8) (defaults before issue 34)": THESIS}
        lines += part_b(seeds[:1] if args.quick else seeds, 100 if args.quick else args.n,
                        100 if args.quick else args.n_beijing, variants)
    cmd = "benchmarks/bench_urk_thesis.py " + " ".join(sys.argv[1:])
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    lines += [f"Command: `OPENBLAS_NUM_THREADS=1 .venv/bin/python {cmd.strip()}` ({time.perf_counter() - t0:.0f} s, "
              f"one job, commit {commit.strip()}, load average at the end {load()}; torch one thread).", ""]
    args.out.write_text("\n".join(lines))
    args.out.with_suffix(".json").write_text(json.dumps(RESULTS, indent=1, default=float))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
