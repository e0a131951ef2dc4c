"""The 10,000-agent ladder: light simulated agents (`loadtest run --light`) against Mosquitto and one aggregator.

    .venv/bin/python benchmarks/bench_fleet_10k.py --runs 1000:60:1:1,2500:60:1:2 --json out.json

Each run is `agents:seconds:window:processes`; results (the load test's JSON summaries, with the load average
at each start and end) are appended to `--json` as they come, so a run that breaks the machine leaves the others.
The markdown (benchmarks/results/fleet_10k.md) is written by hand from them: where it breaks needs words.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from streamfed.runtime.loadtest import LoadTestOptions, run_loadtest, summary_lines  # noqa: E402


def row(r: dict) -> str:
    """One markdown table row of a run."""
    o, a = r["options"], r["aggregator"]
    ms, ag = r.get("mosquitto_steady", {}), r.get("agents_steady", {})
    rej = sum((r["updates_rejected"] or {}).values())
    return (f"| {r['agents']:,} × {o['rate']:g}/s, {o['seconds']:g} s ({o['processes']}) | {o['window']:g} | "
            f"{r['samples_learned']:,} / {r['samples_expected']:,} | {r['updates_published']:,} "
            f"({r['updates_per_s']:.0f}/s) | {r['updates_accepted']:,.0f} | {r['updates_lost']} | {rej} | "
            f"{r['resent']} | {r['reconnects']} | {r['versions_behind_max']} | "
            f"{a['cpu_fraction_steady']:.2f}, {a['rss_bytes_max'] / 2**20:.0f} | "
            f"{r.get('ingest_lag_gauge_max_s', float('nan')):.2f} | "
            f"{ms.get('cpu_fraction', float('nan')):.2f}, {ms.get('rss_bytes_max', 0) / 2**20:.0f} | "
            f"{ag.get('cpu_fraction', float('nan')):.2f}, {ag.get('rss_bytes_max', 0) / 2**20:.0f} | "
            f"{r['lag_s']['p50']:.2f} / {r['lag_s']['p99']:.2f} | "
            f"{r['loadavg_start'][0]:.2f} → {r['loadavg'][0]:.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", required=True, help="agents:seconds:window:processes, comma-separated")
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--drain", type=float, default=60.0)
    args = ap.parse_args()
    done = json.loads(args.json.read_text()) if args.json.exists() else []
    for spec in args.runs.split(","):
        n, secs, w, procs = spec.split(":")
        opts = LoadTestOptions(agents=int(n), seconds=float(secs), window=float(w), processes=int(procs),
                               light=True, drain=args.drain)
        try:
            r = run_loadtest(opts)
        except RuntimeError as e:
            done.append({"options": vars(opts), "error": str(e)[:500], "loadavg": list(os.getloadavg())})
            print(f"run {spec} failed: {e}", flush=True)
        else:
            for p in r["agent_processes"]:
                p.pop("lateness_s", None)
            done.append(r)
            print("\n".join(summary_lines(r)), flush=True)
            print(row(r), flush=True)
        args.json.write_text(json.dumps(done, indent=1))


if __name__ == "__main__":
    main()
