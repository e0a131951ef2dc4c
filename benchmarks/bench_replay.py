"""Replay speed: POF-MKL (N = 16, D = 100, M = 1) over all 12 Beijing stations (~384k client steps).

    .venv/bin/python benchmarks/bench_replay.py [--out benchmarks/results/replay.md] [--quick]

Side by side in the same run: the same replay with OFSKL (one kernel: the floor of the per-step
overhead of the replay loop itself) and a projection of the NumPy oracle driven the same way
(timed on the first 300 steps of every station). `--quick`: the first 3,000 steps of every station (a smoke
run: the figures are indicative only).
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from streamfed.algorithms import get  # noqa: E402
from streamfed.algorithms.pofmkl import POFMKLParams  # noqa: E402
from streamfed.core.features import RFFBank  # noqa: E402
from streamfed.evaluation.datasets import load_beijing  # noqa: E402
from streamfed.evaluation.replay import AlgorithmConfig, replay  # noqa: E402
from tests.oracles.pofmkl import OracleClient, oracle_server_update  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    ap.add_argument("--quick", action="store_true", help="the first 3,000 steps of every station")
    args = ap.parse_args()
    steps = 3000 if args.quick else None
    fleet = load_beijing("paper", "station")
    cfg = AlgorithmConfig(n_kernels=16, n_features=100, bin_size=1, eta=0.02)
    replay(fleet, "pofmkl", cfg, steps=200)  # warm-up / numba cache
    steps_total = sum(len(s.y) if steps is None else min(steps, len(s.y)) for s in fleet.streams)
    rows: list[tuple[str, float, float, float | None]] = []
    for name in ("pofmkl", "ofskl"):
        r = replay(fleet, name, cfg, seed=0, steps=steps)
        rows.append((name, r.wall_s, steps_total / r.wall_s, r.mse))
    # the oracle, driven in lock-step on the first 300 steps of each station, projected to the full run
    bank = RFFBank(cfg.specs(), cfg.n_features, fleet.streams[0].X.shape[1], seed=0)
    p = POFMKLParams(**cfg.params_for(get("pofmkl")))  # the replay's POF-MKL parameters
    oracles = [OracleClient(bank.frequencies, p.eta, p.lam, p.xi, cfg.bin_size) for _ in fleet.streams]
    rng = np.random.default_rng(0)
    theta = np.zeros((bank.n_kernels, bank.dim))
    t0 = time.perf_counter()
    n_or = 300
    for t in range(n_or):
        deltas = [o.step(theta, s.X[t], s.y[t], rng.random())[1] for o, s in zip(oracles, fleet.streams, strict=True)]
        theta = oracle_server_update(theta, deltas)
    per_step = (time.perf_counter() - t0) / (n_or * len(fleet.streams))
    rows.append(("pofmkl NumPy oracle (projected)", per_step * steps_total, 1 / per_step, None))  # MSE not measured
    lines = [
        "## Replay speed on the Beijing fleet",
        "",
        f"Command: `.venv/bin/python benchmarks/bench_replay.py{' --quick' if args.quick else ''}`. 12 stations × "
        f"{'all usable rows' if steps is None else f'the first {steps} usable rows'} "
        f"({steps_total} client steps), lock-step, N = 16 Gaussian kernels, D = 100, M = 1, d = 10. "
        f"Machine: {platform.machine()}, Python {platform.python_version()}.",
        "",
        "| run | wall s | client steps / s | MSE |",
        "|---|---|---|---|",
    ]
    for name, wall, rate, mse in rows:
        lines.append(f"| {name} | {wall:.1f} | {rate:,.0f} | {'–' if mse is None else f'{mse:.6f}'} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
