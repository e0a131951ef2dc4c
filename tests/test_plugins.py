"""The algorithm plug-in contract (:mod:`streamfed.algorithms.base`) from the outside.

1. A whole algorithm family — a federated running mean, ``fedmean`` — defined and registered in this file
   alone, run by the replay, by an aggregator and agents over a real Mosquitto, and by shards and a reducer
   (in-process): every core takes it without knowing it.
2. Personalised FedBNR (``fedbnr-personal``) over a real Mosquitto ends where the replay of the same streams
   ends: the same shared posterior at the aggregator, the same predictive mean and variance at every agent.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import importlib
import math
import types
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest
from pydantic import Field

import streamfed
from streamfed import algorithms
from streamfed.algorithms.base import (
    Aggregation,
    Algorithm,
    BaseLearner,
    Learner,
    Mode,
    NonFiniteError,
    Params,
    Regret,
    Update,
)
from streamfed.algorithms.summed import SummedAggregation, SummedStatistics
from streamfed.evaluation.datasets import ClientStream, Fleet, synthetic_fleet
from streamfed.evaluation.replay import AlgorithmConfig, Arrangement, ReplayResult, replay
from streamfed.fleet.agent import AgentCore
from streamfed.fleet.aggregator import AggregatorCore
from streamfed.fleet.config import FleetConfig
from streamfed.fleet.sharding import ReducerCore, ShardCore
from streamfed.fleet.sources import Reading, array_source
from streamfed.runtime.agent import AgentService, AgentSettings
from streamfed.runtime.aggregator import AggregatorService
from streamfed.wire.message import Message, encode
from streamfed.wire.schema import MessageSchema
from streamfed.wire.topics import Channel

# =========================================================================== FedMean: a plug-in in one file

# --- the fedmean plug-in begins (test_fedmean_plugin_is_short counts its code lines)
FEDMEAN = "fedmean"
STATS = SummedStatistics(FEDMEAN, {"sum": ()}, derived={"mean": ()})  # Σy over samples, and their count
UPDATE, GLOBAL, PARTIAL = STATS.kinds


class FedMeanParams(Params):
    min_upload: int = Field(10, ge=1)  # never upload the sum of fewer samples


class FedMeanLearner(BaseLearner):
    """Predicts the global mean (no variance); uploads `(Σy, count)` of its new samples once `min_upload`
    are pending. The agent numbers its uploads (`Update.seq` is None)."""

    def __init__(self, min_upload: int) -> None:
        self.min_upload = int(min_upload)
        self.mean = 0.0
        self._pend_sum, self._pend_count = 0.0, 0
        self._staged: tuple[float, float] | None = None  # (prediction, y) between begin_learn and end_learn
        self._n, self._loss, self._sy, self._syy = 0, 0.0, 0.0, 0.0

    def predict(self, x: np.ndarray) -> tuple[float, float | None]:
        return self.mean, None

    def begin_learn(self, x: np.ndarray, y: float) -> tuple[float, float | None]:
        if not math.isfinite(y := float(y)):
            raise NonFiniteError(f"target {y!r}")
        self._staged = (self.mean, y)
        return self.mean, None

    def end_learn(self) -> None:
        if self._staged is not None:
            (pred, y), self._staged = self._staged, None
            self._pend_sum, self._pend_count = self._pend_sum + y, self._pend_count + 1
            self._n, self._loss = self._n + 1, self._loss + (pred - y) ** 2
            self._sy, self._syy = self._sy + y, self._syy + y * y

    def take_update(self) -> Update | None:
        if self._pend_count < self.min_upload:
            return None  # fewer than min_upload samples never leave the client
        up = STATS.update({"sum": self._pend_sum}, self._pend_count, self._version)
        self._pend_sum, self._pend_count = 0.0, 0
        return up

    def install_global(self, msg: Message) -> bool:
        g = STATS.read_global(msg, self._version)  # None: not newer than the installed one
        if g is not None:
            self.mean, self._version = float(g["mean"]), int(msg.global_version)
        return g is not None

    def regret(self) -> Regret:  # comparator: the best constant in hindsight, the client's own mean
        best = max(self._syy - self._sy * self._sy / self._n, 0.0) if self._n else 0.0
        return Regret(float(self._n), self._loss, best)

    def diagnostics(self) -> dict[str, float]:
        return {"global_mean": self.mean}


class FedMeanAggregation(SummedAggregation):
    """Σsum and Σcount over every accepted update (each once, in seq order); the global adds `mean = Σsum /
    Σcount` (0 before any sample). Checks, windows, partials and the global message come with the spec."""

    statistics = STATS

    def derived(self, sums: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"mean": np.asarray(sums["sum"] / sums["count"] if sums["count"] else 0.0)}


class FedMean(Algorithm):
    name, title, Params = FEDMEAN, "Federated running mean (test plug-in)", FedMeanParams

    def schemas(self, cfg: FleetConfig) -> list[MessageSchema]:
        return STATS.schemas(cfg)

    def kernel_version(self, cfg: FleetConfig) -> str:
        return "fedmean-1"

    def learner(self, cfg: FleetConfig, client_id: str, index: int, mode: Mode = "async") -> FedMeanLearner:
        if mode == "lockstep":
            raise ValueError("fedmean is order-free (use async)")
        return FedMeanLearner(cfg.params.min_upload)

    def aggregation(self, cfg: FleetConfig, *, max_abs: float = 1e100, check_stats: bool = True
                    ) -> FedMeanAggregation:
        return FedMeanAggregation(max_abs=max_abs)
# --- the fedmean plug-in ends


@pytest.fixture
def fedmean():
    alg = algorithms.register(FedMean())
    try:
        yield alg
    finally:
        algorithms.unregister(FEDMEAN)
    assert FEDMEAN not in algorithms.names()


# =========================================================================== helpers


def replay_keeping_arrangement(*args, **kwargs) -> tuple[ReplayResult, Arrangement]:
    """`replay(*args, **kwargs)` and the arrangement it ran (its learners and aggregations at the end)."""
    result = replay(*args, **kwargs)
    assert result.arrangement is not None
    return result, result.arrangement


async def run_fleet(agents: list[AgentService], aggregator: AggregatorService, timeout: float = 30.0) -> None:
    agg_task = asyncio.create_task(aggregator.run())
    await asyncio.wait_for(aggregator.connected.wait(), 10)
    tasks = [asyncio.create_task(a.run()) for a in agents]
    try:
        await asyncio.wait_for(asyncio.gather(*tasks), timeout)
    finally:
        aggregator.stop()
        for a in agents:
            a.stop()
        with contextlib.suppress(asyncio.CancelledError, asyncio.TimeoutError):
            await asyncio.wait_for(agg_task, 5)


RATE_HZ = 300.0  # samples per second per agent: a stream spans several 50 ms windows, so several globals
WINDOW = 0.05


def run_mqtt_fleet(cfg: FleetConfig, broker, fleet: Fleet, names: list[str]
                   ) -> tuple[AggregatorService, list[AgentService]]:
    """An asynchronous aggregator and one agent per stream (agent `i` named `names[i]`, paced at `RATE_HZ`),
    until every agent's source has ended and its uploads are in a global it installed (then it lingers a
    second for the last global)."""

    async def main():
        agg = AggregatorService(AggregatorCore(cfg, clients=names, mode="async", window=WINDOW), broker)
        agents = [AgentService(AgentCore(cfg, n, i), broker, array_source(s.X, s.y, rate_hz=RATE_HZ),
                               settings=AgentSettings(linger=1.0))
                  for i, (n, s) in enumerate(zip(names, fleet.streams, strict=True))]
        await run_fleet(agents, agg)
        return agg, agents

    return asyncio.run(main())


def rel_diff(a: np.ndarray | float, b: np.ndarray | float) -> float:
    """max |a - b| / max |b| (plain |a - b| when b is all zeros)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape
    scale = float(np.max(np.abs(b))) if b.size else 0.0
    return float(np.max(np.abs(a - b))) / (scale if scale > 0 else 1.0)


def public_imports_only(path: Path) -> list[str]:
    """Every name this file imports from `streamfed` that is not public (underscored, or outside a
    module's `__all__`)."""
    bad = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "streamfed":
            mod = importlib.import_module(node.module)
            public = getattr(mod, "__all__", None)
            for alias in node.names:
                is_module = isinstance(getattr(mod, alias.name, None), types.ModuleType)
                if alias.name.startswith("_") or (public is not None and alias.name not in public and not is_module):
                    bad.append(f"{node.module}.{alias.name}")
        elif isinstance(node, ast.Import):
            bad += [a.name for a in node.names
                    if a.name.split(".")[0] == "streamfed" and any(p.startswith("_") for p in a.name.split("."))]
    return bad


# =========================================================================== 1. FedMean

MIN_UPLOAD = 10
LENGTHS = (47, 33, 60)  # per client: 40, 30 and 60 samples uploaded; 7, 3 and 0 left pending


def fedmean_fleet() -> Fleet:
    base = synthetic_fleet(len(LENGTHS), max(LENGTHS), 2, seed=5)
    streams = tuple(ClientStream(s.name, s.X[:n], s.y[:n], s.feature_names) for s, n in zip(base, LENGTHS, strict=True))
    return Fleet(streams, dataset="synthetic", normalisation="none", split="synthetic", seed=5)


def uploaded_samples(fleet: Fleet) -> np.ndarray:
    """Every sample that left its client: the first `min_upload · ⌊n / min_upload⌋` of each stream (the
    rest is pending below the floor when the stream ends)."""
    return np.concatenate([s.y[: len(s.y) // MIN_UPLOAD * MIN_UPLOAD] for s in fleet.streams])


def sharded_global(cfg: FleetConfig, fleet: Fleet) -> tuple[Message, ReducerCore]:
    """The same streams through agent cores, two shards and a reducer, in-process. Each update goes to the
    shard of its seq's parity; every seq-1 update also reaches the other shard (a resend), so the reducer
    refuses one partial as a repeat and that shard sends its rest again (`partial` rebuilt)."""
    names = list(fleet.names)
    shards = [ShardCore(cfg, f"s{i}", clients=names, mode="async") for i in range(2)]
    reducer = ReducerCore(cfg, clients=names, mode="async", window=3600.0)
    for i, s in enumerate(fleet.streams):
        core = AgentCore(cfg, s.name, i)
        for t in range(len(s.y)):
            _, msgs = core.on_reading(Reading(f"r{t}", s.X[t], float(t), float(s.y[t])), now=0.0)
            for m in msgs:
                shards[m.seq % 2].on_update(s.name, encode(m), now=0.0)
                if m.seq == 1:
                    shards[(m.seq + 1) % 2].on_update(s.name, encode(m), now=0.0)
    queue = [(sh, p) for sh in shards for p in sh.flush(now=0.0)]
    while queue:
        sh, p = queue.pop(0)
        for out in reducer.on_partial(sh.name, encode(p), now=0.0):
            assert out.kind == "partial.ack"
            queue += [(sh, q) for q in sh.on_ack(out, now=0.0)]
    assert [m.kind for m in reducer.tick(now=1e9)] == [GLOBAL]
    return reducer.global_message(), reducer


PLUGIN_BEGINS, PLUGIN_ENDS = "# --- the fedmean plug-in begins", "# --- the fedmean plug-in ends"
MAX_PLUGIN_LINES = 60  # Flower's FedMedian strategy alone is 75


def code_lines(source: str, first: int, last: int) -> set[int]:
    """The lines in `first..last` that hold code, from the AST: every statement's first line and every line of
    its expressions (a continued call, a parenthesised return type) — blank lines, comments and docstrings (a
    string standing alone first in a module, class or function body) are not counted."""
    tree = ast.parse(source)
    docs: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            docs |= set(range(body[0].lineno, body[0].end_lineno + 1))
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.stmt):
            lines.add(node.lineno)
        elif isinstance(node, ast.expr | ast.arg | ast.keyword | ast.alias):
            lines |= set(range(node.lineno, node.end_lineno + 1))
    return {n for n in lines - docs if first < n < last}


def test_fedmean_plugin_is_short():
    """The whole plug-in — its wire, both halves, the family and its parameters — between the two markers, in
    at most MAX_PLUGIN_LINES lines of code: the contract's defaults and the summed-statistics spec do the rest."""
    text = Path(__file__).read_text(encoding="utf-8")
    rows = text.splitlines()
    first, last = (1 + next(i for i, r in enumerate(rows) if r.startswith(m)) for m in (PLUGIN_BEGINS, PLUGIN_ENDS))
    lines = code_lines(text, first, last)
    assert len(lines) <= MAX_PLUGIN_LINES, f"the fedmean plug-in is {len(lines)} code lines"
    # the count is of code: a docstring, a comment or a blank line in the range adds nothing
    sample = 'def f():\n    """doc\n    string"""\n\n    # note\n    return (1,\n            2)\n'
    assert code_lines(sample, 0, 99) == {1, 6, 7}


def test_fedmean_plugin_runs_in_replay_mqtt_and_shards(fedmean, mosquitto_dev):
    # ---- by construction: defined here, unknown to the library, reached through public names only
    assert type(fedmean).__module__ == __name__ and FEDMEAN not in algorithms.BUILTIN
    assert algorithms.get(FEDMEAN) is fedmean and FEDMEAN in algorithms.names()
    package = Path(streamfed.__file__).parent
    assert not [p for p in package.rglob("*.py") if FEDMEAN in p.read_text(encoding="utf-8")]
    assert public_imports_only(Path(__file__)) == []

    fleet = fedmean_fleet()
    names = list(fleet.names)
    uploaded = uploaded_samples(fleet)
    assert uploaded.size == 130
    expected = float(np.mean(uploaded))  # numpy, independently of every core
    cfg = FleetConfig(standardise="none", fleet="plugins-fedmean", algorithm=FEDMEAN, n_inputs=fleet.n_inputs,
                      params={"min_upload": MIN_UPLOAD})
    assert isinstance(fedmean.learner(cfg, "x", 0), Learner)
    assert isinstance(fedmean.aggregation(cfg), Aggregation)
    assert [cfg.protocol_schema.kinds_on(ch) for ch in (Channel.UPDATES, Channel.GLOBAL, Channel.PARTIALS)] == [
        (UPDATE,), (GLOBAL,), (PARTIAL,)]

    # ---- the aggregator core runs its `check` before anything changes: unusable updates leave no trace
    core = AggregatorCore(cfg, clients=["a"], mode="async", window=0.0, max_abs=1e6)

    def update(seq: int, total: float, count: float, n_samples: int) -> bytes:
        return encode(Message(cfg.fleet, "a", UPDATE, seq, 0, core.kernel_version, n_samples, 0.0,
                              {"sum": np.asarray(total), "count": np.asarray(count)}))

    for bad in (update(1, 1.0, 10.5, 10), update(1, 2e6, 10.0, 10), update(1, 1.0, 10.0, 9)):
        assert core.on_update("a", bad, now=0.0) == []
    assert core.on_update("a", update(1, 1.0, 0.0, 0), now=0.0) == []  # the codec: count must be positive
    assert core.version == 0 and core.counters.accepted == 0 and core.rejected["invalid_update"] == 3
    assert [m.kind for m in core.on_update("a", update(1, 5.0, 10.0, 10), now=0.0)] == [GLOBAL]
    assert core.on_update("a", update(1, 5.0, 10.0, 10), now=0.0) == []  # a repeat: the core drops it
    assert float(core.global_message().arrays["mean"]) == 0.5 and core.included() == {"a": 1}

    # ---- (a) the replay
    acfg = AlgorithmConfig(n_kernels=1, n_features=1, params={FEDMEAN: {"min_upload": MIN_UPLOAD}})
    result, arr = replay_keeping_arrangement(fleet, FEDMEAN, acfg, seed=0)
    assert result.lengths.tolist() == list(LENGTHS) and int(result.rejected.sum()) == 0
    ref = arr.global_message(arr.aggregations[0])
    assert float(ref.arrays["count"]) == uploaded.size
    assert float(ref.arrays["mean"]) == pytest.approx(expected, rel=1e-12)
    assert ref.included == {f"c{i}": n // MIN_UPLOAD for i, n in enumerate(LENGTHS)}
    for learner in arr.learners:  # the last global reached every client
        assert learner.predict(np.zeros(fleet.n_inputs)) == (float(ref.arrays["mean"]), None)
    assert result.uploaded_numbers.tolist() == [2.0 * (n // MIN_UPLOAD) for n in LENGTHS]  # (sum, count) each

    # ---- (b) over a real Mosquitto: one aggregator, three agents
    agg, agents = run_mqtt_fleet(cfg, mosquitto_dev.broker_config(), fleet, names)
    assert agg.core.rejected == {}
    assert agg.core.version > 1  # the uploads were folded in over several windows
    g = agg.core.global_message()
    assert float(g.arrays["count"]) == uploaded.size
    assert float(g.arrays["mean"]) == pytest.approx(expected, rel=1e-12)
    assert float(g.arrays["mean"]) == pytest.approx(float(ref.arrays["mean"]), rel=1e-12)
    assert g.included == {n: length // MIN_UPLOAD for n, length in zip(names, LENGTHS, strict=True)}
    for a, length in zip(agents, LENGTHS, strict=True):
        assert a.core.counters.learned == length and a.core.seq == length // MIN_UPLOAD
        assert a.core.global_version == agg.core.version and not a.core.outbox  # installed the last global
        assert a.core.learner.predict(np.zeros(fleet.n_inputs)) == (float(g.arrays["mean"]), None)

    # ---- (c) sharded: two shards and a reducer (in-process), partials summed exactly
    sg, reducer = sharded_global(cfg, fleet)
    assert reducer.rejected == {"duplicate": 1} and reducer.accepted == uploaded.size // MIN_UPLOAD
    assert float(sg.arrays["count"]) == uploaded.size
    assert float(sg.arrays["mean"]) == pytest.approx(expected, rel=1e-12)
    assert sg.included == g.included


# =========================================================================== 2. personalised FedBNR

PERSONAL = "fedbnr-personal"
# σ, λ, τ fixed: A, h depend on the data only; the model's own variance on both sides (no conformal scale); the
# personalised posterior alone (experts=False): the experts' mixture weights follow each prediction made, so they
# depend on when each global arrived — the fleet's 50 ms windows and the replay's steps differ there (the globals,
# which only the personalised expert uploads to, are compared either way; the mixture: tests/test_fedbnr_experts.py)
PERSONAL_PARAMS = {"min_upload": 10, "fit_hyperparameters": False, "calibrate": False, "experts": False}
PERSONAL_STEPS = 60  # a multiple of min_upload: every sample is uploaded, nothing is left pending
PERSONAL_SEED = 4


def test_personal_fedbnr_over_mosquitto_equals_replay(mosquitto_dev):
    fleet = synthetic_fleet(3, PERSONAL_STEPS, 3, seed=11)
    names = [f"c{i}" for i in range(len(fleet))]  # the replay's client names: the server sorts clients by name
    n_inputs = fleet.n_inputs
    acfg = AlgorithmConfig(kernels=("gaussian:1.0",), n_features=10, params={PERSONAL: PERSONAL_PARAMS})
    cfg = FleetConfig(standardise="none",
                      fleet="plugins-personal", algorithm=PERSONAL, n_inputs=n_inputs, n_features=10,
                      kernels=["gaussian:1.0"], seed=PERSONAL_SEED, params=PERSONAL_PARAMS)
    # the fleet is the replay's but for its name and the wire's bound on clients
    differ = {"fleet", "max_clients"}
    assert (cfg.model_dump(exclude=differ)
            == acfg.fleet_config(PERSONAL, n_inputs, PERSONAL_SEED).model_dump(exclude=differ))

    result, arr = replay_keeping_arrangement(fleet, PERSONAL, acfg, seed=PERSONAL_SEED)
    assert int(result.rejected.sum()) == 0 and result.lengths.tolist() == [PERSONAL_STEPS] * 3
    ref = arr.global_message(arr.aggregations[0])

    agg, agents = run_mqtt_fleet(cfg, mosquitto_dev.broker_config(), fleet, names)
    assert agg.core.rejected == {}
    # several globals, agents installing ones that hold part of their own uploads (the replay: one per upload step)
    assert 1 < agg.core.version and ref.global_version == PERSONAL_STEPS // PERSONAL_PARAMS["min_upload"]
    g = agg.core.global_message()

    # The replay publishes after every step with an upload, the fleet once per 50 ms window, so their
    # intermediate globals hold different sets of uploads (and have different versions). With σ, λ, τ fixed
    # and no forgetting, the shared posterior is a deterministic function of each client's summed statistics
    # alone — not of how uploads were grouped into globals — so the globals to compare are the last ones,
    # once every upload of every client is in both (same `included`). Likewise each client's prediction is a
    # function of that final global and of all its own samples.
    everything = {n: PERSONAL_STEPS // PERSONAL_PARAMS["min_upload"] for n in names}
    assert g.included == ref.included == everything
    assert rel_diff(g.arrays["A_upper"], ref.arrays["A_upper"]) <= 1e-10
    assert rel_diff(g.arrays["h"], ref.arrays["h"]) <= 1e-10
    for k in ("sigma", "lam", "tau"):
        assert g.arrays[k].tolist() == ref.arrays[k].tolist() == [1.0]  # one model (τ fixed, no grid)

    probes = np.random.default_rng(0).uniform(-1.0, 1.0, (5, n_inputs))
    for i, a in enumerate(agents):
        assert a.core.counters.learned == PERSONAL_STEPS and not a.core.outbox
        assert a.core.global_version == a.core.learner.global_version == agg.core.version  # the last global
        mine = np.array([a.core.learner.predict(x) for x in probes])
        theirs = np.array([arr.learners[i].predict(x) for x in probes])
        assert arr.learners[i].global_version == arr.aggregations[0].version
        assert rel_diff(mine[:, 0], theirs[:, 0]) <= 1e-10  # predictive means
        assert rel_diff(mine[:, 1], theirs[:, 1]) <= 1e-10  # predictive variances
