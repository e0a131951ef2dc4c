"""Real Mosquitto brokers for integration tests, started from the shipped configurations.

:func:`start_mosquitto` renders `broker_config/mosquitto/dev.conf` or `prod.conf` with test-local
values (free loopback ports, a private work directory, the password file and certificates made by
`broker_config/scripts/make-users.sh` and `make-certs.sh`, the ACL copied verbatim), starts
`mosquitto -c`, waits until every listener accepts TCP connections, and stops it
(SIGTERM, then SIGKILL) when the returned :class:`Broker` is closed — also when start-up fails, and at
interpreter exit for anything left over.

Running as root: Mosquitto started as root switches to the `mosquitto` user before it reads the
password file, ACL and TLS key and before it writes persistence. So the work directory is created by
us outside pytest's `tmp_path` (whose parent `/tmp/pytest-of-root` is mode 0700, untraversable for
`mosquitto`), is mode 0755, its persistence directory belongs to `mosquitto`, and secret files are
`root:mosquitto 0640` exactly as the scripts make them for a production host — so the tests exercise
the real permission story. The rendered config says `user mosquitto` explicitly (`user root` only
if that account does not exist). Running as another user Mosquitto does not switch, and everything
simply belongs to that user.
"""

from __future__ import annotations

import atexit
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from streamfed.fleet.config import BrokerConfig

__all__ = [
    "REPO",
    "BROKER_CONFIG",
    "MosquittoUnavailable",
    "Broker",
    "find_mosquitto",
    "free_port",
    "render_conf",
    "start_mosquitto",
]

REPO = Path(__file__).resolve().parent.parent
BROKER_CONFIG = REPO / "broker_config"
INSTALL_HINT = ("Mosquitto is not installed. `bash scripts/setup.sh` installs it (the Debian packages "
                "`mosquitto mosquitto-clients`), or run `apt-get install -y mosquitto mosquitto-clients`.")
BROKER_USER = "mosquitto"
_STARTED: list[Broker] = []


class MosquittoUnavailable(RuntimeError):
    """The `mosquitto` binary (or a script's tool) is missing; the message says how to install it.

    >>> "scripts/setup.sh" in str(MosquittoUnavailable(INSTALL_HINT))
    True
    """


def find_mosquitto() -> str:
    """Path of the `mosquitto` binary (Debian installs it in /usr/sbin, often not on a user's PATH)."""
    path = shutil.which("mosquitto") or shutil.which("mosquitto", path="/usr/sbin:/usr/local/sbin")
    if path is None:
        raise MosquittoUnavailable(INSTALL_HINT)
    for tool in ("mosquitto_passwd", "openssl"):
        if shutil.which(tool) is None:
            raise MosquittoUnavailable(f"`{tool}` is missing. {INSTALL_HINT}")
    return path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (start-up retries if it is taken meanwhile)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
    workdir: Path
    conf: Path
    host: str = "127.0.0.1"
    port: int | None = None  # plain listener (dev)
    tls_port: int | None = None  # TLS listener (prod)
    ca: Path | None = None
    users: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    _log: Path | None = None

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
        return self._log.read_text(errors="replace") if self._log and self._log.exists() else ""

    def _ports(self) -> list[int]:
        return [p for p in (self.port, self.tls_port) if p is not None]

    def _spawn(self, timeout: float = 10.0) -> None:
        assert self._log is not None
        with open(self._log, "ab") as log:
            self.proc = subprocess.Popen([find_mosquitto(), "-c", str(self.conf)], stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        if self not in _STARTED:
            _STARTED.append(self)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mosquitto exited with {self.proc.returncode}:\n{self.log()}")
            # Mosquitto loads its password file, ACL and certificates before it listens (and exits if
            # it cannot), so accepting TCP connections on every listener means ready.
            if all(_accepts(self.host, p) for p in self._ports()):
                return
            time.sleep(0.02)
        raise RuntimeError(f"mosquitto did not become ready in {timeout} s:\n{self.log()}")

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM (Mosquitto then saves its persistence file), SIGKILL after `timeout`."""
        p, self.proc = self.proc, None
        if p is None or p.poll() is not None:
            return
        p.terminate()
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()

    def restart(self) -> None:
        """Stop and start again on the same ports with the same files (persistence is reloaded)."""
        self.stop()
        self._spawn()

    def close(self) -> None:
        self.stop()
        if self in _STARTED:
            _STARTED.remove(self)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Broker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


@atexit.register
def _kill_leftovers() -> None:  # a crashed test session must not leave brokers behind
    for b in list(_STARTED):
        b.stop(timeout=1.0)


def _broker_account() -> pwd.struct_passwd | None:
    """The account Mosquitto will run as when started by root, or `None` when we are not root."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(BROKER_USER)
    except KeyError:
        return None


def _run(cmd: list[str], **kw: object) -> None:
    res = subprocess.run(cmd, capture_output=True, text=True, **kw)  # type: ignore[call-overload]
    if res.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stdout}{res.stderr}")


def start_mosquitto(flavour: Literal["dev", "prod"] = "dev", *,
                    users: Iterable[str] = ("aggregator", "viewer", "a1", "a2"),
                    client_certs: Iterable[str] = (), attempts: int = 3) -> Broker:
    """Start a Mosquitto from the shipped `flavour` config; see the module docstring.

    `prod`: every user in `users` gets a random password (in `Broker.users`), `client_certs` names
    clients to issue certificates for. Retries with new ports if one was taken meanwhile.
    """
    find_mosquitto()
    workdir = Path(tempfile.mkdtemp(prefix=f"streamfed-mosquitto-{flavour}-"))
    try:
        return _start(flavour, workdir, list(users), list(client_certs), attempts)
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise


def _start(flavour: Literal["dev", "prod"], workdir: Path, users: list[str], client_certs: list[str],
           attempts: int) -> Broker:
    workdir.chmod(0o755)
    data = workdir / "data"
    data.mkdir()
    account = _broker_account()
    if account is not None:
        os.chown(data, account.pw_uid, account.pw_gid)  # persistence is written after the switch
    run_as = [] if os.geteuid() != 0 else [f"user {BROKER_USER if account else 'root'}"]
    broker = Broker(flavour, workdir, workdir / "mosquitto.conf", _log=workdir / "mosquitto.log")

    if flavour == "prod":
        broker.users = {u: secrets.token_urlsafe(12) for u in users}
        _run(["bash", str(BROKER_CONFIG / "scripts" / "make-users.sh"), "-f", str(workdir / "passwd"),
              *(f"{u}:{p}" for u, p in broker.users.items())])
        _run(["bash", str(BROKER_CONFIG / "scripts" / "make-certs.sh"), "-d", str(workdir / "certs"),
              *client_certs])
        (workdir / "certs").chmod(0o755)
        shutil.copyfile(BROKER_CONFIG / "mosquitto" / "acl", workdir / "acl")
        (workdir / "acl").chmod(0o644)
        broker.ca = workdir / "certs" / "ca.crt"

    template = (BROKER_CONFIG / "mosquitto" / f"{flavour}.conf").read_text()
    last: Exception | None = None
    for _ in range(attempts):
        settings = {"persistence_location": f"{data}/"}
        if flavour == "dev":
            broker.port = free_port()
            listeners = {"1883": f"{broker.port} {broker.host}"}
        else:
            broker.tls_port = free_port()
            listeners = {"8883": f"{broker.tls_port} {broker.host}"}
            certs = workdir / "certs"
            settings |= {"password_file": str(workdir / "passwd"), "acl_file": str(workdir / "acl"),
                         "cafile": str(certs / "ca.crt"), "certfile": str(certs / "server.crt"),
                         "keyfile": str(certs / "server.key")}
        broker.conf.write_text(render_conf(template, listeners, settings, run_as))
        try:
            broker._spawn()
            return broker
        except RuntimeError as e:
            broker.stop()
            last = e
            if "Address already in use" not in broker.log():
                break
            broker._log.write_text("")  # type: ignore[union-attr]
    raise RuntimeError(f"could not start the {flavour} Mosquitto: {last}")
