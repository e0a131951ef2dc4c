"""The README's first command at its default load: does the demo fleet federate, on a quiet machine and on a busy one?

    .venv/bin/python benchmarks/bench_demo.py [--out benchmarks/results/demo.md] [--quick] [--duration 30] [--runs 2]

Runs `streamfed demo` exactly as a user does (its own process, the defaults: 12 POF-MKL agents × 100 samples/s,
lock-free async windows of 0.2 s; only `--duration` and `--out` given), `runs` times on the machine as it is and
`runs` times with one busy-looping process per core beside it ("other work running": each takes a whole core
when it can, so the demo and Mosquitto get about half the machine). From each run's `summary.json`: readings
learned of those the sensors produced, the most versions any agent was behind the aggregator (sampled four
times a second), agents that never installed a global, connections lost, updates accepted and rejected,
prediction p99 (worst agent), the fleet MSE, and the demo process's CPU (user + system, from the kernel's
accounting of the child).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from streamfed.evaluation.bench import load_average, machine, write_section  # noqa: E402

HOG = "while True: pass"


def run_demo(duration: float, loaded: bool) -> dict:
    load_before = os.getloadavg()[0]  # what else the machine was doing (the 1-minute average)
    hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(os.cpu_count() or 1)] if loaded else []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.monotonic()
            proc = subprocess.run([sys.executable, "-m", "streamfed.cli", "demo", "--duration", str(duration),
                                   "--out", tmp], capture_output=True, text=True, timeout=duration + 120)
            wall = time.monotonic() - t0
            after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the demo reaped, the hogs not yet
            if proc.returncode != 0:
                raise RuntimeError(f"demo failed ({proc.returncode}): {proc.stdout[-2000:]}{proc.stderr[-2000:]}")
            summary = json.loads((Path(tmp) / "summary.json").read_text())
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    summary["cpu_s"] = cpu
    summary["process_wall_s"] = wall
    summary["loaded"] = loaded
    summary["load_before"] = load_before
    summary["connection_lost_lines"] = proc.stdout.count("connection lost") + proc.stderr.count("connection lost")
    return summary


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--runs", type=int, default=2)
    args = ap.parse_args()
    duration, runs = (5.0, 1) if args.quick else (args.duration, args.runs)
    t0 = time.perf_counter()
    rows = []
    for loaded in (False, True):
        for _ in range(runs):
            rows.append(run_demo(duration, loaded))
    lines = ["## The demo at its default load (the README's first command)", "",
             f"`streamfed demo --duration {duration:g}` with every other setting at its default (12 POF-MKL agents × "
             "100 samples/s, async windows of 0.2 s, Mosquitto from `broker_config/`), in its own process; "
             f"{runs} run(s) on the machine as it is, {runs} with one busy-looping process per core beside it. "
             "Versions behind: the most any agent was behind the aggregator, looked at 4 times a second. "
             "Machine: " + machine() + f"; load average at the end {load_average()}.", "",
             "| machine (1-min load average before) | learned / offered | versions behind (max) "
             "| agents without a global | connections lost | updates accepted | rejected | globals "
             "| p99 ms (worst agent) | fleet MSE | demo CPU s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in rows:
        cpu = f"{s['cpu_s']:.1f}"
        p99 = "—" if s["prediction_p99_ms"] is None else f"{s['prediction_p99_ms']:.2f}"
        what = "+ one busy loop per core" if s["loaded"] else "as it was"
        lines.append(f"| {what} ({s['load_before']:.2f}) | {s['samples']:,} / {s['samples_offered']:,} "
                     f"({s['learned_share']:.1%}) | {s['max_versions_behind']} | {s['agents_without_global']} | "
                     f"{s['connections_lost']} | {s['updates_accepted']:,} | {s['updates_rejected']} | "
                     f"{s['global_version']} | {p99} | {s['fleet_mse']:.4f} | {cpu} |")
    lines += ["", f"Command: `.venv/bin/python benchmarks/bench_demo.py{' --quick' if args.quick else ''}` "
              f"({time.perf_counter() - t0:.0f} s)."]
    write_section(args.out, lines, {"runs": rows}, quick=args.quick)


if __name__ == "__main__":
    main()
