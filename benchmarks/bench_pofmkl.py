"""POF-MKL client step (predict + learn + produce the update) vs the plain NumPy oracle, same run.

    .venv/bin/python benchmarks/bench_pofmkl.py            # prints a markdown section
    .venv/bin/python benchmarks/bench_pofmkl.py --out benchmarks/results/pofmkl.md

Not a test: the figures go to docs/benchmarks.md. Median over many single steps (each timed with
perf_counter_ns), after a warm-up that also triggers numba compilation.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.oracles

from streamfed.algorithms.pofmkl.client import POFMKLClient  # noqa: E402
from streamfed.core import compiled  # noqa: E402
from streamfed.core.features import RFFBank, gaussian_dictionary  # noqa: E402
from tests.oracles.pofmkl import OracleClient  # noqa: E402


def time_steps(fn, n: int, clock=time.perf_counter_ns) -> np.ndarray:
    out = np.empty(n)
    for i in range(n):
        t0 = clock()
        fn(i)
        out[i] = clock() - t0
    return out / 1000.0  # µs



def other_backend(args: tuple, backend: str) -> float:
    """The client step's median on another kernel backend (a fresh process: the backend is per process)."""
    res = subprocess.run([sys.executable, __file__, "--fast-only", json.dumps(args)], capture_output=True, text=True,
                         check=True, env={**os.environ, "STREAMFED_KERNELS": backend})
    return float(json.loads(res.stdout.strip().splitlines()[-1])["fast_median_us"])


def bench(n_kernels: int, n_feat: int, d: int, m: int, xi: float, reps: int, fast_only: bool = False) -> dict:
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((reps, d))
    xs /= np.linalg.norm(xs, axis=1, keepdims=True)
    ys = rng.uniform(0, 1, reps)
    bank = RFFBank(gaussian_dictionary(n_kernels), n_feat, d, seed=1)
    client = POFMKLClient(bank, eta=0.05, lam=1e-4, xi=xi, bin_size=m, rng=1)
    client.set_global(rng.standard_normal((n_kernels, bank.dim)) * 0.1, 1)
    for i in range(2000):  # warm-up (and numba compile)
        client.step(xs[i % reps], ys[i % reps])
    fast = time_steps(lambda i: client.step(xs[i], ys[i]), reps)
    if fast_only:
        return {"fast_median_us": float(np.median(fast)), "backend": compiled.BACKEND}
    oracle = OracleClient(bank.frequencies, 0.05, 1e-4, xi, m)
    theta = client.theta
    u = np.random.default_rng(2).random(reps)
    n_or = min(reps, 3000)
    for i in range(50):
        oracle.step(theta, xs[i], ys[i], u[i])
    slow = time_steps(lambda i: oracle.step(theta, xs[i], ys[i], u[i]), n_or)
    return {
        "N": n_kernels, "D": n_feat, "d": d, "M": m, "xi": xi,
        "fast_median_us": float(np.median(fast)), "fast_p90_us": float(np.percentile(fast, 90)),
        "oracle_median_us": float(np.median(slow)),
        "speedup": float(np.median(slow) / np.median(fast)),
        "upload_numbers": m * bank.dim,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=50000)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--fast-only", help=argparse.SUPPRESS)  # internal: one configuration's step, as JSON
    args = ap.parse_args()
    if args.fast_only:
        print(json.dumps(bench(*json.loads(args.fast_only), fast_only=True)))
        return
    configs = [(20, 50, 10, 1, 0.1, args.reps), (20, 50, 10, 4, 0.1, args.reps),
               (64, 100, 16, 1, 0.1, args.reps // 2), (64, 100, 16, 4, 0.1, args.reps // 2)]
    other = "jit" if compiled.BACKEND == "aot" else "aot"
    if other == "aot":
        from streamfed.core.compiled.build import build

        build()
    rows = []
    for c in configs:
        r = bench(*c)
        r["other_backend"], r["other_median_us"] = other, other_backend(c, other)
        rows.append(r)
    lines = [
        "## POF-MKL client step vs the NumPy oracle",
        "",
        "Command: `.venv/bin/python benchmarks/bench_pofmkl.py`. One client step = predict + learn +",
        "produce the update (`POFMKLClient.step`), timed one by one; the oracle is the plain NumPy",
        "transcription kept in `tests/oracles/pofmkl.py`, run in the same process on the same samples.",
        "Times are `perf_counter_ns` around each single step (so they include the clock call), after a",
        "2,000-step warm-up; the load average is printed below the table. The kernels run from the "
        f"{'ahead-of-time build' if compiled.BACKEND == 'aot' else 'numba JIT'} (`streamfed.core.compiled`); the "
        f"column '{other}' is the same step on the {'numba JIT' if other == 'jit' else 'ahead-of-time build'}, "
        "measured in a fresh process right after.",
        f"Machine: {platform.processor() or platform.machine()}, {platform.python_version()}, "
        f"numpy {np.__version__}; η=0.05, λ=1e-4, ξ=0.1 (so the sort runs every step).",
        "",
        f"| N | D | d | M | upload (numbers) | step median µs ({compiled.BACKEND}) | step p90 µs | oracle median µs "
        f"| speed-up | step median µs ({other}) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['N']} | {r['D']} | {r['d']} | {r['M']} | {r['upload_numbers']} | "
                     f"{r['fast_median_us']:.2f} | {r['fast_p90_us']:.2f} | {r['oracle_median_us']:.1f} | "
                     f"{r['speedup']:.0f}× | {r['other_median_us']:.2f} |")
    lines.append("")
    lines.append("Load average (1, 5, 15 min) at the end: " + ", ".join(f"{v:.2f}" for v in os.getloadavg()))
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
