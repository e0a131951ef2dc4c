"""Every registered algorithm through the plug-in contract, on one stream and one fleet shape, in one run.

    .venv/bin/python benchmarks/bench_algorithms.py [--out benchmarks/results/algorithms.md] [--quick]

The algorithms are whatever :func:`streamfed.algorithms.names` lists (none is named here); each gets
`FleetConfig(fleet="bench", algorithm=name, n_inputs=10, seed=0)` with, in the params of the families that have
a kernel dictionary, `n_kernels=4, n_features=50` (and POF-MKL's `bin_size=1`), and is reached only through
:mod:`streamfed.algorithms.base` (`Algorithm.learner` / `.aggregation`) and
the fleet's pure cores. The stream is `synthetic_fleet(clients, warmup + steps, 10, seed=0)`; a classifier
(`task == "classification"`: pFedGP) learns its targets cut into `n_classes` classes at the fleet's quantiles.

* (a) agent cost — `Learner.learn(x, y)` + `Learner.take_update()` of client 0 (async mode, what an agent
  runs), each sample timed alone with `perf_counter_ns` after `Learner.warm_up` and `warmup` untimed
  samples; the figure is the median over `repeats` fresh learners of each one's median per sample.
* (d) the peer, in the same rounds (interleaved with the algorithms): River's
  `linear_model.LinearRegression()` (defaults), `predict_one` + `learn_one` per sample on the same samples
  (the dicts built beforehand); every agent cost is also given as a ratio to it.
* (b) upload size — an `AgentCore` (async, `upload_every=1`) per client runs the whole stream through
  `on_reading`; bytes per sample = Σ `len(encode(m))` of the update messages it returns / samples learned.
* (c) aggregator cost — those payloads (arrival order: sample by sample, clients round-robin) fed to a
  fresh `AggregatorCore(cfg, clients, mode="async", window=1e9)` with `on_update`, then one `tick` that
  closes the window; µs per accepted update = (Σ on_update + the close) / accepted, median over repeats.

(b) and (c) only for algorithms with `in_fleet` (the paper's baselines run in the replay only).
"""

from __future__ import annotations

import os

os.environ["OPENBLAS_NUM_THREADS"] = "1"
os.environ["OMP_NUM_THREADS"] = "1"
os.environ["MKL_NUM_THREADS"] = "1"

import argparse  # noqa: E402
import copy  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import river  # noqa: E402
from river.linear_model import LinearRegression  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from streamfed import algorithms  # noqa: E402
from streamfed.core import compiled  # noqa: E402
from streamfed.evaluation.bench import load_average, machine, write_section  # noqa: E402
from streamfed.evaluation.datasets import synthetic_fleet  # noqa: E402
from streamfed.fleet.agent import AgentCore  # noqa: E402
from streamfed.fleet.aggregator import AggregatorCore  # noqa: E402
from streamfed.fleet.config import FleetConfig
from streamfed.fleet.sources import Reading  # noqa: E402
from streamfed.wire.message import encode

SHAPE = {"n_inputs": 10, "seed": 0}
DICTIONARY = {"n_kernels": 4, "n_features": 50, "bin_size": 1}  # for the families whose params have these fields
PEER = "River LinearRegression"
clock = time.perf_counter_ns


def fleet_config(name: str) -> FleetConfig:
    fields = algorithms.get(name).Params.model_fields
    return FleetConfig(fleet="bench", algorithm=name, **SHAPE,
                       params={k: v for k, v in DICTIONARY.items() if k in fields})


def targets(alg: algorithms.Algorithm, cfg: FleetConfig, fleet) -> list[np.ndarray]:
    """Each client's labels for `alg`: a regressor learns the stream's targets; a classifier (pFedGP) the same
    targets cut into its `n_classes` classes at the fleet's quantiles (class indices as floats)."""
    if alg.task != "classification":
        return [s.y for s in fleet]
    k = int(cfg.params.n_classes)
    edges = np.quantile(np.concatenate([s.y for s in fleet]), np.linspace(0.0, 1.0, k + 1)[1:-1])
    return [np.digitize(s.y, edges).astype(np.float64) for s in fleet]


# ----------------------------------------------------------------------------- (a) and (d): one client's step
def agent_pass(alg: algorithms.Algorithm, cfg: FleetConfig, X: np.ndarray, y: np.ndarray, warmup: int) -> dict:
    """A fresh learner: warm-up, then `learn` + `take_update` timed sample by sample."""
    learner = alg.learner(cfg, "client-0", 0, "async")
    learner.warm_up(X[0])
    for i in range(warmup):
        learner.learn(X[i], float(y[i]))
        learner.take_update()
    n = len(y) - warmup
    us = np.empty(n)
    uploads = numbers = 0
    sq = 0.0
    for j in range(n):
        x, t = X[warmup + j], float(y[warmup + j])
        t0 = clock()
        yhat, _ = learner.learn(x, t)
        up = learner.take_update()
        us[j] = clock() - t0
        sq += (yhat - t) ** 2
        if up is not None:
            uploads += 1
            numbers += up.n_numbers
    return {"us": us / 1000.0, "uploads": uploads, "numbers": numbers, "mse": sq / n,
            "kernels_used": len(learner.kernel_names)}


def river_pass(xs: list[dict], y: np.ndarray, warmup: int) -> dict:
    model = LinearRegression()
    for i in range(warmup):
        model.predict_one(xs[i])
        model.learn_one(xs[i], float(y[i]))
    n = len(y) - warmup
    us = np.empty(n)
    sq = 0.0
    for j in range(n):
        x, t = xs[warmup + j], float(y[warmup + j])
        t0 = clock()
        yhat = model.predict_one(x)
        model.learn_one(x, t)
        us[j] = clock() - t0
        sq += (yhat - t) ** 2
    return {"us": us / 1000.0, "mse": sq / n}


def summarise(passes: list[dict]) -> dict:
    meds = [float(np.median(p["us"])) for p in passes]
    pooled = np.concatenate([p["us"] for p in passes])
    return {"median_us": statistics.median(meds), "repeat_medians_us": meds,
            "mean_us": float(pooled.mean()), "p90_us": float(np.percentile(pooled, 90)),
            "samples_timed": int(pooled.size), "mse": float(passes[-1]["mse"])}


# ----------------------------------------------------------------------------- (b) the agents' uploads
def run_agents(cfg: FleetConfig, fleet, labels: list[np.ndarray] | None = None) -> dict:
    """One `AgentCore` per client over its whole stream: the update payloads in arrival order, their bytes,
    and the time of `on_reading` + encoding per sample."""
    arrivals: list[tuple[int, int, str, bytes]] = []  # (sample index, client index, client, payload)
    cores = []
    step_us: list[float] = []
    learned = 0
    for c, stream in enumerate(fleet):
        core = AgentCore(cfg, stream.name, c, mode="async")
        core.warm_up()
        X, y = stream.X, stream.y if labels is None else labels[c]
        for i in range(len(y)):
            t0 = clock()
            _, msgs = core.on_reading(Reading(f"r{i}", X[i], float(i), float(y[i])), now=float(i))
            payloads = [encode(m) for m in msgs]
            step_us.append((clock() - t0) / 1000.0)
            arrivals += [(i, c, stream.name, p) for p in payloads]
        skipped = sum(core.counters.skipped.values())
        if skipped:
            raise RuntimeError(f"{cfg.algorithm}: agent {stream.name} skipped {core.counters.skipped}")
        learned += core.counters.learned
        cores.append(core)
    arrivals.sort(key=lambda a: (a[0], a[1]))
    total = sum(len(a[3]) for a in arrivals)
    return {"payloads": [(a[2], a[3]) for a in arrivals], "cores": cores, "learned": learned,
            "upload_bytes": total, "bytes_per_sample": total / learned, "uploads_per_sample": len(arrivals) / learned,
            "bytes_per_upload": total / max(1, len(arrivals)), "core_median_us": float(np.median(step_us))}


# ----------------------------------------------------------------------------- (c) the aggregator
def aggregator_pass(cfg: FleetConfig, clients: list[str], payloads: list[tuple[str, bytes]]) -> dict:
    agg = AggregatorCore(cfg, clients=clients, mode="async", window=1e9)
    agg.warm_up()
    us = np.empty(len(payloads))
    for k, (client, payload) in enumerate(payloads):
        t0 = clock()
        out = agg.on_update(client, payload, now=0.0)
        us[k] = clock() - t0
        if out:
            raise RuntimeError(f"{cfg.algorithm}: a window of 1e9 s closed on update {k}: {[m.kind for m in out]}")
    t0 = clock()
    out = agg.tick(now=2e9)
    close_us = (clock() - t0) / 1000.0
    us /= 1000.0
    glob = [m for m in out if m.kind == cfg.global_kind]
    return {"accepted": agg.counters.accepted, "rejected": agg.rejected, "on_update_us": us,
            "close_us": close_us, "per_update_us": (float(us.sum()) + close_us) / max(1, agg.counters.accepted),
            "global": glob[0] if glob else None}


def fleet_measures(name: str, cfg: FleetConfig, fleet, labels: list[np.ndarray], repeats: int) -> dict:
    agents = run_agents(cfg, fleet, labels)
    payloads = agents["payloads"]
    if not payloads:
        raise RuntimeError(f"{name}: no update in {agents['learned']} samples")
    passes = [aggregator_pass(cfg, list(fleet.names), payloads) for _ in range(repeats)]
    last = passes[-1]
    if last["rejected"] or last["accepted"] != len(payloads) or last["global"] is None:
        raise RuntimeError(f"{name}: aggregator accepted {last['accepted']} of {len(payloads)}, "
                           f"rejected {last['rejected']}, global: {last['global'] is not None}")
    # the other direction: the window's global, as client 0's agent receives it (decode + install_global)
    global_payload = encode(last["global"])
    install = []
    pruned = len(agents["cores"][0].outbox)  # updates the global includes: installing it drops them all
    for _ in range(repeats):
        twin = copy.deepcopy(agents["cores"][0])
        t0 = clock()
        res = twin.on_global_payload(global_payload, now=0.0)
        install.append((clock() - t0) / 1000.0)
        if not res.installed:
            raise RuntimeError(f"{name}: client 0 did not install the global: {res}")
    return {
        "clients": len(fleet), "samples": agents["learned"], "updates": len(payloads),
        "upload_bytes_per_sample": agents["bytes_per_sample"], "uploads_per_sample": agents["uploads_per_sample"],
        "bytes_per_upload": agents["bytes_per_upload"], "agent_core_median_us": agents["core_median_us"],
        "aggregator_us_per_update": statistics.median(p["per_update_us"] for p in passes),
        "on_update_median_us": statistics.median(float(np.median(p["on_update_us"])) for p in passes),
        "window_close_us": statistics.median(p["close_us"] for p in passes),
        "global_bytes": len(global_payload), "global_install_us": statistics.median(install),
        "global_install_pruned": pruned,
    }


# ----------------------------------------------------------------------------- the run
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--quick", action="store_true", help="smoke-test sizes (figures indicative only)")
    ap.add_argument("--clients", type=int, default=8, help="agents feeding the aggregator")
    ap.add_argument("--steps", type=int, default=3000, help="timed samples per client")
    ap.add_argument("--warmup", type=int, default=500, help="untimed samples before the timed ones")
    ap.add_argument("--repeats", type=int, default=5, help="fresh learners (and aggregators) per algorithm")
    args = ap.parse_args()
    if args.quick:
        args.clients, args.steps, args.warmup, args.repeats = 2, 150, 40, 1
    t_start = time.perf_counter()
    names = algorithms.names()
    fleet = synthetic_fleet(args.clients, args.warmup + args.steps, SHAPE["n_inputs"], seed=SHAPE["seed"])
    X0, y0 = fleet[0].X, fleet[0].y
    xs0 = [{f"x{j}": float(v) for j, v in enumerate(row)} for row in X0]
    configs = {n: fleet_config(n) for n in names}
    algs = {n: algorithms.get(n) for n in names}
    labels = {n: targets(algs[n], configs[n], fleet) for n in names}

    # (a) + (d): interleaved rounds, each algorithm and the peer once per round, on the same samples
    for n in names:  # a throw-away pass each: numba dispatch, caches, first-touch allocations
        agent_pass(algs[n], configs[n], X0[: args.warmup + 20], labels[n][0][: args.warmup + 20], args.warmup)
    river_pass(xs0[: args.warmup + 20], y0[: args.warmup + 20], args.warmup)
    a_passes: dict[str, list[dict]] = {n: [] for n in [*names, PEER]}
    extra: dict[str, dict] = {}
    for _ in range(args.repeats):
        for n in names:
            p = agent_pass(algs[n], configs[n], X0, labels[n][0], args.warmup)
            a_passes[n].append(p)
            extra[n] = {k: p[k] for k in ("uploads", "numbers", "kernels_used")}
        a_passes[PEER].append(river_pass(xs0, y0, args.warmup))
        print(f"round {_ + 1}/{args.repeats}: " + ", ".join(
            f"{n} {np.median(a_passes[n][-1]['us']):.1f}" for n in a_passes) + " µs", flush=True)
    peer = summarise(a_passes[PEER])

    rows = []
    for n in names:
        alg = algs[n]
        a = summarise(a_passes[n])
        row = {"algorithm": n, "title": alg.title, "in_fleet": alg.in_fleet, "lockstep": alg.lockstep,
               "bayesian": alg.bayesian, "kernels_used": extra[n]["kernels_used"],
               "agent": a, "agent_us": a["median_us"], "ratio_to_peer": a["median_us"] / peer["median_us"],
               "mean_ratio_to_peer": a["mean_us"] / peer["mean_us"],
               "learner_uploads_per_sample": extra[n]["uploads"] / args.steps,
               "learner_numbers_per_sample": extra[n]["numbers"] / args.steps}
        if alg.in_fleet:
            row["fleet"] = fleet_measures(n, configs[n], fleet, labels[n], args.repeats)
            print(f"{n}: {row['fleet']['upload_bytes_per_sample']:.0f} B/sample, aggregator "
                  f"{row['fleet']['aggregator_us_per_update']:.1f} µs/update", flush=True)
        rows.append(row)
    runtime = time.perf_counter() - t_start

    def notes(r: dict) -> str:
        parts = [] if r["in_fleet"] else ["paper's baseline: replay only, (a) only"]
        parts.append(f"{r['kernels_used']} of {DICTIONARY['n_kernels']} kernels" if r["kernels_used"]
                     else "its learner names no kernels (`kernel_names` is empty)")
        if r["bayesian"]:
            parts.append("predicts a variance")
        ups = r["learner_uploads_per_sample"]
        if 0 < ups < 0.5:
            parts.append(f"an upload every {1 / ups:.0f} samples; mean {r['agent']['mean_us']:.1f} µs/sample "
                         f"({r['mean_ratio_to_peer']:.2f}× River's mean)")
        parts.append(f"{r['learner_numbers_per_sample']:.0f} model numbers uploaded/sample")
        return "; ".join(parts)

    cmd = ".venv/bin/python benchmarks/bench_algorithms.py" + (" --quick" if args.quick else "")
    sizes = (f"{args.clients} clients × ({args.warmup} warm-up + {args.steps} timed) samples, "
             f"{args.repeats} repeat{'s' if args.repeats > 1 else ''}")
    lines = [
        "## Algorithms: agent step, upload and aggregation of every registered algorithm",
        "",
        f"Command: `{cmd}` ({sizes}; {runtime:.0f} s). Every algorithm of `streamfed.algorithms.names()` "
        "with one fleet shape, `FleetConfig(fleet=\"bench\", algorithm=name, n_inputs=10, seed=0)` and, for the "
        "families with a kernel dictionary, `n_kernels=4, n_features=50, bin_size=1` in their params (default "
        "hyperparameters otherwise; some algorithms use only one kernel of "
        "the four: the notes give the learner's own `kernel_names` count), on one stream, "
        "`synthetic_fleet(clients, warm-up + timed, 10, seed=0)` (a classifier, pFedGP, learns its targets cut "
        "into `n_classes` classes at the fleet's quantiles). "
        "Agent µs/sample: client 0's `Learner.learn` + `Learner.take_update` (async, through the plug-in "
        "contract), each sample timed alone with `perf_counter_ns` after `warm_up` and the warm-up samples; "
        "median over the repeats (fresh learners) of each one's median. Peer, interleaved with the algorithms "
        f"in every repeat: River {river.__version__} `linear_model.LinearRegression()` (defaults), `predict_one` "
        f"+ `learn_one` on the same samples (dicts built beforehand) = **{peer['median_us']:.2f} µs/sample** "
        f"(mean {peer['mean_us']:.2f}); the ratio is the algorithm's median over River's. Upload bytes/sample: "
        "an `AgentCore` per client (async, `upload_every=1`) over its whole stream, Σ `len(encode(m))` of "
        "the update messages `on_reading` returns / samples learned. Aggregator µs/update: those payloads "
        "(sample by sample, clients round-robin) into a fresh `AggregatorCore(mode=\"async\", window=1e9)` "
        "with `on_update`, then one `tick` closing the window; (Σ on_update + close) / accepted updates, "
        "median over the repeats. Baselines (`in_fleet = False`) get the agent figure only. "
        f"Machine: {machine()}; numpy {np.__version__}; kernels: "
        f"{'ahead-of-time build' if compiled.BACKEND == 'aot' else 'numba JIT'}; "
        f"OPENBLAS_NUM_THREADS={os.environ['OPENBLAS_NUM_THREADS']}; load average at the end {load_average()}.",
        "",
        f"| algorithm | agent µs/sample | ratio to {PEER} | upload bytes/sample | aggregator µs/update | notes |",
        "|---|---|---|---|---|---|",
        f"| {PEER} (peer) | {peer['median_us']:.2f} | 1.00× | – | – | `predict_one` + `learn_one` |",
    ]
    for r in rows:
        f = r.get("fleet")
        lines.append(f"| {r['algorithm']} | {r['agent_us']:.2f} | {r['ratio_to_peer']:.2f}× | "
                     f"{f['upload_bytes_per_sample']:.0f} | {f['aggregator_us_per_update']:.1f} | " if f else
                     f"| {r['algorithm']} | {r['agent_us']:.2f} | {r['ratio_to_peer']:.2f}× | – | – | ")
        lines[-1] += notes(r) + " |"
    fleet_rows = [r for r in rows if r.get("fleet")]
    if fleet_rows:
        lines += ["", "Behind the fleet columns (same run): updates per sample and their size, the aggregator's "
                  "`on_update` alone (decode, check, take; median) and the window's close, the global it "
                  "publishes and what receiving it costs client 0's agent (`AgentCore.on_global_payload`: "
                  "decode + `install_global`, on a copy of the agent after its stream — so it includes dropping "
                  "from the outbox every update the global includes, the whole stream's: the agents ran without "
                  "globals), and the agent core's whole `on_reading` + `encode` per sample (median):", "",
                  "| algorithm | updates/sample | bytes/update | on_update µs | window close µs | global bytes | "
                  "global install µs (outbox pruned) | AgentCore µs/sample |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in fleet_rows:
            f = r["fleet"]
            lines.append(f"| {r['algorithm']} | {f['uploads_per_sample']:.3f} | {f['bytes_per_upload']:.0f} | "
                         f"{f['on_update_median_us']:.1f} | {f['window_close_us']:.0f} | {f['global_bytes']} | "
                         f"{f['global_install_us']:.0f} ({f['global_install_pruned']}) | "
                         f"{f['agent_core_median_us']:.1f} |")
    config = {"shape": SHAPE, "clients": args.clients, "warmup": args.warmup, "steps": args.steps,
              "repeats": args.repeats, "command": cmd, "runtime_s": runtime, "river": river.__version__,
              "numpy": np.__version__, "backend": compiled.BACKEND,
              "openblas_threads": os.environ["OPENBLAS_NUM_THREADS"]}
    write_section(args.out, lines, {"config": config, "peer": {"name": PEER, **peer}, "rows": rows},
                  quick=args.quick)


if __name__ == "__main__":
    main()
