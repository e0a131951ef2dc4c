"""FedBNR with forgetting on the readings' time base (`half_life_s`, docs/algorithms.md §4.14) on the Beijing streams.

    .venv/bin/python benchmarks/bench_forgetting.py                       # full streams, writes the results
    .venv/bin/python benchmarks/bench_forgetting.py --steps 2000 --out /tmp/forgetting.md   # smoke run

Not a test. Twelve stations, target CO, 10 inputs, `online` normalisation (each station standardises with its own
past samples only), metrics in those standardised units. Each station is a `FedBNRClient` (Gaussian RFF, D = 50,
F = 101 with the bias, bandwidth 2, uploads of ≥ 32 samples), one `FedBNRServer` sums the uploads (σ, λ refitted by
the evidence at every global). Lock-step rounds: every station learns its next `--round` rows (each at its own
reading's timestamp, `FedBNRClient.advance`), uploads, the server publishes, every station installs the global.
Scored: the prequential whole-stream MSE, mean NLPD and 95% coverage of every station, for each half-life.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # small matrices: one BLAS thread per process

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import shlex  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from concurrent.futures import ProcessPoolExecutor  # noqa: E402

import numpy as np  # noqa: E402

from streamfed.algorithms.fedbnr.client import FedBNRClient  # noqa: E402
from streamfed.algorithms.fedbnr.server import FedBNRServer  # noqa: E402
from streamfed.evaluation.datasets import load_beijing  # noqa: E402

HOUR = 3600.0


def run(half_life_h: float | None, steps: int | None, round_rows: int) -> dict:
    fleet = load_beijing(normalisation="online", split="station", steps=steps)
    streams = list(fleet.streams)
    h = None if half_life_h is None else half_life_h * HOUR
    clients = [FedBNRClient(n_inputs=s.n_inputs, n_features=50, bandwidth=2.0, seed=0, min_upload=32,
                            half_life_s=h, client_id=s.name) for s in streams]
    server = FedBNRServer.for_client(clients[0])
    times = [s.time.astype("datetime64[s]").astype(np.float64) for s in streams]
    longest = max(len(s) for s in streams)
    t0 = time.perf_counter()
    for start in range(0, longest, round_rows):
        for c, s, ts in zip(clients, streams, times, strict=True):
            for i in range(start, min(start + round_rows, len(s))):
                c.advance(ts[i])
                c.learn(s.X[i], float(s.y[i]))
            up = c.make_upload()
            if up is not None:
                server.apply(up)
        g = server.publish()
        for c in clients:
            c.apply_global(g)
    out = {"half_life_h": half_life_h, "seconds": time.perf_counter() - t0, "stations": {}}
    for c in clients:
        m = c.metrics
        out["stations"][c.client_id] = {"n": m.count, "mse": m.sq_loss / m.count, "nlpd": m.nlpd_sum / m.count,
                                        "coverage": m.covered / m.count}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--half-lives", default="none,24,168,720,2160", help="hours, comma separated ('none': off)")
    ap.add_argument("--steps", type=int, default=None, help="cut every stream to its first rows")
    ap.add_argument("--round", type=int, default=32, help="rows per station per round")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/forgetting.md")
    args = ap.parse_args()
    hls = [None if v.strip() == "none" else float(v) for v in args.half_lives.split(",")]
    with ProcessPoolExecutor(args.jobs) as pool:
        results = list(pool.map(run, hls, [args.steps] * len(hls), [args.round] * len(hls)))
    base = next((r for r in results if r["half_life_h"] is None), results[0])
    names = list(base["stations"])
    label = {id(r): ("none" if r["half_life_h"] is None else f"{r['half_life_h']:g} h") for r in results}
    lines = ["# FedBNR forgetting on the readings' time base: whole-stream error on the Beijing stations", "",
             f"Command: `.venv/bin/python {' '.join(shlex.quote(a) for a in sys.argv)}`", "",
             "Data: 12 Beijing stations, target CO, 10 inputs, `online` normalisation (causal), metrics in those "
             "standardised units. FedBNR: Gaussian RFF D = 50 (F = 101 with the bias), bandwidth 2, seed 0, uploads "
             f"of ≥ 32 samples, lock-step rounds of {args.round} rows per station, σ, λ refitted by the evidence at "
             "every global, every station installs every global. Forgetting: `half_life_s` on the readings' "
             "timestamps (docs/algorithms.md §4.14); `none` is FedBNR's default (no forgetting). "
             f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}.", "",
             "## Mean over the 12 stations", "",
             "| half-life | MSE | MSE / none | mean NLPD | 95% coverage | stations with lower MSE than none | "
             "run (s) |", "|---|---|---|---|---|---|---|"]
    for r in results:
        st = r["stations"]
        mse = np.mean([st[c]["mse"] for c in names])
        better = sum(st[c]["mse"] < base["stations"][c]["mse"] for c in names)
        lines.append(f"| {label[id(r)]} | {mse:.4f} | {mse / np.mean([base['stations'][c]['mse'] for c in names]):.3f} "
                     f"| {np.mean([st[c]['nlpd'] for c in names]):.3f} "
                     f"| {np.mean([st[c]['coverage'] for c in names]):.3f} | {better}/{len(names)} "
                     f"| {r['seconds']:.0f} |")
    lines += ["", "## MSE per station", "", "| station | " + " | ".join(label[id(r)] for r in results) + " |",
              "|---|" + "---|" * len(results)]
    for c in names:
        lines.append(f"| {c} | " + " | ".join(f"{r['stations'][c]['mse']:.4f}" for r in results) + " |")
    text = "\n".join(lines) + "\n"
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(text)
    with open(os.path.splitext(args.out)[0] + ".json", "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)
    print(text)


if __name__ == "__main__":
    main()
