"""Memory: resident set of an agent process (with and without `import torch`) and state per agent.

    .venv/bin/python benchmarks/bench_memory.py [--out benchmarks/results/memory.md] [--quick]

1. Resident set (VmRSS, and the peak VmHWM, from /proc/self/status) of a **fresh Python process**
   that imports the agent runtime (`streamfed.runtime.agent`: numpy, aiomqtt, the learners),
   builds one `AgentCore`, learns 2,000 samples and installs a global — the work of an edge agent —
   for a POF-MKL and a FedBNR agent: with the ahead-of-time kernel build (the default once
   `streamfed kernels build` has run), with numba's JIT instead, and with a preceding `import torch`
   (the torch 2.13.0 CPU wheel). Peers in the same run: a bare interpreter, `import numpy`,
   `import numba`. Each configuration runs `repeats` times, interleaved; medians. (numba's compiled
   functions come from its on-disk cache, warmed by a first discarded round.)
2. State per simulated agent, in one process: the pickled snapshot an agent checkpoints
   (`AgentCore.snapshot()`), the numpy bytes reachable from its learner, and the resident-set growth
   per agent when 200 of them are built and fed (everything: learner, error feedback, label join,
   metrics, Python objects), for several sizes.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from streamfed.evaluation.bench import load_average, machine, write_section  # noqa: E402

CHILD = r"""
import json, sys
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
torch_first, kind = sys.argv[1] == "1", sys.argv[2]
if torch_first:
    import torch  # noqa: F401
stages = {}
if kind in ("pofmkl", "fedbnr"):
    import numpy as np
    import streamfed.runtime.agent  # noqa: F401  (the agent runtime: aiomqtt, protocol, learners)
    from streamfed.fleet.agent import AgentCore
    from streamfed.fleet.aggregator import AggregatorCore
    from streamfed.fleet.config import FleetConfig
    from streamfed.wire.message import encode
    from streamfed.fleet.sources import Reading
    stages["imports"] = rss()
    if kind == "pofmkl":
        cfg = FleetConfig(fleet="m", algorithm="pofmkl", n_inputs=10, n_kernels=16, n_features=100, bin_size=2)
    else:
        cfg = FleetConfig(fleet="m", algorithm="fedbnr", n_inputs=10, n_kernels=1, n_features=200,
                          kernels=["gaussian:1.0"], fedbnr={"fit_hyperparameters": False})
    core = AgentCore(cfg, "a1", 0)
    stages["core"] = rss()
    # steady state: the fleet loop in-process (every update to an aggregator core, a global back every
    # 50 samples), so the outbox and the unacknowledged uploads stay as short as with a live aggregator
    agg = AggregatorCore(cfg, clients=["a1"], mode="async", window=0.0)
    rng = np.random.default_rng(0)
    for i in range(2000):
        _, msgs = core.on_reading(Reading(f"r{i}", rng.uniform(-1, 1, 10), 0.0, float(rng.normal())))
        for m in msgs:
            agg.on_update("a1", encode(m))
        if i % 50 == 49:
            agg.tick(now=1e12)
            core.on_global_payload(encode(agg.global_message()))
    stages["learned"] = rss()
    assert len(core.outbox) <= 50, len(core.outbox)
elif kind == "numpy":
    import numpy  # noqa: F401
elif kind == "numba":
    import numba  # noqa: F401
out = {"stages": stages, "numba_loaded": "numba" in sys.modules}
for line in open("/proc/self/status"):
    if line.startswith(("VmRSS:", "VmHWM:", "RssAnon:", "RssFile:")):
        out[line.split(":")[0]] = int(line.split()[1]) * 1024
print(json.dumps(out))
"""

# (label, import torch first, kind, kernel backend: "aot" = the ahead-of-time build, what
# `scripts/setup.sh` installs and agents use by default; "jit" = numba's JIT)
PROCS = [("bare interpreter", False, "bare", "aot"), ("import numpy", False, "numpy", "aot"),
         ("import numba", False, "numba", "aot"),
         ("POF-MKL agent (N = 16, D = 100, M = 2)", False, "pofmkl", "aot"),
         ("POF-MKL agent, numba JIT kernels", False, "pofmkl", "jit"),
         ("POF-MKL agent + import torch", True, "pofmkl", "aot"),
         ("FedBNR agent (K = 1, F = 401)", False, "fedbnr", "aot"),
         ("FedBNR agent, numba JIT kernels", False, "fedbnr", "jit"),
         ("FedBNR agent + import torch", True, "fedbnr", "aot"),
         ("import torch alone", True, "bare", "aot")]


def child(torch_first: bool, kind: str, backend: str) -> dict[str, int]:
    env = {**os.environ, "STREAMFED_KERNELS": backend}
    res = subprocess.run([sys.executable, "-c", CHILD, "1" if torch_first else "0", kind], capture_output=True,
                         text=True, cwd=ROOT, check=True, env=env)
    return json.loads(res.stdout.strip().splitlines()[-1])


def rss_per_process(repeats: int, warm: bool = True) -> list[dict]:
    # the ahead-of-time kernels of every family, as `streamfed kernels build` makes them (a no-op when they exist;
    # `build()` alone compiles only the groups registered in this process)
    subprocess.run([sys.executable, "-m", "streamfed.cli", "kernels", "build"], cwd=ROOT, check=True,
                   capture_output=True)
    for _, t, k, b in PROCS if warm else ():  # warm numba's cache and the page cache; discarded
        child(t, k, b)
    got: dict[int, list[dict[str, int]]] = {i: [] for i in range(len(PROCS))}
    for _ in range(repeats):
        for i, (_, t, k, b) in enumerate(PROCS):
            got[i].append(child(t, k, b))
    return [{"process": label, "torch": t, "kind": k, "backend": b,
             "numba_loaded": all(g["numba_loaded"] for g in got[i]),
             "rss_bytes": float(np.median([g["VmRSS"] for g in got[i]])),
             "hwm_bytes": float(np.median([g["VmHWM"] for g in got[i]])),
             "anon_bytes": float(np.median([g["RssAnon"] for g in got[i]])),
             "file_bytes": float(np.median([g["RssFile"] for g in got[i]])),
             "stages": {s: float(np.median([g["stages"][s] for g in got[i]])) for s in got[i][0]["stages"]}}
            for i, (label, t, k, b) in enumerate(PROCS)]


def _ndarray_bytes(obj, seen: set[int], depth: int = 0) -> int:
    if id(obj) in seen or depth > 6:
        return 0
    seen.add(id(obj))
    if isinstance(obj, np.ndarray):
        base = obj
        while isinstance(base.base, np.ndarray):
            base = base.base
        if id(base) in seen and base is not obj:
            return 0
        seen.add(id(base))
        return int(base.nbytes)
    if isinstance(obj, dict):
        return sum(_ndarray_bytes(v, seen, depth + 1) for v in obj.values())
    if isinstance(obj, list | tuple | set):
        return sum(_ndarray_bytes(v, seen, depth + 1) for v in obj)
    total = 0
    d = getattr(obj, "__dict__", None)
    if d:
        total += _ndarray_bytes(d, seen, depth + 1)
    for s in getattr(type(obj), "__slots__", ()):
        if hasattr(obj, s):
            total += _ndarray_bytes(getattr(obj, s), seen, depth + 1)
    return total


def _rss() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def state_per_agent(sizes: list[dict], n_agents: int, steps: int) -> list[dict]:
    """One fresh process per size (memory freed by a previous size would be reused and hide the growth)."""
    rows = []
    for size in sizes:
        res = subprocess.run([sys.executable, __file__, "--state", json.dumps(size), "--state-agents", str(n_agents),
                              "--state-steps", str(steps)], capture_output=True, text=True, cwd=ROOT, check=True)
        rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
    return rows


def _state_rows(sizes: list[dict], n_agents: int, steps: int) -> list[dict]:
    from streamfed.fleet.agent import AgentCore
    from streamfed.fleet.config import FleetConfig
    from streamfed.fleet.sources import Reading

    rows = []
    rng = np.random.default_rng(0)
    for size in sizes:
        cfg = FleetConfig(fleet="m", n_inputs=10, **size)
        xs, ys = rng.uniform(-1, 1, (steps, 10)), rng.normal(size=steps)
        AgentCore(cfg, "warm", 0).on_reading(Reading("w", xs[0], 0.0, 0.0))
        before = _rss()
        cores = []
        for a in range(n_agents):
            core = AgentCore(cfg, f"a{a}", a)
            for i in range(steps):
                core.on_reading(Reading(f"r{i}", xs[i], 0.0, float(ys[i])))
            core.outbox.clear()  # as if every update had been included (the outbox is transient)
            cores.append(core)
        grown = (_rss() - before) / n_agents
        snap = pickle.dumps(cores[0].snapshot(), protocol=pickle.HIGHEST_PROTOCOL)
        learner = pickle.dumps(cores[0].learner, protocol=pickle.HIGHEST_PROTOCOL)
        label = f"{cfg.algorithm} K = {cfg.params.n_kernels}, D = {cfg.params.n_features}, F = {cfg.feature_dim}"
        rows.append({"agent": label, **size, "snapshot_pickle_bytes": len(snap), "learner_pickle_bytes": len(learner),
                     "learner_ndarray_bytes": _ndarray_bytes(cores[0].learner, set()),
                     "rss_per_agent_bytes": grown, "agents_built": n_agents})
        del cores
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--state", help=argparse.SUPPRESS)  # internal: one size's state, as JSON, in this process
    ap.add_argument("--state-agents", type=int, default=200, help=argparse.SUPPRESS)
    ap.add_argument("--state-steps", type=int, default=100, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.state:
        print(json.dumps(_state_rows([json.loads(args.state)], args.state_agents, args.state_steps)[0]))
        return
    repeats = 1 if args.quick else args.repeats
    procs = rss_per_process(repeats, warm=not args.quick)  # quick: no warm-up pass (figures indicative)
    sizes = [{"algorithm": "pofmkl", "n_kernels": 8, "n_features": 50},
             {"algorithm": "pofmkl", "n_kernels": 16, "n_features": 100, "bin_size": 2},
             {"algorithm": "pofmkl", "n_kernels": 64, "n_features": 100, "bin_size": 4},
             {"algorithm": "fedbnr", "n_kernels": 1, "n_features": 50, "kernels": ["gaussian:1.0"]},
             {"algorithm": "fedbnr", "n_kernels": 1, "n_features": 200, "kernels": ["gaussian:1.0"]},
             {"algorithm": "fedbnr", "n_kernels": 4, "n_features": 50}]
    if args.quick:
        sizes = [sizes[0], sizes[3]]
    state = state_per_agent(sizes, 20 if args.quick else 200, 100)
    mib = 2**20
    base = next(p for p in procs if p["kind"] == "bare" and not p["torch"])["rss_bytes"]
    agent_rss = {(p["kind"], p["torch"], p["backend"]): p["rss_bytes"] for p in procs}
    target = max(agent_rss[("pofmkl", False, "aot")], agent_rss[("fedbnr", False, "aot")]) / mib
    jit_max = max(agent_rss[("pofmkl", False, "jit")], agent_rss[("fedbnr", False, "jit")]) / mib
    numba = next(p for p in procs if p["kind"] == "numba")
    aot_numba_free = all(not p["numba_loaded"] for p in procs if p["kind"] in ("pofmkl", "fedbnr")
                         and p["backend"] == "aot" and not p["torch"])
    lines = [
        "## Memory: agent process resident set, state per agent",
        "",
        "Command: `.venv/bin/python benchmarks/bench_memory.py`. Fresh processes, each measured at its end "
        "from /proc/self/status; the agent ones import the agent runtime, build an `AgentCore` and learn "
        "2,000 samples (d = 10) in the fleet's steady state (each update handed to an in-process aggregator "
        "core, a global installed every 50 samples; FedBNR without the evidence fit). Resident set after each "
        f"stage in the last columns. Median of {repeats} interleaved runs. "
        f"Machine: {machine()}; load average at the end {load_average()}.",
        "",
        "| process | VmRSS MiB | of it private (RssAnon) | of it file-backed (RssFile) | VmHWM (peak) MiB | "
        "above the bare interpreter MiB | after imports | after AgentCore() | after 2,000 samples |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for p in procs:
        lines.append(f"| {p['process']} | {p['rss_bytes'] / mib:.1f} | {p['anon_bytes'] / mib:.1f} | "
                     f"{p['file_bytes'] / mib:.1f} | {p['hwm_bytes'] / mib:.1f} | "
                     f"{(p['rss_bytes'] - base) / mib:.1f} | "
                     + " | ".join(f"{p['stages'][k] / mib:.1f}" if k in p["stages"] else "–"
                                  for k in ("imports", "core", "learned")) + " |")
    torch_cost = (agent_rss[("pofmkl", True, "aot")] - agent_rss[("pofmkl", False, "aot")]) / mib
    lines += ["", f"**Target (agent RSS without torch ≤ 150 MB): {'met' if target * mib <= 150e6 else 'not met'}** "
              f"— {target:.0f} MiB for the larger of the two agents, with the learners' kernels compiled ahead of "
              "time (`streamfed kernels build`, run by `scripts/setup.sh`; the agent then "
              f"{'never imports numba' if aot_numba_free else 'STILL IMPORTS numba'}). The same agents on numba's "
              f"JIT: up to {jit_max:.0f} MiB — `import numba` alone is {numba['rss_bytes'] / mib:.0f} MiB "
              f"({numba['file_bytes'] / mib:.0f} MiB of it file-backed: the pages of LLVM's shared library), and "
              "loading compiled functions from numba's cache touches more of LLVM. Both backends run the same "
              "numba source and give the same numbers (`tests/test_compiled.py`). `import torch` adds "
              f"{torch_cost:.0f} MiB to an agent (streamfed never imports it).", "",
              "State per simulated agent (after 100 samples; the outbox emptied as after inclusion): the "
              "checkpointed snapshot, the learner alone, its numpy arrays, and the resident-set growth per "
              f"agent over {state[0]['agents_built']} agents built in one fresh process per size (POF-MKL: most "
              "of it is the random frequencies, N·D·d numbers twice — as given and transposed — which agents "
              "of one process could share):", "",
              "| agent | snapshot pickle KiB | learner pickle KiB | learner numpy KiB | RSS per agent KiB |",
              "|---|---|---|---|---|"]
    for r in state:
        lines.append(f"| {r['agent']} | {r['snapshot_pickle_bytes'] / 1024:.1f} | "
                     f"{r['learner_pickle_bytes'] / 1024:.1f} | "
                     f"{r['learner_ndarray_bytes'] / 1024:.1f} | {r['rss_per_agent_bytes'] / 1024:.1f} |")
    write_section(args.out, lines, {"processes": procs, "state": state, "target_met": target * mib <= 150e6},
                  quick=args.quick)


if __name__ == "__main__":
    main()
