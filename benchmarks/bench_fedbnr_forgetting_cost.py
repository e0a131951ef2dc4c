"""The cost of FedBNR's forgetting on the time base per sample (`half_life_s`, docs/algorithms.md §4.14), and of
`fedbnr-halflives` (§4.15), one FedBNR client per half-life.

    .venv/bin/python benchmarks/bench_fedbnr_forgetting_cost.py [--steps N] [--kernels K] [--features D]
        [--rounds R]

ms per sample of one agent's learner as the agent drives it (`observe_time(ts)`, `learn(x, y)`, `take_update()`)
on a synthetic stream of 10 inputs with one reading an hour (every sample moves the clock, so every sample pays
the discount), `K` Gaussian kernels of `D` random frequencies each (`F = 2D + 1` features): FedBNR without
forgetting, FedBNR with a 24 h half-life, and `fedbnr-halflives` with its default half-lives (none, 7 d, 1 d, 3 h).
The three are timed in turn in one process, `R` rounds, best of each; the ratios to FedBNR without forgetting are
the figures to read. To compare two versions of the code, run this alternately with each on `PYTHONPATH`.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

if not os.environ.get("PYTHONPATH"):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from streamfed import algorithms  # noqa: E402
from streamfed.fleet.config import FleetConfig  # noqa: E402

D_IN = 10


def learner(algorithm: str, kernels: int, features: int, params: dict[str, Any]) -> Any:
    widths = np.geomspace(0.3, 3.0, kernels)
    cfg = FleetConfig(fleet="b", algorithm=algorithm, n_inputs=D_IN, n_features=features,
                      kernels=[f"gaussian:{w:.4g}" for w in widths], params=params)
    return algorithms.get(algorithm).learner(cfg, "a", 0)


def cost(lr: Any, X: np.ndarray, y: np.ndarray, ts: np.ndarray) -> float:
    """ms per sample over the stream."""
    lr.observe_time(float(ts[0]) - 3600.0)  # (on the stream's clock: untold, a learner takes the wall clock)
    lr.learn(X[0], float(y[0]))  # warm (compiled kernels loaded)
    t0 = time.perf_counter()
    for x, yi, t in zip(X, y, ts, strict=True):
        lr.observe_time(float(t))
        lr.learn(x, float(yi))
        lr.take_update()
    return (time.perf_counter() - t0) / len(y) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--kernels", type=int, default=16)
    ap.add_argument("--features", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    X = np.clip(rng.standard_normal((args.steps, D_IN)), -5, 5)
    y = np.sin(X[:, 0]) + 0.3 * X[:, 1] + 0.1 * rng.standard_normal(args.steps)
    ts = 1.36e9 + 3600.0 * np.arange(args.steps)
    runs = {"fedbnr, no forgetting": ("fedbnr", {}),
            "fedbnr, half-life 24 h": ("fedbnr", {"half_life_s": 86400.0}),
            "fedbnr-halflives (none, 7 d, 1 d, 3 h)": ("fedbnr-halflives", {})}
    best = dict.fromkeys(runs, np.inf)
    for _ in range(args.rounds):
        for name, (alg, params) in runs.items():
            best[name] = min(best[name], cost(learner(alg, args.kernels, args.features, params), X, y, ts))
    base = best["fedbnr, no forgetting"]
    print(f"{args.kernels} kernels, F = {2 * args.features + 1}, {args.steps} hourly samples, best of {args.rounds}:")
    for name, ms in best.items():
        print(f"| {name} | {ms:.3f} ms | {ms / base:.2f} |")


if __name__ == "__main__":
    main()
