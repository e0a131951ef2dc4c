#!/usr/bin/env python3
"""Write the Mosquitto configurations of a fleet spread over sites: one core broker and R regional brokers,
each region bridged to the core (TLS, an account per bridge, QoS 1, persistent bridge sessions).

    make-topology.py [-o OUT_DIR] [--etc DIR] [--data DIR] [--dev] TOPOLOGY.toml

TOPOLOGY.toml (see broker_config/mosquitto/topology-example.toml):

    fleet = "wind"
    uplink = "partials"          # "partials": a shard per region, the reducer at the core (default)
                                 # "updates": every update crosses to an aggregator at the core (flat)
    shard_group = "shards"       # the regional shards' $share group (streamfed shard --group)
    monitor = "monitor"          # optional: a $SYS reader account on every broker

    [core]
    address = "core.example.net" # what the regional bridges connect to (a name in the core's certificate)
    port = 8883                  # the core's TLS listener
    bridge_port = 8883           # optional: the port the bridges connect to, if not `port` (a relay between)

    [[region]]
    name = "north"
    port = 8883                  # this regional broker's TLS listener (agents and shards connect here)
    agents = ["t-01", "t-02"]
    shards = ["north"]           # default: one shard named after the region ("partials" uplink only)

For every broker B (`core` and each region) OUT_DIR/B/ receives `mosquitto.conf` (the shipped prod.conf with
B's listener, paths and, for a region, its bridge), `roster.toml` and `dynamic-security.json` (written by
make-dynsec.py's own functions: agents, shards, reducer or aggregator accounts, each bound to its client id).
Copy OUT_DIR/B/ to B's `--etc` directory (default /etc/mosquitto/streamfed; `{broker}` in --etc or --data
is replaced by B's name, for several brokers on one host) and give each host a certificate from one CA:
`make-certs.sh -d DIR/certs -n <address>` (copy ca.crt and ca.key into each DIR/certs first).

What each bridge carries (region ⇄ core, all QoS 1, topics `streamfed/v1/<fleet>/…`):

    out  partials/<shard>   (partials uplink) or updates/+ (updates uplink), and status/+
    in   global (retained), acks/+, shard_acks/<shard> (partials uplink)

The bridge logs in to the core as `<fleet>.bridge.<region>` (client id likewise): the core lets it send only
its own region's partials (or its own agents' updates) and statuses, and hands it only the global, its own
agents' acks and its own shards' acknowledgements. Its password is made up here and written into the regional
mosquitto.conf (`remote_password`), so that file is secret: root:mosquitto 0640 when run as root, like the
JSON; an existing one is read back and its bridge password kept, so regenerating does not break the link.
Persistent on both sides (cleansession false, local_cleansession false): while the link is down, what goes up
waits in the regional broker's queue for the bridge and what comes down waits at the core, up to
`max_queued_messages` each (prod.conf); the agents' outboxes and the shards' unacknowledged partials cover
anything beyond that, or lost in a broker crash between two autosaves.

`--dev` writes the same topology from dev.conf instead, for one machine's loopback only (benchmarks, trying it
out): plain MQTT on 127.0.0.1, anonymous, no dynamic security, bridges without TLS or accounts.

Exit status 2 on a bad topology (one line on stderr). Standard library only (python3 3.11 or later).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import secrets
import sys
import tomllib
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PROD_CONF = HERE.parent / "mosquitto" / "prod.conf"
DEV_CONF = HERE.parent / "mosquitto" / "dev.conf"
DEFAULT_ETC = "/etc/mosquitto/streamfed"
DEFAULT_DATA = "/var/lib/mosquitto/"
TOP_KEYS = {"fleet", "uplink", "shard_group", "monitor", "core", "region"}
REGION_KEYS = {"name", "port", "agents", "shards"}
CORE_KEYS = {"address", "port", "bridge_port"}


def _dynsec() -> Any:
    """make-dynsec.py, loaded as a module (its name has a hyphen): one place for accounts and roles."""
    spec = importlib.util.spec_from_file_location("make_dynsec", HERE / "make-dynsec.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


DYNSEC = _dynsec()
RosterError = DYNSEC.RosterError


def _port(value: Any, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 65535:
        raise RosterError(f"{what} must be a port number (1-65535), not {value!r}")
    return value


def parse(top: dict[str, Any]) -> dict[str, Any]:
    """Check a parsed topology; returns it normalised (defaults filled in). Raises RosterError."""
    bad = set(top) - TOP_KEYS
    if bad:
        raise RosterError(f"unknown topology key(s): {', '.join(sorted(bad))}")
    fleet = DYNSEC.check_name(top.get("fleet"), "fleet name")
    uplink = top.get("uplink", "partials")
    if uplink not in ("partials", "updates"):
        raise RosterError(f"uplink is \"partials\" or \"updates\", not {uplink!r}")
    core = top.get("core")
    if not isinstance(core, dict) or set(core) - CORE_KEYS:
        raise RosterError("[core] needs address (and port), nothing else")
    address = core.get("address")
    if not isinstance(address, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9.:-]{0,252}", address):
        raise RosterError(f"core address must be a host name or IP address, not {address!r}")
    regions = top.get("region")
    if not isinstance(regions, list) or not regions:
        raise RosterError("the topology names no region (add a [[region]] table)")
    out_regions, agents_seen, shards_seen = [], set(), set()
    for r in regions:
        if not isinstance(r, dict) or set(r) - REGION_KEYS:
            what = sorted(set(r) - REGION_KEYS) if isinstance(r, dict) else r
            raise RosterError(f"a [[region]] has unknown keys: {what}")
        name = DYNSEC.check_name(r.get("name"), "region name")
        if name == "core" or name in {x["name"] for x in out_regions}:
            raise RosterError(f"region name {name!r} is used twice (or is \"core\")")
        agents = DYNSEC.check_names(r.get("agents", []), "agents")
        shards = DYNSEC.check_names(r.get("shards", [name] if uplink == "partials" else []), "shards")
        if uplink == "updates" and shards:
            raise RosterError(f"region {name!r}: shards run only with uplink = \"partials\"")
        if uplink == "partials" and not shards:
            raise RosterError(f"region {name!r}: the partials uplink needs a shard in every region")
        for what, names, seen in (("agent", agents, agents_seen), ("shard", shards, shards_seen)):
            twice = sorted(set(names) & seen)
            if twice:
                raise RosterError(f"{what}(s) in two regions: {', '.join(twice)}")
            seen.update(names)
        out_regions.append({"name": name, "port": _port(r.get("port", 8883), f"region {name!r} port"),
                            "agents": agents, "shards": shards})
    monitor = top.get("monitor")
    group = DYNSEC.check_name(top.get("shard_group", "shards"), "shard group")
    return {"fleet": fleet, "uplink": uplink, "shard_group": group,
            "monitor": None if monitor is None else DYNSEC.check_name(monitor, "monitor name"),
            "core": {"address": address, "port": _port(core.get("port", 8883), "core port"),
                     "bridge_port": _port(core.get("bridge_port", core.get("port", 8883)), "core bridge_port")},
            "regions": out_regions}


def bridge_user(fleet: str, region: str) -> str:
    return f"{fleet}.bridge.{region}"


def rosters(top: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """make-dynsec.py rosters per broker (the bridges' accounts at the core are added by :func:`core_accounts`)."""
    fleet, flat = top["fleet"], top["uplink"] == "updates"
    out: dict[str, dict[str, Any]] = {
        "core": {"fleet": [{"name": fleet, "agents": [], "aggregator": flat, "reducer": not flat}]}}
    for r in top["regions"]:
        out[r["name"]] = {"fleet": [{"name": fleet, "agents": r["agents"], "aggregator": False, "reducer": False,
                                     "shards": r["shards"], "shard_group": top["shard_group"]}]}
    if top["monitor"]:
        for roster in out.values():
            roster["monitor"] = top["monitor"]
    return out


def core_accounts(top: dict[str, Any]) -> tuple[list[Any], list[dict[str, Any]]]:
    """The bridges' accounts at the core, each bound to its client id, allowed its own region's traffic only."""
    p = f"{DYNSEC.ROOT}/{top['fleet']}"
    acl = DYNSEC.acl
    accounts, roles = [], []
    for r in top["regions"]:
        user = bridge_user(top["fleet"], r["name"])
        up = [f"{p}/partials/{s}" for s in r["shards"]] or [f"{p}/updates/{a}" for a in r["agents"]]
        acls = [acl("publishClientSend", t) for t in [*up, *(f"{p}/status/{a}" for a in r["agents"])]]
        # It subscribes with wildcards (one line per topic pattern in its config) but is handed only its own
        # agents' acks and its own shards' acknowledgements: the other regions' never leave the core.
        acls += [acl("subscribePattern", t) for t in (f"{p}/global", f"{p}/acks/+", f"{p}/shard_acks/+")]
        acls += [acl("publishClientReceive", t) for t in
                 [f"{p}/global", *(f"{p}/acks/{a}" for a in r["agents"]),
                  *(f"{p}/shard_acks/{s}" for s in r["shards"])]]
        roles.append({"rolename": user, "acls": acls})
        accounts.append(DYNSEC.Account(user, user, [user], f"bridge of region {r['name']} of fleet {top['fleet']}"))
    return accounts, roles


def _directive(conf: str, key: str) -> str | None:
    for line in conf.splitlines():
        words = line.split(None, 1)
        if len(words) == 2 and words[0] == key:
            return words[1].strip()
    return None


def render_conf(template: str, port: int, etc: str, data: str, bridge: list[str], dev: bool = False) -> str:
    """prod.conf (dev.conf) with this broker's listener, file paths and bridge; fails if it lost a directive."""
    settings = {"persistence_location": data}
    if not dev:
        settings |= {"plugin_opt_config_file": f"{etc}/dynamic-security.json", "cafile": f"{etc}/certs/ca.crt",
                     "certfile": f"{etc}/certs/server.crt", "keyfile": f"{etc}/certs/server.key"}
    out, seen = [], set()
    for line in template.splitlines():
        words = line.split(None, 1)
        key = words[0] if words else ""
        if key == "listener" and words[1].split()[0] == ("1883" if dev else "8883"):
            line, key = f"listener {port}" + (" 127.0.0.1" if dev else ""), "listener"
        elif key in settings:
            line = f"{key} {settings[key]}"
        seen.add(key)
        out.append(line)
    missing = ({"listener"} | set(settings)) - seen
    if missing:
        raise RosterError(f"{DEV_CONF if dev else PROD_CONF} lacks {', '.join(sorted(missing))}")
    return "\n".join(out + bridge) + "\n"


def wide_inflight(top: dict[str, Any]) -> list[str]:
    """With every update crossing (uplink "updates"), Mosquitto's default of 20 QoS 1 messages in flight per
    client held updates back at 1,500 agents (benchmarks/results/bridges.md): 1,000 on every broker (broker-wide)."""
    return ["max_inflight_messages 1000"] if top["uplink"] == "updates" else []


def bridge_section(top: dict[str, Any], region: dict[str, Any], password: str | None, etc: str) -> list[str]:
    """The regional broker's bridge to the core (`password` None: --dev, no TLS and no account)."""
    fleet, p = top["fleet"], f"{DYNSEC.ROOT}/{top['fleet']}"
    user = bridge_user(fleet, region["name"])
    up = [f"{p}/partials/{s}" for s in region["shards"]] or [f"{p}/updates/+"]
    down = [f"{p}/global", f"{p}/acks/+", *(f"{p}/shard_acks/{s}" for s in region["shards"])]
    secure = [] if password is None else [f"remote_username {user}", f"remote_password {password}",
                                          f"bridge_cafile {etc}/certs/ca.crt", "bridge_insecure false"]
    return [
        "", *wide_inflight(top), f"# Bridge to the core (generated by make-topology.py for region {region['name']}).",
        f"connection {fleet}-{region['name']}",
        f"address {top['core']['address']}:{top['core']['bridge_port']}",
        "bridge_protocol_version mqttv311",
        "try_private true",  # the core knows it is a bridge: no loops, and the retain flag is passed on as sent
        f"remote_clientid {user}", f"local_clientid {user}.local", *secure,
        # persistent on both ends: a link that drops keeps what waits on either side (QoS 1 below)
        "cleansession false", "local_cleansession false",
        "start_type automatic", "restart_timeout 1 30", "keepalive_interval 30",
        "notifications true", "notifications_local_only true",  # $SYS/broker/connection/<name>/state here only
        *(f"topic {t} out 1" for t in [*up, f"{p}/status/+"]),
        *(f"topic {t} in 1" for t in down),
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="make-topology.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("topology", type=Path, help="the topology (TOML)")
    ap.add_argument("-o", "--output", type=Path, default=Path("topology"), help="directory for the configs")
    ap.add_argument("--etc", default=DEFAULT_ETC,
                    help="each broker's config directory on its host ({broker}: its name)")
    ap.add_argument("--data", default=DEFAULT_DATA, help="each broker's persistence directory ({broker}: its name)")
    ap.add_argument("--dev", action="store_true", help="from dev.conf: loopback, anonymous, no TLS (one machine)")
    args = ap.parse_args(argv)
    try:
        try:
            top = parse(tomllib.loads(args.topology.read_text()))
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise RosterError(f"cannot read topology {args.topology}: {e}") from e
        template = (DEV_CONF if args.dev else PROD_CONF).read_text()
        made_all: dict[str, str] = {}
        # every broker's accounts first: a bad name is refused before anything is written
        built = {broker: (roster, *DYNSEC.build(roster)) for broker, roster in rosters(top).items()}
        for broker, (roster, accounts, roles) in built.items():
            etc, data = args.etc.replace("{broker}", broker), args.data.replace("{broker}", broker)
            data = data if data.endswith("/") else data + "/"
            d = args.output / broker
            region = None if broker == "core" else next(r for r in top["regions"] if r["name"] == broker)
            port = top["core"]["port"] if region is None else region["port"]
            d.mkdir(parents=True, exist_ok=True)
            d.chmod(0o755)
            if args.dev:  # no accounts: no password hashes (thousands of agents would cost minutes)
                bridge = wide_inflight(top) if region is None else bridge_section(top, region, None, etc)
                DYNSEC.write_secret(d / "mosquitto.conf", render_conf(template, port, etc, data, bridge, dev=True))
                continue
            previous: dict[str, dict[str, Any]] = {}
            if (d / "dynamic-security.json").exists():
                previous = {c["username"]: c for c in json.loads((d / "dynamic-security.json").read_text())["clients"]}
            passwords = {u: made_all[u] for u in made_all if u in {a.username for a in accounts}
                         and u not in previous}  # the same account on several brokers: one password
            bridge: list[str] = wide_inflight(top) if region is None else []
            if broker == "core":
                more, more_roles = core_accounts(top)
                accounts, roles = accounts + more, roles + more_roles
                for r in top["regions"]:  # the regional configs hold these passwords: kept if they exist
                    conf = args.output / r["name"] / "mosquitto.conf"
                    old = _directive(conf.read_text(), "remote_password") if conf.exists() else None
                    passwords[bridge_user(top["fleet"], r["name"])] = old or secrets.token_urlsafe(18)
            else:
                assert region is not None
                bridge = bridge_section(top, region, made_all[bridge_user(top["fleet"], broker)], etc)
            doc, made = DYNSEC.render(accounts, roles, passwords, previous)
            made_all |= made | {u: pw for u, pw in passwords.items() if u.startswith(f"{top['fleet']}.bridge.")}
            DYNSEC.write_secret(d / "mosquitto.conf", render_conf(template, port, etc, data, bridge))
            (d / "roster.toml").write_text(_toml(roster))
            DYNSEC.write_secret(d / "dynamic-security.json", json.dumps(doc, indent=1) + "\n")
            for user, pw in made.items():
                print(f"{broker} {user}:{pw}")
    except (RosterError, OSError, ValueError, KeyError) as e:
        print(f"make-topology.py: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.output}/core and {len(top['regions'])} region(s)", file=sys.stderr)
    return 0


def _toml(roster: dict[str, Any]) -> str:
    """A roster as TOML (strings, booleans, lists of names), for make-dynsec.py to regenerate one broker."""
    def value(v: Any) -> str:
        return ("true" if v else "false") if isinstance(v, bool) else json.dumps(v)

    lines = [f"{k} = {value(v)}" for k, v in roster.items() if k != "fleet"]
    for f in roster["fleet"]:
        lines += ["", "[[fleet]]", *(f"{k} = {value(v)}" for k, v in f.items())]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
