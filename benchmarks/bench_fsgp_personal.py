"""FSGP's personalised default against local-only and the unpersonalised fleet posterior (issue 34).

    .venv/bin/python benchmarks/bench_fsgp_personal.py [--quick] [--steps N] [--seeds 0,1,2] [--out PATH.md]

* Beijing, the 12 stations (`normalisation="online"`, every client its station, the first `--steps` samples
  each), through `streamfed.evaluation.replay.replay`: `fsgp` on its defaults (personalised: the fixed-share
  mixture of the fleet's posterior and the station's own), `fsgp` with `personal = false` (the former default:
  the fleet's posterior alone) and `fsgp-local` (every station its own server). Prequential MSE per station and
  pooled, NLPD and 95% coverage pooled, per seed; each expert's prequential MSE and the final mixture weight
  of the station's own expert.
* Streams not chosen for this (the same three variants, the same defaults): Beijing with the stations' samples
  mixed across clients (`split="mixed"`: homogeneous clients, where the fleet should win), and
  `synthetic_fleet(10, --steps // 2, 4)` at heterogeneity 0 (i.i.d. clients), 0.5 and 1 (unrelated functions).
* Cost: µs per sample of an `FSGPLearner` (`predict(x)`, `learn(x, y)`, `take_update()`, as an agent calls
  them; local hyperparameter fits amortised) over the stations' first `--cost-steps` samples: the mean and the
  median, the default and `personal = false` timed in turn in the same process, best of 3 rounds.

With `--out PATH.md` the figures also go to `PATH.json`.
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
from streamfed.evaluation.datasets import Fleet, synthetic_fleet  # noqa: E402
from streamfed.evaluation.datasets.beijing import load_beijing  # noqa: E402
from streamfed.evaluation.replay import AlgorithmConfig, replay  # noqa: E402
from streamfed.fleet.config import FleetConfig  # noqa: E402

VARIANTS = {  # label: (replay variant, FSGP params over the defaults)
    "personalised (default)": ("fsgp", {}),
    "fleet posterior only": ("fsgp", {"personal": False}),
    "local-only": ("fsgp-local", {}),
}
DEFAULT, FLEET, LOCAL = VARIANTS


def scored(result: Any) -> dict[str, Any]:
    """Pooled MSE, NLPD, 95% coverage over every scored step; MSE per client; the experts' diagnostics."""
    e2 = np.concatenate(result.sq_errors)
    var = np.concatenate(result.variances)
    ok = ~np.isnan(e2)
    e2, var = e2[ok], var[ok]
    out: dict[str, Any] = {
        "mse": float(e2.mean()), "nlpd": float(np.mean(0.5 * np.log(2 * np.pi * var) + 0.5 * e2 / var)),
        "coverage": float(np.mean(e2 <= 1.959964 ** 2 * var)),
        "clients": [float(np.nanmean(e)) for e in result.sq_errors]}
    diags = [lr.diagnostics() for lr in result.arrangement.learners] if result.arrangement is not None else []
    if diags and "mixture_weight_own" in diags[0]:
        out["weight_own"] = [float(d["mixture_weight_own"]) for d in diags]
        out["expert_mse_global"] = [float(d.get("expert_mse_global", float("nan"))) for d in diags]
        out["expert_mse_own"] = [float(d.get("expert_mse_own", float("nan"))) for d in diags]
    return out


def run_stream(fleet: Fleet, seeds: list[int]) -> dict[str, list[dict[str, Any]]]:
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    for seed in seeds:
        for label, (variant, params) in VARIANTS.items():
            runs[label].append(scored(replay(fleet, variant, AlgorithmConfig(params={"fsgp": params}), seed=seed,
                                             n_checkpoints=2)))
    return runs


def cost_pass(fleet: Fleet, params: dict[str, Any], steps: int) -> tuple[float, float, float, float]:
    """µs per sample of `predict`, `learn`, `take_update` by a fresh learner per station: wall-clock mean and
    median, and the same in this thread's CPU time (what the sample cost, without the time the shared machine
    gave to other processes)."""
    cfg = FleetConfig(fleet="bench", algorithm="fsgp", n_inputs=fleet.n_inputs, standardise="none", params=params)
    learners = [ALGORITHM.learner(cfg, s.name, c) for c, s in enumerate(fleet)]
    for lr, s in zip(learners, fleet, strict=True):
        lr.warm_up(s.X[0])
    times, cpu = [], []
    clock, cpu_clock = time.perf_counter, time.thread_time
    for lr, s in zip(learners, fleet, strict=True):
        X, y = s.X[:steps], s.y[:steps]
        for i in range(len(y)):
            t0, c0 = clock(), cpu_clock()
            lr.predict(X[i])
            lr.learn(X[i], float(y[i]))
            lr.take_update()
            cpu.append(cpu_clock() - c0)
            times.append(clock() - t0)
    t, c = np.array(times) * 1e6, np.array(cpu) * 1e6
    return float(t.mean()), float(np.median(t)), float(c.mean()), float(np.median(c))


def measure_cost(fleet: Fleet, cost_steps: int) -> dict[str, list[float]]:
    """The default and `personal = false` in turn, 3 rounds, the best of each figure."""
    timed = {DEFAULT: {}, FLEET: {"personal": False}}
    cost = {k: [float("inf")] * 4 for k in timed}
    cost_pass(fleet, {}, 50)  # compile / warm up
    for _ in range(3):
        for label, params in timed.items():
            cost[label] = [min(a, b) for a, b in zip(cost[label], cost_pass(fleet, params, cost_steps), strict=True)]
    print("cost", cost, flush=True)
    return cost


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="300 steps, seed 0, 300 cost steps (a smoke run)")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--cost-steps", type=int, default=1000)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--cost-only", action="store_true", help="re-measure only the cost of the run in --out's JSON")
    args = ap.parse_args()
    steps, cost_steps = (300, 300) if args.quick else (args.steps, args.cost_steps)
    seeds = [0] if args.quick else [int(s) for s in args.seeds.split(",")]
    t_start = time.perf_counter()
    beijing = load_beijing(normalisation="online", split="station", steps=steps)

    if args.cost_only:  # re-measure the cost of an earlier run (its JSON beside --out), keep its accuracy
        data = json.loads(args.out.with_suffix(".json").read_text(encoding="utf-8"))
        data["cost"] = measure_cost(beijing, data["cost_steps"])
        data["cost_load"] = os.getloadavg()
        args.out.with_suffix(".json").write_text(json.dumps(data, indent=1), encoding="utf-8")
        args.out.write_text(render(data), encoding="utf-8")
        print(render(data))
        return
    cost = measure_cost(beijing, cost_steps)
    cost_load = os.getloadavg()

    streams: dict[str, Fleet] = {"Beijing (stations)": beijing,
                                 "Beijing (mixed)": load_beijing(normalisation="online", split="mixed", steps=steps)}
    for h in (0.0, 0.5, 1.0):
        streams[f"synthetic h = {h:g}"] = synthetic_fleet(10, steps // 2, 4, seed=11, heterogeneity=h)
    results = {}
    for name, fleet in streams.items():
        results[name] = run_stream(fleet, seeds)
        r = results[name]
        print(name, {k: round(float(np.mean([x["mse"] for x in v])), 4) for k, v in r.items()}, flush=True)

    data = {"command": "benchmarks/bench_fsgp_personal.py" + (" --quick" if args.quick else
                                                               f" --steps {steps} --seeds {args.seeds}"),
            "wall_s": time.perf_counter() - t_start, "load": os.getloadavg(), "steps": steps,
            "cost_steps": cost_steps, "seeds": seeds, "stations": list(beijing.names), "cost": cost,
            "cost_load": cost_load,
            "results": results}
    if args.out:
        args.out.with_suffix(".json").write_text(json.dumps(data, indent=1), encoding="utf-8")
    text = render(data)
    if args.out and args.out.suffix != ".json":
        args.out.write_text(text, encoding="utf-8")
    print(text)


def _mean(runs: list[dict[str, Any]], key: str) -> float:
    return float(np.mean([r[key] for r in runs]))


def render(data: dict[str, Any]) -> str:
    seeds, steps, res, cost = data["seeds"], data["steps"], data["results"], data["cost"]
    load = ", ".join(f"{v:.2f}" for v in data["load"])
    lines = [f"# FSGP: the personalised default against local-only (issue 34; {steps} steps per client)", "",
             f"Command: `.venv/bin/python {data['command']} --out PATH.md` ({data['wall_s']:.0f} s; load average "
             f"at the end {load}, on a 2-core machine shared with other jobs). Seeds {', '.join(map(str, seeds))}; "
             "every variant on FSGP's defaults (M = 32) but the one setting named. `personalised (default)`: the "
             "client predicts with the fixed-share mixture of the fleet's posterior and its own samples' "
             "posterior; `fleet posterior only`: `personal = false` (the former default); `local-only`: "
             "`fsgp-local`, every client its own server.", "",
             "## Prequential MSE, pooled over the clients (mean ± sd over seeds)", "",
             "| stream | personalised (default) | fleet posterior only | local-only | default / local | "
             "default / fleet only | seeds default ≤ local | NLPD default / fleet / local | "
             "95% cov. default / fleet / local |", "|---|---|---|---|---|---|---|---|---|"]
    for name, r in res.items():
        d, f, lo = r[DEFAULT], r[FLEET], r[LOCAL]
        wins = sum(a["mse"] <= b["mse"] for a, b in zip(d, lo, strict=True))
        sd = {k: float(np.std([x["mse"] for x in v])) for k, v in r.items()}
        lines.append(
            f"| {name} | {_mean(d, 'mse'):.4f} ± {sd[DEFAULT]:.4f} | {_mean(f, 'mse'):.4f} ± {sd[FLEET]:.4f} | "
            f"{_mean(lo, 'mse'):.4f} ± {sd[LOCAL]:.4f} | {_mean(d, 'mse') / _mean(lo, 'mse'):.3f} | "
            f"{_mean(d, 'mse') / _mean(f, 'mse'):.3f} | {wins}/{len(d)} | "
            f"{_mean(d, 'nlpd'):.3f} / {_mean(f, 'nlpd'):.3f} / {_mean(lo, 'nlpd'):.3f} | "
            f"{_mean(d, 'coverage'):.3f} / {_mean(f, 'coverage'):.3f} / {_mean(lo, 'coverage'):.3f} |")
    bj = res["Beijing (stations)"]
    lines += ["", "Per seed, Beijing stations (pooled MSE): " + "; ".join(
        f"seed {s}: default {a['mse']:.4f}, fleet only {b['mse']:.4f}, local-only {c['mse']:.4f}"
        for s, a, b, c in zip(seeds, bj[DEFAULT], bj[FLEET], bj[LOCAL], strict=True)) + ".", "",
        "## Beijing, per station (mean over seeds)", "",
        "| station | personalised (default) | fleet posterior only | local-only | fleet expert | own expert | "
        "own expert's final weight |", "|---|---|---|---|---|---|---|"]
    per = {k: np.mean([x["clients"] for x in bj[k]], axis=0) for k in VARIANTS}
    eg = np.mean([x["expert_mse_global"] for x in bj[DEFAULT]], axis=0)
    eo = np.mean([x["expert_mse_own"] for x in bj[DEFAULT]], axis=0)
    wo = np.mean([x["weight_own"] for x in bj[DEFAULT]], axis=0)
    for i, st in enumerate(data["stations"]):
        lines.append(f"| {st} | {per[DEFAULT][i]:.3f} | {per[FLEET][i]:.3f} | {per[LOCAL][i]:.3f} | {eg[i]:.3f} | "
                     f"{eo[i]:.3f} | {wo[i]:.2f} |")
    n_le = int(np.sum(per[DEFAULT] <= per[LOCAL]))
    lines += ["", f"Stations where the default's MSE ≤ local-only's: {n_le}/{len(per[DEFAULT])}. The experts' "
              "columns are the personalised client's two experts scored alone on the same steps (each expert's "
              "prequential MSE, `expert_mse_global` / `expert_mse_own` of the learner's diagnostics).", "",
              f"## Cost, µs per sample (M = 32, {data['cost_steps']} samples of each station, best of 3 rounds)", "",
              "| variant | wall mean (fits amortised) | wall median (a sample without a fit) | CPU mean | CPU median |",
              "|---|---|---|---|---|"]
    for label, c in cost.items():
        lines.append(f"| {label} | " + " | ".join(f"{v:.1f}" for v in c) + " |")
    base = cost[FLEET]
    load = ", ".join(f"{v:.2f}" for v in data.get("cost_load", data["load"]))
    lines += ["", f"Personalised / fleet only in the same rounds: wall mean {cost[DEFAULT][0] / base[0]:.2f}×, "
              f"median {cost[DEFAULT][1] / base[1]:.2f}×; CPU mean {cost[DEFAULT][2] / base[2]:.2f}×, median "
              f"{cost[DEFAULT][3] / base[3]:.2f}×. Load average after the cost rounds: {load}. `predict`, `learn` and "
              "`take_update` of a fresh learner per station, local fits (at 128, 384, 896 of the first 1000 "
              "samples) included, `OPENBLAS_NUM_THREADS=1`; wall: `time.perf_counter`, CPU: `time.thread_time` "
              "(excludes the time the shared machine ran other processes)."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
