"""Loud failures (issue 15, part 5), over real Mosquitto brokers and real processes.

- A checkpoint that cannot be written (a full disk: a tmpfs of a few KB filled with a ballast file; without
  root, a state directory made read-only) used to raise in a timer callback, be logged, and leave the
  aggregator running with metrics claiming versions that were never on disk. Now: no global that is not on
  disk is published, the aggregator says it is unhealthy (log, `values["healthy"]`, its status topic), retries,
  publishes the durable global once the disk is back, and exits with status 3 if the failure lasts.
- Two aggregators on copies of one state directory (the production broker: both log in as `<fleet>.aggregator`
  with its bound client id) used to take each other's session forever. Now the one started first exits with
  status 4 and "another aggregator connected as <fleet>.aggregator"; a broker restart triggers nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import aiomqtt
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamfed.algorithms.fedbnr import FedBNRParams
from streamfed.fleet.agent import AgentCore
from streamfed.fleet.aggregator import AggregatorCore
from streamfed.fleet.config import FleetConfig
from streamfed.fleet.persistence import read_state
from streamfed.runtime.agent import AgentService, AgentSettings
from streamfed.runtime.aggregator import AggregatorService
from streamfed.runtime.connection import client_kwargs
from streamfed.runtime.exporter import StreamfedCollector, make_registry
from streamfed.runtime.runner import array_source_from
from streamfed.runtime.service import DuplicateService, Lease
from streamfed.wire.message import decode
from streamfed.wire.topics import global_topic, status_topic
from tests import brokers

REPO = Path(__file__).resolve().parent.parent


def bnr_cfg(fleet: str) -> FleetConfig:
    return FleetConfig(standardise="none", fleet=fleet, algorithm="fedbnr", n_inputs=3, n_kernels=1, n_features=6,
                       kernels=["gaussian:1.0"], fedbnr=FedBNRParams(min_upload=5))


def stream(seed: int, n: int = 400) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3))
    return X, np.sin(X[:, 0]) + 0.1 * rng.normal(size=n)


# =========================================================================== a disk that fills up


class FullDisk:
    """A state directory whose writes can be made to fail for real. As root: a 256 KB tmpfs, filled by a
    ballast file (writes then fail with ENOSPC, "No space left on device"). Otherwise: the directory is made
    read-only (EACCES). `free()` undoes it."""

    def __init__(self) -> None:
        self.path = Path(tempfile.mkdtemp(prefix="streamfed-full-"))
        self.tmpfs = os.geteuid() == 0 and subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(self.path)], capture_output=True).returncode == 0
        self.ballast = self.path / "ballast"

    def fill(self) -> None:
        if not self.tmpfs:
            self.path.chmod(0o555)
            return
        with contextlib.suppress(OSError), open(self.ballast, "ab") as fh:
            while True:
                fh.write(b"\0" * 4096)
                fh.flush()

    def free(self) -> None:
        if self.tmpfs:
            self.ballast.unlink(missing_ok=True)
        else:
            self.path.chmod(0o755)

    def close(self) -> None:
        self.free()
        if self.tmpfs:
            subprocess.run(["umount", "-l", str(self.path)], capture_output=True)
        shutil.rmtree(self.path, ignore_errors=True)


# The production broker (TLS, dynsec): each fleet's aggregator and agents log in with their own accounts, and the
# operator account `ops` watches every topic.
PROD_ROSTER = {"operators": ["ops"], "fleet": [{"name": "loud-disk", "agents": ["d1", "d2"]},
                                               {"name": "loud-agent", "agents": ["g1", "g2"]},
                                               {"name": "loud-exit", "agents": ["e1"]}]}


@pytest.fixture(scope="module")
def prod() -> Iterator[brokers.Broker]:
    b = brokers.start_or_fail("prod", roster=PROD_ROSTER)
    with b:
        yield b


@pytest.fixture
def disk() -> Iterator[FullDisk]:
    d = FullDisk()
    try:
        yield d
    finally:
        d.close()


def disk_version(path: Path) -> int:
    st_ = read_state(path)
    return int(st_["core"]["aggregation"].version) if st_ else 0


async def watch(broker_cfg, topics: list[str], got: list[tuple[str, bytes]], ready: asyncio.Event,
                client_id: str | None = None) -> None:
    async with aiomqtt.Client(**client_kwargs(broker_cfg, client_id), timeout=5.0) as c:
        for t in topics:
            await c.subscribe(t, qos=1)
        ready.set()
        async for m in c.messages:
            got.append((m.topic.value, bytes(m.payload)))


async def until(pred, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)


def test_a_checkpoint_that_cannot_be_written_holds_globals_back_and_recovers(prod, disk):
    """In process (to read the stats), over the production broker: the disk fills mid-stream, then is freed."""
    cfg = bnr_cfg("loud-disk")
    state = disk.path / "aggregator-loud-disk.state"

    async def main():
        agg = AggregatorService(AggregatorCore(cfg, clients=["d1", "d2"], window=0.05),
                                prod.broker_config("loud-disk.aggregator"), state_dir=disk.path,
                                checkpoint_retry=0.1, checkpoint_deadline=60)
        # room for every upload (no flow control): each is then exactly `min_upload` samples, so the 400 of each
        # agent end on an upload boundary and the count below can be exact
        agents = [AgentService(AgentCore(cfg, n, i), prod.broker_config(n), array_source_from(*stream(i), 150.0),
                               settings=AgentSettings(drain=20.0, outbox_limit=1024))
                  for i, n in enumerate(["d1", "d2"])]
        got: list[tuple[str, bytes]] = []
        ready = asyncio.Event()
        watcher = asyncio.create_task(watch(prod.broker_config("ops"), [global_topic(cfg.fleet),
                                                                       status_topic(cfg.fleet, "aggregator")],
                                            got, ready, client_id="ops"))
        await asyncio.wait_for(ready.wait(), 10)
        agg_task = asyncio.create_task(agg.run())
        runs = [asyncio.create_task(a.run()) for a in agents]

        def globals_seen() -> list[int]:
            return [decode(p, cfg, kinds=(cfg.global_kind,)).global_version for t, p in got if t.endswith("/global")]

        try:
            await until(lambda: disk_version(state) >= 3, 20, "three globals on disk")
            disk.fill()
            await until(lambda: agg.core.version > disk_version(state) + 2, 20, "globals in memory, not on disk")
            on_disk, seen = disk_version(state), len(got)
            await asyncio.sleep(0.5)
            # nothing beyond the disk's version reaches the broker, and the metrics say what is true
            assert max(globals_seen()) <= on_disk < agg.core.version
            assert agg.core.stats.global_version == on_disk
            assert not agg.healthy and "cannot write its state" in agg.problem
            assert ("No space left on device" if disk.tmpfs else "Permission denied") in agg.problem
            text = make_registry(StreamfedCollector([], [agg.core.stats])).collect()
            healthy = [s.value for fam in text for s in fam.samples
                       if s.name == "streamfed_aggregator_value" and s.labels.get("name") == "healthy"]
            assert healthy == [0.0]
            status = [decode(p, cfg, client="aggregator", kinds=("status",)) for t, p in got[:] if "/status/" in t]
            assert status[-1].meta["healthy"] is False and "cannot write its state" in status[-1].meta["problem"]
            assert len(got) >= seen  # (the watcher is alive)
            # the disk comes back: the durable current global goes out at once
            disk.free()
            await until(lambda: agg.healthy, 5, "the aggregator to be healthy again")
            await until(lambda: max(globals_seen()) > on_disk, 5, "the next global")
            assert max(globals_seen()) <= disk_version(state)
            assert agg.core.stats.values["healthy"] == 1.0
            await asyncio.wait_for(asyncio.gather(*runs), 60)
            assert agg.healthy and agg.held_back > 0
        finally:
            agg.stop()
            for t in runs:
                t.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(agg_task, 10)
            watcher.cancel()
            with contextlib.suppress(BaseException):
                await watcher
        return agg, agents

    agg, agents = asyncio.run(main())
    final = read_state(state)["core"]["aggregation"]
    # every sample of both agents is in the global on disk, once
    assert final.server.stats.n == 2 * 400 and final.included() == {"d1": 80, "d2": 80}
    assert all(a.core.global_version == final.version and not a.core.outbox for a in agents)


def agent_state_seqs(path: Path) -> int:
    """The highest update seq the agent's state on disk covers (0 without a state)."""
    st_ = read_state(path)
    return int(st_["core"]["seq"]) if st_ else 0


def test_an_agent_that_cannot_write_its_state_holds_its_updates_back_then_stops(prod, disk):
    """Before: the OSError of a failed checkpoint ended the task reading the source and the checkpointer; the
    agent neither learned, sent nor exited — silently. Now its updates computed since the last state on disk are
    held back (none reaches the aggregator), it says so (log, `streamfed_agent_healthy` 0), retries every second
    and sends them as soon as the disk is back; a disk that stays full stops it with CheckpointFailed (exit 3)."""
    from streamfed.runtime.service import CheckpointFailed

    cfg = bnr_cfg("loud-agent")
    state = disk.path / "agent-loud-agent-g1.state"

    async def main() -> None:
        agg = AggregatorService(AggregatorCore(cfg, clients=["g1", "g2"], window=0.05),
                                prod.broker_config("loud-agent.aggregator"))
        agg_task = asyncio.create_task(agg.run())
        await asyncio.wait_for(agg.connected.wait(), 10)
        agent = AgentService(AgentCore(cfg, "g1", 0), prod.broker_config("g1"), array_source_from(*stream(0), 100.0),
                             state_dir=disk.path, settings=AgentSettings(drain=20.0, checkpoint_deadline=60.0))
        run = asyncio.create_task(agent.run())
        try:
            await until(lambda: agent_state_seqs(state) >= 3, 20, "three updates on disk")
            disk.fill()
            await until(lambda: agent.core.stats.healthy == 0.0, 10, "the agent to say it is unhealthy")
            await asyncio.sleep(0.5)
            held = agent.core.seq
            on_disk = agent_state_seqs(state)
            assert agg.core.included().get("g1", 0) <= on_disk < held  # nothing beyond the disk left the agent
            text = make_registry(StreamfedCollector([agent.core.stats])).collect()
            assert [s.value for fam in text for s in fam.samples if s.name == "streamfed_agent_healthy"] == [0.0]
            disk.free()
            await until(lambda: agent.core.stats.healthy == 1.0, 5, "the agent to be healthy again")
            await asyncio.wait_for(run, 60)
            assert agg.core.included() == {"g1": agent.core.seq} and not agent.core.outbox
            # a disk that stays full: the agent stops after its deadline, with the reason
            disk.fill()
            again = AgentService(AgentCore(cfg, "g2", 1), prod.broker_config("g2"),
                                 array_source_from(*stream(1), 100.0), state_dir=disk.path,
                                 settings=AgentSettings(checkpoint_deadline=1.0))
            with pytest.raises(CheckpointFailed, match="cannot write its state for"):
                await asyncio.wait_for(again.run(), 30)
        finally:
            agg.stop()
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(agg_task, 10)

    asyncio.run(main())


# =========================================================================== real processes


class Proc:
    """A `python -m streamfed.runtime.runner` subprocess; killed (process group) at the end of the test."""

    def __init__(self, spec: Path, role: str, client: str | None = None, name: str | None = None) -> None:
        self.args = [sys.executable, "-m", "streamfed.runtime.runner", str(spec), role] + ([client] if client else [])
        self.log = spec.parent / f"{name or role + (client or '')}.log"
        with open(self.log, "ab") as fh:
            self.proc = subprocess.Popen(self.args, stdout=fh, stderr=subprocess.STDOUT, cwd=REPO,
                                         start_new_session=True)

    def kill(self, sig: int = signal.SIGKILL) -> int | None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            self.proc.wait(10)
        return self.proc.returncode


def wait_for(pred, timeout: float, what: str, procs=()):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := pred():
            return value
        time.sleep(0.05)
    logs = "\n".join(f"--- {p.log.name} ({p.proc.poll()})\n{p.log.read_text()[-2500:]}" for p in procs)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{logs}")


def spec_file(path: Path, broker_cfg, state_dir: Path, cfg: FleetConfig, clients: list[str], **service: float) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    broker = broker_cfg.model_dump(mode="json")
    if broker_cfg.password is not None:  # (dumped as "**********")
        broker["password"] = broker_cfg.password.get_secret_value()
    path.write_text(json.dumps({
        "broker": broker, "state_dir": str(state_dir),
        **({"service": service} if service else {}),
        "fleets": [{"config": cfg.model_dump(mode="json"), "mode": "async", "window": 0.05, "clients": clients,
                    "rate": 100.0, "streams": {c: f"{c}.npz" for c in clients}}]}))
    return path


def test_an_aggregator_whose_disk_stays_full_exits_3_with_one_line(prod, disk, tmp_path):
    """Real processes over the production broker, each on its own account."""
    cfg = bnr_cfg("loud-exit")
    X, y = stream(7, 3000)
    np.savez(tmp_path / "e1.npz", X=X, y=y)
    agg_spec = spec_file(tmp_path / "agg.json", prod.broker_config("loud-exit.aggregator"), disk.path, cfg, ["e1"],
                         checkpoint_retry=0.2, checkpoint_deadline=2.0)
    agent_spec = spec_file(tmp_path / "agent.json", prod.broker_config("e1"), tmp_path / "agent-state", cfg, ["e1"])
    state = disk.path / "aggregator-loud-exit.state"
    agg, agent = Proc(agg_spec, "aggregator"), Proc(agent_spec, "agent", "e1")
    try:
        wait_for(lambda: disk_version(state) >= 2, 60, "globals on disk", [agg, agent])
        disk.fill()
        t0 = time.monotonic()
        wait_for(lambda: agg.proc.poll() is not None, 30, "the aggregator to exit", [agg, agent])
        took = time.monotonic() - t0
    finally:
        agent.kill()
        agg.kill()
    log = agg.log.read_text()
    errors = [line for line in log.splitlines() if line.startswith("error: ")]
    assert agg.proc.returncode == 3, log[-3000:]
    assert "Traceback" not in log and len(errors) == 1, log[-3000:]
    assert "loud-exit.aggregator: cannot write its state" in errors[0]
    assert errors[0].endswith(f"the last global on disk is v{disk_version(state)}")
    assert ("No space left on device" if disk.tmpfs else "Permission denied") in errors[0]
    assert 2.0 <= took < 15.0
    # the retained global is no newer than the state on disk
    got: list[tuple[str, bytes]] = []

    async def retained() -> None:
        ready = asyncio.Event()
        task = asyncio.create_task(watch(prod.broker_config("ops"), [global_topic(cfg.fleet)], got, ready,
                                         client_id="ops"))
        await asyncio.sleep(1.0)
        task.cancel()
        with contextlib.suppress(BaseException):
            await task

    asyncio.run(retained())
    assert decode(got[-1][1], cfg, kinds=(cfg.global_kind,)).global_version <= disk_version(state)


# =========================================================================== duplicate aggregators

ROSTER = {"fleet": [{"name": "dup", "agents": ["a1"], "viewers": ["viewer"]}]}


def grant_status_topic(broker: brokers.Broker, fleet: str) -> None:
    """The aggregator's status topic in its role (the change make-dynsec.py needs, see the draft), then a
    broker restart to load it. A no-op once make-dynsec.py grants it."""
    path = broker.workdir / "dynamic-security.json"
    doc = json.loads(path.read_text())
    topic = status_topic(fleet, "aggregator")
    for role in doc["roles"]:
        if role["rolename"] == f"{fleet}.aggregator" and not any(
                a["acltype"] == "publishClientSend" and a["topic"] == topic for a in role["acls"]):
            role["acls"].append({"acltype": "publishClientSend", "topic": topic, "priority": 0, "allow": True})
            path.write_text(json.dumps(doc, indent=2))
            broker.restart()


def claims(broker: brokers.Broker, cfg: FleetConfig, seconds: float = 0.7) -> list[dict]:
    """The statuses on the aggregator's status topic that a viewer sees in `seconds` (the retained one first)."""
    got: list[tuple[str, bytes]] = []

    async def main() -> None:
        ready = asyncio.Event()
        task = asyncio.create_task(watch(broker.broker_config("viewer"), [status_topic(cfg.fleet, "aggregator")],
                                         got, ready, client_id=broker.client_ids["viewer"]))
        await asyncio.sleep(seconds)
        task.cancel()
        with contextlib.suppress(BaseException):
            await task

    asyncio.run(main())
    return [dict(decode(p, cfg, client="aggregator", kinds=("status",)).meta) for _, p in got]


def test_a_second_aggregator_on_a_copy_of_the_state_ends_the_first(mosquitto_factory, tmp_path):
    cfg = bnr_cfg("dup")
    broker = mosquitto_factory("prod", roster=ROSTER)
    grant_status_topic(broker, "dup")
    b = broker.broker_config("dup.aggregator")
    X, y = stream(3, 200)
    np.savez(tmp_path / "a1.npz", X=X, y=y)
    first = Proc(spec_file(tmp_path / "one" / "spec.json", b, tmp_path / "one" / "state", cfg, ["a1"]),
                 "aggregator", name="first")
    procs = [first]
    try:
        claim = wait_for(lambda: claims(broker, cfg, 0.3), 30, "the first aggregator's claim", procs)[-1]
        assert claim["state"] == "online" and claim["healthy"] is True
        # a copy of its state directory, and a second aggregator on it (same account, same client id)
        shutil.copytree(tmp_path / "one" / "state", tmp_path / "two" / "state",
                        ignore=shutil.ignore_patterns("*.lock"))
        second = Proc(spec_file(tmp_path / "two" / "spec.json", b, tmp_path / "two" / "state", cfg, ["a1"]),
                      "aggregator", name="second")
        procs.append(second)
        t0 = time.monotonic()
        wait_for(lambda: first.proc.poll() is not None, 30, "the first aggregator to exit", procs)
        took = time.monotonic() - t0
        log = first.log.read_text()
        assert first.proc.returncode == 4 and "Traceback" not in log, log[-3000:]
        errors = [line for line in log.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1 and errors[0].startswith("error: another aggregator connected as dup.aggregator")
        assert took < 20
        # the second holds the client id, undisturbed
        time.sleep(2.0)
        assert second.proc.poll() is None
        now = claims(broker, cfg)[-1]
        assert now["instance"] != claim["instance"] and now["healthy"] is True
        lost = second.log.read_text().count("connection lost")
        time.sleep(1.5)
        assert second.log.read_text().count("connection lost") == lost  # nobody takes its session any more
        # a broker restart is not a takeover: the second reconnects and stays
        broker.restart()
        wait_for(lambda: second.log.read_text().count("connection lost") > lost, 15, "the lost connection", procs)
        time.sleep(3.0)
        assert second.proc.poll() is None, second.log.read_text()[-3000:]
        assert claims(broker, cfg)[-1]["instance"] == now["instance"]
        assert second.kill(signal.SIGTERM) == 0, second.log.read_text()[-3000:]
    finally:
        for p in procs:
            p.kill()


def test_a_broker_that_refuses_the_status_topic_leaves_the_aggregator_running(mosquitto_factory):
    """The production roster as make-dynsec.py writes it today (no status topic for the aggregator): the claim
    is refused (PUBACK 0x87); the aggregator warns and serves on without duplicate detection."""
    cfg = bnr_cfg("dup")
    broker = mosquitto_factory("prod", roster=ROSTER)
    b = broker.broker_config("dup.aggregator")

    async def main():
        agg = AggregatorService(AggregatorCore(cfg, clients=["a1"], window=0.05), b)
        task = asyncio.create_task(agg.run())
        try:
            await asyncio.wait_for(agg.connected.wait(), 10)
            await asyncio.sleep(1.0)
            return agg, task.done(), agg.lease is not None and agg.lease.enabled
        finally:
            agg.stop()
            await asyncio.wait_for(task, 10)

    agg, done, enabled = asyncio.run(main())
    if enabled:  # make-dynsec.py grants the aggregator its status topic: the claim was taken
        assert claims(broker, cfg)[-1]["instance"] == agg.lease.instance
    assert not done and agg.refusals == {}


# =========================================================================== the lease, as a property


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.sampled_from("abcd")), min_size=1, max_size=4,
                unique_by=lambda t: t[1]),
       st.randoms(use_true_random=False))
def test_of_any_set_of_claims_only_the_newest_instance_survives(starts, rnd):
    """Every instance sees every claim (its own included), in any order: exactly the newest by (start,
    instance) raises nothing; each other one raises DuplicateService naming the client id."""
    cfg = bnr_cfg("p")
    leases = [Lease(cfg, "aggregator", instance=i, since=float(s)) for s, i in starts]
    newest = max(starts)
    for lease in leases:
        msgs = [other.claim(True) for other in leases]
        rnd.shuffle(msgs)
        try:
            for m in msgs:
                lease.observe(m)
        except DuplicateService as e:
            assert (lease.since, lease.instance) != (float(newest[0]), newest[1])
            assert "another aggregator connected as p.aggregator" in str(e)
        else:
            assert (lease.since, lease.instance) == (float(newest[0]), newest[1])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 5), st.sampled_from("abcd")), min_size=1, max_size=4,
                unique_by=lambda t: t[2]),
       st.randoms(use_true_random=False))
def test_of_any_set_of_claims_the_newest_state_survives(claims_, rnd):
    """Fencing (issue 30 part 5): with durable state versions in the claims, exactly the instance with the
    largest (version, start, instance) raises nothing — an instance started later from an older state loses."""
    cfg = bnr_cfg("p")
    leases = [Lease(cfg, "aggregator", instance=i, since=float(s), version=lambda v=v: v) for v, s, i in claims_]
    best = max(claims_)
    for lease in leases:
        msgs = [other.claim(True) for other in leases]
        rnd.shuffle(msgs)
        mine = (lease.version(), lease.since, lease.instance)
        try:
            for m in msgs:
                lease.observe(m)
        except DuplicateService as e:
            assert mine != (best[0], float(best[1]), best[2])
            assert "another aggregator connected as p.aggregator" in str(e)
        else:
            assert mine == (best[0], float(best[1]), best[2])


def _core_at(cfg: FleetConfig, rounds: int) -> AggregatorCore:
    """An aggregator core that has published `rounds` globals of agent a1's uploads (in process)."""
    core = AggregatorCore(cfg, clients=["a1"], window=0.0)
    agent = AgentCore(cfg, "a1", 0)
    X, y = stream(5, 200)
    from streamfed.fleet.sources import Reading
    from streamfed.wire.message import encode

    for t in range(200):
        if core.version >= rounds:
            break
        _, ups = agent.on_reading(Reading(str(t), X[t], float(t), float(y[t])), now=float(t))
        for m in ups:
            for g in core.on_update(m.client, encode(m, cfg), now=float(t)) + core.tick(now=float(t)):
                if g.kind.endswith(".global"):
                    agent.on_global(decode(encode(g, cfg), cfg), now=float(t))
    assert core.version == rounds, core.version
    return core


@pytest.mark.parametrize("stale_first", [True, False])
def test_an_aggregator_on_a_stale_state_exits_whoever_started_first(mosquitto_dev, stale_first):
    """Issue 30 part 5, over Mosquitto: two aggregators with one client id, one holding v2 and one v5 (started
    from an older copy of the state). Before: the later start won, even from the stale copy, and then refused
    every client as `ahead_of_state`. Now the one with the newer state keeps the lease, the stale one ends with
    DuplicateService saying why, whichever started first."""
    cfg = bnr_cfg("fence")
    b = mosquitto_dev.broker_config()
    stale, fresh = _core_at(cfg, 2), _core_at(cfg, 5)
    assert (stale.version, fresh.version) == (2, 5)

    async def main():
        order = [stale, fresh] if stale_first else [fresh, stale]
        services = {id(c): AggregatorService(c, b) for c in order}
        tasks = {}
        for c in order:
            tasks[id(c)] = asyncio.create_task(services[id(c)].run())
            await asyncio.wait_for(services[id(c)].connected.wait(), 10)
            await asyncio.sleep(0.5)
        done, _ = await asyncio.wait([tasks[id(stale)]], timeout=15)
        alive = not tasks[id(fresh)].done()
        services[id(fresh)].stop()
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(tasks[id(fresh)], 10)
        return done, tasks[id(stale)], alive

    done, stale_task, fresh_alive = asyncio.run(main())
    assert done and isinstance(stale_task.exception(), DuplicateService), stale_task
    assert "holds a newer state (v5) than this one (v2" in str(stale_task.exception())
    assert fresh_alive


def test_sigterm_stops_a_cli_agent_cleanly_with_its_state_saved(mosquitto_dev, tmp_path):
    """systemd stops a service with SIGTERM. Before: the CLI had no handler, so the agent died at once — no last
    checkpoint, no stop line. Now it stops as on Ctrl-C: state saved, exit 0, no traceback."""
    b = mosquitto_dev.broker_config()
    conf = tmp_path / "fleet.toml"
    conf.write_text('[fleet]\nfleet = "sigterm"\nalgorithm = "fedbnr"\nn_inputs = 2\nn_kernels = 1\nn_features = 4\n'
                    f'[broker]\nhost = "{b.host}"\nport = {b.port}\n')
    rng = np.random.default_rng(0)
    data = tmp_path / "a.csv"
    data.write_text("x0,x1,y\n" + "".join(f"{u:.4f},{v:.4f},{u + v:.4f}\n" for u, v in rng.normal(size=(5000, 2))))
    state = tmp_path / "state"
    proc = subprocess.Popen([sys.executable, "-m", "streamfed.cli", "agent", "--config", str(conf), "--client", "s1",
                             "--source", f"csv:{data}", "--features", "x0,x1", "--target", "y", "--rate", "200",
                             "--state-dir", str(state)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: (state / "agent-sigterm-s1.state").exists(), 60, "the agent's first checkpoint")
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    saved = read_state(state / "agent-sigterm-s1.state")
    assert saved["source_pos"] > 0 and saved["source_pos"] < 5000  # stopped mid-stream, where it was
