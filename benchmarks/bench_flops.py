"""FLOPs: the random-feature map and FedBNR's rank-one update as a fraction of this machine's peak.

    .venv/bin/python benchmarks/bench_flops.py [--out benchmarks/results/flops.md] [--quick]

Peak (the peer): a float64 matrix product (`numpy.matmul`, OpenBLAS, n = 1024, 2n³ flops) on one
thread (`OPENBLAS_NUM_THREADS=1` is set before numpy is imported). Subjects, timed in the same
rounds, interleaved with the peak:

* `RFFBank.transform_into` (one sample, as a learner calls it) and `rff_transform_many` (a batch of
  1,000 samples: the same kernel without the per-call dispatch), at several (N, D, d);
* FedBNR's rank-one Cholesky update `chol_update` of the augmented `(F+1)×(F+1)` factor, and the
  whole per-sample `FedBNRClient.learn` (features, update, staging of the statistics).

Flop counts (a multiply-add is 2): angles `V x` = 2·N·D·d; `sincos` (the fdlibm polynomials of
`streamfed.core.numerics`, counted operation by operation) 42 per angle, the scale 2 more, so features
cost 2·N·D·d + 44·N·D. `chol_update` on an n×n factor: 6 per off-diagonal entry of the upper
triangle plus 8 per row, 3n² + 5n. `learn`: features + `chol_update` (n = F + 1) + the staged
scatter (the upper triangle of φφᵀ and φy, F² + 3F per sample, amortised).
"""

from __future__ import annotations

import os

os.environ["OPENBLAS_NUM_THREADS"] = "1"
os.environ["OMP_NUM_THREADS"] = "1"
os.environ["MKL_NUM_THREADS"] = "1"

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from streamfed.algorithms.fedbnr._kernels import chol_update  # noqa: E402
from streamfed.core.compiled import features as feature_kernels  # noqa: E402
from streamfed.core.features import RFFBank, gaussian_dictionary  # noqa: E402
from streamfed.evaluation.bench import load_average, machine, write_section  # noqa: E402

SINCOS_FLOPS = 42
SCALE_FLOPS = 2


def feature_flops(n: int, d_feat: int, d: int) -> int:
    return 2 * n * d_feat * d + (SINCOS_FLOPS + SCALE_FLOPS) * n * d_feat


def chol_flops(n: int) -> int:
    return 3 * n * n + 5 * n


def timed(fn, min_time: float) -> float:
    """Seconds per call: calls repeated until `min_time` has passed."""
    fn()
    n, t = 1, 0.0
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t = time.perf_counter() - t0
        if t >= min_time:
            return t / n
        n = max(n * 2, int(n * min_time / max(t, 1e-9) * 1.2))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    rounds, min_time, nmat = (2, 0.05, 512) if args.quick else (args.rounds, 0.3, 1024)
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((nmat, nmat)), rng.standard_normal((nmat, nmat))
    c = np.empty((nmat, nmat))

    feat_sizes = [(8, 50, 4), (16, 100, 10), (64, 100, 16), (16, 400, 10)]
    chol_sizes = [101, 401]
    if args.quick:
        feat_sizes, chol_sizes = feat_sizes[:2], chol_sizes[:1]
    feats = []
    for n, dd, d in feat_sizes:
        bank = RFFBank(gaussian_dictionary(n), dd, d, seed=1)
        x = rng.uniform(-1, 1, d)
        xs = rng.uniform(-1, 1, (1000, d))
        out1, outm = np.empty((n, 2 * dd)), np.empty((1000, n, 2 * dd))
        feats.append({"N": n, "D": dd, "d": d, "flops": feature_flops(n, dd, d),
                      "one": (lambda bank=bank, x=x, out1=out1: bank.transform_into(x, out1)),
                      "many": (lambda bank=bank, xs=xs, outm=outm:
                               feature_kernels.rff_transform_many(bank.frequency_matrix, xs, outm))})
    chols = []
    for f in chol_sizes:
        nn = f + 1
        m = rng.standard_normal((nn, 4 * nn))
        r0 = np.linalg.cholesky(m @ m.T / (4 * nn)).T.copy()  # upper factor, well conditioned
        xs = rng.standard_normal((64, nn)) * 0.01
        state = {"r": r0.copy(), "i": 0}

        def one_update(state=state, xs=xs):
            x = xs[state["i"] & 63].copy()  # chol_update destroys x
            state["i"] += 1
            chol_update(state["r"], x)

        from streamfed import algorithms
        from streamfed.fleet.config import FleetConfig

        cfg = FleetConfig(fleet="flops", algorithm="fedbnr", n_inputs=8, n_kernels=1, n_features=(f - 1) // 2,
                          kernels=["gaussian:1.0"])
        client = algorithms.get(cfg.algorithm).learner(cfg, "c", 0)
        lx, ly = rng.uniform(-1, 1, (4096, 8)), rng.normal(size=4096)
        lstate = {"i": 0}

        def learn(client=client, lx=lx, ly=ly, lstate=lstate):
            i = lstate["i"] & 4095
            lstate["i"] += 1
            client.learn(lx[i], ly[i])

        copy_cost = {"x": xs[0]}
        chols.append({"F": f, "n": nn, "flops": chol_flops(nn),
                      "learn_flops": feature_flops(1, (f - 1) // 2, 8) + chol_flops(nn) + f * f + 3 * f,
                      "update": one_update, "copy": (lambda c=copy_cost: c["x"].copy()), "learn": learn})

    t_peak, t_one, t_many, t_chol, t_copy, t_learn = [], [[] for _ in feats], [[] for _ in feats], \
        [[] for _ in chols], [[] for _ in chols], [[] for _ in chols]
    for _ in range(rounds):  # every round: the peak, then every subject
        t_peak.append(timed(lambda: np.matmul(a, b, out=c), min_time))
        for i, fc in enumerate(feats):
            t_one[i].append(timed(fc["one"], min_time))
            t_many[i].append(timed(fc["many"], min_time) / 1000)
        for i, ch in enumerate(chols):
            t_chol[i].append(timed(ch["update"], min_time))
            t_copy[i].append(timed(ch["copy"], min_time))
            t_learn[i].append(timed(ch["learn"], min_time))
    peak = 2 * nmat**3 / float(np.median(t_peak)) / 1e9
    rows_f, rows_c = [], []
    for i, fc in enumerate(feats):
        one, many = float(np.median(t_one[i])), float(np.median(t_many[i]))
        rows_f.append({"N": fc["N"], "D": fc["D"], "d": fc["d"], "flops": fc["flops"], "one_us": one * 1e6,
                       "many_us": many * 1e6, "one_gflops": fc["flops"] / one / 1e9,
                       "many_gflops": fc["flops"] / many / 1e9,
                       "one_fraction": fc["flops"] / one / 1e9 / peak,
                       "many_fraction": fc["flops"] / many / 1e9 / peak})
    for i, ch in enumerate(chols):
        upd = max(float(np.median(t_chol[i])) - float(np.median(t_copy[i])), 1e-9)  # minus the copy of x
        learn = float(np.median(t_learn[i]))
        rows_c.append({"F": ch["F"], "n": ch["n"], "flops": ch["flops"], "update_us": upd * 1e6,
                       "update_gflops": ch["flops"] / upd / 1e9, "update_fraction": ch["flops"] / upd / 1e9 / peak,
                       "learn_flops": ch["learn_flops"], "learn_us": learn * 1e6,
                       "learn_gflops": ch["learn_flops"] / learn / 1e9,
                       "learn_fraction": ch["learn_flops"] / learn / 1e9 / peak})
    lines = [
        "## FLOPs: feature map and rank-one update vs this machine's peak",
        "",
        "Command: `.venv/bin/python benchmarks/bench_flops.py`. Peak (peer, same rounds): float64 "
        f"`numpy.matmul` n = {nmat} on one OpenBLAS thread = **{peak:.1f} GFLOP/s** (median of {rounds} "
        "rounds, each subject timed between two peaks). Flop counts as in the script's docstring "
        "(a multiply-add = 2; `sincos` = 42 counted operations per angle). "
        f"Machine: {machine()}; load average at the end {load_average()}.",
        "",
        "| N | D | d | flops / sample | one sample µs | GFLOP/s | of peak | batch of 1000: µs / sample | "
        "GFLOP/s | of peak |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows_f:
        lines.append(f"| {r['N']} | {r['D']} | {r['d']} | {r['flops']:,} | {r['one_us']:.2f} | {r['one_gflops']:.2f} | "
                     f"{r['one_fraction']:.1%} | {r['many_us']:.2f} | {r['many_gflops']:.2f} | "
                     f"{r['many_fraction']:.1%} |")
    lines += ["", "FedBNR (one kernel, F = 2D + 1, d = 8): the rank-one update of the augmented factor alone, and "
              "the whole `FedBNRClient.learn` per sample:", "",
              "| F | chol_update flops | µs | GFLOP/s | of peak | learn flops (est.) | learn µs | GFLOP/s | of peak |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in rows_c:
        lines.append(f"| {r['F']} | {r['flops']:,} | {r['update_us']:.2f} | {r['update_gflops']:.2f} | "
                     f"{r['update_fraction']:.1%} | {r['learn_flops']:,} | {r['learn_us']:.2f} | "
                     f"{r['learn_gflops']:.2f} | {r['learn_fraction']:.1%} |")
    lines += ["", "Reading it: the matrix product runs fused multiply-adds on full vector registers from cache; "
              "the feature map's `sincos` is a chain of dependent multiplies and adds (no FMA pairing in the "
              "count) plus a floor, selects and the row copies, and the rank-one update is a sequence of n "
              "dependent row rotations of shrinking length — latency-bound, memory-bound for large n."]
    write_section(args.out, lines, {"peak_gflops": peak, "matmul_n": nmat, "features": rows_f, "fedbnr": rows_c},
                  quick=args.quick)


if __name__ == "__main__":
    main()
