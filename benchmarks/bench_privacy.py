"""Privacy: what differential privacy costs in accuracy, and what secure aggregation costs in time and bytes.

    .venv/bin/python benchmarks/bench_privacy.py [--out benchmarks/results/privacy.md] [--quick] [--secagg-only]

**Utility** — the 12 Beijing stations (raw readings, `T` samples each; each agent standardises with the declared
public scales of `streamfed/evaluation/datasets/public_scales.py` and uploads on DP's public schedule of 32
arrivals, as `streamfed agent` does), run through the real fleet cores in process (`AgentCore` → codec →
`AggregatorCore` → codec → every agent), prequentially: each prediction is made before its label is learned.
FedBNR (one Gaussian kernel, D = 10, uploads of 32 samples, σ and λ fitted by the evidence) and POF-MKL
(lock-step, N = 8, D = 50, M = 2). At a total per-client budget ε ∈ {1, 4, 8} (δ = 1e-5) the noise multiplier is
calibrated (`dp_accounting`, RDP) so that the client's `U` uploads compose to exactly ε; ∞ is the noiseless
fleet. *Local* DP: each upload carries the whole noise; *distributed* DP: each of the 12 clients adds 1/12 of
the variance and only the sum (behind secure aggregation) carries the whole noise. Labels clipped to `|y| <= 1`
in the declared units (CO within [−2,000, 6,000] µg/m³), POF-MKL updates clipped to `‖Δ‖ <= C` (C = the median
norm of its noiseless updates). MSE and NLPD (Gaussian, FedBNR only) over every prediction of every station;
NLPD uses the predictive variance the agent reports, which adds the global's noise to first order
(docs/privacy.md).

**Secure aggregation** — one SecAgg+ round in process (`streamfed.privacy.secagg.run_round`: key
advertisement, encrypted Shamir shares, masked inputs, unmasking) over FedBNR uploads of the Beijing
streams encoded in fixed point (`Z_{2^64}`), at 10, 100 and 1,000 clients, with no dropout and with a
tenth of the clients dropping after sharing their keys; vs the plain round (the float64 sum of the same
uploads and their encoded `fedbnr.update` messages). Whether the unmasked sum equals the plain fixed-point
sum bit for bit, and its largest deviation from the float64 sum.
"""

from __future__ import annotations

import argparse
import gc
import logging
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from streamfed.algorithms.fedbnr import FedBNRParams  # noqa: E402
from streamfed.algorithms.fedbnr.wire import stats_update_message  # noqa: E402
from streamfed.algorithms.pofmkl import POFMKLParams  # noqa: E402
from streamfed.evaluation.bench import load_average, machine, write_section  # noqa: E402
from streamfed.evaluation.datasets import load_beijing  # noqa: E402
from streamfed.evaluation.datasets.public_scales import beijing_public_scales  # noqa: E402
from streamfed.fleet.agent import AgentCore  # noqa: E402
from streamfed.fleet.aggregator import AggregatorCore  # noqa: E402
from streamfed.fleet.config import FleetConfig
from streamfed.fleet.sources import Reading  # noqa: E402
from streamfed.privacy import fixed_point  # noqa: E402
from streamfed.privacy.accountant import calibrate_noise_multiplier  # noqa: E402
from streamfed.privacy.secagg import SecAggSettings, run_round  # noqa: E402
from streamfed.wire.message import Message, decode, encode

DELTA = 1e-5
EPSILONS = (1.0, 4.0, 8.0, math.inf)
UPLOAD = 32
# FedBNR's utility runs use D = 10 (F = 21: 252 noised numbers an upload, against 5,253 at D = 50): at D = 50 the
# noise swamps the scatter and the evidence fit drives σ towards 0 (NLPD ~1e7 at ε = 8; docs/privacy.md)
UTILITY_FEATURES = 10


def _scaling(declared: bool) -> dict:
    # the utility runs standardise as a private agent must: with declared, public scales on the raw readings
    return {"standardise": "online", "public_scales": beijing_public_scales()} if declared else {"standardise": "none"}


def fedbnr_cfg(n_features: int = 50, declared: bool = False) -> FleetConfig:
    return FleetConfig(fleet="bench", algorithm="fedbnr", n_inputs=10, n_features=n_features, kernels=["gaussian:2.0"],
                       fedbnr=FedBNRParams(min_upload=UPLOAD), **_scaling(declared))


def pofmkl_cfg(declared: bool = False) -> FleetConfig:
    return FleetConfig(fleet="bench", algorithm="pofmkl", n_inputs=10, n_kernels=8, n_features=50, bin_size=2,
                       seed=1, pofmkl=POFMKLParams(), **_scaling(declared))


def run_fleet(cfg: FleetConfig, fleet, steps: int, z: float | None, share: float, clip_norm: float,
              seed: int = 0) -> dict[str, float | None]:
    """The fleet, prequentially; `z` None: no noise. Returns MSE, NLPD and the measured update norms (None,
    `null` in the JSON, where there is none: NLPD without a predicted variance, norms of noised updates)."""
    streams = fleet.streams
    names = [s.name for s in streams]
    lockstep = cfg.algorithm == "pofmkl"
    mode = "lockstep" if lockstep else "async"
    if z is not None:
        # the agent's own privacy boundary (declared scales, the public schedule of dp_window arrivals, dummies):
        # AgentCore builds it from the configuration; ε per upload is a placeholder for the calibrated multiplier
        cfg = cfg.model_copy(update={"dp_epsilon": 1.0, "dp_delta": DELTA, "clip_label": 1.0, "clip_norm": clip_norm})
    agents = [AgentCore(cfg, n, i, mode=mode) for i, n in enumerate(names)]
    if z is not None:
        for i, a in enumerate(agents):
            # public attributes of the private learner: the multiplier calibrated for the whole stream, the
            # distributed share (secure aggregation's masking is left out: the sum it unmasks is what is summed here)
            p = a.privacy
            p.z, p.noise_share = z, share
            p.std = z * p.l2 * math.sqrt(share)
            p.rng = np.random.default_rng(seed * 1000 + i)
    agg = AggregatorCore(cfg, clients=names, mode=mode, window=0.0, check_stats=z is None)
    sq, nlpd, norms, rejected_globals = [], [], [], 0
    for t in range(steps):
        msgs = []
        for a, s in zip(agents, streams, strict=True):
            pred, out = a.on_reading(Reading(f"{t}", s.X[t], float(t), float(s.y[t])))
            y = float(s.y[t])
            sq.append((pred.mean - y) ** 2)
            if pred.var is not None:
                nlpd.append(0.5 * math.log(2 * math.pi * pred.var) + (pred.mean - y) ** 2 / (2 * pred.var))
            msgs += out
        queue = list(msgs)
        while queue:
            m = queue.pop(0)
            payload = encode(m, cfg)
            if m.kind.endswith(".update"):
                if z is None and lockstep:
                    norms.append(float(np.linalg.norm(m.arrays["delta"])))
                queue += agg.on_update(m.client, payload, now=float(t))
            elif m.kind.endswith(".global"):
                for a in agents:
                    r = a.install_global(decode(payload, cfg, kernel_version=a.kernel_version), now=float(t))
                    rejected_globals += r.reason is not None
    return {"mse": float(np.mean(sq)), "nlpd": float(np.mean(nlpd)) if nlpd else None,
            "median_norm": float(np.median(norms)) if norms else None,
            "rejected_updates": float(sum(agg.rejected.values())), "rejected_globals": float(rejected_globals)}


def utility(steps: int) -> tuple[list[str], dict]:
    fleet = load_beijing("none", steps=steps)  # raw readings: the agents standardise with the declared scales
    n = len(fleet.streams)
    out: dict = {}
    lines = ["", f"### Utility under differential privacy (Beijing, 12 stations × {steps} samples, δ = {DELTA:g}; "
             "declared scales, the agent's public schedule)", "",
             "| algorithm | ε (per client, whole stream) | uploads per client | noise multiplier z | DP | MSE (µg/m³)² "
             "| NLPD |",
             "|---|---|---|---|---|---|---|"]
    for name, make in (("fedbnr", lambda: fedbnr_cfg(UTILITY_FEATURES, declared=True)),
                       ("pofmkl", lambda: pofmkl_cfg(declared=True))):
        cfg = make()
        uploads = steps // UPLOAD if name == "fedbnr" else steps
        t0 = time.perf_counter()
        plain = run_fleet(cfg, fleet, steps, None, 1.0, 1.0)
        clip = plain["median_norm"] if name == "pofmkl" else 1.0
        rows = {"inf": plain}
        for eps in EPSILONS:
            if eps == math.inf:
                lines.append(f"| {name} | ∞ | {uploads} | 0 | none | {plain['mse']:,.0f} | {_f(plain['nlpd'])} |")
                continue
            z = calibrate_noise_multiplier(eps, DELTA, uploads)
            for mode, share in (("local", 1.0), ("distributed", 1.0 / n)):
                r = run_fleet(cfg, fleet, steps, z, share, clip)
                r["z"] = z
                rows[f"{eps:g}/{mode}"] = r
                lines.append(f"| {name} | {eps:g} | {uploads} | {z:.2f} | {mode} | {r['mse']:,.0f} | {_f(r['nlpd'])} |")
        out[name] = {"uploads": uploads, "clip_norm": clip, "rows": rows, "seconds": time.perf_counter() - t0}
    lines += ["", "POF-MKL's clip norm C = the median L2 norm of its noiseless updates "
              f"({out['pofmkl']['clip_norm']:.3g}). Globals rejected by an agent and updates rejected by the "
              "aggregator, over every run: "
              f"{sum(r['rejected_globals'] for a in out.values() for r in a['rows'].values()):.0f} and "
              f"{sum(r['rejected_updates'] for a in out.values() for r in a['rows'].values()):.0f}."]
    return lines, out


def _f(x: float | None) -> str:
    return "—" if x is None or math.isnan(x) else f"{x:.3f}"


def fedbnr_uploads(count: int) -> list[np.ndarray]:
    """`count` real FedBNR uploads (S_upper, b, n, q of 32 samples) from the Beijing stations, flattened."""
    cfg = fedbnr_cfg()
    per = max(1, math.ceil(count / 12))
    fleet = load_beijing("paper", steps=per * UPLOAD)
    out = []
    for i, s in enumerate(fleet.streams):
        agent = AgentCore(cfg, s.name, i)
        for t in range(per * UPLOAD):
            for m in agent.on_reading(Reading(f"{t}", s.X[t], float(t), float(s.y[t])))[1]:
                out.append(np.concatenate([np.ravel(m.arrays[k]) for k in ("S_upper", "b", "n", "q")]))
    return out[:count]


def secagg_cost(sizes: tuple[int, ...], repeats: int) -> tuple[list[str], dict]:
    cfg = fedbnr_cfg()
    ups = fedbnr_uploads(max(sizes))
    length = ups[0].size
    f = cfg.feature_dim
    k = f * (f + 1) // 2
    plain_bytes = len(encode(stats_update_message("bench", "c0000", 1, ups[0][:k].reshape(1, -1),
                                                  ups[0][k:k + f].reshape(1, -1), ups[0][-2], ups[0][-1],
                                                  global_version=0, kernel_version="k")))
    out: dict = {"vector_length": length, "plain_upload_bytes": plain_bytes, "rows": []}
    lines = ["", "### Secure aggregation cost (in process, FedBNR uploads: "
             f"{length} numbers = S_upper, b, n, q of F = {cfg.feature_dim})", "",
             "| clients | neighbours k | threshold t | dropped | round (s) | per client (ms) | bytes up / client "
             "| bytes down / client | plain round (ms) | plain bytes up | exact | max deviation from float64 sum |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for n in sizes:
        vecs = {f"c{i:04d}": ups[i % len(ups)] for i in range(n)}
        bound = max(float(np.max(np.abs(v))) for v in vecs.values())
        fbits = fixed_point.frac_bits_for(bound, n)
        enc = {c: fixed_point.encode(v, fbits) for c, v in vecs.items()}
        plain_int = np.zeros(length, dtype=np.uint64)
        for v in enc.values():
            plain_int += v
        settings = SecAggSettings(1, tuple(sorted(enc)), length)
        for drop_share in (0.0, 0.1):
            dropped = sorted(enc)[: int(n * drop_share)]
            times, stats = [], {}
            for r in range(repeats):
                t0 = time.perf_counter()
                total = run_round(enc, round_id=r + 1, drop_before_masking=dropped, stats=stats)
                times.append(time.perf_counter() - t0)
            want = plain_int.copy()
            for c in dropped:
                want -= enc[c]
            exact = bool(np.array_equal(total, want))
            kept = [vecs[c] for c in sorted(vecs) if c not in dropped]
            dev = float(np.max(np.abs(fixed_point.decode(total, fbits) - np.sum(kept, axis=0))))
            t0 = time.perf_counter()
            for _ in range(repeats):
                np.sum(kept, axis=0)
            plain_ms = (time.perf_counter() - t0) / repeats * 1e3
            sec = float(np.median(times))
            row = {"clients": n, "degree": settings.degree, "threshold": settings.threshold, "dropped": len(dropped),
                   "round_s": sec, "per_client_ms": sec / n * 1e3, "bytes_up": stats["bytes_up"],
                   "bytes_down": stats["bytes_down"], "plain_ms": plain_ms, "exact": exact, "max_dev": dev,
                   "frac_bits": fbits}
            out["rows"].append(row)
            lines.append(f"| {n} | {settings.degree} | {settings.threshold} | {len(dropped)} | {sec:.3f} | "
                         f"{sec / n * 1e3:.2f} | {stats['bytes_up']:,.0f} | {stats['bytes_down']:,.0f} | "
                         f"{plain_ms:.3f} | {plain_bytes:,} | {'yes' if exact else 'NO'} | {dev:.1e} |")
    lines += ["", "Round time = every client's and the server's work in one process, one after the other (what a "
              "fleet spreads over its devices); per client = round / clients. Bytes up = keys, encrypted shares, "
              "the masked vector (8 bytes a number) and the unmasking shares; down = the neighbours' keys, the "
              "forwarded shares and the survivor list. The plain upload is one encoded `fedbnr.update` "
              "(float64). Deviation: the unmasked fixed-point sum decoded, against numpy's float64 sum of the same "
              f"uploads ({max(r['frac_bits'] for r in out['rows'])} fractional bits at most)."]
    return lines, out


def agent_breakdown(n: int = 1000, length: int | None = None, repeats: int = 15) -> tuple[list[str], dict]:
    """Where one SecAgg+ client's milliseconds go in a round of `n` (k neighbours, the FedBNR vector length): the
    three client steps (`share_keys`, `masked_input`, `unmask`) timed whole, beside each primitive they are made
    of timed alone with the public APIs — the 2k X25519 agreements (parse, exchange, HKDF), the k + 1 masks
    (`secagg.masks`), the two Shamir splits, the k AEAD encryptions and decryptions. Each the fastest of
    `repeats` (the machine is shared: the minimum is the cost, the rest is the neighbours' load)."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
    from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    from streamfed.privacy import shamir
    from streamfed.privacy.secagg import SecAggClient, SecAggServer, masks

    length = length or len(fedbnr_uploads(1)[0])
    s = SecAggSettings(1, tuple(f"c{i:04d}" for i in range(n)), length)
    me = s.clients[0]
    k, t = len(s.neighbours[me]), s.threshold
    x = np.arange(length, dtype=np.uint64)

    def client_steps() -> dict[str, float]:
        # a fresh round: everyone advertises, my neighbours share, then my three steps are timed
        cs = {c: SecAggClient(c, s) for c in s.clients}
        srv = SecAggServer(s)
        for c in cs.values():
            srv.add_keys(c.advertise())
        for c in s.neighbours[me]:
            srv.add_shares(c, cs[c].share_keys(srv.roster_for(c)))
        out = {}
        t0 = time.perf_counter()
        srv.add_shares(me, cs[me].share_keys(srv.roster_for(me)))
        out["share_keys"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        cs[me].masked_input(x, srv.forwarded(me))
        out["masked_input"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        cs[me].unmask(frozenset((me, *s.neighbours[me])))
        out["unmask"] = time.perf_counter() - t0
        return out

    sk = X25519PrivateKey.generate()
    pks = [X25519PrivateKey.generate().public_key().public_bytes_raw() for _ in range(2 * k)]
    seeds = [(os.urandom(32), b"mask") for _ in range(k + 1)]
    aead = ChaCha20Poly1305(os.urandom(32))
    plain = os.urandom(2 * shamir.SHARE_BYTES)
    cts = [aead.encrypt(bytes(12), plain, b"") for _ in range(k)]

    def timed(f) -> float:  # noqa: ANN001
        t0 = time.perf_counter()
        f()
        return time.perf_counter() - t0

    parts = {
        f"{2 * k} X25519 exchanges": lambda: [sk.exchange(X25519PublicKey.from_public_bytes(p)) for p in pks],
        f"{2 * k} HKDF-SHA256 (the agreed keys)": lambda: [
            HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"i").derive(p) for p in pks],
        f"{k + 1} masks (HKDF + ChaCha20, {length} words each)": lambda: masks(seeds, length, 1),
        f"2 Shamir splits (k = {k}, t = {t})": lambda: [shamir.split(int.from_bytes(os.urandom(32), "big"), k, t)
                                                       for _ in range(2)],
        f"{k} + {k} ChaCha20-Poly1305 (shares)": lambda: ([aead.encrypt(bytes(12), plain, b"") for _ in range(k)],
                                                          [aead.decrypt(bytes(12), c, b"") for c in cts]),
    }
    best: dict[str, float] = {}
    steps: dict[str, float] = {}
    for _ in range(repeats):  # interleaved, so that a burst of load hits every part alike
        for name, f in parts.items():
            best[name] = min(best.get(name, math.inf), timed(f))
        for name, v in client_steps().items():
            steps[name] = min(steps.get(name, math.inf), v)
    total = sum(steps.values())
    lines = ["", f"### One client's round, where the time goes (n = {n:,}: k = {k}, t = {t}, {length} words; fastest "
             f"of {repeats}, load {load_average()})", "",
             "| part | ms | share of the client's round |", "|---|---|---|"]
    for name, v in steps.items():
        lines.append(f"| step `{name}` | {v * 1e3:.3f} | {v / total:.0%} |")
    lines.append(f"| **the client's round** | **{total * 1e3:.3f}** | 100% |")
    for name, v in best.items():
        lines.append(f"| {name} | {v * 1e3:.3f} | {v / total:.0%} |")
    rest = total - sum(best.values())
    lines += [f"| the rest (checks, nonces, dictionaries) | {rest * 1e3:.3f} | {rest / total:.0%} |", "",
              "The steps are a client's own work in `streamfed.privacy.secagg.SecAggClient` (not the fleet's messages "
              "around it); the parts below them are the primitives those steps call, timed alone with the same "
              "sizes. The X25519 agreements are the protocol's floor: two per neighbour (one key pair encrypts the "
              "shares, the other agrees on masks; one pair for both would let a server that rebuilds a dropped "
              "client's mask key decrypt the shares that client held of its neighbours' secrets), each at "
              "OpenSSL's speed through `cryptography`."]
    return lines, {"n": n, "degree": k, "threshold": t, "length": length,
                   "steps_ms": {a: v * 1e3 for a, v in steps.items()},
                   "parts_ms": {a: v * 1e3 for a, v in best.items()}, "client_ms": total * 1e3, "rest_ms": rest * 1e3}


def _proc_cpu(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (0.0 when it cannot be read)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def mqtt_cost(sizes: tuple[int, ...], modes: tuple[bool, ...] = (False, True),
              repeats: int = 1, profile: Path | None = None) -> tuple[list[str], dict]:
    """One round of a fleet of `n` real agents and an aggregator (`AgentService`, `AggregatorService`, one
    process, one event loop) over a private Mosquitto, secure vs plain: from the first upload message on the
    broker to the global that includes every client, and the bytes per client into and out of the aggregator."""
    import asyncio

    from streamfed.fleet.secure_aggregation import DOWN_KINDS
    from streamfed.fleet.sources import array_source
    from streamfed.runtime.agent import AgentService, AgentSettings
    from streamfed.runtime.aggregator import AggregatorService
    from streamfed.runtime.loadtest import MosquittoProcess

    logging.getLogger("mqtt").setLevel(logging.ERROR)
    fleet = load_beijing("paper", steps=UPLOAD)
    out: dict = {"rows": []}
    lines = ["", "### Secure aggregation over Mosquitto (one round, FedBNR uploads of F = 101, one process)", "",
             "| clients | mode | round (s) | SecAgg+ / plain | CPU: process + broker (s) | CPU SecAgg+ / plain "
             "| aggregator CPU (s) | agents' SecAgg+ CPU (s) | GC CPU (s) | up / client (bytes) "
             "| down / client (bytes) "
             "| max down / client (bytes) "
             "| messages / client | load (1 min) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for n, rep in ((m, r) for m in sizes for r in range(repeats if m >= 1000 else 1)):
        for secure in modes:
            cfg = fedbnr_cfg().model_copy(update={"fleet": f"b{n}{'s' if secure else 'p'}",
                                                  "secure_aggregation": secure, "max_clients": max(n, 2)})
            names = [f"c{i:04d}" for i in range(n)]
            mosq = MosquittoProcess()
            try:
                broker = mosq.config

                async def main(cfg: FleetConfig = cfg, names: list[str] = names, broker=broker,  # noqa: ANN001
                               pid: int = mosq.proc.pid if mosq.proc else 0) -> dict:
                    # bytes counted where they enter and leave the aggregator: each payload that reached it (up) and
                    # each message it published to one client's acks topic (down; the global, broadcast, not).
                    # A subscriber to those topics in this process fell behind once the stages went out at broker
                    # speed, and the broker dropped what it could not queue for it.
                    seen: list[tuple[str, str, int]] = []
                    counting = [False]
                    # secure: one round of everyone (keys are gathered until all are in); plain: 50 ms windows
                    window = 120.0 if cfg.secure_aggregation else 0.05
                    core = AggregatorCore(cfg, clients=names, window=window)  # stage timeouts: the defaults
                    cpu = [0.0]  # the aggregator core's CPU (decoding, SecAgg+ server, unmasking, the global)

                    def timed(f, up: bool):  # noqa: ANN001, ANN202
                        def call(*a, **kw):  # noqa: ANN002, ANN003, ANN202
                            t0 = time.process_time()
                            try:
                                out = f(*a, **kw)
                            finally:
                                cpu[0] += time.process_time() - t0
                            if counting[0]:
                                if up:
                                    seen.append(("up", a[0], len(a[1])))
                            return out
                        return call

                    core.on_update = timed(core.on_update, True)  # type: ignore[method-assign]
                    core.tick = timed(core.tick, False)  # type: ignore[method-assign]
                    agg = AggregatorService(core, broker)
                    routed = agg.route

                    def route(msg: Message):  # noqa: ANN202 - what the service publishes to a client (acks too)
                        if counting[0] and (msg.kind == "ack" or msg.kind in DOWN_KINDS):
                            seen.append(("down", msg.client, len(encode(msg))))
                        return routed(msg)

                    agg.route = route  # type: ignore[method-assign]
                    agg_task = asyncio.create_task(agg.run())
                    await asyncio.wait_for(agg.connected.wait(), 30)
                    go = asyncio.Event()  # the streams start once every agent's session is up

                    async def gated(i: int):  # noqa: ANN202
                        await go.wait()
                        async for r in array_source(fleet.streams[i % 12].X, fleet.streams[i % 12].y):
                            yield r

                    # drain: a source of 32 samples ends at once, and an agent then leaves after `drain`
                    # (5 s by default) with its update not yet in a global; a secure round of 1,000 agents
                    # on this one loop takes longer, so they stay until the measurement stops them
                    agents = [AgentService(AgentCore(cfg, c, i), broker, gated(i),
                                           settings=AgentSettings(linger=1.0, wait_for_global=0.0, drain=600.0))
                              for i, c in enumerate(names)]
                    agent_cpu = [0.0]  # the agents' own SecAgg+ work: keys, shares, masks, unmasking (process time)
                    gc_cpu, gc_start = [0.0], [0.0]  # the garbage collector's passes during the round

                    def gc_timed(phase: str, info: dict) -> None:
                        if phase == "start":
                            gc_start[0] = time.process_time()
                        else:
                            gc_cpu[0] += time.process_time() - gc_start[0]

                    def agent_timed(f):  # noqa: ANN001, ANN202
                        def call(*a, **kw):  # noqa: ANN002, ANN003, ANN202
                            t0 = time.process_time()
                            try:
                                return f(*a, **kw)
                            finally:
                                agent_cpu[0] += time.process_time() - t0
                        return call

                    if cfg.secure_aggregation:
                        for a in agents:
                            a.core.on_secagg = agent_timed(a.core.on_secagg)  # type: ignore[method-assign]
                            a.core.secagg_tick = agent_timed(a.core.secagg_tick)  # type: ignore[method-assign]
                    tasks = [asyncio.create_task(a.run()) for a in agents]
                    for a in agents:
                        await asyncio.wait_for(a.connected.wait(), 60)
                    prof = None
                    if profile is not None:  # the round only: not the set-up, the compilation, the shutdown
                        import cProfile

                        prof = cProfile.Profile()
                        prof.enable()
                    start = time.perf_counter()
                    cpu[0] = agent_cpu[0] = gc_cpu[0] = 0.0
                    gc.callbacks.append(gc_timed)
                    own0, broker0 = time.process_time(), _proc_cpu(pid)
                    counting[0] = True
                    go.set()
                    stages: list[tuple[str, float]] = []  # SecAgg+: when each stage began (s after start)
                    while set(agg.core.included()) != set(names):
                        sa = agg.core.secagg
                        if sa is not None and (not stages or stages[-1][0] != sa.stage
                                               or time.perf_counter() - start - stages[-1][1] > 5):
                            stages.append((sa.stage, round(time.perf_counter() - start, 2), *sa.progress()))
                        if time.perf_counter() - start > 300:  # say what is missing rather than hang
                            missing = sorted(set(names) - set(agg.core.included()))
                            raise RuntimeError(f"round not done after 300 s: {len(missing)} missing "
                                               f"({missing[:5]}…), rejected {dict(agg.core.rejected)}, secagg "
                                               f"{getattr(agg.core.secagg, 'rejected', None)}; stages {stages}")
                        await asyncio.sleep(0.005)
                    done = time.perf_counter()
                    own, broker_cpu = time.process_time() - own0, _proc_cpu(pid) - broker0
                    gc.callbacks.remove(gc_timed)
                    load = os.getloadavg()[0]
                    if prof is not None and profile is not None:
                        prof.disable()
                        prof.dump_stats(f"{profile}.{len(names)}{'s' if cfg.secure_aggregation else 'p'}")
                    # the acks that follow the global are counted too: until a second passes without one (30 s at most)
                    quiet, count = time.perf_counter(), len(seen)
                    while time.perf_counter() - quiet < 1.0 and time.perf_counter() - done < 30.0:
                        await asyncio.sleep(0.1)
                        if len(seen) != count:
                            quiet, count = time.perf_counter(), len(seen)
                    counting[0] = False
                    for a in agents:
                        a.stop()
                    await asyncio.wait_for(asyncio.gather(*tasks), 60)
                    agg.stop()
                    await asyncio.wait_for(agg_task, 30)
                    ups = [(c, b) for d, c, b in seen if d == "up"]
                    downs = [b for d, _, b in seen if d == "down"]
                    per: dict[str, int] = {}
                    for d, c, b in seen:
                        if d == "down":
                            per[c] = per.get(c, 0) + b
                    return {"round_s": done - start, "up": sum(b for _, b in ups) / len(names),
                            "down": sum(downs) / len(names), "max_down": max(per.values(), default=0),
                            "messages": (len(ups) + len(downs)) / len(names), "aggregator_cpu_s": cpu[0],
                            "process_cpu_s": own, "broker_cpu_s": broker_cpu, "load_1min": load, "stages": stages,
                            "agents_secagg_cpu_s": agent_cpu[0], "gc_cpu_s": gc_cpu[0]}

                r = asyncio.run(main())
            finally:
                mosq.close()
            r.update(clients=n, secure=secure, repeat=rep)
            r["cpu_s"] = r["process_cpu_s"] + r["broker_cpu_s"]
            if secure:
                r["ratio"] = r["round_s"] / out["rows"][-1]["round_s"] if out["rows"] else math.nan
                r["cpu_ratio"] = r["cpu_s"] / out["rows"][-1]["cpu_s"] if out["rows"] else math.nan
            out["rows"].append(r)
            run = f" (run {rep + 1})" if repeats > 1 and n >= 1000 else ""
            lines.append(f"| {n}{run} | {'SecAgg+' if secure else 'plain'} | {r['round_s']:.2f} | "
                         + (f"{r['ratio']:.2f} | " if secure else "1 | ")
                         + f"{r['process_cpu_s']:.2f} + {r['broker_cpu_s']:.2f} | "
                         + (f"{r['cpu_ratio']:.2f} | " if secure else "1 | ")
                         + f"{r['aggregator_cpu_s']:.2f} | {r['agents_secagg_cpu_s']:.2f} | {r['gc_cpu_s']:.2f} | "
                         + f"{r['up']:,.0f} | "
                         + f"{r['down']:,.0f} | {r['max_down']:,.0f} | "
                         + f"{r['messages']:.1f} | {r['load_1min']:.2f} |")
    for n in sizes:
        ratios = [r["ratio"] for r in out["rows"] if r["clients"] == n and r["secure"] and "ratio" in r]
        cpu_ratios = [r["cpu_ratio"] for r in out["rows"] if r["clients"] == n and r["secure"] and "cpu_ratio" in r]
        if len(ratios) > 1:
            out[f"median_ratio_{n}"] = float(np.median(ratios))
            out[f"median_cpu_ratio_{n}"] = float(np.median(cpu_ratios))
            lines += ["", f"At {n:,} agents, SecAgg+ / plain over {len(ratios)} runs (each pair back to back): round "
                      f"time median {np.median(ratios):.2f}, from {min(ratios):.2f} to {max(ratios):.2f}; CPU "
                      f"(this process and the broker) median {np.median(cpu_ratios):.2f}, from {min(cpu_ratios):.2f} "
                      f"to {max(cpu_ratios):.2f}."]
    lines += ["", "Round = from the moment every agent's session is up and the streams start to the aggregator "
              "holding every client's update (plain: each agent's `fedbnr.update`; secure: the round's "
              "unmasked sum); it includes "
              "each agent learning its 32 samples and, for SecAgg+, the four steps' key agreements, encryption, "
              "PRG masks and the server's unmasking — all on the one event loop of this process (and the broker "
              "on the other core). Down = the aggregator's messages to one client's acks topic (roster, forwarded "
              "shares, survivors; plain: none but acks), not the global, which both modes broadcast. Each agent's "
              "source is 32 samples long and the agent stays up (`drain`) until the measurement stops it; "
              "the aggregator's stage timeout is its default (5 s plus 40 ms a member: `stage_wait`). "
              "Each member is sent its own neighbourhood only (roster: "
              "its neighbours' keys; forward: their shares; survivors: which of them survived), so `down` grows "
              "with the neighbourhood k, not the fleet. Aggregator CPU = process time inside the aggregator core's "
              "`on_update` and `tick` (decoding, the SecAgg+ server's checks, building each member's messages, "
              "Shamir reconstruction and the PRG masks it removes, folding the sum into the global), not its MQTT "
              "I/O. Agents' SecAgg+ CPU = process time inside the agent cores' `on_secagg` and `secagg_tick` (key "
              "pairs, summing the outbox into the partial, the shares' key agreements, Shamir splits and "
              "encryption, the masks, the unmasking; not "
              "their MQTT I/O or the codec around them; a collection that falls inside them counts there too). GC "
              "CPU = process time of the garbage collector's passes during the round (`gc.callbacks`), wherever they "
              "fell. CPU = the CPU time this process (agents and aggregator: "
              "one event loop) and the broker's "
              "process spent during the round (`time.process_time`, `/proc/<pid>/stat`): on a machine shared with "
              "other work it moves less with the neighbours' load than the round's wall time does. Load = the "
              "1-minute load average as the round ended. SecAgg+ / plain = the two rounds of the same size in this "
              "run."]
    return lines, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--secagg-only", action="store_true",
                    help="only the secure-aggregation sections (in process and over Mosquitto)")
    ap.add_argument("--profile", type=Path, default=None,
                    help="with --secagg-only: cProfile each Mosquitto round (the round only) to PROFILE.<n><p|s>")
    args = ap.parse_args()
    steps = args.steps or (100 if args.quick else 2000)
    sizes = (10, 100) if args.quick else (10, 100, 1000)
    t0 = time.perf_counter()
    if args.secagg_only:
        b_lines, b = agent_breakdown(100 if args.quick else 1000, repeats=3 if args.quick else 15)
        s_lines, s = secagg_cost(sizes, 1 if args.quick else 3)
        m_lines, m = mqtt_cost((10,) if args.quick else (10, 100, 1000), repeats=1 if args.quick else 3,
                               profile=args.profile)
        cmd = ".venv/bin/python benchmarks/bench_privacy.py --secagg-only" + (" --quick" if args.quick else "")
        lines = ["## Privacy: SecAgg+ at scale (a member is sent its neighbourhood only)", "",
                 f"`{cmd}` — {machine()}, load {load_average()}; {time.perf_counter() - t0:.0f} s.", "",
                 *(__doc__ or "").split("\n\n")[3].strip().split("\n"), *b_lines, *s_lines, *m_lines]
        write_section(args.out, lines, {"client": b, "secagg": s, "mosquitto": m}, quick=args.quick)
        return
    u_lines, u = utility(steps)
    s_lines, s = secagg_cost(sizes, 1 if args.quick else 3)
    m_lines, m = mqtt_cost((10,) if args.quick else (10, 100, 1000))
    cmd = ".venv/bin/python benchmarks/bench_privacy.py" + (" --quick" if args.quick else "")
    lines = ["## Privacy: differential privacy and secure aggregation", "",
             f"`{cmd}` — {machine()}, load {load_average()}; {time.perf_counter() - t0:.0f} s.",
             "",
             *(__doc__ or "").split("\n\n", 2)[2].strip().split("\n"), *u_lines, *s_lines, *m_lines]
    write_section(args.out, lines, {"utility": u, "secagg": s, "mosquitto": m}, quick=args.quick)


if __name__ == "__main__":
    main()
