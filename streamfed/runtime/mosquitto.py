"""Start and stop a private Mosquitto, and pick free loopback ports: the one launcher the demo
(`streamfed.runtime.broker`), the load test (`streamfed.runtime.loadtest`) and the integration
tests (`tests/brokers.py`) share.

:class:`Mosquitto` writes a configuration into a work directory, runs `mosquitto -c` with its output
in `mosquitto.log` there, waits until it listens on its port, and stops it (SIGTERM,
then SIGKILL) — also at interpreter exit for anything left running. When it picked the port itself
(:func:`free_port`) and another process took that port meanwhile, it retries with a new one.

Running as root: Mosquitto started as root switches to the `mosquitto` user before it reads password
files, ACLs and TLS keys and before it writes persistence. So a work directory made here is mode
0755 (under `/tmp`, not under a 0700 directory such as pytest's `/tmp/pytest-of-root`), the
configuration it writes is 0644, :meth:`Mosquitto.writable_dir` makes directories (e.g. for
persistence) owned by that user, and a configuration without a `user` directive gets `user mosquitto`
(`user root` when that account does not exist, which Mosquitto would otherwise refuse). Secret files
the caller adds should be `root:mosquitto 0640`, as `broker_config/scripts/` makes them. Run as
another user, Mosquitto does not switch, and everything simply belongs to that user.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

__all__ = [
    "BROKER_USER",
    "INSTALL_HINT",
    "Mosquitto",
    "MosquittoError",
    "MosquittoUnavailable",
    "broker_account",
    "find_mosquitto",
    "free_port",
    "require_mosquitto",
]

INSTALL_HINT = ("Mosquitto is not installed. `bash scripts/setup.sh` installs it (the Debian packages "
                "`mosquitto mosquitto-clients`), or run `apt-get install -y mosquitto mosquitto-clients`.")
BROKER_USER = "mosquitto"
_STARTED: list[Mosquitto] = []


class MosquittoUnavailable(RuntimeError):
    """The `mosquitto` binary (or a tool the caller needs with it) is missing; the message says how to
    install it.

    >>> "scripts/setup.sh" in str(MosquittoUnavailable(INSTALL_HINT))
    True
    """


class MosquittoError(RuntimeError):
    """Mosquitto exited or did not listen on its port in time; the message ends with its log's tail.
    `port_in_use` tells whether it failed because its port was taken."""

    def __init__(self, message: str, *, port_in_use: bool = False) -> None:
        super().__init__(message)
        self.port_in_use = port_in_use


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on `host` that was free a moment ago (the kernel's choice for a bind to port 0).
    Another process may take it before it is used; :class:`Mosquitto` retries when it picked the port.

    >>> port = free_port()
    >>> 1024 <= port <= 65535
    True
    >>> with socket.socket() as s:  # still free: it can be bound
    ...     s.bind(("127.0.0.1", port))
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def find_mosquitto() -> str | None:
    """Path of the `mosquitto` binary, or `None` (Debian installs it in /usr/sbin, often not on PATH).

    >>> path = find_mosquitto()
    >>> path is None or os.path.basename(path) == "mosquitto"
    True
    """
    return shutil.which("mosquitto") or shutil.which("mosquitto", path="/usr/sbin:/usr/local/sbin")


def require_mosquitto() -> str:
    """Path of the `mosquitto` binary; raises :class:`MosquittoUnavailable` (with how to install it)."""
    path = find_mosquitto()
    if path is None:
        raise MosquittoUnavailable(INSTALL_HINT)
    return path


def broker_account() -> pwd.struct_passwd | None:
    """The account Mosquitto switches to when started by us: `mosquitto` when we are root and it
    exists, else `None` (not root: no switch; root without that account: see the module docstring)."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(BROKER_USER)
    except KeyError:
        return None


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


def _listening_ports(pid: int) -> set[int] | None:
    """The TCP ports process `pid` listens on (Linux `/proc`), or `None` where that cannot be read."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    inodes = set()
    for fd in fds:
        with contextlib.suppress(OSError):  # closed meanwhile
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    ports: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                f = line.split()
                if len(f) > 9 and f[3] == "0A" and f[9] in inodes:  # 0A: LISTEN
                    ports.add(int(f[1].rsplit(":", 1)[1], 16))
    return ports


def _ready(pid: int, host: str, port: int) -> bool:
    """Process `pid` listens on `port` — checked in `/proc`, so a stranger that took the port does
    not pass for it; where `/proc` cannot tell, the port accepting a connection has to do."""
    ports = _listening_ports(pid)
    return port in ports if ports is not None else _accepts(host, port)


def _has_directive(text: str, name: str) -> bool:
    return any(line.split(None, 1)[0] == name for line in text.splitlines()
               if line.strip() and not line.lstrip().startswith("#"))


class Mosquitto:
    """One Mosquitto process: configuration, work directory, log, start/stop.

    `conf` is the configuration text, a callable rendering it for a port, or the path of an existing
    file (used as it is). `port` is the listener to wait for; `None` (only with a callable `conf`)
    picks a free one at the first :meth:`start` — retried up to `attempts` times if it was taken
    meanwhile — and keeps it for later restarts. `workdir` holds `mosquitto.conf` and
    `mosquitto.log`; without one a private directory is made (mode 0755, named after `prefix`) and
    removed by :meth:`close`. `preexec_fn` runs in the child before `exec` (e.g. to raise limits).

    Nothing here needs Mosquitto until :meth:`start`:

    >>> m = Mosquitto(lambda port: f"listener {port} 127.0.0.1\\nallow_anonymous true\\n")
    >>> (m.port, m.running, m.conf_path.parent == m.workdir, oct(m.workdir.stat().st_mode & 0o777))
    (None, False, True, '0o755')
    >>> m.close()
    >>> m.workdir.exists()
    False

    With Mosquitto installed, ``with Mosquitto(render) as m:`` starts it, and leaving the block stops
    it and removes its directory; ``m.port`` is where it listens, ``m.log_tail()`` what it said.
    """

    def __init__(self, conf: str | Path | Callable[[int], str], port: int | None = None,
                 workdir: str | Path | None = None, *, host: str = "127.0.0.1", timeout: float = 10.0,
                 attempts: int = 3, preexec_fn: Callable[[], object] | None = None,
                 prefix: str = "streamfed-mosquitto-") -> None:
        if port is None and not callable(conf):
            raise ValueError("without a port, conf must be a callable rendering the config for a port")
        self.conf = conf
        self.port = port
        self.host = host
        self.timeout = timeout
        self.attempts = attempts
        self.preexec_fn = preexec_fn
        self._owns_workdir = workdir is None
        if workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix=prefix))
            self.workdir.chmod(0o755)  # traversable by the `mosquitto` user after the privilege drop
        else:
            self.workdir = Path(workdir)
            self.workdir.mkdir(parents=True, exist_ok=True)
        self.conf_path = conf if isinstance(conf, Path) else self.workdir / "mosquitto.conf"
        self.log_path = self.workdir / "mosquitto.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_start = 0  # where the current run's output begins in the log

    # ---------------------------------------------------------------- files
    def writable_dir(self, name: str) -> Path:
        """`workdir/name`, created and owned by the account Mosquitto runs as (e.g. for persistence)."""
        path = self.workdir / name
        path.mkdir(parents=True, exist_ok=True)
        account = broker_account()
        if account is not None:
            os.chown(path, account.pw_uid, account.pw_gid)
        return path

    def log_text(self, *, current: bool = False) -> str:
        """Everything Mosquitto wrote to its log (all runs), or only the current run's output."""
        if not self.log_path.exists():
            return ""
        with open(self.log_path, "rb") as f:
            f.seek(self._log_start if current else 0)
            return f.read().decode(errors="replace")

    def log_tail(self, chars: int = 3000) -> str:
        """The end of the current run's log."""
        return self.log_text(current=True)[-chars:]

    def _write_conf(self, port: int) -> None:
        if isinstance(self.conf, Path):
            return
        text = self.conf(port) if callable(self.conf) else self.conf
        if os.geteuid() == 0 and not _has_directive(text, "user"):
            text = text.rstrip("\n") + f"\nuser {BROKER_USER if broker_account() else 'root'}\n"
        self.conf_path.write_text(text)
        self.conf_path.chmod(0o644)  # read after the privilege drop when reloaded

    # ---------------------------------------------------------------- life cycle
    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> Mosquitto:
        """Start (no-op when running) and wait until it listens on its port — Mosquitto loads its
        password file, ACL and certificates before it listens, so that means ready. Raises
        :class:`MosquittoUnavailable` without the binary, :class:`MosquittoError` if it fails."""
        if self.running:
            return self
        binary = require_mosquitto()
        pick = self.port is None
        for attempt in range(self.attempts if pick else 1):
            port = free_port(self.host) if pick else self.port
            assert port is not None
            self._write_conf(port)
            try:
                self._spawn(binary, port)
            except MosquittoError as e:
                if not (pick and e.port_in_use and attempt + 1 < self.attempts):
                    raise
                continue
            self.port = port
            return self
        raise AssertionError("unreachable")

    def _spawn(self, binary: str, port: int) -> None:
        self._log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([binary, "-c", str(self.conf_path)], stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                         preexec_fn=self.preexec_fn)
        if self not in _STARTED:
            _STARTED.append(self)
        deadline = time.monotonic() + self.timeout
        while True:
            exited = self.proc.poll() is not None
            if not exited and _ready(self.proc.pid, self.host, port):
                return
            if exited or time.monotonic() > deadline:
                code = self.proc.poll()
                self.stop()
                tail = self.log_tail()
                what = (f"exited with code {code}" if exited
                        else f"did not listen on {self.host}:{port} within {self.timeout:g} s")
                raise MosquittoError(f"mosquitto ({self.conf_path}) {what}; its log ends:\n{tail}",
                                     port_in_use="address already in use" in tail.lower())
            time.sleep(0.02)

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM (Mosquitto then saves its persistence), SIGKILL after `timeout`; keeps the files, so
        :meth:`start` runs it again on the same port."""
        p, self.proc = self.proc, None
        if self in _STARTED:
            _STARTED.remove(self)
        if p is None or p.poll() is not None:
            return
        p.terminate()
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()

    def restart(self) -> None:
        """Stop and start again on the same port with the same files (persistence is reloaded)."""
        self.stop()
        self.start()

    def close(self) -> None:
        """Stop, and remove the work directory if it was made here."""
        self.stop()
        if self._owns_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Mosquitto:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        state = f"pid {self.proc.pid}" if self.running else "stopped"  # type: ignore[union-attr]
        return f"Mosquitto({self.host}:{self.port}, {state}, {self.workdir})"


@atexit.register
def _stop_leftovers() -> None:  # a crashed program or test session must not leave brokers behind
    for m in list(_STARTED):
        m.stop(timeout=1.0)
