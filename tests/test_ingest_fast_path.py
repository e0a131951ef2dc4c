"""The aggregator's cheaper ingest path (issue 27 part 4) against the path it replaced, on random valid and invalid
updates: the strict decoder against its verbatim former self (tests/oracles/codec.py), FedBNR's one-copy
`upload_of` against `Upload.from_message(stats_fields(...))`, the in-place Cauchy–Schwarz bound against its former
expression, and POF-MKL's cached step bound against the bound worked out from the radius per update. Every payload
refused before is refused with the same reason and detail; every other one gives the same message, statistics or
verdict."""

from __future__ import annotations

import math
import pickle
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tests.oracles.codec as reference
from streamfed import algorithms
from streamfed.algorithms.fedbnr.aggregation import check_statistics, checked_upload, upload_of
from streamfed.algorithms.fedbnr.messages import Upload
from streamfed.algorithms.fedbnr.wire import stats_fields, stats_update_message
from streamfed.algorithms.pofmkl.aggregation import BOUND_SLACK, POFMKLAggregation, StepBound
from streamfed.algorithms.pofmkl.messages import KernelUpdate
from streamfed.algorithms.pofmkl.wire import update_message
from streamfed.algorithms.robust_mean import row_norms
from streamfed.core.stats import SufficientStats, check_labelled_scatter
from streamfed.fleet.config import FleetConfig
from streamfed.wire.message import Message, ProtocolError, decode, encode
from tests.test_protocol import _POOL, BNR, POF, _envelope_with_a_replaced_field, _mutated, _pack, exact_equal, messages

FAST = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
BENCH_POF = FleetConfig(fleet="f", algorithm="pofmkl", n_inputs=3, n_kernels=16, n_features=20, bin_size=2)


def _outcome(fn: Any, payload: bytes, cfg: FleetConfig, kw: dict[str, Any]) -> tuple[str, Any]:
    try:
        return "message", fn(payload, cfg, **kw)
    except ProtocolError as e:
        return "refused", (e.reason, str(e))


def assert_same_verdict(payload: bytes, cfg: FleetConfig, **kw: Any) -> None:
    want = _outcome(reference.decode, payload, cfg, kw)
    got = _outcome(decode, payload, cfg, kw)
    assert got[0] == want[0], (got, want)
    if want[0] == "refused":
        assert got[1] == want[1]
    else:
        assert exact_equal(got[1], want[1])
        assert all(not a.flags.writeable for a in got[1].arrays.values())


# ------------------------------------------------------------------ the decoder


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([POF, BNR]).flatmap(lambda c: st.tuples(st.just(c), messages(c))))
def test_valid_messages_decode_as_before(case: tuple[FleetConfig, Any]) -> None:
    cfg, msg = case
    payload = encode(msg)
    assert_same_verdict(payload, cfg)
    assert_same_verdict(payload, cfg, kernel_version=msg.kernel_version, client=msg.client, kinds=(msg.kind,))
    assert_same_verdict(payload, cfg, kernel_version=msg.kernel_version + "x", client=msg.client + "x")


@FAST
@given(_mutated() | _envelope_with_a_replaced_field())
def test_mutated_payloads_decode_or_are_refused_as_before(case: tuple[bytes, FleetConfig]) -> None:
    assert_same_verdict(*case)


_ODD = [True, False, -1, 0, 1, 2**63 - 1, 2**63, 2**64 - 1, -(2**63), 0.0, -0.0, 1.0, -1.5, math.nan, math.inf,
        -math.inf, 1e308, "", "k", "kv1", "\x07", "é", "x" * 300, b"", b"x", [], [1], [True, 2], [-1, 2], {}, {"a": 1},
        None, [0], [2], [3], [4], [0, 4], [1, 4], [2, 4], [3, 4], [4, 4], [1, 1], [1, 6], [2, 2], [3, 3]]


def test_every_envelope_field_set_to_every_odd_value_gets_the_same_verdict() -> None:
    """Each field of a valid update of each algorithm (and each key of an array entry) set to each odd value in turn,
    decoded with and without the aggregator's expectations."""
    for cfg in (POF, BNR):
        kind = cfg.update_kind
        payload = next(p for c, p in _POOL if c is cfg and msgpack.unpackb(p, raw=False)["kind"] == kind)
        env = msgpack.unpackb(payload, raw=False)
        cases = [(None, key) for key in sorted(env)] + [(name, key) for name in sorted(env["arrays"])
                                                          for key in sorted(env["arrays"][name])]
        for array, key in cases:
            for value in _ODD:
                changed = msgpack.unpackb(payload, raw=False)
                (changed if array is None else changed["arrays"][array])[key] = value
                for _ in range(2):  # a shape seen before is checked from the plan's cache the second time
                    assert_same_verdict(_pack(changed), cfg)
                    assert_same_verdict(_pack(changed), cfg, kernel_version="kv1", client=env["client"],
                                        kinds=(kind,))


@st.composite
def _envelope_field_set(draw: st.DrawFn) -> tuple[bytes, FleetConfig]:
    """A valid payload with one envelope field, array entry or array datum set to an odd value: the counters,
    `created`, `kernel_version`, the client name, shapes and dtypes, NaN and infinities inside the data."""
    cfg, payload = draw(st.sampled_from(_POOL))
    env = msgpack.unpackb(payload, raw=False)
    where = draw(st.sampled_from(["envelope", "array", "data"]))
    if where == "envelope":
        env[draw(st.sampled_from(sorted(env)))] = draw(st.sampled_from(_ODD))
    elif env["arrays"]:
        entry = env["arrays"][draw(st.sampled_from(sorted(env["arrays"])))]
        if where == "array":
            entry[draw(st.sampled_from(sorted(entry)))] = draw(st.sampled_from(_ODD))
        elif entry["dtype"] == "float64" and entry["data"]:
            values = np.frombuffer(entry["data"], dtype=np.float64).copy()
            values[draw(st.integers(0, values.size - 1))] = draw(st.sampled_from(
                [math.nan, math.inf, -math.inf, 1e308, -0.0, 5e-324, 1.0]))
            entry["data"] = values.tobytes()
    return _pack(env), cfg


@FAST
@given(_envelope_field_set(), st.booleans())
def test_odd_fields_are_refused_with_the_same_reason_and_detail(case: tuple[bytes, FleetConfig], expect: bool) -> None:
    payload, cfg = case
    if expect:  # the aggregator's expectations: its kernel version, the topic's client, its update kind
        assert_same_verdict(payload, cfg, kernel_version="kv1", client="a1", kinds=("pofmkl.update", "fedbnr.update"))
    else:
        assert_same_verdict(payload, cfg)


# ------------------------------------------------------------------ FedBNR: the upload, the Cauchy–Schwarz bound


def _stats(seed: int, n: int, f: int, k: int = 1) -> SufficientStats:
    rng = np.random.default_rng(seed)
    phi = rng.standard_normal((n, k, f))
    return SufficientStats.from_samples(phi, rng.standard_normal(n), kernel_version="kv", epoch=2)


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 10**6), st.integers(1, 40), st.integers(1, 12), st.integers(1, 3), st.integers(0, 10**6))
def test_upload_of_equals_the_upload_from_message(seed: int, n: int, f: int, k: int, seq: int) -> None:
    packed = _stats(seed, n, 2 * f + 1, k).to_packed()  # F = 2D + 1 features (D sin/cos pairs and a bias)
    cfg = FleetConfig(fleet="f", algorithm="fedbnr", n_inputs=2, n_features=f,
                      kernels=[f"gaussian:{i + 1}.0" for i in range(k)])
    payload = encode(stats_update_message("f", "a", seq, packed["S_upper"], packed["b"], packed["n"], packed["q"],
                                          global_version=3, kernel_version="kv", epoch=2))
    msg = decode(payload, cfg)
    got, want = upload_of(msg), Upload.from_message(stats_fields(msg))
    assert got == want and type(got.stats.n) is float and type(got.stats.q) is float
    for a in (got.stats.S, got.stats.b):  # the statistics own writable arrays, none of them a view of the payload
        assert a.flags.writeable and a.flags.c_contiguous and a.dtype == np.float64
        assert not any(np.shares_memory(a, v) for v in msg.arrays.values())


def _old_check_labelled_scatter(S: np.ndarray, b: np.ndarray, q: float, n: float, label_bound: float | None) -> None:
    """The check as it was (its Cauchy–Schwarz bound written out in one expression)."""
    slack = 1e-9
    S, b = np.asarray(S, dtype=np.float64), np.asarray(b, dtype=np.float64)
    trace = np.trace(S, axis1=-2, axis2=-1)
    if label_bound is not None:
        bound2 = float(n) * (float(label_bound) * float(label_bound))
        if q > bound2 * (1.0 + slack) + slack:
            raise ValueError("q")
        qq = max(q, 0.0)
        if np.any(b**2 > np.maximum(np.diagonal(S, axis1=-2, axis2=-1), 0.0) * qq * (1.0 + slack) + slack):
            raise ValueError("b_i")
        if np.any(np.sum(b**2, axis=-1) > np.maximum(trace, 0.0) * qq * (1.0 + slack) + slack):
            raise ValueError("b")
    f = S.shape[-1]
    aug = np.empty(S.shape[:-2] + (f + 1, f + 1))
    aug[..., :f, :f], aug[..., :f, f], aug[..., f, :f], aug[..., f, f] = S, b, b, q
    jitter = 1e-9 * np.maximum(trace + abs(q), 1.0)
    aug.reshape(aug.shape[:-2] + ((f + 1) ** 2,))[..., :: f + 2] += np.asarray(jitter)[..., None]
    np.linalg.cholesky(aug)


def _verdict(fn: Any, *args: Any) -> str:
    try:
        fn(*args)
    except np.linalg.LinAlgError:
        return "not positive semi-definite"
    except ValueError as e:
        text = str(e)
        return "q" if text.startswith("q") else "b_i" if "_i" in text.split(":")[0] else "b"
    return "accepted"


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 10**6), st.integers(1, 30), st.integers(1, 8), st.integers(1, 2),
       st.sampled_from([None, 0.5, 1.0, 3.0, 1e200]),
       st.floats(0.0, 2.0), st.integers(0, 20), st.sampled_from([1.0, -1.0, 1.0 + 1e-12, 1.0 - 1e-12]))
def test_cauchy_schwarz_bound_in_place_gives_the_same_verdicts(seed: int, n: int, f: int, k: int,
                                                                label_bound: float | None, q_scale: float, i: int,
                                                                b_scale: float) -> None:
    st_ = _stats(seed, n, f, k)
    S, b, q = st_.S, st_.b.copy(), st_.q * q_scale
    j = i % f
    # near the bound b_j² = S_jj·q, on both sides
    b[..., j] = b_scale * np.sqrt(np.maximum(np.diagonal(S, axis1=-2, axis2=-1)[..., j], 0.0) * max(q, 0.0))
    assert _verdict(check_labelled_scatter, S, b, q, float(n), label_bound) == \
        _verdict(_old_check_labelled_scatter, S, b, q, float(n), label_bound)


# ------------------------------------------------------------------ POF-MKL: the step bound, cached per radius


def _old_limits(agg: POFMKLAggregation, kernels: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    assert agg.bound is not None
    return allowed * agg.bound.per_step(agg.radius[kernels]) * (1.0 + BOUND_SLACK)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 15), min_size=1, max_size=4, unique=True),
                          st.floats(0.0, 2.0) | st.sampled_from([1e151, 1e200, 1e300, 1.0 + 1e-12, 1.0 - 1e-12,
                                                          1.0 - 5e-10, 1.0 - 1e-9, 1.0 - 2e-9]),
                          st.integers(1, 3), st.booleans()),
                min_size=1, max_size=8),
       st.integers(0, 10**6))
def test_pofmkl_refuses_exactly_the_rows_beyond_the_bound(uploads: list[tuple[list[int], float, int, bool]],
                                                          seed: int) -> None:
    """Each upload's rows scaled to a fraction of what the plain bound allows it (1 ± 1e-12: at the bound; 1 − 1e-9
    and around it: where the compiled row scan stops deciding alone; 1e151 and beyond: squares that overflow);
    accepted exactly when every row is within `allowed × per_step(R_p)`."""
    agg = algorithms.get("pofmkl").aggregation(BENCH_POF)
    rng = np.random.default_rng(seed)
    for seq, (kernels, scale, n, resend) in enumerate(uploads, start=1):
        ks = np.array(kernels, dtype=np.int64)
        steps = agg.steps.get("a")
        allowed = steps.allowance(seq, n, kernels) if steps is not None else np.full(len(ks), n, dtype=np.int64)
        limit = _old_limits(agg, ks, allowed)
        rows = rng.standard_normal((len(ks), agg.dim))
        rows *= (limit * scale / np.linalg.norm(rows, axis=1))[:, None]
        if not resend:
            rows[0] *= -1.0
        msg = update_message("f", "a", seq, ks, rows, n_samples=n, global_version=0, kernel_version="k")
        within = bool((row_norms(rows) <= limit).all()) and bool(np.abs(rows).max() <= agg.max_abs)
        try:
            agg.check(msg)
            accepted = True
        except ValueError:
            accepted = False
        assert accepted == within, (scale, row_norms(rows), limit)
        if accepted:
            agg.take("a", seq, KernelUpdate(ks, rows, n))


def test_pofmkl_step_bound_follows_the_radius_and_is_not_pickled() -> None:
    """A state from before the configured radius bounds rows by the largest ‖θ_p‖ published: the cache follows it."""
    agg = POFMKLAggregation(2, 2, bound=StepBound(0.5, 1.0, 0.0))
    assert agg._per_step().tolist() == agg.bound.per_step(np.zeros(2)).tolist()
    agg.apply_round(1, [("a", KernelUpdate(np.array([0]), np.full((1, 2), -3.0)))])
    assert agg.radius[0] > 0
    assert agg._per_step().tolist() == agg.bound.per_step(agg.radius).tolist()
    back = pickle.loads(pickle.dumps(agg))
    assert "_per_step_cache" not in back.__dict__
    assert back._per_step().tolist() == agg._per_step().tolist()


@pytest.mark.parametrize("value", [math.nan, math.inf, 1e101])
def test_pofmkl_non_finite_and_huge_deltas_are_refused_as_before(value: float) -> None:
    agg = algorithms.get("pofmkl").aggregation(BENCH_POF)
    rows = np.zeros((1, agg.dim))
    rows[0, 3] = value
    msg = update_message("f", "a", 1, np.array([2]), rows, global_version=0, kernel_version="k")
    with pytest.raises(ValueError, match="beyond ±1e"):
        agg.check(msg)


# ------------------------------------------------------------------ admission: one level per bucket


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("ab"), st.integers(-2, 40), st.floats(0.0, 5.0)), max_size=60),
       st.floats(0.5, 20.0), st.floats(1.0, 60.0), st.floats(0.1, 5.0), st.floats(1.0, 6.0))
def test_admission_is_the_two_token_buckets(calls: list[tuple[str, int, float]], sample_rate: float,
                                            sample_burst: float, upload_rate: float, upload_burst: float) -> None:
    """`admit` against the rule written out: both buckets refill at their rate up to their burst (a clock that
    goes back refills nothing); an update takes `n_samples` and one upload, both or neither."""
    from streamfed.fleet.admission import Admission
    from streamfed.fleet.robustness import Robustness

    adm = Admission(Robustness(max_sample_rate=sample_rate, sample_burst=sample_burst,
                               max_upload_rate=upload_rate, upload_burst=upload_burst))
    buckets: dict[str, list[float]] = {}  # client → [samples, uploads, at of samples, at of uploads]
    now = 0.0
    for client, n, dt in calls:
        now += dt - 1.0  # sometimes backwards
        b = buckets.setdefault(client, [sample_burst, upload_burst, now, now])
        have = min(sample_burst, b[0] + max(0.0, now - b[2]) * sample_rate)
        slots = min(upload_burst, b[1] + max(0.0, now - b[3]) * upload_rate)
        want = float(max(n, 0))
        expected = want <= have and slots >= 1.0
        if expected:
            b[:] = [have - want, slots - 1.0, max(b[2], now), max(b[3], now)]
        assert adm.admit(client, n, now) == expected


# ------------------------------------------------------------------ FedBNR: the check in one pass over the triangle


def _old_checked_upload(msg: Any, **kw: Any) -> Upload:
    """The path before: the upload built, then `check_statistics` of its statistics (numpy, the full matrix)."""
    up = upload_of(msg)
    check_statistics(up.stats, **kw)
    return up


def _check_outcome(fn: Any, msg: Any, kw: dict[str, Any]) -> tuple[str, Any]:
    try:
        return "accepted", fn(msg, **kw)
    except np.linalg.LinAlgError as e:
        return "LinAlgError", str(e)
    except ValueError as e:
        return "ValueError", str(e)


_EDITS = ["none", "indefinite", "nearly_singular", "b_row", "b_norm", "q", "trace_high", "trace_low", "huge", "nan",
          "inf", "negative_diagonal", "n"]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 10**6), st.integers(1, 40), st.integers(1, 70), st.integers(1, 2), st.sampled_from(_EDITS),
       st.sampled_from([1.0, 1.0 + 1e-12, 1.0 - 1e-12, 1.0 + 1e-9, 1.0 - 1e-9, 0.5, 2.0]),
       st.sampled_from([None, 0.5, 3.0, 1e200]), st.booleans(), st.booleans())
def test_fedbnr_check_in_one_pass_gives_the_same_verdicts(seed: int, n: int, f: int, k: int, edit: str, scale: float,
                                                           label_bound: float | None, with_phi_min: bool,
                                                           checked: bool) -> None:
    """Honest statistics of `n` samples with RFF-like features (`‖φ‖² = 1`), one thing moved to or across one of
    the bounds (the edge ± 1e-12 and ± 1e-9 relative), or not at all: `checked_upload` against the upload built
    and then checked by `check_statistics` — the same refusal with the same message, or the same statistics.
    Knife edges included: an eigenvalue pushed to ∓ the jitter, rows of `b` at Cauchy–Schwarz's bound."""
    rng = np.random.default_rng(seed)
    phi = rng.standard_normal((n, k, f))
    phi /= np.linalg.norm(phi, axis=-1, keepdims=True)  # ‖φ‖² = 1 for every kernel
    y = rng.uniform(-1.0, 1.0, n) * (label_bound if label_bound is not None and label_bound < 10 else 3.0)
    stats = SufficientStats.from_samples(phi, y, kernel_version="kv", epoch=1)
    S, b, q, count = stats.S.copy(), stats.b.copy(), float(stats.q), float(n)
    j = int(rng.integers(0, f))
    if edit == "indefinite" or edit == "nearly_singular":
        w, v = np.linalg.eigh(S[0])
        jitter = 1e-9 * max(np.trace(S[0]) + abs(q), 1.0)
        # "indefinite": the augmented matrix's smallest eigenvalue at about jitter·(1 − scale), i.e. at 0 to within
        # rounding (accepted or refused by the factorisation's last bits); "nearly_singular": an eigenvalue near 0
        w[0] = -scale * jitter if edit == "indefinite" else (scale - 1.0) * jitter * 2.0
        S[0] = (v * w) @ v.T
        S[0] = 0.5 * (S[0] + S[0].T)
    elif edit == "b_row":
        b[..., j] = scale * np.sqrt(np.maximum(np.diagonal(S, axis1=-2, axis2=-1)[..., j], 0.0) * max(q, 0.0))
    elif edit == "b_norm":
        b *= scale * np.sqrt(np.trace(S, axis1=-2, axis2=-1) * q)[:, None] / np.linalg.norm(b, axis=-1)[:, None]
    elif edit == "q" and label_bound is not None:
        q = count * label_bound * label_bound * scale
    elif edit == "trace_high":
        S *= scale * 1.0 * count / np.trace(S[0])
    elif edit == "trace_low":
        count = float(np.floor(np.trace(S[0]) / scale)) or 1.0
    elif edit == "huge":
        S[0, j, j] = 1e100 * scale
    elif edit in ("nan", "inf"):
        S[-1, j, (j + 1) % f] = S[-1, (j + 1) % f, j] = math.nan if edit == "nan" else math.inf
    elif edit == "negative_diagonal":
        S[0, j, j] = -scale
    elif edit == "n":
        count = scale * count
    packed = SufficientStats(S, b, count, q, "kv", 1).to_packed()
    msg = Message("f", "a", "fedbnr.update", 1, 0, "kv", int(count), 0.0,
                  {k_: np.asarray(packed[k_], dtype=np.float64) for k_ in ("S_upper", "b", "n", "q")},
                  epoch=1)
    kw = {"max_abs": 1e100, "phi_sq": 1.0 if checked else None, "phi_sq_min": 1.0 if checked and with_phi_min else None,
          "label_bound": label_bound if checked else None}
    want = _check_outcome(_old_checked_upload, msg, kw)
    got = _check_outcome(checked_upload, msg, kw)
    assert got[0] == want[0], (edit, got, want)
    if want[0] == "accepted":  # bit for bit (a NaN passes when nothing is checked but the bound)
        a, w = got[1], want[1]
        assert (a.client, a.seq, a.base_version, a.time, a.count) == (w.client, w.seq, w.base_version, w.time, w.count)
        assert (a.stats.S.tobytes(), a.stats.b.tobytes(), a.stats.n, a.stats.q, a.stats.tag) == \
            (w.stats.S.tobytes(), w.stats.b.tobytes(), w.stats.n, w.stats.q, w.stats.tag)
        assert got[1].stats.S.flags.writeable and got[1].stats.S.flags.c_contiguous
    else:
        assert got[1] == want[1], (edit, got, want)


def test_fedbnr_check_in_one_pass_refuses_an_indefinite_scatter() -> None:
    """Not only the same as before: an upload whose scatter has a negative eigenvalue beyond the jitter is refused,
    one whose scatter is a sum of outer products is accepted."""
    rng = np.random.default_rng(3)
    phi = rng.standard_normal((8, 1, 5))
    phi /= np.linalg.norm(phi, axis=-1, keepdims=True)
    honest = SufficientStats.from_samples(phi, rng.uniform(-1, 1, 8), kernel_version="kv")
    bad_S = honest.S.copy()
    w, v = np.linalg.eigh(bad_S[0])
    w[0] = -1e-3
    bad_S[0] = (v * w) @ v.T
    kw = {"max_abs": 1e100, "phi_sq": 1.0, "phi_sq_min": None, "label_bound": 1.0}  # (the trace moved too)
    for S, accepted in ((honest.S, True), (bad_S, False)):
        packed = SufficientStats(S, honest.b, 8.0, honest.q, "kv").to_packed()
        msg = Message("f", "a", "fedbnr.update", 1, 0, "kv", 8, 0.0, {k: packed[k] for k in ("S_upper", "b", "n", "q")})
        if accepted:
            checked_upload(msg, **kw)
        else:
            with pytest.raises(np.linalg.LinAlgError):
                checked_upload(msg, **kw)


def test_fedbnr_check_in_one_pass_at_the_factorisation_edge() -> None:
    """Scatters whose augmented matrix has its smallest eigenvalue at 0 to within rounding — where only the last bits
    of the factorisation decide — judged by both paths: the same verdict every time, and both verdicts occur."""
    seen = set()
    for seed in range(200):
        rng = np.random.default_rng(seed)
        f = int(rng.integers(2, 40))
        phi = rng.standard_normal((f + 3, 1, f))
        phi /= np.linalg.norm(phi, axis=-1, keepdims=True)
        stats = SufficientStats.from_samples(phi, rng.uniform(-1, 1, f + 3), kernel_version="kv")
        aug = np.block([[stats.S[0], stats.b[0][:, None]], [stats.b[0][None, :], np.array([[stats.q]])]])
        w, v = np.linalg.eigh(aug)
        w[0] = -1e-9 * max(np.trace(stats.S[0]) + abs(stats.q), 1.0) * (1.0 + rng.uniform(-1e-5, 1e-5))
        aug = (v * w) @ v.T
        aug = 0.5 * (aug + aug.T)
        S, b, q = aug[None, :f, :f], aug[None, :f, f], float(aug[f, f])
        packed = SufficientStats(S, b, stats.n, q, "kv").to_packed()
        msg = Message("f", "a", "fedbnr.update", 1, 0, "kv", int(stats.n), 0.0,
                      {k: packed[k] for k in ("S_upper", "b", "n", "q")})
        kw = {"max_abs": 1e100, "phi_sq": 1.0 + 1e-6, "phi_sq_min": None, "label_bound": None}
        want = _check_outcome(_old_checked_upload, msg, kw)
        got = _check_outcome(checked_upload, msg, kw)
        assert got[0] == want[0] and (want[0] == "accepted" or got[1] == want[1]), (seed, got, want)
        seen.add(want[0])
    assert seen == {"accepted", "LinAlgError"}, seen
