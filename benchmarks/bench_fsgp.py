"""FSGP experiments: the paper's first synthetic problem, the carry-over of statistics to new inducing inputs,
and the Beijing streams.

    .venv/bin/python benchmarks/bench_fsgp.py [--quick] [--out PATH.md]

* (a) 1-D, after Guo, Wu and Ma (2022): `f(x) = 3 sin(2πx/20)` on 500 evenly spaced `x ∈ [-10, 10]`,
  `y = f(x) + N(0, 0.5²)`, 300 test points the same way; 5 clients of random, unequal sizes. Inputs are
  scaled by the known half-width (`x/10`), as an agent's would be standardised. For `M ∈ {5, 10, 20}`:
  the centralised sparse GP (Titsias' bound maximised on all the data by Adam), the paper's FedAvg
  (rounds of `P` local Adam steps on 2 of the 5 clients, averaged by sample counts, then the summed
  statistics) and the streaming plug-in (every client streams its samples in a random order through
  `streamfed.evaluation.replay.replay`, hyperparameters learned on reservoirs). Test RMSE of the mean.
* (b) Moving `Z` without losing the past: a stream of 1000 samples is learned under `(θ₀, Z₀)`, then
  `(θ₁, Z₁)` arrive (`Z` shifted and jittered, lengthscale ×1.3). Test RMSE of: refitting from all 1000
  samples (the reference), the Bui et al. projection of the statistics, re-embedding a reservoir of 100
  samples (uniform over the stream), and discarding the statistics.
* (c) The Beijing streams (`normalisation="online"`, every client its station): `fsgp`, `fsgp-local`,
  and `fedbnr` for scale, through `replay` (first 2000 steps; `--quick`: 500).
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from streamfed.algorithms.fsgp.bound import fit_hyper  # noqa: E402
from streamfed.algorithms.fsgp.design import gaussian_design  # noqa: E402
from streamfed.algorithms.fsgp.kernels import Hyper, cov  # noqa: E402
from streamfed.algorithms.fsgp.posterior import SparsePosterior, Stats  # noqa: E402
from streamfed.algorithms.fsgp.projection import project, reembed  # noqa: E402
from streamfed.evaluation.datasets import ClientStream, Fleet  # noqa: E402
from streamfed.evaluation.replay import AlgorithmConfig, replay  # noqa: E402

JITTER = 1e-6


def rmse(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.sqrt(np.mean((np.asarray(a) - np.asarray(b)) ** 2)))


def stats_of(h: Hyper, X: np.ndarray, y: np.ndarray, epoch: int = 0) -> Stats:
    return Stats.from_samples(cov(h, X, h.Z), y, epoch)


def predict(h: Hyper, s: Stats, X: np.ndarray) -> np.ndarray:
    return SparsePosterior(h, s, JITTER).predict_many(X)[0]


# =========================================================================== (a) the paper's 1-D problem


def paper_data(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    f = lambda x: 3.0 * np.sin(2.0 * np.pi * x / 20.0)  # noqa: E731
    x = np.linspace(-10, 10, 500)
    xt = np.linspace(-10, 10, 300)
    y = f(x) + 0.5 * rng.normal(size=500)
    yt = f(xt) + 0.5 * rng.normal(size=300)
    # 5 clients of unequal sizes (a random split of a shuffled index)
    cuts = np.sort(rng.choice(np.arange(40, 460), size=4, replace=False))
    parts = np.split(rng.permutation(500), cuts)
    return x[:, None] / 10.0, y, xt[:, None] / 10.0, yt, parts


def fedavg(h0: Hyper, X: np.ndarray, y: np.ndarray, parts: list[np.ndarray], rounds: int, local: int,
           per_round: int, lr: float, rng: np.random.Generator) -> Hyper:
    """The paper's FedAvg: each round `per_round` clients take `local` Adam steps from the global on their
    own bound; the global is their average weighted by sample counts."""
    h = h0
    for _ in range(rounds):
        chosen = rng.choice(len(parts), size=per_round, replace=False)
        vecs, weights = [], []
        for c in chosen:
            fitted = fit_hyper(h, X[parts[c]], y[parts[c]], steps=local, learning_rate=lr, jitter=JITTER)
            if fitted is not None:
                vecs.append(fitted.to_vector())
                weights.append(len(parts[c]))
        if vecs:
            h = Hyper.from_vector(h.kind, np.average(vecs, axis=0, weights=weights), h.m, h.d)
    return h


def streaming(X: np.ndarray, y: np.ndarray, parts: list[np.ndarray], m: int, seed: int) -> Any:
    """The plug-in through the replay, each client streaming its part in a random order; its aggregation."""
    rng = np.random.default_rng(seed)
    streams = []
    for c, p in enumerate(parts):
        o = rng.permutation(p)
        streams.append(ClientStream(f"c{c}", X[o], y[o], ("x",)))
    fleet = Fleet(tuple(streams), dataset="paper-1d", normalisation="none", split="random", seed=seed)
    acfg = AlgorithmConfig(params={"fsgp": {"n_inducing": m, "min_upload": 16, "fit_every": 32, "fit_steps": 10,
                                            "reservoir": 256, "lengthscale": 1.0, "sigma": 0.5,
                                            "min_proposal_weight": 64.0, "learning_rate": 0.05}})
    result = replay(fleet, "fsgp", acfg, seed=seed)
    arr = result.arrangement
    return None if arr is None else arr.aggregations[0]


def part_a(quick: bool) -> list[str]:
    lines = ["## (a) The paper's 1-D problem (test RMSE of the mean; noise σ = 0.5 is the floor)", "",
             "| M | initial | centralised SGPR | FedAvg (paper) | streaming plug-in | epochs "
             "| wall s (SGPR / FedAvg / stream) |",
             "|---|---|---|---|---|---|---|"]
    seeds = [0] if quick else [0, 1, 2]
    for m in (5, 10, 20):
        rows = []
        for seed in seeds:
            X, y, Xt, yt, parts = paper_data(seed)
            h0 = Hyper.initial("se", gaussian_design(m, 1, seed=seed), lengthscale=1.0, sigma=0.5)
            init = rmse(predict(h0, stats_of(h0, X, y), Xt), yt)
            t0 = time.perf_counter()
            hc = fit_hyper(h0, X, y, steps=150 if quick else 500, learning_rate=0.05, jitter=JITTER) or h0
            t1 = time.perf_counter()
            hf = fedavg(h0, X, y, parts, rounds=30 if quick else 100, local=3, per_round=2, lr=0.05,
                        rng=np.random.default_rng(seed))
            t2 = time.perf_counter()
            agg = streaming(X, y, parts, m, seed)
            t3 = time.perf_counter()
            sc = rmse(predict(hc, stats_of(hc, X, y), Xt), yt)
            sf = rmse(predict(hf, stats_of(hf, X, y), Xt), yt)
            ss = rmse(predict(agg.server.hyper, agg.server.stats, Xt), yt) if agg is not None else math.nan
            rows.append((init, sc, sf, ss, agg.server.epoch if agg is not None else 0, t1 - t0, t2 - t1, t3 - t2))
        r = np.array(rows)
        mu = r.mean(axis=0)
        sd = r.std(axis=0)
        lines.append(f"| {m} | {mu[0]:.3f} | {mu[1]:.3f} ± {sd[1]:.3f} | {mu[2]:.3f} ± {sd[2]:.3f} | "
                     f"{mu[3]:.3f} ± {sd[3]:.3f} | {mu[4]:.0f} | {mu[5]:.1f} / {mu[6]:.1f} / {mu[7]:.1f} |")
    lines += ["", f"Seeds: {len(seeds)}. FedAvg: {30 if quick else 100} rounds, 2 of 5 clients, 3 local Adam "
              "steps (learning rate 0.05). The streaming plug-in sees each sample once; its (θ, σ, Z) move by "
              "FedAvg of reservoir fits and its statistics are carried across versions by the Bui projection.", ""]
    return lines


# =========================================================================== (b) carrying statistics over


def part_b(quick: bool) -> list[str]:
    lines = ["## (b) New (θ, Z) mid-stream: keep the past how? (test RMSE of the mean)", "",
             "| M | refit on all data (reference) | Bui projection | re-embed a 100-sample reservoir | discard |",
             "|---|---|---|---|---|"]
    seeds = [0] if quick else list(range(5))
    for m in (10, 20, 40):
        rows = []
        for seed in seeds:
            rng = np.random.default_rng(seed)
            X = rng.uniform(-3, 3, (1000, 1))
            y = np.sin(2 * X[:, 0]) + 0.5 * np.sin(5 * X[:, 0]) + 0.1 * rng.normal(size=1000)
            Xt = np.linspace(-3, 3, 400)[:, None]
            yt = np.sin(2 * Xt[:, 0]) + 0.5 * np.sin(5 * Xt[:, 0])
            h0 = Hyper.initial("se", np.linspace(-3, 3, m)[:, None], lengthscale=0.5, sigma=0.1)
            h1 = Hyper(h0.kind, h0.log_amp, h0.log_ls + math.log(1.3), h0.log_sigma,
                       h0.Z + 0.3 + 0.1 * rng.normal(size=h0.Z.shape))
            s0 = stats_of(h0, X, y)
            keep = rng.choice(1000, size=100, replace=False)
            ref = rmse(predict(h1, stats_of(h1, X, y, 1), Xt), yt)
            bui = rmse(predict(h1, project(s0, h0, h1, 1, JITTER), Xt), yt)
            emb = rmse(predict(h1, reembed(X[keep], y[keep], h1, 1), Xt), yt)
            nothing = rmse(predict(h1, Stats.zeros(m, 1), Xt), yt)
            rows.append((ref, bui, emb, nothing))
        mu = np.array(rows).mean(axis=0)
        lines.append(f"| {m} | {mu[0]:.4f} | {mu[1]:.4f} | {mu[2]:.4f} | {mu[3]:.4f} |")
    lines += ["", f"Seeds: {len(seeds)}. `f(x) = sin 2x + ½ sin 5x`, 1000 samples, noise 0.1; `Z₁ = Z₀ + 0.3 + "
              "N(0, 0.1²)`, `ℓ₁ = 1.3 ℓ₀`.", ""]
    return lines


# =========================================================================== (c) Beijing


def part_c(quick: bool) -> list[str]:
    from streamfed.evaluation.datasets.beijing import load_beijing

    steps = 500 if quick else 2000
    fleet = load_beijing(normalisation="online", split="station")
    lines = [f"## (c) Beijing streams, first {steps} steps of every station (normalisation online)", "",
             "| algorithm | MSE | numbers uploaded per client per step | wall s |", "|---|---|---|---|"]
    for name in ("fsgp", "fsgp-local", "fedbnr"):
        t0 = time.perf_counter()
        result = replay(fleet, name, AlgorithmConfig(), seed=0, steps=steps)
        wall = time.perf_counter() - t0
        per = float(np.mean(result.uploaded_numbers)) / steps
        lines.append(f"| {name} | {result.mse:.4f} | {per:.1f} | {wall:.1f} |")
    lines += ["", "Defaults of each algorithm (FSGP: M = 32, SE-ARD, data-free initial Z, learned θ, σ, Z).", ""]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--parts", default="abc")
    args = ap.parse_args()
    t0 = time.perf_counter()
    lines = ["# FSGP experiments", ""]
    for p, fn in (("a", part_a), ("b", part_b), ("c", part_c)):
        if p in args.parts:
            lines += fn(args.quick)
    lines.append(f"Command: `benchmarks/bench_fsgp.py{' --quick' if args.quick else ''}` "
                 f"({time.perf_counter() - t0:.0f} s).")
    text = "\n".join(lines) + "\n"
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
