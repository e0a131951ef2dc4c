"""One broker vs 3 regional brokers bridged to a core: agents held, updates/s, CPU per broker process, latency
from an update to the global that includes it, and the bytes crossing the core link.

    .venv/bin/python benchmarks/bench_bridges.py [--agents 600,1500] [--seconds 40] [--out results/bridges.md]

Three set-ups, each with real processes and the same light simulated agents (`streamfed/runtime/loadtest_light.py`:
one MQTT v5 connection per agent, 1 sample/s each, honest POF-MKL updates, QoS 1, outbox flow control):

* `1 broker`: one Mosquitto (the shipped dev.conf) and `streamfed aggregator` (async windows of 1 s);
* `3 regions + core, partials`: `broker_config/scripts/make-topology.py --dev` — a core Mosquitto and 3 regional
  ones bridged to it (QoS 1, persistent bridges); a `streamfed shard` per region next to its broker, the
  `streamfed reducer` at the core (windows of 1 s); the agents split evenly between the regions;
* `3 regions + core, updates`: the same brokers, every update bridged to `streamfed aggregator` at the core.

The bytes crossing the core link are read from the kernel's counters of the bridges' TCP connections (`ss -ti`:
MQTT with its framing, what a WAN link between sites would carry, TLS aside). A monitor subscribed to the global on the
agents' side (the single broker, or region `north`'s broker) times, per update, from its creation at the agent
to the first global whose `included` covers it: one hop (agent → broker → aggregator → broker) vs two (agent →
region → shard → region → bridge → core → reducer → core → bridge → region). CPU of every process from /proc over
the sampling phase. The plain profile (no TLS, no accounts) because thousands of agents would each need a
password hash; the production profile is what tests/test_bridges.py runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiomqtt
import msgpack

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_sharding import stop_services  # noqa: E402

from streamfed.evaluation.bench import load_average, machine, write_section  # noqa: E402
from streamfed.fleet.config import BrokerConfig  # noqa: E402
from streamfed.runtime.broker import dev_config  # noqa: E402
from streamfed.runtime.connection import client_kwargs  # noqa: E402
from streamfed.runtime.loadtest import LoadTestOptions, proc_stat, raise_nofile  # noqa: E402
from streamfed.runtime.mosquitto import Mosquitto  # noqa: E402
from streamfed.runtime.topology import LocalTopology, Region  # noqa: E402
from streamfed.wire.topics import global_topic  # noqa: E402

WINDOW = 1.0
REGIONS = ("north", "east", "south")
# key → label; "partials-0.5": the shards flush every 0.5 s instead of their default 0.1 s (fewer, fuller partials)
SETUPS = {"single": "1 broker", "partials": "3 regions + core, partials (flush 0.1 s)",
          "partials-0.5": "3 regions + core, partials (flush 0.5 s)", "updates": "3 regions + core, updates"}


def link_bytes(pids: set[int], core_port: int) -> tuple[int, int]:
    """Bytes the bridges (TCP connections of the regional brokers `pids` to the core's port) have sent and
    received so far, from the kernel's per-socket counters (`ss -ti`): nothing sits in the path."""
    out = subprocess.run(["ss", "-tinpH", "state", "established", f"( dport = :{core_port} )"], capture_output=True,
                         text=True, check=True).stdout
    up = down = 0
    owner = None
    for line in out.splitlines():
        m = re.search(r"pid=(\d+),", line)
        if m:
            owner = int(m.group(1))
            continue
        if owner in pids:
            sent, received = re.search(r"bytes_sent:(\d+)", line), re.search(r"bytes_received:(\d+)", line)
            up += int(sent.group(1)) if sent else 0
            down += int(received.group(1)) if received else 0
        owner = None
    return up, down


def streamfed_cmd() -> list[str]:
    exe = Path(sys.executable).parent / "streamfed"
    return [str(exe)] if exe.exists() else [sys.executable, "-c", "from streamfed.cli import main; main()"]


def service(workdir: Path, name: str, cfg_json: dict, args: list[str]) -> subprocess.Popen[bytes]:
    conf = workdir / f"{name}.json"
    conf.write_text(json.dumps(cfg_json))
    log = open(workdir / f"{name}.log", "wb")  # noqa: SIM115 - the child keeps it
    return subprocess.Popen([*streamfed_cmd(), *args, "--config", str(conf)], stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, preexec_fn=raise_nofile)


async def monitor(broker: BrokerConfig, fleet: str, seen: list, ready: asyncio.Event, stop: asyncio.Event) -> None:
    async with aiomqtt.Client(**client_kwargs(broker, f"{fleet}.monitor"), max_queued_incoming_messages=0) as c:
        await c.subscribe(global_topic(fleet), qos=1)
        ready.set()

        async def receive() -> None:
            async for m in c.messages:
                env = msgpack.unpackb(bytes(m.payload), raw=False)  # type: ignore[arg-type]
                seen.append((time.time(), int(env["global_version"]), dict(env.get("included") or {})))

        task = asyncio.create_task(receive())
        await stop.wait()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, aiomqtt.MqttError):
            await task


def latencies(agents: dict, seen: list) -> list[float]:
    """Per update (client, seq): first global seen that includes it − its creation."""
    seen = sorted(seen, key=lambda g: g[0])
    out = []
    for client, a in agents.items():
        k = 0
        for seq, created in enumerate(a["created"], 1):
            while k < len(seen) and seen[k][2].get(client, 0) < seq:
                k += 1
            if k == len(seen):
                break
            if created is not None:
                out.append(seen[k][0] - created)
    return out


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q / 100 * len(xs)))]


async def run(setup: str, n_agents: int, seconds: float) -> dict:
    opts = LoadTestOptions(agents=n_agents, seconds=seconds, window=WINDOW, light=True)
    fleet = f"br{os.getpid() % 10000}{n_agents}"
    cfg = opts.fleet_config(fleet)
    clients = [f"a{i:05d}" for i in range(n_agents)]
    workdir = Path(tempfile.mkdtemp(prefix="bench-bridges-"))
    procs: dict[str, subprocess.Popen[bytes]] = {}
    brokers: dict[str, int] = {}  # name → pid
    topo = single = None
    stop, ready = asyncio.Event(), asyncio.Event()
    seen: list = []
    try:
        if setup == "single":
            single = Mosquitto(dev_config, workdir=workdir / "mosquitto", preexec_fn=raise_nofile).start()
            brokers["broker"] = single.proc.pid  # type: ignore[union-attr]
            agent_brokers = {"all": (BrokerConfig(port=single.port), clients)}  # type: ignore[arg-type]
            agg_broker = watch = BrokerConfig(port=single.port)  # type: ignore[arg-type]
        else:
            regions = [Region(r, clients[i::3]) for i, r in enumerate(REGIONS)]
            uplink = "updates" if setup == "updates" else "partials"
            topo = LocalTopology(fleet, regions, uplink=uplink, dev=True, preexec_fn=raise_nofile)
            topo.start()
            brokers.update({n: m.proc.pid for n, m in topo.brokers.items()})  # type: ignore[union-attr]
            agent_brokers = {r.name: (topo.broker_config(r.name), list(r.agents)) for r in regions}
            agg_broker, watch = topo.broker_config("core"), topo.broker_config("north")
        fleet_json = {"fleet": cfg.model_dump(mode="json")}
        names = ",".join(clients)
        if setup.startswith("partials"):
            assert topo is not None
            procs["reducer"] = service(workdir, "reducer", {**fleet_json, "broker": agg_broker.model_dump(mode="json")},
                                       ["reducer", "--clients", names, "--mode", "async", "--window", str(WINDOW),
                                        "--shards", ",".join(REGIONS)])
            for r in REGIONS:
                procs[f"shard {r}"] = service(workdir, f"shard-{r}",
                                              {**fleet_json, "broker": topo.broker_config(r).model_dump(mode="json")},
                                              ["shard", "--name", r, "--clients", names, "--mode", "async",
                                               *(["--flush-interval", "0.5"] if setup == "partials-0.5" else [])])
        else:
            procs["aggregator"] = service(workdir, "aggregator",
                                          {**fleet_json, "broker": agg_broker.model_dump(mode="json")},
                                          ["aggregator", "--clients", names, "--window", str(WINDOW)])
        mon = asyncio.create_task(monitor(watch, fleet, seen, ready, stop))
        await asyncio.wait_for(ready.wait(), 20)
        deadline = time.monotonic() + 60
        while not seen:  # the aggregator's (reducer's) first retained global reached the agents' side
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs.values()):
                raise RuntimeError(f"{setup}: services did not come up (logs in {workdir})")
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)  # shards subscribed
        ramp = max(1.0, n_agents / 500)
        t_start = time.time() + ramp + 3.0
        agent_procs, outs = [], []
        for key, (broker, share) in agent_brokers.items():
            spec = {"fleet": cfg.model_dump(mode="json"), "broker": broker.model_dump(mode="json"),
                    "clients": [(c, clients.index(c)) for c in share], "rate": 1.0, "samples": int(seconds),
                    "t_start": t_start, "drain": 30.0, "ramp": ramp, "seed": 0, "profile": None,
                    "resend_after": opts.resend_timeout(), "light": True, "outbox_limit": 8, "linger": 3.0}
            sp, out = workdir / f"agents-{key}.json", workdir / f"agents-{key}.out.json"
            sp.write_text(json.dumps(spec))
            outs.append(out)
            agent_procs.append(subprocess.Popen([sys.executable, "-m", "streamfed.runtime.loadtest", "agents", str(sp),
                                                 str(out)], stdout=open(workdir / f"agents-{key}.log", "wb"),  # noqa: SIM115
                                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                preexec_fn=raise_nofile))
        while time.time() < t_start:
            await asyncio.sleep(0.05)
        pids = {**{f"mosquitto {k}": v for k, v in brokers.items()}, **{k: p.pid for k, p in procs.items()},
                **{f"agents {i}": p.pid for i, p in enumerate(agent_procs)}}
        cpu0 = {k: proc_stat(pid)[0] for k, pid in pids.items()}
        t0, v0 = time.time(), max(g[1] for g in seen)
        regional = {pid for n, pid in brokers.items() if n != "core"} if topo else set()
        core_port = topo.ports["core"] if topo else 0
        up0, down0 = link_bytes(regional, core_port) if topo else (0, 0)
        while time.time() < t_start + seconds:
            await asyncio.sleep(0.2)
        cpu1 = {k: proc_stat(pid)[0] for k, pid in pids.items()}
        t1, v1 = time.time(), max(g[1] for g in seen)
        up1, down1 = link_bytes(regional, core_port) if topo else (0, 0)
        while any(p.poll() is None for p in agent_procs):
            await asyncio.sleep(0.2)
        await asyncio.sleep(2 * WINDOW)
        stop.set()
        await mon
        agents: dict = {}
        for out in outs:
            agents.update(json.loads(out.read_text())["agents"])
        lat = latencies(agents, seen)
        published = sum(a["seq"] for a in agents.values())
        final = max(seen, key=lambda g: g[1])[2]
        lost = sum(1 for c, a in agents.items() if final.get(c, 0) < a["seq"])
        rounds = max(1, v1 - v0)
        return {
            "setup": setup, "label": SETUPS[setup], "agents": n_agents, "seconds": seconds, "updates": published,
            "updates_per_s": published / seconds, "agents_not_fully_included": lost,
            "cpu_cores": {k: (cpu1[k] - cpu0[k]) / (t1 - t0) for k in pids},
            "latency_s": {"p50": pct(lat, 50), "p99": pct(lat, 99), "n": len(lat)},
            "rounds": v1 - v0, "core_link_bytes": {"up": up1 - up0, "down": down1 - down0},
            "core_link_bytes_per_round": {"up": (up1 - up0) / rounds, "down": (down1 - down0) / rounds},
            "resent": sum(a["resent"] for a in agents.values()), "loadavg_end": list(os.getloadavg()),
        }
    finally:
        stop.set()
        stop_services(procs)
        if topo is not None:
            topo.close()
        if single is not None:
            single.close()


def table(results: list[dict]) -> list[str]:
    lines = ["| set-up | agents × 1/s | updates/s | not all included | brokers' CPU (cores) | services' CPU (cores) "
             "| agents' CPU | update → global p50 / p99 s | core link bytes/round up / down | load avg at end |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        cpu = r["cpu_cores"]
        brokers = ", ".join(f"{k.split(' ', 1)[1]} {v:.2f}" for k, v in cpu.items() if k.startswith("mosquitto"))
        services = ", ".join(f"{k} {v:.2f}" for k, v in cpu.items() if not k.startswith(("mosquitto", "agents")))
        agents = sum(v for k, v in cpu.items() if k.startswith("agents"))
        link = r["core_link_bytes_per_round"]
        link_s = "—" if r["setup"] == "single" else f"{link['up'] / 1024:,.1f} KiB / {link['down'] / 1024:,.1f} KiB"
        lines.append(f"| {r['label']} | {r['agents']:,} | {r['updates_per_s']:.0f} | {r['agents_not_fully_included']} "
                     f"| {brokers} | {services} | {agents:.2f} | {r['latency_s']['p50']:.2f} / "
                     f"{r['latency_s']['p99']:.2f} | {link_s} | {r['loadavg_end'][0]:.2f} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--agents", default="600,1500")
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument("--setups", default=",".join(SETUPS), help=f"of {', '.join(SETUPS)}")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--append", action="store_true", help="keep the runs already in --out's JSON, add these")
    args = ap.parse_args()
    load_start = load_average()
    results, commands = [], []
    if args.append and args.out is not None and args.out.with_suffix(".json").exists():
        old = json.loads(args.out.with_suffix(".json").read_text())
        results, commands = old["results"], old.get("commands", [])
    commands.append(f"PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_bridges.py --agents {args.agents} "
                    f"--seconds {args.seconds:g} --setups {args.setups} --out {args.out}"
                    + (" --append" if args.append else "") + f"   # load average at start {load_start}")
    for n in (int(x) for x in args.agents.split(",")):
        for setup in args.setups.split(","):
            r = asyncio.run(run(setup, n, args.seconds))
            print(json.dumps(r), flush=True)
            results.append(r)
    lines = ["# Bridged brokers: 1 broker vs 3 regional brokers + a core", "",
             "Agents and updates/s held at 1 sample/s per agent, CPU per broker process, latency from an update to "
             "the global that includes it (one hop vs two) and the bytes crossing the core link per round (partial "
             "sums vs raw updates), with real Mosquitto and `streamfed` processes (`benchmarks/bench_bridges.py`).",
             "", f"Machine: {machine()}; 2 cores shared with other work (the load average is in the table).", "",
             "Commands (from the repository; the JSON of every run is in `bridges.json` beside this file):", "",
             *(f"    {c}" for c in commands), "",
             "Light simulated agents at 1 sample/s each (one MQTT v5 connection per agent, honest async POF-MKL "
             "updates N = 8, D = 50, d = 4), windows of 1 s, the dev profile (plain MQTT on loopback) generated by "
             "`broker_config/scripts/make-topology.py --dev`; every process on the same 2 cores. Latency: from an "
             "update's creation at its agent to the first global covering it, seen on the agents' side (the single "
             "broker, or region north's broker: two hops). Core link: bytes of the bridges' TCP connections to the "
             "core (kernel counters), per global (round), summed over the 3 bridges.", "", *table(results)]
    write_section(args.out, lines, {"results": results, "commands": commands})


if __name__ == "__main__":
    main()
