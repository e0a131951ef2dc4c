"""The cost of FSGP's forgetting on the time base (`half_life_s`, docs/algorithms.md, FSGP "Forgetting").

    .venv/bin/python benchmarks/bench_fsgp_forgetting.py [--steps N] [--m 32,64,128] [--out PATH.md]

µs per sample of an `FSGPLearner` as an agent drives it (`observe_time(ts)`, `learn(x, y)`, `take_update()`) on
FSGP's defaults (personalised, calibrated, local hyperparameter fits amortised), without and with a 24 h
half-life, on a synthetic stream of 10 inputs with one reading an hour (every sample moves the clock, so every
sample pays the discount: a refactorisation of `C + σ⁻²P` for the working posterior and for the own-samples
expert). The two are timed in turn in one process, best of 3 rounds; the ratio is the figure to read.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from streamfed.algorithms.fsgp import ALGORITHM  # noqa: E402
from streamfed.fleet.config import FleetConfig  # noqa: E402

D = 10


def cost(m: int, half_life_s: float | None, X: np.ndarray, y: np.ndarray, ts: np.ndarray) -> float:
    """µs per sample over the stream, one fresh learner."""
    cfg = FleetConfig(fleet="b", algorithm="fsgp", n_inputs=D, params={"n_inducing": m, "half_life_s": half_life_s})
    learner = ALGORITHM.learner(cfg, "a", 0)
    learner.observe_time(float(ts[0]) - 3600.0)  # (on the stream's clock: untold, a learner takes the wall clock)
    learner.learn(X[0], float(y[0]))  # warm (compiled kernels loaded)
    t0 = time.perf_counter()
    for x, yi, t in zip(X, y, ts, strict=True):
        learner.observe_time(float(t))
        learner.learn(x, float(yi))
        learner.take_update()
    return (time.perf_counter() - t0) / len(y) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--m", default="32,64,128")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    X = np.clip(rng.standard_normal((args.steps, D)), -5, 5)
    y = np.sin(X[:, 0]) + 0.3 * X[:, 1] + 0.1 * rng.standard_normal(args.steps)
    ts = 1.36e9 + 3600.0 * np.arange(args.steps)
    rows = []
    for m in (int(v) for v in args.m.split(",")):
        best = {None: np.inf, 86400.0: np.inf}
        for _ in range(3):
            for h in best:
                best[h] = min(best[h], cost(m, h, X, y, ts))
        rows.append((m, best[None], best[86400.0]))
        print(f"M={m}: {best[None]:.1f} µs without, {best[86400.0]:.1f} µs with a 24 h half-life", flush=True)
    lines = [
        "# FSGP: the cost of forgetting on the time base",
        "",
        f"Command: `.venv/bin/python benchmarks/bench_fsgp_forgetting.py --steps {args.steps} --m {args.m}`. "
        f"Machine: {platform.machine()}, {os.cpu_count()} cores (shared), Python {platform.python_version()}, "
        "OPENBLAS_NUM_THREADS=1.",
        "",
        f"µs per sample of an `FSGPLearner` on FSGP's defaults (personalised, calibrated, local fits amortised), "
        f"d = {D}, one reading an hour (every sample moves the clock), {args.steps} samples, best of 3, the two "
        "timed in turn.",
        "",
        "| M | no forgetting | half-life 24 h | ratio |",
        "|---|---|---|---|",
        *(f"| {m} | {a:.1f} | {b:.1f} | {b / a:.2f} |" for m, a, b in rows),
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
