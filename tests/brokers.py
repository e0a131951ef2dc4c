"""Real Mosquitto brokers for integration tests, started from the shipped configurations.

:func:`start_mosquitto` renders `broker_config/mosquitto/dev.conf` or `prod.conf` with test-local
values (a free loopback port, a private work directory, the dynamic-security JSON made from a fleet
roster by `broker_config/scripts/make-dynsec.py` and the certificates by `make-certs.sh`) and runs it with
the shared launcher :class:`streamfed.runtime.mosquitto.Mosquitto`, which waits until the listener
accepts TCP connections, retries with another port if the chosen one was taken meanwhile, and stops
it (SIGTERM, then SIGKILL) when the returned :class:`Broker` is closed — also when start-up fails, and
at interpreter exit for anything left over.

Running as root: Mosquitto started as root switches to the `mosquitto` user before its security plugin
reads the dynamic-security JSON, before it reads the TLS key and before it writes persistence. The
launcher's work directory is made outside pytest's `tmp_path` (whose parent `/tmp/pytest-of-root` is
mode 0700, untraversable for `mosquitto`) with mode 0755, the persistence directory belongs to `mosquitto`
(:meth:`~streamfed.runtime.mosquitto.Mosquitto.writable_dir`), the rendered config says
`user mosquitto` explicitly (`user root` only if that account does not exist), and secret files are
`root:mosquitto 0640` exactly as the scripts make them for a production host — so the tests exercise
the real permission story. Running as another user Mosquitto does not switch, and everything simply
belongs to that user.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from streamfed.fleet.config import BrokerConfig
from streamfed.runtime.mosquitto import (
    INSTALL_HINT,
    Mosquitto,
    MosquittoUnavailable,
    find_mosquitto,
    free_port,
    require_mosquitto,
)

__all__ = [
    "REPO",
    "BROKER_CONFIG",
    "INSTALL_HINT",
    "MosquittoUnavailable",
    "Broker",
    "DEFAULT_USERS",
    "DYNSEC_PLUGIN",
    "roster_toml",
    "find_mosquitto",
    "free_port",
    "render_conf",
    "require_tools",
    "start_mosquitto",
]

REPO = Path(__file__).resolve().parent.parent
BROKER_CONFIG = REPO / "broker_config"
DEFAULT_USERS = ("aggregator", "viewer", "monitor", "a1", "a2")
_SERVICES = {"aggregator", "reducer", "viewer", "monitor"}


def _plugin_path() -> str:
    """The dynamic-security plugin named by prod.conf (the tests fail, not skip, if it is missing)."""
    for line in (BROKER_CONFIG / "mosquitto" / "prod.conf").read_text().splitlines():
        if line.startswith("plugin "):
            return line.split(None, 1)[1].strip()
    raise ValueError("prod.conf loads no plugin")


DYNSEC_PLUGIN = _plugin_path()


def roster_toml(roster: Mapping[str, object]) -> str:
    """A roster for `make-dynsec.py` as TOML (the subset it reads: strings, booleans, lists of names).

    >>> print(roster_toml({"monitor": "monitor", "fleet": [{"name": "f", "agents": ["a1"], "reducer": False}]}))
    monitor = "monitor"
    <BLANKLINE>
    [[fleet]]
    name = "f"
    agents = ["a1"]
    reducer = false
    <BLANKLINE>
    """
    def value(v: object) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, list | tuple):
            return "[" + ", ".join(value(x) for x in v) + "]"
        raise TypeError(f"roster value {v!r}")

    lines = [f"{k} = {value(v)}" for k, v in roster.items() if k != "fleet"]
    for f in roster.get("fleet", []):  # type: ignore[attr-defined]
        lines += ["", "[[fleet]]", *(f"{k} = {value(v)}" for k, v in f.items())]
    return "\n".join(lines) + "\n"


def _legacy_roster(users: Iterable[str], fleet: str = "f") -> dict[str, object]:
    """The roster the old `users=` argument meant: agents and services of one fleet `f`."""
    users = list(users)
    if "shard" in users:
        raise ValueError("shards have one account each now: pass roster= with the fleet's shard names")
    fl: dict[str, object] = {"name": fleet, "agents": [u for u in users if u not in _SERVICES],
                             "aggregator": "aggregator" in users, "reducer": "reducer" in users}
    if "viewer" in users:
        fl["viewers"] = ["viewer"]
    roster: dict[str, object] = {"fleet": [fl]}
    if "monitor" in users:
        roster["monitor"] = "monitor"
    return roster


def require_tools() -> str:
    """Path of `mosquitto`; raises :class:`MosquittoUnavailable` if it, `openssl` (which the prod
    flavour's certificate script needs) or the dynamic-security plugin is missing."""
    path = require_mosquitto()
    if shutil.which("openssl") is None:
        raise MosquittoUnavailable(f"`openssl` is missing. {INSTALL_HINT}")
    if not Path(DYNSEC_PLUGIN).is_file():
        raise MosquittoUnavailable(f"the dynamic-security plugin {DYNSEC_PLUGIN} is missing. {INSTALL_HINT}")
    return path


def render_conf(template: str, listeners: Mapping[str, str], settings: Mapping[str, str],
                append: Iterable[str] = ()) -> str:
    """Rewrite a Mosquitto config: `listener <port>` lines whose port is a key of `listeners` become
    `listener <value>`; the value of every directive named in `settings` is replaced where it occurs.
    Every key must be found — a config that drifted from what the tests expect fails loudly.

    >>> render_conf("listener 1883\\nfoo a\\n#foo b", {"1883": "5000 127.0.0.1"}, {"foo": "z"})
    'listener 5000 127.0.0.1\\nfoo z\\n#foo b\\n'
    """
    out, seen = [], set()
    for line in template.splitlines():
        words = line.split(None, 1)
        key = words[0] if words and not line.lstrip().startswith("#") else ""
        if key == "listener" and len(words) > 1 and words[1].split()[0] in listeners:
            port = words[1].split()[0]
            line = f"listener {listeners[port]}"
            seen.add(f"listener {port}")
        elif key in settings:
            line = f"{key} {settings[key]}"
            seen.add(key)
        out.append(line)
    wanted = {f"listener {p}" for p in listeners} | set(settings)
    if wanted - seen:
        raise ValueError(f"config template lacks {sorted(wanted - seen)}")
    out.extend(append)
    return "\n".join(out) + "\n"


@dataclass
class Broker:
    """A running Mosquitto: where it listens, its credentials, and how to stop or restart it.

    >>> with start_mosquitto("dev") as broker:
    ...     cfg = broker.broker_config()
    ...     (cfg.host, cfg.port == broker.port, broker.proc.poll())
    ('127.0.0.1', True, None)
    >>> broker.proc is None and not broker.workdir.exists()
    True
    """

    flavour: Literal["dev", "prod"]
    mosquitto: Mosquitto
    host: str = "127.0.0.1"
    port: int | None = None  # plain listener (dev)
    tls_port: int | None = None  # TLS listener (prod)
    ca: Path | None = None
    users: dict[str, str] = field(default_factory=dict)  # prod: user name -> password
    client_ids: dict[str, str] = field(default_factory=dict)  # prod: user name -> its bound client id

    @property
    def workdir(self) -> Path:
        return self.mosquitto.workdir

    @property
    def conf(self) -> Path:
        return self.mosquitto.conf_path

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        return self.mosquitto.proc

    # ---------------------------------------------------------------- clients
    def broker_config(self, username: str | None = None, *, tls: bool | None = None,
                      password: str | None = None, **kw: object) -> BrokerConfig:
        """A :class:`BrokerConfig` for this broker (prod: TLS with the test CA, `username`'s password)."""
        tls = self.flavour == "prod" if tls is None else tls
        if username is not None and password is None:
            password = self.users.get(username)
        port = self.tls_port if tls else self.port
        assert port is not None, f"the {self.flavour} broker has no {'TLS' if tls else 'plain'} listener"
        return BrokerConfig(host=self.host, port=port, username=username, password=password,
                            tls_ca=str(self.ca) if tls and self.ca else None, **kw)  # type: ignore[arg-type]

    # ---------------------------------------------------------------- life cycle
    def log(self) -> str:
        return self.mosquitto.log_text()

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM (Mosquitto then saves its persistence file), SIGKILL after `timeout`."""
        self.mosquitto.stop(timeout)

    def restart(self) -> None:
        """Stop and start again on the same port with the same files (persistence is reloaded)."""
        self.mosquitto.restart()

    def close(self) -> None:
        """Stop and remove the work directory."""
        self.mosquitto.close()

    def __enter__(self) -> Broker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _run(cmd: list[str], **kw: object) -> None:
    res = subprocess.run(cmd, capture_output=True, text=True, **kw)  # type: ignore[call-overload]
    if res.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stdout}{res.stderr}")


def start_mosquitto(flavour: Literal["dev", "prod"] = "dev", *,
                    users: Iterable[str] = DEFAULT_USERS, roster: Mapping[str, object] | None = None,
                    client_certs: Iterable[str] = (), overrides: Mapping[str, str] | None = None,
                    attempts: int = 3) -> Broker:
    """Start a Mosquitto from the shipped `flavour` config; see the module docstring.

    `prod`: the accounts of `roster` (a `make-dynsec.py` roster as a mapping; default: fleet `f` with
    agents and services named by `users` — `aggregator` is `f.aggregator`, `viewer`, `monitor` and
    `reducer` likewise) get random passwords (`Broker.users`, by user name) and are bound to their
    client ids (`Broker.client_ids`). `client_certs` names clients to issue certificates for.
    `overrides` replaces the values of directives of the shipped file (e.g. `sys_interval`; each must be
    in it). Retries with new ports if one was taken meanwhile.
    """
    require_tools()
    template = (BROKER_CONFIG / "mosquitto" / f"{flavour}.conf").read_text()
    listener = "1883" if flavour == "dev" else "8883"
    settings: dict[str, str] = dict(overrides or {})
    host = "127.0.0.1"
    mosquitto = Mosquitto(lambda port: render_conf(template, {listener: f"{port} {host}"}, settings),
                          host=host, attempts=attempts, prefix=f"streamfed-mosquitto-{flavour}-")
    try:
        workdir = mosquitto.workdir
        settings["persistence_location"] = f"{mosquitto.writable_dir('data')}/"
        broker = Broker(flavour, mosquitto, host=host)
        if flavour == "prod":
            (workdir / "roster.toml").write_text(roster_toml(roster or _legacy_roster(users)))
            dynsec = workdir / "dynamic-security.json"
            # The generator makes every password up and prints it once, as an operator would see it.
            made = subprocess.run([sys.executable, str(BROKER_CONFIG / "scripts" / "make-dynsec.py"),
                                   "-o", str(dynsec), str(workdir / "roster.toml")], capture_output=True, text=True)
            if made.returncode:
                raise RuntimeError(f"make-dynsec.py failed ({made.returncode}): {made.stderr.strip()}")
            broker.users = dict(line.split(":", 1) for line in made.stdout.splitlines())
            broker.client_ids = {c["username"]: c["clientid"] for c in json.loads(dynsec.read_text())["clients"]}
            certs = workdir / "certs"
            _run(["bash", str(BROKER_CONFIG / "scripts" / "make-certs.sh"), "-d", str(certs), *client_certs])
            certs.chmod(0o755)
            broker.ca = certs / "ca.crt"
            settings |= {"plugin_opt_config_file": str(dynsec),
                         "cafile": str(certs / "ca.crt"), "certfile": str(certs / "server.crt"),
                         "keyfile": str(certs / "server.key")}
        try:
            mosquitto.start()
        except RuntimeError as e:
            raise RuntimeError(f"could not start the {flavour} Mosquitto: {e}") from e
        if flavour == "dev":
            broker.port = mosquitto.port
        else:
            broker.tls_port = mosquitto.port
        return broker
    except BaseException:
        mosquitto.close()
        raise


def start_or_fail(flavour: Literal["dev", "prod"] = "dev", **kw: object) -> Broker:
    """:func:`start_mosquitto`, or a test failure naming what is missing — deliberately not a skip: the integration
    tests are part of CI."""
    import pytest

    try:
        return start_mosquitto(flavour, **kw)  # type: ignore[arg-type]
    except MosquittoUnavailable as e:
        pytest.fail(str(e), pytrace=False)
