"""The cost of FSGP's forgetting on the time base (`half_life_s`, docs/algorithms.md, FSGP "Forgetting").

    .venv/bin/python benchmarks/bench_fsgp_forgetting.py [--steps N] [--m 32,64,128] [--beijing STEPS]
        [--half-lives 24,72,168] [--out PATH.md]

µs per sample of an `FSGPLearner` as an agent drives it (`observe_time(ts)`, `learn(x, y)`, `take_update()`) on
FSGP's defaults (personalised, calibrated, local hyperparameter fits amortised), without and with a 24 h
half-life, on a synthetic stream of 10 inputs with one reading an hour (every sample moves the clock, so every
sample pays the discount: a refactorisation of `C + σ⁻²P` for the working posterior and for the own-samples
expert). The two are timed in turn in one process, best of 3 rounds; the ratio is the figure to read.

With `--beijing STEPS`: accuracy too — the 12 Beijing stations (`normalisation="online"`, every client its
station, the first STEPS samples each, readings discounted by their own hourly timestamps) replayed by
`streamfed.evaluation.replay.replay` with FSGP's defaults and with each half-life of `--half-lives` (hours):
prequential MSE, mean NLPD and 95% coverage pooled over the stations, and the stations whose MSE the half-life
lowers (seed 0).
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


def accuracy(steps: int, half_lives_h: list[float]) -> list[str]:
    """The Beijing table (module docstring)."""
    from streamfed.evaluation.datasets.beijing import load_beijing
    from streamfed.evaluation.replay import AlgorithmConfig, replay

    fleet = load_beijing(normalisation="online", split="station", steps=steps)
    rows, base = [], None
    for h in [None, *half_lives_h]:
        t0 = time.perf_counter()
        params = {} if h is None else {"half_life_s": h * 3600.0}
        res = replay(fleet, "fsgp", AlgorithmConfig(params={"fsgp": params}), seed=0, n_checkpoints=2)
        e2, var = np.concatenate(res.sq_errors), np.concatenate(res.variances)
        ok = ~np.isnan(e2)
        e2, var = e2[ok], var[ok]
        per = [float(np.nanmean(e)) for e in res.sq_errors]
        out = (e2.mean(), np.mean(0.5 * np.log(2 * np.pi * var) + 0.5 * e2 / var), np.mean(e2 <= 1.959964**2 * var),
               per, time.perf_counter() - t0)
        base = out if base is None else base
        label = "none (default)" if h is None else f"{h:g} h"
        better = "" if h is None else str(sum(a < b for a, b in zip(per, base[3], strict=True)))
        rows.append(f"| {label} | {out[0]:.4f} | {out[0] / base[0]:.3f} | {out[1]:.3f} | {out[2]:.3f} | {better} "
                    f"| {out[4]:.0f} |")
        print(rows[-1], flush=True)
    return ["", f"Beijing, 12 stations, first {steps} samples each, `online` normalisation (standardised units), "
            "FSGP's defaults otherwise, seed 0:", "",
            "| half-life | MSE | MSE / none | mean NLPD | 95% coverage | stations with lower MSE | run (s) |",
            "|---|---|---|---|---|---|---|", *rows, ""]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--m", default="32,64,128")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--beijing", type=int, default=0, help="also score accuracy on Beijing's first STEPS samples")
    ap.add_argument("--half-lives", default="24,72,168", help="hours, for --beijing")
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
        f"Command: `.venv/bin/python benchmarks/bench_fsgp_forgetting.py --steps {args.steps} --m {args.m}"
        + (f" --beijing {args.beijing} --half-lives {args.half_lives}" if args.beijing else "") + "`. "
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
    if args.beijing:
        lines += accuracy(args.beijing, [float(v) for v in args.half_lives.split(",")])
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
