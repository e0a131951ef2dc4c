"""Fuzzing the aggregator's message handler (`AggregatorCore.on_update`) and the agent's global handler
(`AgentCore.on_global_payload`) with hostile input, while an honest fleet keeps them busy.

Invariants, checked after *every* message: no exception escapes; exactly one of `accepted` /
`rejected[reason]` grows, and the reason is a known one; the model stays finite (POF-MKL θ; FedBNR
statistics, whose posterior precision stays positive definite). A second test sends only messages that
must be refused, each of a known kind, between honest rounds: the final model equals the honest-only one
bit for bit and each hostile message was refused for the expected reason.

Budget: `STREAMFED_FUZZ_EXAMPLES` generated messages in total (default 11,000; e.g. 200000 for a long
run), shared by the tests below. `STREAMFED_FUZZ_REPORT=path.json` writes the counts by kind and outcome
(docs/reliability.md).
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from collections.abc import Callable

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamfed.algorithms.fedbnr import FedBNRParams
from streamfed.algorithms.pofmkl import POFMKLParams
from streamfed.fleet.agent import AgentCore
from streamfed.fleet.aggregator import AggregatorCore
from streamfed.fleet.config import FleetConfig
from streamfed.fleet.sources import Reading
from streamfed.fleet.telemetry import DEFAULT_REJECT_REASONS
from streamfed.wire.message import encode

BUDGET = int(os.environ.get("STREAMFED_FUZZ_EXAMPLES", "11000"))
COUNTS: Counter[str] = Counter()  # "<test>/<kind>/<outcome>" → messages


PER = 6  # messages per generated example (fixed, so the budget is met exactly)


def _settings(share: float) -> settings:
    return settings(max_examples=max(10, round(BUDGET * share / PER)), deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.fixture(scope="module", autouse=True)
def _report():
    yield
    path = os.environ.get("STREAMFED_FUZZ_REPORT")
    if path:
        with open(path, "w") as fh:
            json.dump({"budget": BUDGET, "total": sum(COUNTS.values()), "counts": dict(sorted(COUNTS.items()))},
                      fh, indent=1)


POF = FleetConfig(standardise="none",
                  fleet="fz", algorithm="pofmkl", n_inputs=3, n_kernels=4, n_features=4, bin_size=2, seed=1,
                  seq_window=64, pofmkl=POFMKLParams(eta=0.05, xi=0.2))
BNR = FleetConfig(standardise="none",
                  fleet="fz", algorithm="fedbnr", n_inputs=3, n_features=3, kernels=["gaussian:1.0", "gaussian:2.0"],
                  seq_window=64, fedbnr=FedBNRParams(min_upload=2, fit_hyperparameters=False))
HONEST = ["h0", "h1", "h2"]
KNOWN = set(DEFAULT_REJECT_REASONS)


class Fleet:
    """An aggregator and its honest agents on a synthetic stream; `step()` is one honest sample each."""

    def __init__(self, cfg: FleetConfig, mode: str) -> None:
        self.cfg = cfg
        self.agg = AggregatorCore(cfg, clients=HONEST, mode=mode, window=0.0)  # type: ignore[arg-type]
        self.agents = [AgentCore(cfg, c, i, mode=mode if cfg.algorithm == "pofmkl" else "async")  # type: ignore[arg-type]
                       for i, c in enumerate(HONEST)]
        self.rng = np.random.default_rng(7)
        self.t = 0
        self.delivered: list[bytes] = []  # honest payloads already taken (mutating them gives stale seqs)
        self.now = 0.0

    def step(self) -> None:
        self.t += 1
        msgs = []
        for a in self.agents:
            x = self.rng.uniform(-1, 1, self.cfg.n_inputs)
            if a.waiting_for is not None:  # lock-step: an intruder's update took its round; it waits
                continue
            msgs += a.on_reading(Reading(f"r{self.t}", x, float(self.t), float(np.sin(x.sum()))))[1]
        self.deliver(msgs)

    def deliver(self, msgs: list) -> None:
        queue = list(msgs)
        while queue:
            m = queue.pop(0)
            payload = encode(m)
            if m.kind.endswith(".update"):
                self.delivered.append(payload)
                queue += self.agg.on_update(m.client, payload, now=self.now)
            elif m.kind.endswith(".global"):
                for a in self.agents:
                    a.on_global_payload(payload)
        if self.agg.mode == "async":
            self.now += 1.0
            for g in self.agg.tick(now=self.now):
                if g.kind != "ack":
                    for a in self.agents:
                        a.on_global_payload(encode(g))
        del self.delivered[:-64]

    def healthy(self) -> None:
        if self.cfg.algorithm == "pofmkl":
            assert np.isfinite(self.agg.aggregation.server.theta).all()
            return
        s = self.agg.aggregation.server
        assert s.stats.is_finite() and np.isfinite(s.sigma).all() and np.isfinite(s.lam).all()
        f = s.stats.dim
        for k in range(s.n_kernels):  # the posterior precision every agent will factorise stays PD
            np.linalg.cholesky(s.stats.S[k] / s.sigma[k] ** 2 + np.eye(f) / s.lam[k] ** 2)


FLEETS: dict[str, Fleet] = {}


def fleet(name: str) -> Fleet:
    if name not in FLEETS:
        cfg, mode = {"pofmkl-lockstep": (POF, "lockstep"), "pofmkl-async": (POF, "async"),
                     "fedbnr": (BNR, "async")}[name]
        FLEETS[name] = Fleet(cfg, mode)
        for _ in range(3):
            FLEETS[name].step()
    return FLEETS[name]


# =========================================================================== hostile payloads

SPECIAL = np.array([np.nan, np.inf, -np.inf, 1e308, -1e308, 1e151, -1e151, 1e-310, 0.0, -0.0, 2.0**53])
DTYPES = ["float64", "float32", "int64", "int32", "uint64", "uint8", "complex128", "f8", ""]


def _values(rng: np.random.Generator, shape: tuple[int, ...], hostile: float) -> np.ndarray:
    a = np.asarray(rng.standard_normal(shape) * 10.0 ** rng.integers(-3, 4))
    if a.size and rng.random() < hostile:
        idx = rng.random(a.shape) < rng.choice([0.02, 0.3, 1.0])
        a[idx] = rng.choice(SPECIAL, size=int(idx.sum()))
    return a


def _pack_array(rng: np.random.Generator, name: str, good_dtype: str, good_shape: tuple[int, ...],
                index_bound: int | None) -> tuple[dict, str]:
    """An array entry, usually of the right dtype and shape, with hostile values; `kind` says what is wrong."""
    kind = "ok"
    dtype, shape = good_dtype, list(good_shape)
    r = rng.random()
    if r < 0.08:
        dtype, kind = str(rng.choice(DTYPES)), "dtype"
    elif r < 0.18:
        shape, kind = [int(v) for v in rng.integers(0, 9, rng.integers(0, 4))], "shape"
    if index_bound is not None:
        n = math.prod(shape)
        vals = rng.permutation(index_bound)[:n] if n <= index_bound else rng.integers(0, index_bound, n)
        if rng.random() < 0.3 and vals.size:
            vals = vals.copy()
            vals[rng.integers(0, max(len(vals), 1))] = rng.choice([-1, index_bound, 2**62, vals[0]])
            kind = "index" if kind == "ok" else kind
        arr = np.asarray(vals, dtype=np.int64).reshape(shape)
    else:
        arr = _values(rng, tuple(shape), hostile=0.4)
        if kind == "ok" and not np.isfinite(arr).all():
            kind = "values"
    wire = {"float64": "<f8", "float32": "<f4", "int64": "<i8", "int32": "<i4", "uint64": "<u8", "uint8": "|u1"}
    if dtype in wire:
        with np.errstate(all="ignore"):  # NaN/inf cast to integers: garbage values are the point
            data = np.ascontiguousarray(arr).astype(wire[dtype]).tobytes()
    else:
        data = rng.bytes(int(rng.integers(0, 64)))
    if rng.random() < 0.05:
        data, kind = data[: int(rng.integers(0, len(data) + 1))] + rng.bytes(int(rng.integers(0, 3))), "data"
    return {"dtype": dtype, "shape": shape, "data": data}, kind


def _stats_arrays(rng: np.random.Generator, cfg: FleetConfig) -> tuple[dict, str]:
    """FedBNR statistics: sometimes those of real samples, else improper ones (not PSD, tr S too large,
    n not a count, q < 0) — finite, so only the aggregator's own checks can refuse them."""
    k, f = cfg.params.n_kernels, cfg.feature_dim
    n = int(rng.integers(1, 6))
    phi = rng.standard_normal((k, n, f))
    phi /= np.linalg.norm(phi, axis=-1, keepdims=True) / math.sqrt(2.0)  # ‖φ‖² = 2, as RFF + bias
    y = rng.standard_normal(n)
    S = np.einsum("kni,knj->kij", phi, phi)
    b = np.einsum("kni,n->ki", phi, y)
    q, nn, kind = float(y @ y), float(n), "proper"
    r = rng.random()
    if r < 0.2:
        S = S - 3.0 * np.eye(f)
        kind = "not_psd"
    elif r < 0.3:
        S, kind = S * 10.0, "trace"
    elif r < 0.4:
        nn, kind = float(rng.choice([0.0, -3.0, 2.5, 1e300, np.nan])), "bad_n"
    elif r < 0.5:
        q, kind = -1.0, "q_negative"
    elif r < 0.6:
        b, kind = b * 1e6, "b_large"  # not consistent with q: the augmented matrix is not PSD
    iu = np.triu_indices(f)
    arrays = {"S_upper": S[:, iu[0], iu[1]], "b": b, "n": np.asarray(nn), "q": np.asarray(q)}
    return {a: {"dtype": "float64", "shape": list(v.shape), "data": np.ascontiguousarray(v).astype("<f8").tobytes()}
            for a, v in arrays.items()}, kind


def structured(fl: Fleet, seed: int) -> tuple[str, bytes, str]:
    """`(topic client, payload, kind)`: a well-formed envelope with hostile fields and arrays."""
    rng = np.random.default_rng(seed)
    cfg = fl.cfg
    ks = cfg.message_schema(cfg.update_kind)
    r = rng.random()  # mostly honest names, so that most envelopes get past the name checks
    client = str(rng.choice(HONEST)) if r < 0.75 else "intruder" if r < 0.87 else str(rng.choice(["h0 ", "../h1", ""]))
    mark = fl.agg.tracker.mark(client) if client in HONEST else 0
    seq = int(rng.choice([mark, max(mark - 1, 0), mark + 1, mark + 2, mark + 40, mark + 10_000, 2**63 - 1]))
    kind = "envelope"
    if cfg.algorithm == "fedbnr" and rng.random() < 0.6:
        arrays, kind = _stats_arrays(rng, cfg)
    else:
        dims = {d: int(rng.integers(lo, hi + 1)) for d, (lo, hi) in ks.dims.items()}
        arrays = {}
        for a in ks.arrays:
            shape = tuple(d if isinstance(d, int) else dims[d] for d in a.shape)
            arrays[a.name], k = _pack_array(rng, a.name, a.dtype, shape, a.index_bound)
            kind = k if k != "ok" else kind
    if rng.random() < 0.1:
        arrays.pop(next(iter(arrays))) if rng.random() < 0.5 else arrays.update(extra=arrays[next(iter(arrays))])
        kind = "array_set"
    env = {"schema": 1, "fleet": cfg.fleet, "client": client, "kind": cfg.update_kind, "seq": seq,
           "global_version": fl.agg.version, "kernel_version": fl.agg.kernel_version, "epoch": 0,
           "n_samples": 1, "created": 1.0, "arrays": arrays, "meta": {}, "included": {}}
    r = rng.random()
    if r < 0.05:
        env["fleet"], kind = "other", "fleet"
    elif r < 0.1:
        env["kernel_version"], kind = "rff-v0", "kernel_version"
    elif r < 0.13:
        env["kind"], kind = str(rng.choice([cfg.global_kind, "ack", "status", "nope"])), "kind"
    elif r < 0.16:
        env["seq"], kind = [-1, 2**64 - 1, 1.5, "7", None][int(rng.integers(0, 5))], "seq"
    topic_client = client if rng.random() < 0.95 else str(rng.choice(HONEST))
    return topic_client, msgpack.packb(env, use_bin_type=True), kind


def mutated(fl: Fleet, seed: int) -> tuple[str, bytes, str]:
    """A delivered honest payload (stale seq), with bytes flipped, cut, inserted or duplicated."""
    rng = np.random.default_rng(seed)
    src = fl.delivered[int(rng.integers(0, len(fl.delivered)))]
    data = bytearray(src)
    for _ in range(int(rng.integers(0, 4))):
        i = int(rng.integers(0, max(len(data), 1)))
        op = rng.integers(0, 5)
        if op == 0 and data:
            data[i] ^= 1 << int(rng.integers(0, 8))
        elif op == 1 and data:
            data[i] = int(rng.choice([0x00, 0x7F, 0x80, 0xC1, 0xCB, 0xCF, 0xD3, 0xDC, 0xDE, 0xFF]))
        elif op == 2:
            del data[i: i + int(rng.integers(1, 24))]
        elif op == 3:
            data[i:i] = rng.bytes(int(rng.integers(1, 9)))
        else:
            data[i:i] = data[i: i + int(rng.integers(1, 40))]
    client = msgpack.unpackb(src, raw=False)["client"]
    return client, bytes(data), "mutated" if bytes(data) != src else "replay"


def oversized(fl: Fleet, seed: int) -> tuple[str, bytes, str]:
    rng = np.random.default_rng(seed)
    size = fl.cfg.protocol_schema.max_bytes + int(rng.integers(1, 4096))
    return str(rng.choice(HONEST)), fl.delivered[-1] + rng.bytes(size), "oversized"


def random_bytes(fl: Fleet, seed: int) -> tuple[str, bytes, str]:
    rng = np.random.default_rng(seed)
    return str(rng.choice(HONEST)), rng.bytes(int(rng.integers(0, 700))), "random_bytes"


MAKERS: list[Callable[[Fleet, int], tuple[str, bytes, str]]] = [
    structured, structured, structured, mutated, mutated, random_bytes, oversized]
seeds = st.integers(0, 2**32 - 1)


def send(fl: Fleet, test: str, client: str, payload: bytes, kind: str) -> str:
    before_acc, before_rej = fl.agg.counters.accepted, dict(fl.agg.rejected)
    out = fl.agg.on_update(client, payload, now=fl.now)  # must not raise
    after = fl.agg.rejected
    grew = {r: n - before_rej.get(r, 0) for r, n in after.items() if n != before_rej.get(r, 0)}
    accepted = fl.agg.counters.accepted - before_acc
    assert (accepted, sum(grew.values())) in ((1, 0), (0, 1)), (kind, accepted, grew)
    outcome = "accepted" if accepted else next(iter(grew))
    assert outcome == "accepted" or outcome in KNOWN, outcome
    for m in out:
        if m.kind != "ack":
            for a in fl.agents:
                assert a.on_global_payload(encode(m)).installed or a.global_version >= m.global_version
    fl.healthy()
    COUNTS[f"{test}/{kind}/{outcome}"] += 1
    return outcome


# =========================================================================== the fuzz tests


@pytest.mark.slow  # over 2 s: outside the pure tier, in every full run
@pytest.mark.parametrize("name", ["pofmkl-lockstep", "pofmkl-async", "fedbnr"])
def test_fuzz_the_aggregator_never_raises_never_corrupts(name):
    fl = fleet(name)

    @_settings(share=0.25)
    @given(st.lists(st.tuples(st.integers(0, len(MAKERS) - 1), seeds), min_size=PER, max_size=PER), st.booleans())
    def run(plan, honest):
        for maker, seed in plan:
            send(fl, name, *MAKERS[maker](fl, seed))
        if honest:
            fl.step()
            fl.healthy()

    before = sum(v for k, v in COUNTS.items() if k.startswith(name + "/"))
    run()
    sent = sum(v for k, v in COUNTS.items() if k.startswith(name + "/")) - before
    assert sent >= 0.99 * BUDGET * 0.25  # the budget was spent
    assert fl.agg.version > 3 and fl.agg.counters.accepted > 0  # honest rounds kept closing


# ---------------------------------------------------------------- refused for sure: the model is the honest one


def _must_refuse(fl: Fleet, rng: np.random.Generator) -> tuple[str, bytes, str, str]:
    """`(topic client, payload, kind, expected reason)` — each of these is invalid for a known reason."""
    cfg = fl.cfg
    honest = fl.delivered[-1]
    env = msgpack.unpackb(honest, raw=False)
    c = env["client"]
    choice = int(rng.integers(0, 13))

    def pack(**kw) -> bytes:
        return msgpack.packb({**env, **kw}, use_bin_type=True)

    def arr(name: str, values: np.ndarray) -> dict:
        return {**env["arrays"], name: {"dtype": "float64", "shape": list(values.shape),
                                        "data": np.ascontiguousarray(values, dtype="<f8").tobytes()}}

    big = "delta" if cfg.algorithm == "pofmkl" else "b"
    shape = env["arrays"][big]["shape"]
    if choice == 0:
        return c, honest, "replay", "stale_seq"
    if choice == 1:
        return c, rng.bytes(int(rng.integers(1, 300))) + b"\xc1", "random_bytes", "not_msgpack"
    if choice == 2:
        return c, honest + b"\x00" * cfg.protocol_schema.max_bytes, "oversized", "too_large"
    if choice == 3:
        return c, pack(fleet="other"), "wrong_fleet", "wrong_fleet"
    if choice == 4:
        return c, pack(kernel_version="rff-v0"), "wrong_kernel_version", "wrong_kernel_version"
    if choice == 5:
        return "intruder", pack(client="intruder", seq=10**6), "unknown_client", "unknown_client"
    if choice == 6:
        return c, pack(seq=max(fl.agg.tracker.mark(c) - int(rng.integers(0, 3)), 0)), "old_seq", "stale_seq"
    if choice == 7:
        v = rng.standard_normal(shape)
        v.flat[int(rng.integers(0, v.size))] = rng.choice([np.nan, np.inf, -np.inf])
        return c, pack(arrays=arr(big, v)), "nan_inf", "non_finite"
    if choice == 8:
        return c, pack(arrays=arr(big, rng.standard_normal([shape[0] + 1] + shape[1:]))), "wrong_shape", \
            "wrong_shape"
    if choice == 9:
        bad = {**env["arrays"], big: {**env["arrays"][big], "dtype": "float32"}}
        return c, pack(arrays=bad), "wrong_dtype", "wrong_dtype"
    if choice == 10:
        return c, pack(client="h9"), "topic_mismatch", "bad_client"
    if choice == 11:
        return c, honest[: int(rng.integers(1, len(honest)))], "truncated", "not_msgpack"
    # finite, well-formed, fresh — but out of range (POF-MKL) or improper (FedBNR): the aggregator's own checks
    fresh = fl.agg.tracker.mark(c) + 1
    if cfg.algorithm == "pofmkl":
        return c, pack(seq=fresh, arrays=arr("delta", np.full(shape, 1e200))), "huge_delta", "invalid_update"
    k, f = cfg.params.n_kernels, cfg.feature_dim
    iu = np.triu_indices(f)
    s_bad = np.repeat((np.eye(f) * -1.0)[None], k, axis=0)[:, iu[0], iu[1]]
    return c, pack(seq=fresh, arrays=arr("S_upper", s_bad)), "not_psd", "invalid_update"


@pytest.mark.parametrize("name", ["pofmkl-lockstep", "fedbnr"])
def test_fuzz_refused_messages_never_reach_the_model(name):
    cfg, mode = (POF, "lockstep") if name.startswith("pofmkl") else (BNR, "async")
    fuzzed, honest_only = Fleet(cfg, mode), Fleet(cfg, mode)
    for _ in range(3):
        fuzzed.step(), honest_only.step()

    @_settings(share=0.075)
    @given(st.lists(seeds, min_size=PER, max_size=PER))
    def run(plan):
        for seed in plan:
            client, payload, kind, reason = _must_refuse(fuzzed, np.random.default_rng(seed))
            assert send(fuzzed, f"refuse-{name}", client, payload, kind) == reason, kind
        fuzzed.step()
        honest_only.step()

    run()
    assert fuzzed.agg.version == honest_only.agg.version > 10
    if cfg.algorithm == "pofmkl":
        assert np.array_equal(fuzzed.agg.aggregation.server.theta, honest_only.agg.aggregation.server.theta)
    else:
        assert fuzzed.agg.aggregation.server.stats == honest_only.agg.aggregation.server.stats
        assert fuzzed.agg.aggregation.server.included == honest_only.agg.aggregation.server.included
    for a, b in zip(fuzzed.agents, honest_only.agents, strict=True):
        assert a.global_version == b.global_version and a.counters.learned == b.counters.learned


# ---------------------------------------------------------------- globals at the agent


def test_fuzz_hostile_globals_at_the_agent():
    fl = fleet("pofmkl-async")
    agent = AgentCore(POF, "watcher", 9)
    good = encode(fl.agg.global_message())
    agent.on_global_payload(good)

    @_settings(share=0.1)
    @given(st.lists(seeds, min_size=PER, max_size=PER))
    def run(plan):
        for seed in plan:
            rng = np.random.default_rng(seed)
            env = msgpack.unpackb(good, raw=False)
            r = rng.random()
            if r < 0.25:
                payload, kind = rng.bytes(int(rng.integers(0, 400))), "random_bytes"
            elif r < 0.5:
                data = bytearray(good)
                for _ in range(int(rng.integers(1, 4))):
                    data[int(rng.integers(0, len(data)))] ^= 1 << int(rng.integers(0, 8))
                payload, kind = bytes(data), "mutated"
            else:
                shape = env["arrays"]["theta"]["shape"]
                entry, kind = _pack_array(rng, "theta", "float64", tuple(shape), None)
                if kind == "ok" and rng.random() < 0.5:  # finite, but ‖θ_p‖² overflows
                    entry["data"] = np.full(shape, 1e160).astype("<f8").tobytes()
                    kind = "huge"
                env["arrays"]["theta"] = entry
                env["seq"] = env["global_version"] = agent.global_version + int(rng.integers(-1, 3))
                payload = msgpack.packb(env, use_bin_type=True)
            before = (agent.counters.rejected_globals, agent.counters.ignored_globals, agent.global_version)
            res = agent.on_global_payload(payload)  # must not raise
            after = (agent.counters.rejected_globals, agent.counters.ignored_globals, agent.global_version)
            if res.installed:
                outcome = "installed"
                assert after[2] > before[2]
            elif res.reason is not None:
                outcome = res.reason
                assert after[0] == before[0] + 1 and agent.counters.rejected_globals_by[res.reason] > 0
            else:
                outcome = "ignored"
                assert after[1] == before[1] + 1
            assert np.isfinite(agent.learner.client.theta).all() and np.isfinite(agent.learner.client._theta_sq).all()
            COUNTS[f"agent-global/{kind}/{outcome}"] += 1

    run()
    assert sum(v for k, v in COUNTS.items() if k.startswith("agent-global/")) >= 0.99 * BUDGET * 0.1
