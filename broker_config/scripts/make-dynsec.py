#!/usr/bin/env python3
"""Write Mosquitto's dynamic-security JSON (accounts, client-id bindings, roles) for streamfed fleets.

    make-dynsec.py [-o FILE] [--passwords FILE|-] ROSTER.toml

ROSTER.toml names who may connect (see broker_config/README.md, "Users and roles"):

    monitor = "monitor"               # optional: the $SYS reader (streamfed broker-metrics)
    operators = ["ops"]               # optional: read every topic, publish nothing (the broker's operator)

    [[fleet]]
    name = "beijing"
    agents = ["station-01", "station-02"]
    aggregator = true                 # default true: account beijing.aggregator
    shards = ["s0", "s1"]             # default none: accounts beijing.shard.s0, beijing.shard.s1
    shard_group = "shards"            # the shards' $share group (streamfed shard --group)
    reducer = true                    # default: true when there are shards
    viewers = ["viewer"]              # read-only accounts (the same name in several fleets: one account)
    sensor_adapters = false           # true: an account per agent for its sensor adapter (below)

Every account is bound to exactly one MQTT client id, so nobody can take over another client's id:
an agent logs in as `<client>` with client id `<fleet>.<client>`; every other account's user name *is*
its client id (`<fleet>.aggregator`, `<fleet>.shard.<name>`, `<fleet>.reducer`, a viewer's name, the
monitor's name, an operator's name). With `sensor_adapters = true`, agent `<client>` also gets `<client>.sensor`, bound
to `<fleet>.<client>.sensor` (edge/sensor_adapter.py's client id), which may only publish the agent's
sensor topic. Everything not granted is refused: subscriptions, publishes and deliveries.

Passwords: `--passwords FILE` (or `-` for stdin) gives `user:password` lines. An account that is in
FILE already (the previous output) and gets no new password keeps its hash; every other account gets a
random password, printed once as `user:password` on stdout. Accounts no longer in the roster are
dropped (named on stderr).

Run as root, FILE ends up root:mosquitto 0640 (Mosquitto drops to the `mosquitto` user before its
plugins read it; MOSQUITTO_USER names another account); as another user, 0600 owned by that user.
Default FILE: /etc/mosquitto/streamfed/dynamic-security.json. Exit status 2 on a bad roster.
Standard library only: run it with the broker host's python3 (3.11 or later, for tomllib).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import pwd
import re
import secrets
import sys
import tempfile
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_OUTPUT = "/etc/mosquitto/streamfed/dynamic-security.json"
# streamfed.wire.topics.name_problem's alphabet: safe as topic level, user name and client id.
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
# PBKDF2-HMAC-SHA512 rounds per password (the plugin reads the count from the file). mosquitto_ctrl 2.0.11 writes
# 101, which makes an offline guess at a leaked file cheap. Each connection costs the broker one hash (~0.1 s at
# 100,000 on this machine's cores): a reconnect storm of 1,000 agents is ~100 s of broker CPU.
ITERATIONS = 100_000
ROOT = "streamfed/v1"


class RosterError(ValueError):
    """A roster (or password list) the generator refuses; the message is the one line shown."""


@dataclass
class Account:
    username: str
    clientid: str
    roles: list[str] = field(default_factory=list)
    textname: str = ""


def acl(acltype: str, topic: str) -> dict[str, Any]:
    return {"acltype": acltype, "topic": topic, "priority": 0, "allow": True}


def _role(name: str, send: Sequence[str] = (), read: Sequence[str] = (),
          subscribe_literal: Sequence[str] = ()) -> dict[str, Any]:
    """`read`: topics subscribed to (as patterns) and delivered; `subscribe_literal`: filters that may be
    subscribed exactly as written (a `$share/...` filter: dynsec checks the whole filter, group included)."""
    acls = [acl("publishClientSend", t) for t in send]
    acls += [acl("subscribePattern", t) for t in read]
    acls += [acl("publishClientReceive", t) for t in read]
    acls += [acl("subscribeLiteral", t) for t in subscribe_literal]
    return {"rolename": name, "acls": acls}


def check_name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not NAME_RE.fullmatch(value):
        raise RosterError(f"invalid {what}: {value!r} (letters, digits, '_', '-', '.', at most 64, "
                          "first one a letter or digit)")
    return value


def check_names(value: Any, what: str) -> list[str]:
    if not isinstance(value, list):
        raise RosterError(f"{what} must be a list of names, not {value!r}")
    names = [check_name(v, what.rstrip("s")) for v in value]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise RosterError(f"{what} listed twice: {', '.join(dup)}")
    return names


FLEET_KEYS = {"name", "agents", "aggregator", "shards", "shard_group", "reducer", "viewers", "sensor_adapters"}


def build(roster: dict[str, Any]) -> tuple[list[Account], list[dict[str, Any]]]:
    """Accounts and roles for a parsed roster; raises :class:`RosterError` on a bad one."""
    unknown = set(roster) - {"fleet", "monitor", "operators"}
    if unknown:
        raise RosterError(f"unknown roster key(s): {', '.join(sorted(unknown))} "
                          "(expected [[fleet]], monitor, operators)")
    fleets = roster.get("fleet", [])
    if not isinstance(fleets, list) or not fleets:
        raise RosterError("the roster names no fleet (add a [[fleet]] table)")
    accounts: dict[str, Account] = {}
    roles: list[dict[str, Any]] = []
    seen_fleets: set[str] = set()

    def add(acc: Account) -> Account:
        if acc.username in accounts:
            raise RosterError(f"user name {acc.username!r} is used twice (user names are broker-wide; "
                              f"{accounts[acc.username].textname} and {acc.textname})")
        clash = [a for a in accounts.values() if a.clientid == acc.clientid]
        if clash:
            raise RosterError(f"client id {acc.clientid!r} is bound twice ({clash[0].textname} and {acc.textname})")
        accounts[acc.username] = acc
        return acc

    for f in fleets:
        if not isinstance(f, dict):
            raise RosterError("each [[fleet]] must be a table")
        bad = set(f) - FLEET_KEYS
        if bad:
            raise RosterError(f"unknown key(s) in fleet {f.get('name')!r}: {', '.join(sorted(bad))}")
        fleet = check_name(f.get("name"), "fleet name")
        if fleet in seen_fleets:
            raise RosterError(f"fleet {fleet!r} is listed twice")
        seen_fleets.add(fleet)
        p = f"{ROOT}/{fleet}"
        agents = check_names(f.get("agents", []), "agents")
        shards = check_names(f.get("shards", []), "shards")
        viewers = check_names(f.get("viewers", []), "viewers")
        group = check_name(f.get("shard_group", "shards"), "shard group")
        with_aggregator, with_reducer = f.get("aggregator", True), f.get("reducer", bool(shards))
        adapters = f.get("sensor_adapters", False)
        if not all(isinstance(v, bool) for v in (with_aggregator, with_reducer, adapters)):
            raise RosterError(f"fleet {fleet!r}: aggregator, reducer and sensor_adapters are true or false")
        for a in agents:
            # An agent's client id is <fleet>.<client>: these names would be a service's client id.
            if a in ("aggregator", "reducer") or a.startswith("shard."):
                raise RosterError(f"agent name {a!r} in fleet {fleet!r} collides with the service client id "
                                  f"{fleet}.{a} (aggregator, reducer and shard.* are reserved)")
            role = f"{fleet}.agent.{a}"
            # Literal topics per agent: dynsec 2.0.11 does not substitute %u/%c in ACL topics.
            roles.append(_role(role, send=[f"{p}/{ch}/{a}" for ch in ("updates", "predictions", "status", "sensors")],
                               read=[f"{p}/global", f"{p}/acks/{a}", f"{p}/sensors/{a}"]))
            add(Account(a, f"{fleet}.{a}", [role], f"agent {a} of fleet {fleet}"))
            if adapters:
                # A separate process on the device: its own account, so it cannot take the agent's id.
                roles.append(_role(f"{role}.sensor", send=[f"{p}/sensors/{a}"]))
                add(Account(f"{a}.sensor", f"{fleet}.{a}.sensor", [f"{role}.sensor"],
                            f"sensor adapter of agent {a} of fleet {fleet}"))
        if with_aggregator:
            role = f"{fleet}.aggregator"
            # status/aggregator: its retained claim of the client id (a second aggregator is detected and exits)
            roles.append(_role(role, send=[f"{p}/global", f"{p}/acks/+", f"{p}/status/aggregator"],
                               read=[f"{p}/updates/+", f"{p}/status/+"]))
            add(Account(role, role, [role], f"aggregator of fleet {fleet}"))
        for s in shards:
            name = f"{fleet}.shard.{s}"
            roles.append(_role(name, send=[f"{p}/partials/{s}"],
                               read=[f"{p}/updates/+", f"{p}/global", f"{p}/shard_acks/{s}"],
                               subscribe_literal=[f"$share/{group}/{p}/updates/+"]))
            add(Account(name, name, [name], f"shard {s} of fleet {fleet}"))
        if with_reducer:
            role = f"{fleet}.reducer"
            roles.append(_role(role, send=[f"{p}/global", f"{p}/acks/+", f"{p}/shard_acks/+", f"{p}/status/reducer"],
                               read=[f"{p}/partials/+", f"{p}/status/+"]))
            add(Account(role, role, [role], f"reducer of fleet {fleet}"))
        if viewers:
            role = f"{fleet}.viewer"
            roles.append(_role(role, read=[f"{p}/predictions/+", f"{p}/status/+", f"{p}/global"]))
            for v in viewers:
                if v in accounts and accounts[v].textname.startswith("viewer"):
                    accounts[v].roles.append(role)  # one read-only account may watch several fleets
                    continue
                add(Account(v, v, [role], f"viewer {v}"))
    if "monitor" in roster:
        m = check_name(roster["monitor"], "monitor name")
        roles.append(_role("monitor", read=["$SYS/#"]))
        add(Account(m, m, ["monitor"], f"monitor {m}"))
    operators = check_names(roster.get("operators", []), "operators")
    if operators:
        # The broker's operator: reads every topic (what a broker administrator can see anyway), publishes
        # nothing. The privacy threat model's "broker operator" (docs/privacy.md); give it to nobody else.
        roles.append(_role("operator", read=["#"]))
        for o in operators:
            add(Account(o, o, ["operator"], f"operator {o}"))
    return list(accounts.values()), roles


def hash_password(password: str, salt: bytes | None = None, iterations: int = ITERATIONS) -> dict[str, Any]:
    """The plugin's password fields: base64 PBKDF2-HMAC-SHA512 over the raw salt (12 random bytes)."""
    salt = secrets.token_bytes(12) if salt is None else salt
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, iterations)
    return {"password": base64.b64encode(digest).decode(), "salt": base64.b64encode(salt).decode(),
            "iterations": iterations}


def read_passwords(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        user, sep, password = line.partition(":")
        if not sep or not password:
            raise RosterError(f"password line {i}: expected user:password")
        out[check_name(user, "user name")] = password
    return out


def render(accounts: list[Account], roles: list[dict[str, Any]], passwords: dict[str, str],
           previous: dict[str, dict[str, Any]]) -> tuple[dict[str, Any], dict[str, str]]:
    """The JSON document, and the passwords made up for accounts that had none."""
    unknown = sorted(set(passwords) - {a.username for a in accounts})
    if unknown:
        raise RosterError(f"password given for user(s) not in the roster: {', '.join(unknown)}")
    made: dict[str, str] = {}
    clients = []
    for a in accounts:
        if a.username in passwords:
            secret = hash_password(passwords[a.username])
        elif a.username in previous and previous[a.username].get("password"):
            old = previous[a.username]
            secret = {k: old[k] for k in ("password", "salt", "iterations")}
        else:
            made[a.username] = secrets.token_urlsafe(18)
            secret = hash_password(made[a.username])
        clients.append({"username": a.username, "clientid": a.clientid, "textname": a.textname,
                        "roles": [{"rolename": r} for r in a.roles], **secret})
    doc = {
        # Deny by default: what a role does not grant is refused (subscribe) or dropped (publish, delivery).
        "defaultACLAccess": {"publishClientSend": False, "publishClientReceive": False,
                             "subscribe": False, "unsubscribe": True},
        "clients": clients, "groups": [], "roles": roles,
    }
    return doc, made


def write_secret(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
        broker_user = os.environ.get("MOSQUITTO_USER", "mosquitto")
        try:
            gid = pwd.getpwnam(broker_user).pw_gid if os.geteuid() == 0 else None
        except KeyError:
            gid = None
        if gid is not None:
            os.chown(tmp, 0, gid)
            os.chmod(tmp, 0o640)
        else:
            os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="make-dynsec.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("roster", type=Path, help="the fleet roster (TOML)")
    ap.add_argument("-o", "--output", type=Path, default=Path(DEFAULT_OUTPUT))
    ap.add_argument("--passwords", help="user:password lines (a file, or - for stdin)")
    args = ap.parse_args(argv)
    try:
        try:
            roster = tomllib.loads(args.roster.read_text())
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise RosterError(f"cannot read roster {args.roster}: {e}") from e
        accounts, roles = build(roster)
        passwords = {}
        if args.passwords:
            text = sys.stdin.read() if args.passwords == "-" else Path(args.passwords).read_text()
            passwords = read_passwords(text)
        previous: dict[str, dict[str, Any]] = {}
        if args.output.exists():
            try:
                previous = {c["username"]: c for c in json.loads(args.output.read_text()).get("clients", [])}
            except (ValueError, AttributeError, KeyError, TypeError) as e:
                raise RosterError(f"{args.output} exists but is not a dynamic-security file: {e}") from e
        doc, made = render(accounts, roles, passwords, previous)
    except (RosterError, OSError) as e:
        print(f"make-dynsec.py: error: {e}", file=sys.stderr)
        return 2
    write_secret(args.output, json.dumps(doc, indent=1) + "\n")
    for user, password in made.items():
        print(f"{user}:{password}")
    dropped = sorted(set(previous) - {a.username for a in accounts})
    if dropped:
        print(f"dropped account(s) not in the roster: {', '.join(dropped)}", file=sys.stderr)
    print(f"wrote {args.output} ({len(accounts)} accounts, {len(roles)} roles)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
