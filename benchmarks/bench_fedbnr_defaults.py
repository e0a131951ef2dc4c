"""`FedBNRRegressor()` on its defaults, per sample, next to River's LinearRegression recipe — this checkout and an
earlier one, interleaved (issue 29, part 2).

    .venv/bin/python benchmarks/bench_fedbnr_defaults.py --before /path/to/checkout --rounds 6 \\
        --out benchmarks/results/fedbnr_defaults.md

Each round runs one fresh process per checkout (their order alternates round by round), each with the checkout's own
`streamfed` on `PYTHONPATH` and `OPENBLAS_NUM_THREADS=1`. A process times, on `datasets.TrumpApproval()` and
`datasets.ChickWeights()`, River's progressive validation by hand as `benchmarks/bench_progressive.py` does:
`predict_one(x, with_dist=True)` then `learn_one(x, y)`, each call pair timed with `perf_counter_ns` (wall) — and the
whole stream's `thread_time_ns` (CPU) — for `FedBNRRegressor()` and for the reference
`preprocessing.TargetStandardScaler(regressor=preprocessing.StandardScaler() | linear_model.LinearRegression())`,
alternately, `--repeats` times each, after one untimed warm-up pass of each on the first 50 samples. A figure is the
median over the repeats; the ratio is FedBNR's over the reference's in the same process. The load average is read
at the end of each process (the machine is shared: absolute times under load are inflated, the ratios less so).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
REPO = HERE.parents[1]


def worker(repeats: int) -> dict:
    """Run in a checkout's process (its `streamfed` first on `sys.path`): the figures of that checkout."""
    from river import datasets, linear_model, preprocessing

    from streamfed.algorithms.fedbnr.estimator import FedBNRRegressor
    from streamfed.core import compiled

    def reference() -> object:
        return preprocessing.TargetStandardScaler(
            regressor=preprocessing.StandardScaler() | linear_model.LinearRegression())

    def run(make: object, data: list, dist: bool) -> tuple[float, float, float]:
        model = make()  # type: ignore[operator]
        wall = 0
        abs_err = 0.0
        c0 = time.thread_time_ns()
        for x, y in data:
            t0 = time.perf_counter_ns()
            if dist:
                mu = model.predict_one(x, with_dist=True).mu
            else:
                mu = model.predict_one(x)
            model.learn_one(x, y)
            wall += time.perf_counter_ns() - t0
            abs_err += abs(y - mu)
        cpu = time.thread_time_ns() - c0
        return wall / len(data) / 1e3, cpu / len(data) / 1e3, abs_err / len(data)

    streams = {"TrumpApproval": [(dict(x), float(y)) for x, y in datasets.TrumpApproval()],
               "ChickWeights": [(dict(x), float(y)) for x, y in datasets.ChickWeights()]}
    for data in streams.values():
        run(FedBNRRegressor, data[:50], True)
        run(reference, data[:50], False)
    out: dict = {"backend": compiled.backend()}
    for name, data in streams.items():
        ours, ref = [], []
        for _ in range(repeats):
            ours.append(run(FedBNRRegressor, data, True))
            ref.append(run(reference, data, False))
        out[name] = {
            "us": statistics.median(r[0] for r in ours), "cpu_us": statistics.median(r[1] for r in ours),
            "ref_us": statistics.median(r[0] for r in ref), "ref_cpu_us": statistics.median(r[1] for r in ref),
            "mae": ours[0][2]}
        out[name]["ratio"] = out[name]["us"] / out[name]["ref_us"]
        out[name]["cpu_ratio"] = out[name]["cpu_us"] / out[name]["ref_cpu_us"]
    out["load"] = os.getloadavg()[0]
    return out


def run_side(checkout: Path, repeats: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(checkout), "OPENBLAS_NUM_THREADS": "1"}
    res = subprocess.run([sys.executable, str(HERE), "--worker", "--repeats", str(repeats)], cwd=checkout, env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def git_head(checkout: Path) -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=checkout, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", type=Path, default=None, help="an earlier checkout to interleave with this one")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3, help="timed passes of each model per stream and process")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.repeats)))
        return
    sides = {"after": REPO} | ({"before": args.before.resolve()} if args.before else {})
    rows: list[tuple[int, str, dict]] = []
    for r in range(args.rounds):
        order = list(sides) if r % 2 == 0 else list(sides)[::-1]
        for side in order:
            res = run_side(sides[side], args.repeats)
            rows.append((r + 1, side, res))
            t, c = res["TrumpApproval"], res["ChickWeights"]
            print(f"round {r + 1} {side:>6}: TrumpApproval {t['us']:.1f} µs ({t['ratio']:.2f}×, CPU {t['cpu_us']:.1f}),"
                  f" ChickWeights {c['us']:.1f} µs ({c['ratio']:.2f}×, CPU {c['cpu_us']:.1f}), load {res['load']:.1f}",
                  flush=True)
    lines = ["## FedBNRRegressor() on its defaults, before/after interleaved (issue 29, part 2)", "",
             "Command: `.venv/bin/python benchmarks/bench_fedbnr_defaults.py"
             + (f" --before <checkout of {git_head(sides['before'])}>" if "before" in sides else "")
             + f" --rounds {args.rounds} --repeats {args.repeats}`; this checkout: {git_head(REPO)}. µs per sample "
             "(predict_one with_dist + learn_one, wall, median of the repeats; CPU: the stream's thread time), × = "
             "over River's LinearRegression recipe in the same process; load = 1-min load average at the process' "
             "end (2 shared cores).", "",
             "| round | code | TrumpApproval µs | × LR | CPU µs | × LR (CPU) | ChickWeights µs | × LR | CPU µs "
             "| × LR (CPU) | load |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r, side, res in rows:
        t, c = res["TrumpApproval"], res["ChickWeights"]
        lines.append(f"| {r} | {side} | {t['us']:.1f} | {t['ratio']:.2f} | {t['cpu_us']:.1f} | {t['cpu_ratio']:.2f} "
                     f"| {c['us']:.1f} | {c['ratio']:.2f} | {c['cpu_us']:.1f} | {c['cpu_ratio']:.2f} "
                     f"| {res['load']:.1f} |")
    lines += ["", "Medians over the rounds:", "", "| code | TrumpApproval µs | × LR | CPU µs | ChickWeights µs | × LR "
              "| CPU µs | MAE TrumpApproval | MAE ChickWeights |", "|---|---|---|---|---|---|---|---|---|"]
    med: dict[str, dict[str, float]] = {}
    for side in sides:
        res = [x for _, s, x in rows if s == side]
        m = {f"{d}/{k}": statistics.median(x[d][k] for x in res) for d in ("TrumpApproval", "ChickWeights")
             for k in ("us", "ratio", "cpu_us")}
        med[side] = m
        lines.append(f"| {side} | {m['TrumpApproval/us']:.1f} | {m['TrumpApproval/ratio']:.2f} | "
                     f"{m['TrumpApproval/cpu_us']:.1f} | {m['ChickWeights/us']:.1f} | {m['ChickWeights/ratio']:.2f} | "
                     f"{m['ChickWeights/cpu_us']:.1f} | {res[0]['TrumpApproval']['mae']:.6f} | "
                     f"{res[0]['ChickWeights']['mae']:.6f} |")
    if "before" in med:
        a, b = med["after"], med["before"]
        lines += ["", "After / before (medians): " + "; ".join(
            f"{d} time {a[d + '/us'] / b[d + '/us']:.2f}, ratio to LR {a[d + '/ratio'] / b[d + '/ratio']:.2f}, CPU "
            f"{a[d + '/cpu_us'] / b[d + '/cpu_us']:.2f}" for d in ("TrumpApproval", "ChickWeights")) + "."]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
        args.out.with_suffix(".json").write_text(json.dumps({"rows": rows, "medians": med}, indent=1))


if __name__ == "__main__":
    main()
