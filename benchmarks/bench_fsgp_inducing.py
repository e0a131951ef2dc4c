"""FSGP's number of inducing inputs M on the Beijing streams: federated against local-only, and the cost.

    .venv/bin/python benchmarks/bench_fsgp_inducing.py [--quick] [--steps N] [--seeds 0,1,2]
                                                       [--ms 32,48,64,96,128] [--out PATH.md]
    .venv/bin/python benchmarks/bench_fsgp_inducing.py --render RUN.json [RUN2.json ...] --out PATH.md

* Accuracy: the 12 Beijing stations (`normalisation="online"`, every client its station, the first `--steps`
  samples each) through `streamfed.evaluation.replay.replay`, for every M: `fsgp` (federated, on its defaults:
  since issue 34 personalised, the fixed-share mixture of the shared sparse GP and the station's own posterior;
  the figures in benchmarks/results/fsgp_inducing.md predate that and are the shared GP alone) and `fsgp-local`
  (its replay variant: every station its own server, nothing shared), all other settings FSGP's defaults.
  Prequential MSE (each step predicted before it is learned) per station and pooled over the fleet, NLPD and
  95% coverage pooled; mean over seeds.
* Cost: µs per sample of an `FSGPLearner` (`predict(x)` then `learn(x, y)`, as an agent calls them; local
  hyperparameter fits and uploads included, amortised) over the same stations' first `--cost-steps` samples,
  every M timed in turn in the same process, the best of 3 rounds; the ratio to the peer, FSGP at M = 32,
  measured in the same rounds. A shared machine slows every M alike, so the ratio is the comparable figure.

With `--out PATH.md`, the figures also go to `PATH.json` (`--out PATH.json`: only there); `--render`
rewrites the markdown from such JSON files (several runs, e.g. a second range of M, merged by M).
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from streamfed.algorithms.fsgp import ALGORITHM  # noqa: E402
from streamfed.evaluation.datasets import Fleet  # noqa: E402
from streamfed.evaluation.datasets.beijing import load_beijing  # noqa: E402
from streamfed.evaluation.replay import AlgorithmConfig, replay  # noqa: E402
from streamfed.fleet.config import FleetConfig  # noqa: E402

PEER_M = 32  # the cost peer: FSGP at the former default


def pooled(result: Any) -> dict[str, Any]:
    """Pooled MSE, NLPD, 95% coverage over every scored step; MSE per station."""
    e2 = np.concatenate(result.sq_errors)
    var = np.concatenate(result.variances)
    ok = ~np.isnan(e2)
    e2, var = e2[ok], var[ok]
    return {"mse": float(e2.mean()),
            "nlpd": float(np.mean(0.5 * np.log(2 * np.pi * var) + 0.5 * e2 / var)),
            "coverage": float(np.mean(e2 <= 1.959964 ** 2 * var)),
            "stations": [float(np.nanmean(e)) for e in result.sq_errors]}


def cost_pass(fleet: Fleet, m: int, steps: int) -> tuple[float, float]:
    """µs per sample of `predict` then `learn` by a fresh `FSGPLearner` per station (default settings at M):
    the mean (local fits amortised) and the median (a sample without a fit)."""
    cfg = FleetConfig(fleet="bench", algorithm="fsgp", n_inputs=fleet.n_inputs, standardise="none",
                      params={"n_inducing": m})
    learners = [ALGORITHM.learner(cfg, s.name, c) for c, s in enumerate(fleet)]
    for lr, s in zip(learners, fleet, strict=True):
        lr.warm_up(s.X[0])
    times = []
    clock = time.perf_counter
    for lr, s in zip(learners, fleet, strict=True):
        X, y = s.X[:steps], s.y[:steps]
        for i in range(len(y)):
            t0 = clock()
            lr.predict(X[i])
            lr.learn(X[i], float(y[i]))
            lr.take_update()  # what an agent uploads (local statistics), built as it would be
            times.append(clock() - t0)
    t = np.array(times) * 1e6
    return float(t.mean()), float(np.median(t))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="150 steps, seed 0, 300 cost steps (a smoke run)")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--cost-steps", type=int, default=1000)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--ms", default="32,48,64,96,128")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--render", type=Path, nargs="+", metavar="JSON",
                    help="measure nothing: write the markdown of these runs' JSON (rows merged by M)")
    args = ap.parse_args()
    if args.render:
        emit(render([json.loads(p.read_text(encoding="utf-8")) for p in args.render]), args.out)
        return
    steps, cost_steps = (150, 300) if args.quick else (args.steps, args.cost_steps)
    seeds = [0] if args.quick else [int(s) for s in args.seeds.split(",")]
    ms = [int(m) for m in args.ms.split(",")]
    t_start = time.perf_counter()
    fleet = load_beijing(normalisation="online", split="station", steps=steps)

    # --- cost: every M in turn, 3 rounds, best per M; the peer (M = 32) in the same rounds
    timed = sorted(set(ms) | {PEER_M})
    us: dict[int, float] = {m: float("inf") for m in timed}  # mean, fits amortised
    med: dict[int, float] = {m: float("inf") for m in timed}  # median
    cost_pass(fleet, PEER_M, 50)  # compile / warm up
    for _ in range(3):
        for m in timed:
            mean, median = cost_pass(fleet, m, cost_steps)
            us[m], med[m] = min(us[m], mean), min(med[m], median)

    # --- accuracy: federated against local-only per M and seed
    rows: list[dict[str, Any]] = []
    for m in ms:
        acfg = AlgorithmConfig(params={"fsgp": {"n_inducing": m}})
        runs = {"fsgp": [], "fsgp-local": []}
        for seed in seeds:
            for name in runs:
                runs[name].append(pooled(replay(fleet, name, acfg, seed=seed, n_checkpoints=2)))
        row: dict[str, Any] = {"M": m, "us": us[m], "ratio": us[m] / us[PEER_M], "median_us": med[m],
                               "median_ratio": med[m] / med[PEER_M], "runs": runs}
        for name, rs in runs.items():
            row[name] = {k: float(np.mean([r[k] for r in rs])) for k in ("mse", "nlpd", "coverage")}
            row[name]["mse_sd"] = float(np.std([r["mse"] for r in rs]))
            row[name]["stations"] = np.mean([r["stations"] for r in rs], axis=0).tolist()
        row["stations_fed_no_worse"] = int(np.sum(np.array(row["fsgp"]["stations"])
                                                  <= np.array(row["fsgp-local"]["stations"])))
        pairs = zip(runs["fsgp"], runs["fsgp-local"], strict=True)
        row["seeds_fed_no_worse"] = int(sum(f["mse"] <= lo["mse"] for f, lo in pairs))
        rows.append(row)
        print(f"M={m}: fed {row['fsgp']['mse']:.4f} local {row['fsgp-local']['mse']:.4f} "
              f"{us[m]:.1f} µs ({row['ratio']:.2f}×), median {med[m]:.1f} µs", flush=True)

    wall = time.perf_counter() - t_start
    cmd = "benchmarks/bench_fsgp_inducing.py" + (" --quick" if args.quick else
                                                  f" --steps {steps} --seeds {args.seeds} --ms {args.ms}")
    data = {"command": cmd, "wall_s": wall, "steps": steps, "cost_steps": cost_steps, "seeds": seeds,
            "stations": list(fleet.names), "rows": rows}
    if args.out:
        args.out.with_suffix(".json").write_text(json.dumps(data, indent=1), encoding="utf-8")
    emit(render([data]), args.out if args.out and args.out.suffix != ".json" else None)


def emit(text: str, out: Path | None) -> None:
    if out:
        out.write_text(text, encoding="utf-8")
    print(text)


def render(runs: list[dict[str, Any]]) -> str:
    """The markdown of one or more runs (JSON as written by `--out`; same steps and stations), rows by M."""
    head = runs[0]
    steps, seeds, cost_steps, names = head["steps"], head["seeds"], head["cost_steps"], head["stations"]
    rows = sorted((r for run in runs for r in run["rows"]), key=lambda r: r["M"])
    better = [r["M"] for r in rows if r["fsgp"]["mse"] <= r["fsgp-local"]["mse"]]
    qualifying = [r["M"] for r in rows if r["M"] in better and r["us"] <= 50.0]
    qualifying_median = [r["M"] for r in rows if r["M"] in better and r["median_us"] <= 50.0]
    commands = "; ".join(f"`.venv/bin/python {run['command']} --out PATH.md`"
                         + (f" ({run['wall_s']:.0f} s)" if "wall_s" in run else "") for run in runs)
    lines = [f"# FSGP: inducing inputs M on Beijing, federated against local-only ({steps} steps, 12 stations)", "",
             f"Command: {commands}. The 12 Beijing stations (online normalisation, every client its station, the first "
             f"{steps} samples each) replayed by `fsgp` (FSGP's federated default) and `fsgp-local` (every station "
             "its own server) at each M, every other setting FSGP's default; prequential MSE per station and pooled, "
             f"seeds {', '.join(map(str, seeds))}. Cost: µs per sample of an `FSGPLearner`'s `predict` then `learn` "
             "(local fits amortised: the mean; a sample without a fit: the median), as a ratio to M = 32 timed in "
             "the same run.", "",
             "| M | federated MSE | local-only MSE | fed / local | NLPD fed / local | 95% cov. fed / local "
             "| stations fed ≤ local | seeds fed ≤ local | µs/sample mean (× M = 32) | median (× M = 32) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        f, lo = r["fsgp"], r["fsgp-local"]
        lines.append(f"| {r['M']} | {f['mse']:.4f} ± {f['mse_sd']:.4f} | {lo['mse']:.4f} ± {lo['mse_sd']:.4f} | "
                     f"{f['mse'] / lo['mse']:.3f} | {f['nlpd']:.3f} / {lo['nlpd']:.3f} | "
                     f"{f['coverage']:.3f} / {lo['coverage']:.3f} | {r['stations_fed_no_worse']}/12 | "
                     f"{r['seeds_fed_no_worse']}/{len(seeds)} | {r['us']:.1f} ({r['ratio']:.2f}×) | "
                     f"{r['median_us']:.1f} ({r['median_ratio']:.2f}×) |")
    lines += ["", "Per station, MSE federated / local-only (mean over seeds):", "",
              "| station | " + " | ".join(f"M = {r['M']}" for r in rows) + " |",
              "|---|" + "---|" * len(rows)]
    for s, name in enumerate(names):
        lines.append(f"| {name} | " + " | ".join(
            f"{r['fsgp']['stations'][s]:.3f} / {r['fsgp-local']['stations'][s]:.3f}" for r in rows) + " |")
    lines += ["", f"MSE: mean ± sd over seeds. Every setting but M is FSGP's default (SE-ARD, data-free initial Z; "
              "θ, σ and Z learned by FedAvg of local fits; `fsgp-local`: the same learner, every station its own "
              "server). Cost: `predict` then `learn` (and `take_update`) of a fresh learner per station over the "
              f"first {cost_steps} samples of each — the mean, with the local hyperparameter fits (every 128 samples) "
              "amortised, and the median, a sample without a fit — best of 3 rounds, every M in turn in one process "
              "(`OPENBLAS_NUM_THREADS=1`) on a shared 2-core machine; the ratio to M = 32 in the same rounds is the "
              "comparable figure (rows from separate runs have their own M = 32 peer).",
              "", "M with federated pooled MSE ≤ local-only: " + (", ".join(map(str, better)) or "none")
              + "; of those ≤ 50 µs per sample, mean: " + (", ".join(map(str, qualifying)) or "none")
              + "; median: " + (", ".join(map(str, qualifying_median)) or "none") + "."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
