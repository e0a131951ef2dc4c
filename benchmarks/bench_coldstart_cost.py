"""What one held-out station of the cold-start benchmark costs, before and after, and how its figures move (issue 29).

    .venv/bin/python benchmarks/bench_coldstart_cost.py --before /path/to/older/checkout \\
        --out benchmarks/results/coldstart_cost.md
    .venv/bin/python benchmarks/bench_coldstart_cost.py --thin 0.02,0.1     # also: refits thinned (an experiment)
    .venv/bin/python benchmarks/bench_coldstart_cost.py --simplex 1,0.25,0.05  # also: smaller warm-start simplices
    .venv/bin/python benchmarks/bench_coldstart_cost.py --search nelder-mead,l-bfgs-b --growth 0.01,0.05

Not a test: the figures go to `benchmarks/results/coldstart_cost.{md,json}` and docs/benchmarks.md.

The unit of `benchmarks/bench_coldstart.py --mixture` is one held-out station replayed from its seed's recording
(`leave_one_out_recorded`: the held-out fleet's aggregation fed the other stations' recorded uploads, and the
held-out learner from the join step on), with its configuration (personalised FedBNR, D = 50, Gaussian bandwidth 2,
uploads of 32 samples, join at 8,760, windows 24, 48, 168, 336, 2000). The seed's recording is made once here
(`record_uploads`, its CPU time reported); then each checkout replays the same held-out station in a fresh process
(its own sources on `PYTHONPATH`, `OPENBLAS_NUM_THREADS=1`), interleaved, `--repeats` times: CPU seconds of the
held-out replay alone (`time.process_time`; on a shared machine the steadier figure), and its rows compared with the
first checkout's — bit for bit, and at the digits the tables print (MSE 4 decimals, NLPD and coverage 3).

`--thin G` (an experiment from before the product had a schedule; `--growth` replays the product's): the same replay
from this checkout with the held-out fleet's evidence refit skipped (the previous `σ, λ, τ` kept) unless the fleet's
samples grew by the fraction `G` since its last fit, before the held-out station's first upload only (`prejoin`) or
throughout (`all`) — what a cheaper refit schedule would save and how far it moves the figures. `--simplex S` (an
experiment too): every fit of the held-out fleet from an initial simplex whose edges are scaled by `S` (the
product's: 0.2 in each log-parameter around the warm start), with the number of evidence evaluations. `--search` /
`--growth` (the product's options, issue 29): the same station from this checkout with
`PersonalParams.evidence_search` / `PersonalParams.refit_growth` set, the held-out fleet's fits and evidence
evaluations (values; values with gradient) counted.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pickle
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WINDOWS = (24, 48, 168, 336, 2000)
JOIN = 8760

# The child: one held-out station from the recording, optionally with the fleet's refits thinned; prints JSON.
_CHILD = r"""
import json, math, os, pickle, sys, time
sys.argv = ["bench_coldstart.py", "--mixture"]
sys.path.insert(0, os.path.join(os.environ["BENCH_TREE"], "benchmarks"))
import argparse
import bench_coldstart as bc
from streamfed.evaluation.coldstart import leave_one_out_recorded
from streamfed.evaluation.datasets import load_beijing
thin = os.environ.get("BENCH_THIN")
state = {"n": 0.0, "fits": 0, "skips": 0}
if thin:
    from streamfed.algorithms.fedbnr_personal import server as hs
    growth, mode = float(thin.split(":")[0]), thin.split(":")[1]
    fit = hs.fit_hierarchical
    def thinned(client_stats, start=None, **kw):
        n, k = sum(st.n for st in client_stats), len(client_stats)
        if k > 1 and start is not None and n < state["n"] * (1 + growth) and (mode == "all" or k == 11):
            state["skips"] += 1
            return (*start, float("nan"))
        if k > 1:
            state["n"] = n
            state["fits"] += 1
        return fit(client_stats, start, **kw)
    hs.fit_hierarchical = thinned
simplex = os.environ.get("BENCH_SIMPLEX")
if simplex:
    import numpy as np
    from streamfed.algorithms.fedbnr_personal import evidence as ev
    minimize, scale = ev.optimize.minimize, float(simplex)
    def scaled(fun, x0, **kw):
        opts = dict(kw.get("options", {}))
        if "initial_simplex" in opts:
            s = np.asarray(opts["initial_simplex"])
            opts["initial_simplex"] = s[0] + (s - s[0]) * scale
        res = minimize(fun, x0, **{**kw, "options": opts})
        state["fits"] += 1
        state["evals"] = state.get("evals", 0) + res.nfev
        return res
    ev.optimize.minimize = scaled
cfg = bc.configs(argparse.Namespace(mixture=True, personal_alone=False, n_features=50, bandwidth=2.0))["bayes"]
variant = json.loads(os.environ.get("BENCH_PARAMS") or "{}")
if variant:
    cfg.params["fedbnr-personal"].update(variant)
if os.environ.get("BENCH_COUNT"):  # count the held-out fleet's fits and evidence evaluations (value, gradient)
    from streamfed.algorithms.fedbnr_personal import evidence as ev, server as hs
    fit0, lev0, grad0 = hs.fit_hierarchical, ev._Spectra.log_evidence, ev._Spectra.log_evidence_and_grad
    state.update(evals=0, grads=0)
    def counted_fit(*a, **kw):
        state["fits"] += 1
        return fit0(*a, **kw)
    def counted_lev(self, *a):
        state["evals"] += 1
        return lev0(self, *a)
    def counted_grad(self, *a):
        state["grads"] += 1
        return grad0(self, *a)
    hs.fit_hierarchical, ev._Spectra.log_evidence, ev._Spectra.log_evidence_and_grad = (
        counted_fit, counted_lev, counted_grad)
fleet = load_beijing(normalisation="online", split="station")
with open(os.environ["BENCH_RECORDING"], "rb") as fh:
    rec = pickle.load(fh)
c0 = time.process_time()
res = leave_one_out_recorded(fleet, "fedbnr-personal", cfg, int(os.environ["BENCH_JOIN"]),
                             windows=tuple(int(w) for w in os.environ["BENCH_WINDOWS"].split(",")),
                             seed=rec.seed, clients=(os.environ["BENCH_STATION"],), recording=rec)
cpu = time.process_time() - c0
rows = [[r.algorithm, r.window, r.mse, r.nlpd, r.coverage] for r in res.rows]
print(json.dumps({"cpu_s": cpu, "rows": rows, "fits": state["fits"], "skips": state["skips"],
                  "evals": state.get("evals"), "grads": state.get("grads"), "load": os.getloadavg()[0]}))
"""


def run_child(tree: Path, recording: Path, station: str, thin: str | None = None, simplex: str | None = None,
              params: dict | None = None, count: bool = False) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree), OPENBLAS_NUM_THREADS="1", BENCH_TREE=str(tree),
               BENCH_RECORDING=str(recording), BENCH_STATION=station, BENCH_JOIN=str(JOIN),
               BENCH_WINDOWS=",".join(map(str, WINDOWS)), BENCH_PARAMS=json.dumps(params or {}),
               BENCH_COUNT="1" if count else "")
    if thin:
        env["BENCH_THIN"] = thin
    if simplex:
        env["BENCH_SIMPLEX"] = simplex
    out = subprocess.run([sys.executable, "-c", _CHILD], env=env, cwd=tree, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def compare(rows: list, ref: list) -> dict:
    """Bit-equal values, the largest relative difference and the values whose printed digits differ."""
    same = total = 0
    worst = 0.0
    printed = []
    for a, b in zip(rows, ref, strict=True):
        for i, (name, fmt) in enumerate((("mse", "{:.4f}"), ("nlpd", "{:.3f}"), ("coverage", "{:.3f}")), start=2):
            x, y = a[i], b[i]
            if math.isnan(x) and math.isnan(y):
                continue
            total += 1
            same += x == y
            worst = max(worst, abs(x - y) / max(abs(y), 1e-300))
            if fmt.format(x) != fmt.format(y):
                printed.append(f"{a[0]} {a[1]} {name}: {fmt.format(x)} vs {fmt.format(y)}")
    return {"values": total, "bit_equal": same, "max_rel": worst, "printed_diffs": printed}


def printed_cell(c: dict) -> str:
    """A table cell of :func:`compare`'s printed digits that differ: how many, and the first four."""
    d = c["printed_diffs"]
    return f"{len(d)}" + (": " + "; ".join(d[:4]) + (" …" if len(d) > 4 else "") if d else "")


def commit_of(tree: Path) -> str:
    out = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip() or "?"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, help="another checkout to replay the same station from (before)")
    ap.add_argument("--station", default="Dongsi")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--thin", default="", help="comma-separated growth fractions G for the thinned-refit experiment")
    ap.add_argument("--simplex", default="", help="comma-separated scales of the fits' initial simplex (1: as it "
                    "is) for the warm-start experiment")
    ap.add_argument("--search", default="", help="comma-separated evidence searches (PersonalParams."
                    "evidence_search) to replay this checkout with, fits and evaluations counted")
    ap.add_argument("--growth", default="", help="comma-separated refit schedules (PersonalParams.refit_growth) to "
                    "replay this checkout with (its default search), fits and evaluations counted")
    ap.add_argument("--out", type=Path, help="markdown file (a .json next to it)")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_coldstart as bc

    from streamfed.evaluation.coldstart import record_uploads
    from streamfed.evaluation.datasets import load_beijing

    load0 = os.getloadavg()
    cfg = bc.configs(argparse.Namespace(mixture=True, personal_alone=False, n_features=50, bandwidth=2.0))["bayes"]
    fleet = load_beijing(normalisation="online", split="station")
    c0 = time.process_time()
    rec = record_uploads(fleet, "fedbnr-personal", bc.recording_config(cfg), args.seed, JOIN + max(WINDOWS))
    record_cpu = time.process_time() - c0
    print(f"record: {record_cpu:.1f} s CPU", file=sys.stderr)
    trees = ([("before", args.before.resolve())] if args.before else []) + [("after", ROOT)]
    runs: dict[str, list[dict]] = {label: [] for label, _ in trees}
    thins: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "recording.pickle"
        with path.open("wb") as fh:
            pickle.dump(rec, fh, protocol=pickle.HIGHEST_PROTOCOL)
        del rec
        for _ in range(args.repeats):
            for label, tree in trees:
                r = run_child(tree, path, args.station)
                runs[label].append(r)
                print(f"{label}: {r['cpu_s']:.1f} s CPU (load {r['load']:.2f})", file=sys.stderr)
        for g in [x for x in args.thin.split(",") if x]:
            for mode in ("prejoin", "all"):
                r = run_child(ROOT, path, args.station, f"{g}:{mode}")
                thins[f"{g}:{mode}"] = r
                print(f"thin {g} {mode}: {r['cpu_s']:.1f} s CPU, {r['fits']} fits", file=sys.stderr)
        simplices: dict[str, dict] = {}
        for x in [x for x in args.simplex.split(",") if x]:
            r = run_child(ROOT, path, args.station, simplex=x)
            simplices[x] = r
            print(f"simplex {x}: {r['cpu_s']:.1f} s CPU, {r['evals']} evaluations", file=sys.stderr)
        products: dict[str, dict] = {}
        for x in [x for x in args.search.split(",") if x]:
            products[f"search {x}"] = r = run_child(ROOT, path, args.station, params={"evidence_search": x},
                                                    count=True)
            print(f"search {x}: {r['cpu_s']:.1f} s CPU, {r['fits']} fits", file=sys.stderr)
        for x in [x for x in args.growth.split(",") if x]:
            products[f"refit_growth {x}"] = r = run_child(ROOT, path, args.station, params={"refit_growth": float(x)},
                                                          count=True)
            print(f"refit_growth {x}: {r['cpu_s']:.1f} s CPU, {r['fits']} fits", file=sys.stderr)
    load1 = os.getloadavg()
    ref = runs[trees[0][0]][0]["rows"]
    commits = {label: commit_of(tree) for label, tree in trees}
    cmd = " ".join(["benchmarks/bench_coldstart_cost.py"] + sys.argv[1:])
    lines = [
        "## Cold start: the cost of one held-out station (issue 29)",
        "",
        f"One held-out station ({args.station}, seed {args.seed}) of `bench_coldstart.py --mixture` replayed from its "
        "seed's recording (`leave_one_out_recorded`), each checkout in a fresh process, interleaved; CPU seconds of "
        "the held-out replay alone, and its rows against the first checkout's (bit for bit, and at the digits the "
        "tables print: MSE 4 decimals, NLPD and coverage 3).",
        "",
        f"Command: `.venv/bin/python {cmd}`",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores (shared), Python {platform.python_version()}; load "
        f"average {load0[0]:.2f} at the start, {load1[0]:.2f} at the end. Commits: "
        + ", ".join(f"{k} {v}" for k, v in commits.items()) + f". The seed's recording: {record_cpu:.1f} s of CPU "
        "(once per seed, shared by its 12 held-out stations).",
        "",
        "| checkout | run | CPU s | load | values bit-equal | max rel. diff | printed digits that differ |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, _ in trees:
        for i, r in enumerate(runs[label]):
            c = compare(r["rows"], ref)
            lines.append(f"| {label} | {i + 1} | {r['cpu_s']:.1f} | {r['load']:.2f} | {c['bit_equal']}/{c['values']} | "
                         f"{c['max_rel']:.1e} | {len(c['printed_diffs'])} |")
    if thins:
        lines += ["", "Experiment: the held-out fleet's refits thinned (`--thin`: a refit only once its samples grew "
                  "by G since the last; `prejoin`: before the held-out station's first upload only).", "",
                  "| G | where | CPU s | load | fits | values bit-equal | max rel. diff | printed digits that differ |",
                  "|---|---|---|---|---|---|---|---|"]
        for key, r in thins.items():
            c = compare(r["rows"], ref)
            g, mode = key.split(":")
            lines.append(f"| {g} | {mode} | {r['cpu_s']:.1f} | {r['load']:.2f} | {r['fits']} | "
                         f"{c['bit_equal']}/{c['values']} | {c['max_rel']:.1e} | {printed_cell(c)} |")
    if simplices:
        lines += ["", "Experiment: every Nelder-Mead fit of the held-out fleet started from a smaller simplex "
                  "(`--simplex`: its edges scaled by S; as it is, 0.2 in each log-parameter around the warm start).",
                  "",
                  "| S | CPU s | load | evaluations | values bit-equal | max rel. diff | printed digits that differ |",
                  "|---|---|---|---|---|---|---|"]
        for x, r in simplices.items():
            c = compare(r["rows"], ref)
            lines.append(f"| {x} | {r['cpu_s']:.1f} | {r['load']:.2f} | {r['evals']} | "
                         f"{c['bit_equal']}/{c['values']} | {c['max_rel']:.1e} | {printed_cell(c)} |")
    if products:
        lines += ["", "This checkout's options, each replayed once (`--search`: `PersonalParams.evidence_search`; "
                  "`--growth`: `PersonalParams.refit_growth`, with the default search): the held-out fleet's fits, "
                  "its evaluations of the evidence's value and of value with gradient, against the first checkout's "
                  "rows.", "",
                  "| option | CPU s | load | fits | values | values + gradients | values bit-equal | max rel. diff | "
                  "printed digits that differ |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for key, r in products.items():
            c = compare(r["rows"], ref)
            lines.append(f"| {key} | {r['cpu_s']:.1f} | {r['load']:.2f} | {r['fits']} | {r['evals']:,} | "
                         f"{r['grads']:,} | {c['bit_equal']}/{c['values']} | {c['max_rel']:.1e} | "
                         f"{printed_cell(c)} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        args.out.with_suffix(".json").write_text(json.dumps(
            {"command": cmd, "station": args.station, "seed": args.seed, "record_cpu_s": record_cpu,
             "load": [load0, load1], "commits": commits, "runs": runs, "thin": thins, "simplex": simplices,
             "options": products},
            indent=1))


if __name__ == "__main__":
    main()
