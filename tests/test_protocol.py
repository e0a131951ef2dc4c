"""Wire protocol: schemas derived from the configuration, exact round trips, every rejection reason,
fuzzing of the decoder, sequence tracking, and conversions to/from the learners' objects."""

from __future__ import annotations

import asyncio
import doctest
import json
import math
import string
import time
from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from pydantic import ValidationError

import streamfed.fleet.config as config_module
import streamfed.wire.message as protocol_module
from streamfed.algorithms.fedbnr.wire import global_fields as fedbnr_global_fields
from streamfed.algorithms.fedbnr.wire import global_message as fedbnr_global_message
from streamfed.algorithms.fedbnr.wire import stats_fields, stats_update_message
from streamfed.algorithms.pofmkl.wire import global_message as pofmkl_global_message
from streamfed.algorithms.pofmkl.wire import global_theta, to_kernel_update
from streamfed.algorithms.pofmkl.wire import update_message as pofmkl_update_message
from streamfed.fleet.config import BrokerConfig, FleetConfig, StreamfedConfig, env_overrides, load_config
from streamfed.fleet.sequences import SeqTracker
from streamfed.runtime.connection import client_kwargs
from streamfed.wire.message import (
    Message,
    ProtocolError,
    Reason,
    ack_message,
    decode,
    encode,
    prediction_message,
    status_message,
)
from streamfed.wire.schema import MAX_KERNEL_VERSION_LEN, MAX_META_ITEMS, MAX_META_STR, MessageSchema

POF = FleetConfig(standardise="none", fleet="f", algorithm="pofmkl", n_inputs=2, n_kernels=3, n_features=2, bin_size=2,
                  max_clients=50, max_prediction_batch=8, seq_window=16)
BNR = FleetConfig(standardise="none", fleet="f", algorithm="fedbnr", n_inputs=2, n_features=1,
                  kernels=["gaussian:1.0", "gaussian:2.0"], max_clients=50, max_prediction_batch=8,
                  seq_window=16)
FUZZ = settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])

names = st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}\Z")
u63 = st.integers(0, 2**63 - 1)
finite = st.floats(allow_nan=False, allow_infinity=False)
scalars = st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | finite | st.text(max_size=MAX_META_STR)


# =========================================================================== strategies


@st.composite
def _message_for(draw: st.DrawFn, cfg: FleetConfig, ks: MessageSchema) -> Message:
    """Any valid message of kind `ks`, built from the schema alone (so new kinds are covered too)."""
    dims = {d: draw(st.integers(lo, min(hi, lo + 6))) for d, (lo, hi) in ks.dims.items()}
    arrays: dict[str, np.ndarray] = {}
    for a in ks.arrays:
        shape = tuple(d if isinstance(d, int) else dims[d] for d in a.shape)
        if a.index_bound is not None and a.distinct:
            arrays[a.name] = np.array(draw(st.permutations(range(a.index_bound)))[: shape[0]], dtype=np.int64)
        elif a.index_bound is not None:  # indices that may repeat (a round's kernels: one update after another)
            arrays[a.name] = draw(hnp.arrays(np.dtype(a.dtype), shape, elements=st.integers(0, a.index_bound - 1)))
        elif a.distinct:
            arrays[a.name] = np.array(draw(st.lists(u63, min_size=shape[0], max_size=shape[0], unique=True)),
                                      dtype=np.int64)
        elif a.dtype.startswith(("int", "uint")):
            lo = 1 if a.positive else 0 if (a.nonnegative or a.dtype.startswith("uint")) else -(2**31)
            arrays[a.name] = draw(hnp.arrays(np.dtype(a.dtype), shape, elements=st.integers(lo, 2**31)))
        else:
            lo = 0.0 if (a.nonnegative or a.positive) else None
            elems = st.floats(min_value=lo, allow_nan=False, allow_infinity=False, exclude_min=a.positive)
            arrays[a.name] = draw(hnp.arrays(np.float64, shape, elements=elems))
    meta = draw(st.dictionaries(st.text(min_size=1, max_size=32), scalars, max_size=4))
    for spec in ks.meta:
        meta[spec.name] = draw(st.sampled_from(spec.choices)) if spec.choices else draw(scalars)
    meta = dict(list(meta.items())[-MAX_META_ITEMS:])
    included = draw(st.dictionaries(names, u63, max_size=min(ks.max_included, 4)))
    kv = draw(st.text(alphabet=string.printable[:95], max_size=MAX_KERNEL_VERSION_LEN))
    return Message(cfg.fleet, draw(names), ks.kind, draw(u63), draw(u63), kv, draw(u63),
                   draw(st.floats(0, 1e12)), arrays, meta, included, draw(u63))


def messages(cfg: FleetConfig) -> st.SearchStrategy[Message]:
    kinds = cfg.protocol_schema.kinds
    return st.sampled_from(sorted(kinds)).flatmap(lambda k: _message_for(cfg, kinds[k]))


def exact_equal(a: Message, b: Message) -> bool:
    same_bits = all(np.asarray(a.arrays[k]).tobytes() == np.asarray(b.arrays[k]).tobytes() for k in a.arrays)
    return a == b and same_bits


# =========================================================================== configuration → schemas


def test_pofmkl_schema_from_configuration() -> None:
    assert POF.array_shapes("pofmkl.update") == {"kernels": ("int64", ("m",)), "delta": ("float64", ("m", 4))}
    assert POF.message_schema("pofmkl.update").dims == {"m": (1, 2)}
    assert POF.array_shapes("pofmkl.global") == {"theta": ("float64", (3, 4))}
    assert POF.update_kind == "pofmkl.update" and POF.global_kind == "pofmkl.global"
    assert POF.protocol_schema.kinds_on("acks") == ("ack",)
    assert "var" not in POF.array_shapes("prediction")


def test_fedbnr_schema_from_configuration() -> None:
    assert BNR.params.n_kernels == 2 and BNR.feature_dim == 3
    assert BNR.array_shapes("fedbnr.update") == {
        "S_upper": ("float64", (2, 6)), "b": ("float64", (2, 3)), "n": ("float64", ()), "q": ("float64", ())}
    assert set(BNR.array_shapes("fedbnr.global")) == {"S_upper", "b", "n", "q", "sigma", "lam", "log_evidence"}
    assert BNR.message_schema("fedbnr.global").max_included == 50
    assert "var" in BNR.array_shapes("prediction")
    assert BNR.message_schema("fedbnr.update").arrays[1].shape == (2, 3)
    nobias = BNR.model_copy(update={"params": BNR.params.model_copy(update={"bias": False})})  # schemas follow the copy
    assert nobias.feature_dim == 2 and nobias.array_shapes("fedbnr.update")["b"] == ("float64", (2, 2))


def test_protocol_schema_is_cached_per_configuration() -> None:
    assert POF.protocol_schema is POF.protocol_schema
    assert POF.protocol_schema is FleetConfig.model_validate(POF.model_dump()).protocol_schema


@pytest.mark.parametrize("cfg", [POF, BNR], ids=["pofmkl", "fedbnr"])
def test_byte_limits_hold_for_the_largest_possible_messages(cfg: FleetConfig) -> None:
    for ks in cfg.protocol_schema.kinds.values():
        arrays = {}
        for a in ks.arrays:
            shape = a.max_shape(ks.dims)
            if a.index_bound is not None:
                arrays[a.name] = np.arange(shape[0], dtype=np.int64) % a.index_bound
            elif a.distinct:
                arrays[a.name] = np.arange(2**63 - 1 - shape[0], 2**63 - 1, dtype=np.int64)
            elif a.dtype.startswith(("int", "uint")):
                arrays[a.name] = np.full(shape, np.iinfo(a.dtype).max, dtype=a.dtype)
            else:
                arrays[a.name] = np.full(shape, 1.0)
        meta: dict[str, Any] = {f"{i:032d}": "x" * MAX_META_STR for i in range(MAX_META_ITEMS - len(ks.meta))}
        meta.update({s.name: s.choices[0] if s.choices else 2**63 - 1 for s in ks.meta})
        included = {f"{i:064d}": 2**63 - 1 for i in range(ks.max_included)}
        msg = Message(cfg.fleet, "c" * 64, ks.kind, 2**63 - 1, 2**63 - 1, "k" * MAX_KERNEL_VERSION_LEN,
                      2**63 - 1, 1e300, arrays, meta, included, 2**63 - 1)
        payload = encode(msg, cfg)
        assert len(payload) <= ks.max_bytes <= cfg.protocol_schema.max_bytes
        assert ks.max_bytes < 1.2 * len(payload) + 1024 + 4096  # the limit is tight, not arbitrary


def test_fleet_config_validation() -> None:
    with pytest.raises(ValidationError, match="bin_size"):
        FleetConfig(standardise="none", fleet="f", algorithm="pofmkl", n_inputs=1, n_kernels=2, bin_size=3)
    with pytest.raises(ValidationError, match="fleet name"):
        FleetConfig(standardise="none", fleet="a/b", algorithm="pofmkl", n_inputs=1)
    with pytest.raises(ValidationError, match="2 kernels are listed"):
        FleetConfig(standardise="none",
                    fleet="f", algorithm="pofmkl", n_inputs=1, n_kernels=3, kernels=["gaussian:1", "laplacian:1"])
    with pytest.raises(ValidationError, match="repeated"):
        FleetConfig(standardise="none",
                    fleet="f", algorithm="pofmkl", n_inputs=1, kernels=["gaussian:1", "gaussian:1.0"])
    with pytest.raises(ValidationError):
        FleetConfig(standardise="none", fleet="f", algorithm="pofmkl", n_inputs=1, kernels=["cosine:1"])
    with pytest.raises(ValidationError):
        FleetConfig(standardise="none", fleet="f", algorithm="magic", n_inputs=1)  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="extra"):
        FleetConfig(standardise="none", fleet="f", algorithm="pofmkl", n_inputs=1, typo=1)  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        FleetConfig(standardise="none", fleet="f", algorithm="pofmkl", n_inputs=1, sensor_topic="a/+/{client}")
    cfg = FleetConfig(standardise="none",
                      fleet="f", algorithm="pofmkl", n_inputs=1, kernels=["laplacian:2", "gaussian:0.5"])
    assert cfg.params.kernels == ("laplacian:2.0", "gaussian:0.5") and cfg.params.n_kernels == 2
    with pytest.raises(ValidationError):
        cfg.seed = 3  # type: ignore[misc]


def test_default_kernel_dictionary_matches_the_learners() -> None:
    from streamfed.core.features import gaussian_dictionary

    assert POF.params.kernel_specs(POF.n_inputs, POF.standardise) == tuple(s.key for s in gaussian_dictionary(3))


def test_streamfed_config_from_toml_json_env(tmp_path) -> None:  # type: ignore[no-untyped-def]
    toml_text = """
[fleet]
fleet = "beijing"
algorithm = "fedbnr"
n_inputs = 10
kernels = ["gaussian:1.0", "gaussian:3.0"]
[fleet.fedbnr]
min_upload = 64
[broker]
host = "broker.example"
protocol = 5
tls_ca = "/etc/streamfed/ca.crt"
username = "station-1"
"""
    env = {"STREAMFED_BROKER__PASSWORD": "pw", "STREAMFED_FLEET__FEDBNR__SIGMA": "0.5",
           "STREAMFED_APT_PACKAGES": "mosquitto", "OTHER": "x"}
    cfg = StreamfedConfig.from_toml(toml_text, env)
    assert cfg.fleet.params.n_kernels == 2 and cfg.fleet.params.min_upload == 64 and cfg.fleet.params.sigma == 0.5
    assert cfg.broker.port == 8883 and cfg.broker.protocol == "5" and cfg.broker.use_tls
    assert cfg.broker.password is not None and cfg.broker.password.get_secret_value() == "pw"
    assert "pw" not in repr(cfg)
    again = StreamfedConfig.from_json(cfg.model_dump_json(), env={})
    assert again.fleet == cfg.fleet and again.broker.host == cfg.broker.host
    (tmp_path / "c.toml").write_text(toml_text)
    (tmp_path / "c.json").write_text(json.dumps(json.loads(cfg.model_dump_json()) | {"broker": {}}))
    assert load_config(tmp_path / "c.toml", env=env) == cfg
    assert load_config(tmp_path / "c.json", env={}).broker == BrokerConfig()
    only_env = {"STREAMFED_FLEET__FLEET": "g", "STREAMFED_FLEET__ALGORITHM": "pofmkl",
                "STREAMFED_FLEET__N_INPUTS": "4", "STREAMFED_FLEET__KERNELS": '["gaussian:1.0"]'}
    assert load_config(env=only_env).fleet.params.kernels == ("gaussian:1.0",)
    assert env_overrides({"STREAMFED___X": "1", "STREAMFED_A__": "2"}) == {}


def test_broker_config_rules() -> None:
    assert BrokerConfig().port == 1883 and not BrokerConfig().use_tls
    assert BrokerConfig(tls=True).port == 8883 and BrokerConfig(tls=True, port=9000).port == 9000
    assert BrokerConfig(protocol="3.1.1").protocol == BrokerConfig(protocol="v311").protocol == "3.1.1"
    with pytest.raises(ValidationError, match="go together"):
        BrokerConfig(tls_cert="c.pem")
    with pytest.raises(ValidationError, match="username"):
        BrokerConfig(password="x")
    with pytest.raises(ValidationError):
        BrokerConfig(protocol="4")


def test_broker_config_to_aiomqtt_arguments() -> None:
    import aiomqtt

    b = BrokerConfig(username="a1", password="pw", tls_ca="/ca.crt", session_expiry=600)
    kw = client_kwargs(b, "a1", persistent=True)
    assert kw["password"] == "pw" and kw["port"] == 8883 and kw["tls_params"].ca_certs == "/ca.crt"
    assert kw["protocol"] == aiomqtt.ProtocolVersion.V5
    assert kw["clean_start"] is False and kw["properties"].SessionExpiryInterval == 600
    kw = client_kwargs(b, "a1")
    assert kw["clean_start"] is True and kw["properties"].SessionExpiryInterval == 0
    kw = client_kwargs(BrokerConfig(protocol="3.1.1"), "a1", persistent=True)
    assert kw["clean_session"] is False and "properties" not in kw and "tls_params" not in kw
    with pytest.raises(ValueError, match="client_id"):
        client_kwargs(b, persistent=True)

    async def construct() -> None:
        aiomqtt.Client(**kw)  # the arguments are accepted by the real constructor

    asyncio.run(construct())


# =========================================================================== round trips


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([POF, BNR]).flatmap(lambda c: st.tuples(st.just(c), messages(c))))
def test_random_valid_messages_round_trip_exactly(case: tuple[FleetConfig, Message]) -> None:
    cfg, msg = case
    payload = encode(msg)
    back = decode(payload, cfg, client=msg.client, kernel_version=msg.kernel_version)
    assert exact_equal(back, msg)
    assert all(not a.flags.writeable for a in back.arrays.values())
    assert encode(back) == payload  # canonical: decoding and re-encoding changes nothing


def test_decoded_arrays_are_read_only_views_and_helpers_return_writable_copies() -> None:
    theta = np.arange(12.0).reshape(3, 4)
    msg = decode(encode(pofmkl_global_message("f", "agg", theta, 7, kernel_version="k", created=1.0)), POF)
    with pytest.raises(ValueError):
        msg.arrays["theta"][0, 0] = 1.0
    got, version = global_theta(msg)
    got[0, 0] = -1.0  # writable, and does not alias the message
    assert version == 7 and msg.arrays["theta"][0, 0] == 0.0 and got.flags.c_contiguous


def test_big_endian_and_non_contiguous_inputs_encode_correctly() -> None:
    delta = np.arange(16.0).reshape(4, 4)[::2].astype(">f8")  # (2, 4), strided, big-endian
    msg = pofmkl_update_message("f", "a1", 1, np.array([0, 2], dtype=">i8"), delta, global_version=0,
                                kernel_version="k", created=0.0)
    back = decode(encode(msg, POF), POF)
    assert back.arrays["delta"].tolist() == delta.tolist() and back.arrays["kernels"].tolist() == [0, 2]


def test_encoding_is_vectorised() -> None:
    big = FleetConfig(standardise="none", fleet="f", algorithm="pofmkl", n_inputs=2, n_kernels=64, n_features=4096)
    theta = np.random.default_rng(0).standard_normal((64, 8192))  # 4 MiB
    msg = pofmkl_global_message("f", "agg", theta, 1, kernel_version="k", created=0.0)
    t0 = time.perf_counter()
    for _ in range(5):
        back = decode(encode(msg), big)
    per_round_trip = (time.perf_counter() - t0) / 5
    assert np.array_equal(back.arrays["theta"], theta)
    assert per_round_trip < 0.25, per_round_trip  # a per-element loop would take seconds



def test_mutable_payloads_decode_like_bytes_and_are_copied() -> None:
    msg = pofmkl_update_message("f", "a1", 1, np.array([0, 2]), np.ones((2, 4)), global_version=0,
                                kernel_version="k", created=0.0)
    payload = encode(msg, POF)
    for mutable in (bytearray(payload), memoryview(bytearray(payload))):
        back = decode(mutable, POF)
        assert back == msg
        raw = mutable if isinstance(mutable, bytearray) else mutable.obj
        raw[-8:] = b"\xff" * 8  # the sender's buffer changes after decoding: the message does not
        assert back.arrays["delta"].tolist() == np.ones((2, 4)).tolist()


def test_each_configuration_is_checked_against_its_own_schema() -> None:
    """The decoder caches its checks per schema: two fleets of the same name and different sizes,
    alternated, each keep their own shapes, limits and kernel bounds."""
    small = FleetConfig(standardise="none",
                        fleet="f", algorithm="pofmkl", n_inputs=2, n_kernels=3, n_features=2, bin_size=2)
    large = FleetConfig(standardise="none",
                        fleet="f", algorithm="pofmkl", n_inputs=2, n_kernels=8, n_features=5, bin_size=2)
    for_small = encode(pofmkl_update_message("f", "a1", 1, np.array([2]), np.ones((1, 4)), global_version=0,
                                             kernel_version="k", created=0.0))
    for_large = encode(pofmkl_update_message("f", "a1", 1, np.array([7]), np.ones((1, 10)), global_version=0,
                                             kernel_version="k", created=0.0))
    for _ in range(2):
        assert decode(for_small, small).arrays["delta"].shape == (1, 4)
        assert decode(for_large, large).arrays["delta"].shape == (1, 10)
        with pytest.raises(ProtocolError) as e:
            decode(for_large, small)
        assert e.value.reason in (Reason.WRONG_SHAPE, Reason.BAD_INDEX)
        with pytest.raises(ProtocolError, match="wrong_shape"):
            decode(for_small, large)


# =========================================================================== rejections


def _upd(**kw: Any) -> Message:
    base = dict(fleet="f", client="a1", kind="pofmkl.update", seq=5, global_version=2, kernel_version="k1",
                n_samples=1, created=1.5, arrays={"kernels": np.array([0, 2]), "delta": np.ones((2, 4))})
    return Message(**(base | kw))  # type: ignore[arg-type]


def _env(msg: Message) -> dict[str, Any]:
    return msgpack.unpackb(encode(msg), raw=False)


def _pack(env: Any) -> bytes:
    return msgpack.packb(env, use_bin_type=True)


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(env: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node = env
        for p in parents:
            node = node[p]
        if value is _DELETE:
            del node[last]
        else:
            node[last] = value
    return mutate


_DELETE = object()
_F32 = {"dtype": "float32", "shape": [2, 4], "data": np.ones((2, 4), np.float32).tobytes()}

# (id, payload, expected reason, decode keyword arguments)
CASES: list[tuple[str, bytes, Reason, dict[str, Any]]] = [
    ("too_large", b"\x00" * (POF.protocol_schema.max_bytes + 1), Reason.TOO_LARGE, {}),
    # within the fleet's limit (set by the global) but above the limit of a status message
    ("too_large_for_kind", _pack(_env(status_message("f", "a1", "online", created=0.0)) | {"meta": {
        "state": "online", **{f"x{i}": "y" * 3000 for i in range(3)}}}), Reason.TOO_LARGE, {}),
    ("reserved_byte", b"\xc1", Reason.NOT_MSGPACK, {}),
    ("truncated", encode(_upd())[:-3], Reason.NOT_MSGPACK, {}),
    ("trailing_bytes", encode(_upd()) + b"\x00", Reason.NOT_MSGPACK, {}),
    ("empty", b"", Reason.NOT_MSGPACK, {}),
    ("ext_type", _pack(msgpack.ExtType(5, b"xx")), Reason.NOT_MSGPACK, {}),
    ("timestamp_ext", msgpack.packb(msgpack.Timestamp(1, 0)), Reason.NOT_MSGPACK, {}),
    ("invalid_utf8", b"\xa2\xff\xfe", Reason.NOT_MSGPACK, {}),
    ("not_a_map", _pack([1, 2, 3]), Reason.BAD_SCHEMA, {}),
]


def _case(name: str, mutation: Callable[[dict[str, Any]], None], reason: Reason, msg: Message | None = None,
          **kw: Any) -> None:
    env = _env(msg if msg is not None else _upd())
    mutation(env)
    CASES.append((name, _pack(env), reason, kw))


_case("missing_key", _set("created", _DELETE), Reason.BAD_SCHEMA)
_case("extra_key", _set("extra", 1), Reason.BAD_SCHEMA)
_case("schema_version", _set("schema", 2), Reason.BAD_SCHEMA)
_case("schema_bool", _set("schema", True), Reason.BAD_SCHEMA)
_case("created_nan", _set("created", math.nan), Reason.BAD_SCHEMA)
_case("created_int", _set("created", 3), Reason.BAD_SCHEMA)
_case("negative_version", _set("global_version", -1), Reason.BAD_SCHEMA)
_case("n_samples_str", _set("n_samples", "1"), Reason.BAD_SCHEMA)
_case("kernel_version_control_char", _set("kernel_version", "k\n1"), Reason.BAD_SCHEMA)
_case("kernel_version_too_long", _set("kernel_version", "k" * 129), Reason.BAD_SCHEMA)
_case("meta_not_scalar", _set("meta", {"x": [1]}), Reason.BAD_SCHEMA)
_case("meta_too_many", _set("meta", {f"k{i}": i for i in range(17)}), Reason.BAD_SCHEMA)
_case("meta_key_too_long", _set("meta", {"k" * 33: 1}), Reason.BAD_SCHEMA)
_case("meta_nan", _set("meta", {"x": math.inf}), Reason.NON_FINITE)
_case("status_without_state", _set("meta", {}), Reason.BAD_SCHEMA,
      status_message("f", "a1", "online", created=0.0))
_case("status_bad_state", _set("meta.state", "sleepy"), Reason.BAD_SCHEMA,
      status_message("f", "a1", "online", created=0.0))
_case("included_on_update", _set("included", {"a1": 1}), Reason.BAD_SCHEMA)
_case("included_bad_name", _set("included", {"a/1": 1}), Reason.BAD_CLIENT,
      pofmkl_global_message("f", "agg", np.zeros((3, 4)), 1, kernel_version="k", created=0.0))
_case("included_bad_seq", _set("included", {"a1": -1}), Reason.BAD_SEQ,
      pofmkl_global_message("f", "agg", np.zeros((3, 4)), 1, kernel_version="k", created=0.0))
_case("unknown_kind", _set("kind", "pofmkl.weights"), Reason.UNKNOWN_KIND)
_case("other_learners_kind", _set("kind", "fedbnr.update"), Reason.UNKNOWN_KIND)
_case("kind_not_on_this_topic", lambda e: None, Reason.UNKNOWN_KIND, kinds=["pofmkl.global"])
_case("wrong_fleet", _set("fleet", "g"), Reason.WRONG_FLEET)
_case("client_with_slash", _set("client", "a/1"), Reason.BAD_CLIENT)
_case("client_not_string", _set("client", 7), Reason.BAD_CLIENT)
_case("client_not_the_topic_one", lambda e: None, Reason.BAD_CLIENT, client="a2")
_case("arrays_missing", _set("arrays.delta", _DELETE), Reason.BAD_ARRAY)
_case("arrays_extra", _set("arrays.w", _env(_upd())["arrays"]["delta"]), Reason.BAD_ARRAY)
_case("array_entry_keys", _set("arrays.delta.order", "C"), Reason.BAD_ARRAY)
_case("array_data_length", _set("arrays.delta.data", b"\x00" * 63), Reason.BAD_ARRAY)
_case("array_data_not_bytes", _set("arrays.delta.data", "x" * 64), Reason.BAD_ARRAY)
_case("ack_negative_missing", _set("arrays.missing.data", np.array([-1]).tobytes()), Reason.BAD_ARRAY,
      ack_message("f", "a1", 1, [4], seq=1, created=0.0))
_case("wrong_dtype", _set("arrays.delta", _F32), Reason.WRONG_DTYPE)
_case("fixed_axis", _set("arrays.delta.shape", [4, 2]), Reason.WRONG_SHAPE)
_case("too_many_kernels", lambda e: None, Reason.WRONG_SHAPE,
      _upd(arrays={"kernels": np.array([0, 1, 2]), "delta": np.ones((3, 4))}))
_case("zero_kernels", lambda e: None, Reason.WRONG_SHAPE,
      _upd(arrays={"kernels": np.zeros(0, np.int64), "delta": np.ones((0, 4))}))
_case("m_disagrees", lambda e: None, Reason.WRONG_SHAPE,
      _upd(arrays={"kernels": np.array([1]), "delta": np.ones((2, 4))}))
_case("ndim", _set("arrays.delta.shape", [2, 4, 1]), Reason.WRONG_SHAPE)
_case("shape_not_ints", _set("arrays.delta.shape", [2.0, 4]), Reason.WRONG_SHAPE)
_case("nan", lambda e: None, Reason.NON_FINITE,
      _upd(arrays={"kernels": np.array([0]), "delta": np.array([[0, 0, math.nan, 0]])}))
_case("inf_theta", lambda e: None, Reason.NON_FINITE,
      pofmkl_global_message("f", "agg", np.full((3, 4), math.inf), 1, kernel_version="k", created=0.0))
_case("kernel_out_of_range", lambda e: None, Reason.BAD_INDEX,
      _upd(arrays={"kernels": np.array([3]), "delta": np.ones((1, 4))}))
_case("kernel_negative", lambda e: None, Reason.BAD_INDEX,
      _upd(arrays={"kernels": np.array([-1]), "delta": np.ones((1, 4))}))
_case("kernel_repeated", lambda e: None, Reason.BAD_INDEX,
      _upd(arrays={"kernels": np.array([1, 1]), "delta": np.ones((2, 4))}))
_case("seq_negative", _set("seq", -1), Reason.BAD_SEQ)
_case("seq_too_big", _set("seq", 2**64 - 1), Reason.BAD_SEQ)
_case("seq_bool", _set("seq", True), Reason.BAD_SEQ)
_case("seq_string", _set("seq", "5"), Reason.BAD_SEQ)
_case("kernel_version", lambda e: None, Reason.WRONG_KERNEL_VERSION, kernel_version="k2")


@pytest.mark.parametrize("payload, reason, kw", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_each_rejection_has_its_reason(payload: bytes, reason: Reason, kw: dict[str, Any]) -> None:
    with pytest.raises(ProtocolError) as e:
        decode(payload, POF, **kw)
    assert e.value.reason is reason, e.value


def test_fedbnr_value_constraints() -> None:
    g = fedbnr_global_message("f", "agg", 1, np.zeros((2, 6)), np.zeros((2, 3)), 0.0, 0.0, np.ones(2),
                              np.array([1.0, 0.0]), np.zeros(2), {}, kernel_version="k", created=0.0)
    with pytest.raises(ProtocolError) as e:
        decode(encode(g), BNR)
    assert e.value.reason is Reason.BAD_ARRAY and "lam" in e.value.detail
    up = stats_update_message("f", "a1", 1, np.zeros((2, 6)), np.zeros((2, 3)), 1.0, math.nan,
                              global_version=0, kernel_version="k", created=0.0)
    with pytest.raises(ProtocolError) as e:
        decode(encode(up), BNR)
    assert e.value.reason is Reason.NON_FINITE
    with pytest.raises(ProtocolError) as e:  # a POF-MKL fleet does not take FedBNR updates
        decode(encode(up), POF)
    assert e.value.reason is Reason.UNKNOWN_KIND


def test_every_reason_code_is_exercised() -> None:
    assert {c[2] for c in CASES} | {Reason.STALE_SEQ} == set(Reason)


def test_encode_with_expectations_catches_sender_mistakes() -> None:
    with pytest.raises(ProtocolError) as e:
        encode(_upd(arrays={"kernels": np.array([0]), "delta": np.ones((1, 5))}), POF)
    assert e.value.reason is Reason.WRONG_SHAPE
    with pytest.raises(ProtocolError) as e:
        encode(_upd(arrays={"kernels": np.array([True]), "delta": np.ones((1, 4))}))
    assert e.value.reason is Reason.WRONG_DTYPE
    with pytest.raises(ProtocolError) as e:
        encode(_upd(meta={"x": object()}))
    assert e.value.reason is Reason.BAD_SCHEMA
    with pytest.raises(ProtocolError) as e:
        encode(_upd(seq=2**64))
    assert e.value.reason is Reason.BAD_SCHEMA


# =========================================================================== fuzzing


def _only_protocol_errors(payload: bytes, cfg: FleetConfig = POF) -> None:
    try:
        msg = decode(payload, cfg)
    except ProtocolError:
        return
    # whatever is accepted is a valid message: it re-encodes to something accepted as the same message
    assert decode(encode(msg), cfg) == msg


@FUZZ
@given(st.binary(max_size=600))
def test_fuzz_random_bytes(payload: bytes) -> None:
    _only_protocol_errors(payload)


def _random_message(cfg: FleetConfig, ks: MessageSchema, rng: np.random.Generator) -> Message:
    """A valid message from plain NumPy randomness: a cheap pool of seeds for the mutation fuzzers."""
    dims = {d: int(rng.integers(lo, min(hi, lo + 4) + 1)) for d, (lo, hi) in ks.dims.items()}
    arrays = {}
    for a in ks.arrays:
        shape = tuple(d if isinstance(d, int) else dims[d] for d in a.shape)
        if a.index_bound is not None and a.distinct:
            arrays[a.name] = rng.permutation(a.index_bound)[: shape[0]].astype(np.int64)
        elif a.index_bound is not None:
            arrays[a.name] = rng.integers(0, a.index_bound, shape).astype(a.dtype)
        elif a.distinct:
            arrays[a.name] = rng.choice(1000, shape[0], replace=False).astype(np.int64)
        elif a.dtype.startswith(("int", "uint")):
            arrays[a.name] = rng.integers(1, 100, shape).astype(a.dtype)
        else:
            arrays[a.name] = np.abs(rng.standard_normal(shape)) + 0.1
    meta = {s.name: (s.choices[0] if s.choices else 1) for s in ks.meta} | {"note": "x", "k": 1, "t": 0.5}
    included = {f"c{i}": int(rng.integers(0, 100)) for i in range(min(ks.max_included, 2))}
    return Message(cfg.fleet, f"a{rng.integers(9)}", ks.kind, int(rng.integers(0, 10**6)), 3, "kv1", 1,
                   1.0e9, arrays, meta, included, 0)


_POOL = [(cfg, encode(_random_message(cfg, ks, np.random.default_rng(i)), cfg))
         for cfg in (POF, BNR) for ks in cfg.protocol_schema.kinds.values() for i in range(4)]


@st.composite
def _mutated(draw: st.DrawFn) -> tuple[bytes, FleetConfig]:
    cfg, payload = draw(st.sampled_from(_POOL))
    data = bytearray(payload)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "set", "cut", "insert", "dup"]))
        i = draw(st.integers(0, max(len(data) - 1, 0)))
        if op == "flip" and data:
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "set" and data:
            data[i] = draw(st.sampled_from([0x00, 0x7F, 0x80, 0xC0, 0xC1, 0xC3, 0xCF, 0xD3, 0xDC, 0xDE, 0xFF]))
        elif op == "cut":
            del data[i: i + draw(st.integers(1, 16))]
        elif op == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=8))
        elif op == "dup":
            data[i:i] = data[i: i + draw(st.integers(1, 32))]
    return bytes(data), cfg


@pytest.mark.slow  # over 2 s: outside the pure tier, in every full run
@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_mutated())
def test_fuzz_mutated_valid_payloads(case: tuple[bytes, FleetConfig]) -> None:
    _only_protocol_errors(*case)


_objects = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=20)
    | st.binary(max_size=40),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5),
    max_leaves=8,
)


@st.composite
def _envelope_with_a_replaced_field(draw: st.DrawFn) -> tuple[bytes, FleetConfig]:
    cfg, payload = draw(st.sampled_from(_POOL))
    env = msgpack.unpackb(payload, raw=False)
    node: Any = env
    while isinstance(node, dict) and node and draw(st.booleans()):  # descend a random path
        key = draw(st.sampled_from(sorted(node)))
        if not isinstance(node[key], dict) or not node[key]:
            break
        node = node[key]
    if isinstance(node, dict) and node:
        node[draw(st.sampled_from(sorted(node)))] = draw(_objects)
    return _pack(env), cfg


@pytest.mark.slow  # over 2 s: outside the pure tier, in every full run
@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_envelope_with_a_replaced_field() | _objects.map(lambda o: (_pack(o), POF)))
def test_fuzz_structured_payloads(case: tuple[bytes, FleetConfig]) -> None:
    _only_protocol_errors(*case)


def test_deep_nesting_is_rejected_cleanly() -> None:
    for payload in (b"\x91" * 100_000, b"\x81\xa1a" * 50_000):
        with pytest.raises(ProtocolError) as e:
            decode(payload, POF)
        assert e.value.reason in (Reason.NOT_MSGPACK, Reason.TOO_LARGE)


# =========================================================================== sequence numbers


def test_seq_tracker_duplicates_replays_and_gaps() -> None:
    t = SeqTracker(window=8)
    assert t.record("a", 1) == (True, False, None, None)
    with pytest.raises(ProtocolError) as e:
        t.record("a", 1)
    assert e.value.reason is Reason.STALE_SEQ
    with pytest.raises(ProtocolError):
        t.check("a", 0)  # below first_seq: a replay of nothing
    assert t.record("a", 4) == (False, False, (2, 3), None)
    assert t.record("a", 6).new_gap == (5, 5)
    assert t.gaps("a") == [(2, 3), (5, 5)] and t.missing("a") == [2, 3, 5] and t.highest("a") == 6
    with pytest.raises(ProtocolError, match="duplicate"):
        t.record("a", 4)
    assert t.record("a", 3) == (False, True, None, None)
    assert t.record("a", 2).in_order and t.mark("a") == 4
    assert t.record("b", 1).in_order and t.clients == ["a", "b"]
    snapshot = t.to_dict()
    assert t.check("a", 5).fills_gap and t.to_dict() == snapshot  # check never changes state
    assert json.loads(json.dumps(snapshot)) == snapshot


def test_seq_tracker_gives_up_beyond_the_window() -> None:
    t = SeqTracker(window=4)
    t.record("a", 1)
    t.record("a", 3)
    r = t.record("a", 10)  # more than 4 ahead of mark 1: seqs up to 6 are given up
    assert r.dropped == (2, 6) and r.new_gap == (7, 9)
    assert t.mark("a") == 6 and t.missing("a") == [7, 8, 9]
    with pytest.raises(ProtocolError):
        t.record("a", 2)  # given up counts as stale


def test_seq_tracker_rejects_non_integers_and_bad_state() -> None:
    with pytest.raises(ProtocolError) as e:
        SeqTracker().check("a", True)  # type: ignore[arg-type]
    assert e.value.reason is Reason.BAD_SEQ
    with pytest.raises(ValueError):
        SeqTracker.from_dict({"window": 4, "first_seq": 1, "clients": {"a": {"mark": 1, "above": [2]}}})
    with pytest.raises(ValueError):
        SeqTracker(window=0)
    assert SeqTracker(first_seq=0).record("a", 0).in_order


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 12), st.lists(st.integers(0, 40), max_size=60))
def test_seq_tracker_against_a_reference_model(window: int, seqs: list[int]) -> None:
    t = SeqTracker(window=window)
    applied: set[int] = set()
    floor = 0  # everything <= floor is applied or given up
    for s in seqs:
        stale = s <= floor or s in applied
        if stale:
            with pytest.raises(ProtocolError):
                t.record("c", s)
            continue
        t.record("c", s)
        applied.add(s)
        if s - floor > window:
            floor = s - window
        while floor + 1 in applied:
            floor += 1
        assert t.mark("c") == floor
        assert t.missing("c") == [x for x in range(floor + 1, max(applied | {floor})) if x not in applied]
        t = SeqTracker.from_dict(t.to_dict())  # persistence round trip at every step



@settings(max_examples=300, deadline=None)
@given(st.integers(1, 12), st.lists(st.tuples(st.sampled_from("ab"), st.integers(0, 40)), max_size=80))
def test_seq_tracker_commit_after_check_equals_record(window: int, seqs: list[tuple[str, int]]) -> None:
    by_record, by_commit = SeqTracker(window=window), SeqTracker(window=window)
    for c, s in seqs:
        try:
            expected = by_record.record(c, s)
        except ProtocolError as e:
            with pytest.raises(ProtocolError, match=e.reason.value):
                by_commit.check(c, s)
            continue
        assert by_commit.commit(c, s, by_commit.check(c, s)) == expected
        assert by_commit.to_dict() == by_record.to_dict()


def test_invalid_client_names_are_refused_every_time() -> None:
    """Valid names are remembered (checked once per client, not per message); invalid ones never are."""
    good = encode(status_message("f", "a1", "online", created=0.0))
    bad = good.replace(b"\xa2a1", b"\xa2a+")
    for _ in range(3):
        assert decode(good, POF, client="a1").client == "a1"
        with pytest.raises(ProtocolError, match="bad_client"):
            decode(bad, POF)
    assert protocol_module._name_problem("a+") is not None and "a+" not in protocol_module._VALID_NAMES


# =========================================================================== learner conversions


def test_pofmkl_update_and_global_through_the_wire() -> None:
    from streamfed.algorithms.pofmkl.client import POFMKLClient
    from streamfed.algorithms.pofmkl.server import POFMKLServer
    from streamfed.core.features import RFFBank

    p = POF.params
    bank = RFFBank(p.kernel_specs(POF.n_inputs, POF.standardise), p.n_features, POF.n_inputs, seed=POF.seed)
    client = POFMKLClient(bank, bin_size=POF.params.bin_size, rng=1)
    direct, wired = POFMKLServer(3, 4), POFMKLServer(3, 4)
    for t in range(20):
        _, upd = client.step(np.array([0.1 * t, -0.2]), 0.5)
        payload = encode(pofmkl_update_message("f", "a1", t + 1, upd.kernels, upd.delta, global_version=t,
                                               kernel_version=bank.version), POF, kernel_version=bank.version)
        got = to_kernel_update(decode(payload, POF, kernel_version=bank.version, client="a1"))
        assert got.kernels.flags.writeable and np.array_equal(got.kernels, upd.kernels)
        direct.add(upd)
        wired.add(got)
        v = wired.finish_round()
        direct.finish_round()
        g = encode(pofmkl_global_message("f", "aggregator", wired.theta, v, kernel_version=bank.version), POF)
        theta, version = global_theta(decode(g, POF, kernel_version=bank.version))
        client.set_global(theta, version)
    assert np.array_equal(direct.theta, wired.theta) and client.global_version == 20


def test_fedbnr_upload_and_global_through_the_wire() -> None:
    from streamfed.algorithms.fedbnr.client import FedBNRClient
    from streamfed.algorithms.fedbnr.messages import GlobalModel, Upload
    from streamfed.algorithms.fedbnr.server import FedBNRServer

    client = FedBNRClient(n_inputs=2, n_features=1, bandwidth=[1.0, 2.0], min_upload=4, client_id="a1")
    rng = np.random.default_rng(0)
    for x in rng.standard_normal((10, 2)):
        client.learn(x, float(x.sum()))
    up = client.make_upload()
    assert up is not None
    f = up.to_message()
    msg = stats_update_message("f", f["client"], f["seq"], f["S_upper"], f["b"], f["n"], f["q"],
                               global_version=f["base_version"], kernel_version=f["kernel_version"],
                               epoch=f["epoch"])
    back = decode(encode(msg, BNR), BNR, kernel_version=client.kernel_version, client="a1")
    assert Upload.from_message(stats_fields(back)) == up

    server = FedBNRServer.for_client(client)
    assert server.apply(Upload.from_message(stats_fields(back)))
    g = server.publish().to_message()
    gm = fedbnr_global_message("f", "aggregator", g["version"], g["S_upper"], g["b"], g["n"], g["q"],
                               g["sigma"], g["lam"], g["log_evidence"], g["included"],
                               kernel_version=g["kernel_version"], epoch=g["epoch"])
    fields = fedbnr_global_fields(decode(encode(gm, BNR), BNR))
    model = GlobalModel.from_message(fields)
    assert model.included == {"a1": 1} and model.stats == server.stats
    assert client.apply_global(model)


def test_small_message_builders() -> None:
    s = decode(encode(status_message("f", "a1", "offline", created=2.0)), POF,
               kinds=POF.protocol_schema.kinds_on("status"))
    assert s.meta == {"state": "offline"} and s.arrays == {}
    a = decode(encode(ack_message("f", "a1", 4, [6, 7], seq=3, created=0.0)), POF)
    assert a.included == {"a1": 4} and a.arrays["missing"].tolist() == [6, 7]
    p = decode(encode(prediction_message("f", "a1", 1, 0.25, 0.5, created=0.0)), BNR)
    assert p.n_samples == 1 and p.arrays["var"].tolist() == [0.5]
    with pytest.raises(ValueError):
        to_kernel_update(a)


@pytest.mark.parametrize("module", [protocol_module, config_module])
def test_docstring_examples(module: object) -> None:
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)  # type: ignore[arg-type]
    assert result.attempted > 0 and result.failed == 0
