"""The `streamfed replay` command with FedBNR, timed as a user runs it, next to FSGP in the same run (issue 29).

    .venv/bin/python benchmarks/bench_fedbnr_replay.py                           # this checkout only
    .venv/bin/python benchmarks/bench_fedbnr_replay.py --before /path/to/older/checkout \\
        --out benchmarks/results/fedbnr_replay.md

Not a test: the figures go to `benchmarks/results/fedbnr_replay.{md,json}` and docs/benchmarks.md.

Each run is a fresh process, `python -m streamfed.cli replay --dataset beijing-air -a ALG --steps 300 --out TMP`
(defaults otherwise: 16 Gaussian kernels, D = 100, so F = 201 for FedBNR; plots written), with
`OPENBLAS_NUM_THREADS=1`; timed: its wall time and its CPU time (user + system, from `getrusage` of the
children — on a shared machine the CPU time is the steadier figure). Every command runs twice in a row: the
second invocation is the repeated replay, and the process counts the numba compilations it did (cache misses of
every numba dispatcher it loaded; 0 when the compiled kernels came from numba's cache or the ahead-of-time
build). With `--before`, the same commands run from another checkout (its own sources on `PYTHONPATH`) in the
same run, interleaved, so before and after see the same machine. The MSE and average regret each run prints are
recorded, to show the figures did not move.

Where each run's CPU time goes, measured inside the child: `start-up` (the imports of the CLI and what it loads, its
options and algorithm registry), `load` (reading and normalising the Beijing streams), `replay` (the replay loop:
`streamfed.evaluation.replay.replay`) and `report` (the results files and the plots).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# What runs in the child: the CLI, then (at exit) the numba compilations it did and the compiled backend.
_CHILD = r"""
import time
_t0 = time.process_time()
import atexit, gc, json, os, sys
_marks = []  # (the phase that ends here, CPU seconds of the process at that point)
def _report():
    misses = hits = 0
    if "numba" in sys.modules:
        from numba.core.registry import CPUDispatcher
        for o in gc.get_objects():
            if isinstance(o, CPUDispatcher):
                st = o.stats
                misses += sum(st.cache_misses.values())
                hits += sum(st.cache_hits.values())
    from streamfed.core import compiled
    phases, prev = {}, _t0  # CPU seconds per phase; "report": the tables and plots after the replay
    for name, t in _marks + [("report", time.process_time())]:
        phases[name] = phases.get(name, 0.0) + t - prev
        prev = t
    with open(os.environ["BENCH_REPORT"], "w") as fh:
        json.dump({"compiles": misses, "cache_hits": hits, "backend": compiled.backend(), "phases": phases,
                   "numba_imported": "numba" in sys.modules}, fh)
atexit.register(_report)
sys.argv = ["streamfed"] + sys.argv[1:]
from streamfed.cli import app
import streamfed.cli.replay as _cli
_marks.append(("imports", time.process_time()))
def _phase(name, f):
    def run(*a, **k):
        _marks.append(("other", time.process_time()))
        out = f(*a, **k)
        _marks.append((name, time.process_time()))
        return out
    return run
for _name, _attr in (("load", "_load_fleet"), ("replay", "_replay_all")):
    if hasattr(_cli, _attr):  # (an older checkout may lack them: its phases are then "other")
        setattr(_cli, _attr, _phase(_name, getattr(_cli, _attr)))
app()
"""


def run_once(tree: Path, algorithm: str, steps: int) -> dict:
    """One fresh `streamfed replay` process from checkout `tree`: wall and CPU seconds, compilations, figures."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        env = dict(os.environ, PYTHONPATH=str(tree), OPENBLAS_NUM_THREADS="1", BENCH_REPORT=str(report))
        cmd = [sys.executable, "-c", _CHILD, "replay", "--dataset", "beijing-air", "-a", algorithm,
               "--steps", str(steps), "--out", str(Path(tmp) / "out")]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run(cmd, env=env, check=True, cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        summary = json.loads((Path(tmp) / "out" / "results.json").read_text())["algorithms"][algorithm]
        child = json.loads(report.read_text())
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu, "replay_wall_s": summary["wall_s"], "mse": summary["mse_mean"],
            "avg_regret": summary["avg_regret"], **child}


def commit_of(tree: Path) -> str:
    out = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip() or "?"


def variants(steps: int, repeats: int) -> str:
    """The replay loop of FedBNR's command in this process, as it is and with one change each, interleaved: the fleet
    server's evidence fit by the 1-d profile search instead of the grid (`fit_hyperparameters(search="profile")`),
    and the regret read at 50 checkpoints instead of 200. CPU seconds of `replay` alone, the figures it prints and,
    for the search, the largest relative change of the server's final σ, λ. Markdown lines."""
    import numpy as np

    from streamfed.algorithms.fedbnr import server as fleet_server
    from streamfed.evaluation.datasets import load_beijing
    from streamfed.evaluation.replay import AlgorithmConfig, replay

    fit = fleet_server.fit_hyperparameters
    fleet = load_beijing(normalisation="paper", split="station", steps=steps)
    cases = {"as it is (grid search, 200 checkpoints)": ("grid", 200), "profile search": ("profile", 200),
             "50 checkpoints": ("grid", 50)}
    out: dict[str, list] = {k: [] for k in cases}
    fitted = {}
    for _ in range(repeats):
        for name, (search, checkpoints) in cases.items():
            fleet_server.fit_hyperparameters = (  # type: ignore[assignment]
                fit if search == "grid" else (lambda *a, **k: fit(*a, **{**k, "search": "profile"})))
            try:
                c0 = time.process_time()
                r = replay(fleet, "fedbnr", AlgorithmConfig(), steps=steps, n_checkpoints=checkpoints)
                cpu = time.process_time() - c0
            finally:
                fleet_server.fit_hyperparameters = fit  # type: ignore[assignment]
            server = r.arrangement.aggregations[0].server
            fitted[name] = (server.sigma.copy(), server.lam.copy())
            out[name].append((cpu, r.mse, r.avg_regret, os.getloadavg()[0]))
            print(f"{name}: {cpu:.2f} s CPU, MSE {r.mse:.10f}, R/T {r.avg_regret:.6e}", file=sys.stderr)
    base = fitted["as it is (grid search, 200 checkpoints)"]
    lines = ["| replay loop | CPU s (each run) | load | MSE | avg R/T | max rel. change of σ, λ |",
             "|---|---|---|---|---|---|"]
    for name, rs in out.items():
        sig, lam = fitted[name]
        change = max(float(np.max(np.abs(sig / base[0] - 1))), float(np.max(np.abs(lam / base[1] - 1))))
        lines.append(f"| {name} | {' / '.join(f'{c:.2f}' for c, *_ in rs)} | "
                     f"{' / '.join(f'{x[3]:.1f}' for x in rs)} | {rs[0][1]:.10f} | {rs[0][2]:.6e} | {change:.1e} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", type=int, default=0, metavar="REPEATS",
                    help="only the replay loop in this process, as it is and with one change each (see variants)")
    ap.add_argument("--before", type=Path, help="another checkout to run the same commands from (before)")
    ap.add_argument("--before-commit", help="the commit --before holds, when it is not a git checkout")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--algorithms", default="fedbnr,fsgp")
    ap.add_argument("--out", type=Path, help="markdown file (a .json next to it)")
    args = ap.parse_args()
    if args.variants:
        load0 = os.getloadavg()
        table = variants(args.steps, args.variants)
        load1 = os.getloadavg()
        cmd = " ".join(["benchmarks/bench_fedbnr_replay.py"] + sys.argv[1:])
        print(f"Command: `.venv/bin/python {cmd}`; commit {commit_of(ROOT)}; load average {load0[0]:.2f} at the "
              f"start, {load1[0]:.2f} at the end.\n\n{table}")
        return
    trees = ([("before", args.before.resolve())] if args.before else []) + [("after", ROOT)]
    algs = args.algorithms.split(",")
    load0 = os.getloadavg()
    runs: dict[str, dict[str, list[dict]]] = {label: {a: [] for a in algs} for label, _ in trees}
    for invocation in range(2):  # first, then the repeated replay
        for a in algs:
            for label, tree in trees:
                r = run_once(tree, a, args.steps)
                runs[label][a].append(r)
                print(f"{label:6s} {a:7s} invocation {invocation + 1}: {r['wall_s']:.1f} s wall, {r['cpu_s']:.1f} s "
                      f"CPU, {r['compiles']} numba compilations, MSE {r['mse']:.6f}, R/T {r['avg_regret']:.3e}",
                      file=sys.stderr)
    load1 = os.getloadavg()
    commits = {label: (args.before_commit if label == "before" and args.before_commit else commit_of(tree))
               for label, tree in trees}
    cmd = " ".join(["benchmarks/bench_fedbnr_replay.py"] + sys.argv[1:])
    lines = [
        "## FedBNR replay: the `streamfed replay` command at the speed of the step",
        "",
        f"The command `streamfed replay --dataset beijing-air -a ALG --steps {args.steps}` (defaults: 16 Gaussian "
        "kernels, D = 100 — F = 201 for FedBNR —, plots written, `OPENBLAS_NUM_THREADS=1`) timed as a fresh "
        "process, FedBNR next to FSGP in the same run, each twice in a row (the second invocation is the repeated "
        "replay: numba compilations counted in the process)"
        + (", from the checkout before (`--before`) and this one, interleaved." if args.before else "."),
        "",
        f"Command: `.venv/bin/python {cmd}`",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores (shared), Python {platform.python_version()}; "
        f"load average {load0[0]:.2f} at the start, {load1[0]:.2f} at the end (CPU seconds are the steadier "
        "figure on a loaded machine). Commits: " + ", ".join(f"{k} {v}" for k, v in commits.items()) + ".",
        "",
        "| checkout | algorithm | invocation | wall s | CPU s | CPU / FSGP's | CPU s: start-up / load / replay / "
        "report | numba compilations | backend | MSE | avg R/T |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, _ in trees:
        for a in algs:
            for i, r in enumerate(runs[label][a]):
                peer = runs[label].get("fsgp", [None, None])[i]
                ratio = f"{r['cpu_s'] / peer['cpu_s']:.2f}" if peer else "—"
                ph = dict(r.get("phases", {}))
                ph["start-up"] = ph.get("imports", math.nan) + ph.get("other", 0.0)
                split = " / ".join(f"{ph.get(k, math.nan):.2f}" for k in ("start-up", "load", "replay", "report"))
                lines.append(f"| {label} | {a} | {i + 1} | {r['wall_s']:.1f} | {r['cpu_s']:.1f} | {ratio} | {split} | "
                             f"{r['compiles']} | {r['backend']} | {r['mse']:.6f} | {r['avg_regret']:.3e} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        args.out.with_suffix(".json").write_text(json.dumps(
            {"command": cmd, "steps": args.steps, "load": [load0, load1], "runs": runs,
             "commits": commits}, indent=1))


if __name__ == "__main__":
    main()
