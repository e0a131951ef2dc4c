"""A real Prometheus (and `promtool`) for integration tests.

:func:`start_prometheus` writes the given configuration (a mapping is written as JSON, which is
YAML) into a private work directory, starts `prometheus` on a free loopback port with its TSDB in
that directory, waits until `/-/ready` answers 200, and kills it (SIGTERM, then SIGKILL) and removes
the directory when the returned :class:`Prometheus` is closed — also when start-up fails, and at
interpreter exit for anything left over. :func:`scrape_config` builds a configuration with short
scrape and evaluation intervals.

A missing binary raises :class:`PrometheusUnavailable`, whose message says how to install it; the
tests turn it into a failure, never a skip (:func:`require`).

Prometheus spreads scrapes over the interval and needs a few seconds before a new target's first
sample is queryable: wait with :meth:`Prometheus.wait_for` rather than sleeping a fixed time.
"""

from __future__ import annotations

import atexit
import json
import math
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from streamfed.runtime.mosquitto import free_port  # the project's one port picker

__all__ = [
    "REPO",
    "PROMETHEUS_CONFIG",
    "INSTALL_HINT",
    "PrometheusError",
    "PrometheusUnavailable",
    "Prometheus",
    "find_prometheus",
    "find_promtool",
    "free_port",
    "promtool",
    "require",
    "scrape_config",
    "start_prometheus",
]

REPO = Path(__file__).resolve().parent.parent
PROMETHEUS_CONFIG = REPO / "broker_config" / "prometheus"
INSTALL_HINT = ("Prometheus is not installed. `bash scripts/setup.sh` installs it (the Debian package "
                "`prometheus`, which also provides `promtool`), or run `apt-get install -y prometheus`.")
_STARTED: list[Prometheus] = []
T = TypeVar("T")


class PrometheusUnavailable(RuntimeError):
    """The `prometheus` or `promtool` binary is missing; the message says how to install it.

    >>> "scripts/setup.sh" in str(PrometheusUnavailable(INSTALL_HINT))
    True
    """


def _which(name: str) -> str:
    path = shutil.which(name) or shutil.which(name, path="/usr/bin:/usr/sbin:/usr/local/bin")
    if path is None:
        raise PrometheusUnavailable(f"`{name}` not found. {INSTALL_HINT}")
    return path


def find_prometheus() -> str:
    """Path of the `prometheus` server binary."""
    return _which("prometheus")


def find_promtool() -> str:
    """Path of `promtool`."""
    return _which("promtool")


def require(fail: Callable[[str], Any]) -> None:
    """Call `fail(message)` (e.g. `pytest.fail`) if either binary is missing."""
    try:
        find_prometheus()
        find_promtool()
    except PrometheusUnavailable as e:
        fail(str(e))


def promtool(*args: str, stdin: bytes | None = None, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run `promtool args...` and return the finished process (not checked: callers assert on it)."""
    return subprocess.run([find_promtool(), *args], input=stdin.decode() if stdin is not None else None,
                          capture_output=True, text=True, timeout=timeout)


def scrape_config(jobs: Mapping[str, Sequence[str]], *, interval: str = "1s",
                  rule_files: Iterable[str | Path] = (),
                  file_sd: Mapping[str, str | Path] | None = None) -> dict[str, Any]:
    """A Prometheus configuration scraping `jobs` (job name → `host:port` targets) every `interval`,
    evaluating `rule_files` at the same interval. `file_sd` maps a job name to a file-based discovery
    file (targets are then read from it as well).

    >>> scrape_config({"j": ["127.0.0.1:1"]})["scrape_configs"][0]["static_configs"]
    [{'targets': ['127.0.0.1:1']}]
    """
    configs: list[dict[str, Any]] = []
    for job, targets in jobs.items():
        c: dict[str, Any] = {"job_name": job, "scrape_interval": interval, "scrape_timeout": interval}
        if targets:
            c["static_configs"] = [{"targets": list(targets)}]
        if file_sd and job in file_sd:
            c["file_sd_configs"] = [{"files": [str(file_sd[job])], "refresh_interval": "1s"}]
        configs.append(c)
    for job in file_sd or {}:
        if job not in jobs:
            configs.append({"job_name": job, "scrape_interval": interval, "scrape_timeout": interval,
                            "file_sd_configs": [{"files": [str(file_sd[job])], "refresh_interval": "1s"}]})
    return {"global": {"scrape_interval": interval, "evaluation_interval": interval},
            "rule_files": [str(p) for p in rule_files], "scrape_configs": configs}


class PrometheusError(RuntimeError):
    """The HTTP API answered with an error (e.g. a PromQL syntax error).

    >>> str(PrometheusError("GET /api/v1/query: bad_data: parse error"))
    'GET /api/v1/query: bad_data: parse error'
    """


@dataclass
class Prometheus:
    """A running Prometheus (made by :func:`start_prometheus`): its URL, HTTP API helpers, and how to
    stop it.

    >>> Prometheus(Path("/tmp/w"), Path("/tmp/w/prometheus.yml"), port=9090).url
    'http://127.0.0.1:9090'
    """

    workdir: Path
    config: Path
    port: int = 0
    host: str = "127.0.0.1"
    proc: subprocess.Popen[bytes] | None = None
    _log: Path | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def log(self) -> str:
        return self._log.read_text(errors="replace") if self._log and self._log.exists() else ""

    # ---------------------------------------------------------------- HTTP API
    def get(self, path: str, timeout: float = 5.0, **params: Any) -> Any:
        """GET `path` of the HTTP API (list values repeat a parameter) and return `data`, or raise
        :class:`PrometheusError` with Prometheus' error type and message."""
        query = urllib.parse.urlencode(params, doseq=True)
        url = f"{self.url}{path}" + (f"?{query}" if query else "")
        try:
            with urllib.request.urlopen(url, timeout=timeout) as r:
                body = json.loads(r.read())
        except urllib.error.HTTPError as e:  # 400/422 carry a JSON error body
            try:
                body = json.loads(e.read())
            except ValueError:
                raise PrometheusError(f"GET {url}: HTTP {e.code}") from e
        if body.get("status") != "success":
            raise PrometheusError(f"GET {url}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """Instant query: the result list of `/api/v1/query` (`resultType` vector or scalar made a list)."""
        params: dict[str, Any] = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self.get("/api/v1/query", **params)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        if data["resultType"] == "matrix":
            return [{"metric": s["metric"], "value": s["values"][-1]} for s in data["result"] if s["values"]]
        return list(data["result"])

    def values(self, expr: str) -> dict[tuple[tuple[str, str], ...], float]:
        """Instant query as {sorted label pairs: value}."""
        return {tuple(sorted(s["metric"].items())): float(s["value"][1]) for s in self.query(expr)}

    def value(self, expr: str) -> float:
        """The single value of an instant query (`AssertionError` unless exactly one series)."""
        res = self.query(expr)
        assert len(res) == 1, f"{expr!r} returned {len(res)} series: {res}"
        return float(res[0]["value"][1])

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1.0) as r:
                return r.status == 200
        except OSError:
            return False

    def wait_for(self, predicate: Callable[[], T], timeout: float = 20.0, interval: float = 0.2,
                 what: str = "condition") -> T:
        """Poll `predicate` until it returns something truthy (returned); fail after `timeout` with
        the last exception or value and the Prometheus log."""
        deadline = time.monotonic() + timeout
        last: object = None
        while True:
            try:
                v = predicate()
                if v:
                    return v
                last = v
            except (PrometheusError, OSError, AssertionError, KeyError, ValueError) as e:
                last = e
            if time.monotonic() > deadline:
                raise AssertionError(f"Prometheus: {what} not met within {timeout} s (last: {last!r})\n"
                                     f"{self.log()[-3000:]}")
            time.sleep(interval)

    def wait_for_series(self, expr: str, timeout: float = 20.0) -> list[dict[str, Any]]:
        """Wait until `expr` returns at least one finite sample."""
        def have() -> list[dict[str, Any]]:
            res = self.query(expr)
            return res if any(math.isfinite(float(s["value"][1])) for s in res) else []
        return self.wait_for(have, timeout, what=f"data for {expr!r}")

    # ---------------------------------------------------------------- life cycle
    def _spawn(self, timeout: float) -> None:
        assert self._log is not None
        with open(self._log, "ab") as log:
            self.proc = subprocess.Popen(
                [find_prometheus(), f"--config.file={self.config}",
                 f"--storage.tsdb.path={self.workdir / 'data'}",
                 f"--web.listen-address={self.host}:{self.port}",
                 "--storage.tsdb.retention.time=1h", "--log.level=info"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                cwd=self.workdir)
        if self not in _STARTED:
            _STARTED.append(self)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self.proc.returncode}:\n{self.log()}")
            if self.ready():
                return
            time.sleep(0.05)
        raise RuntimeError(f"prometheus did not become ready in {timeout} s:\n{self.log()}")

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM, SIGKILL after `timeout`."""
        p, self.proc = self.proc, None
        if p is None or p.poll() is not None:
            return
        p.terminate()
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()

    def close(self) -> None:
        self.stop()
        if self in _STARTED:
            _STARTED.remove(self)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Prometheus:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@atexit.register
def _kill_leftovers() -> None:  # a crashed test session must not leave servers behind
    for p in list(_STARTED):
        p.stop(timeout=1.0)


def start_prometheus(config: Mapping[str, Any] | str, *, files: Mapping[str, str] | None = None,
                     attempts: int = 3, timeout: float = 20.0) -> Prometheus:
    """Start Prometheus with `config` (a mapping, written as JSON, or YAML text) on a free loopback
    port with a private TSDB; `files` are extra files (name → text) written next to the config, e.g.
    file-discovery target lists (relative paths in the config resolve against that directory).
    Retries with another port if the chosen one was taken meanwhile. Close the result to stop it."""
    find_prometheus()
    workdir = Path(tempfile.mkdtemp(prefix="streamfed-prometheus-"))
    try:
        text = json.dumps(config, indent=1) if isinstance(config, Mapping) else config
        conf = workdir / "prometheus.yml"
        conf.write_text(text)
        for name, content in (files or {}).items():
            (workdir / name).write_text(content)
        prom = Prometheus(workdir, conf, _log=workdir / "prometheus.log")
        last: Exception | None = None
        for _ in range(attempts):
            prom.port = free_port()
            try:
                prom._spawn(timeout)
                return prom
            except RuntimeError as e:
                prom.stop()
                last = e
                if "address already in use" not in prom.log():
                    break
                prom._log.write_text("")  # type: ignore[union-attr]
        raise RuntimeError(f"could not start Prometheus: {last}")
    except BaseException:
        for p in list(_STARTED):
            if p.workdir == workdir:
                p.stop()
                _STARTED.remove(p)
        shutil.rmtree(workdir, ignore_errors=True)
        raise
