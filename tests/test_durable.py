"""The durable codec (streamfed.core.durable) on its own: exact values, registered names instead of module paths,
schema migrations, refusals in words; and state files of format 2 (streamfed.fleet.persistence) that are damaged
or name what this build does not know are never loaded."""

from __future__ import annotations

import hashlib
import struct
import types
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from streamfed.core import durable
from streamfed.core.durable import DurableError, decode, encode, migration
from streamfed.fleet.persistence import FORMAT_VERSION, MAGIC, StateError, dumps, loads, read_state


def make_class(name: str, version: int, module: str, slots: bool = False) -> type:
    """A class `Thing` defined in `module`, registered as `name` — in place of the class registered so before
    (a stand-in for the class of another build: moved elsewhere, or of another schema version)."""
    old = durable.registered().get(name)
    if old is not None:
        del durable._BY_NAME[name], durable._BY_CLASS[old[0]]
    ns: dict = {"__module__": module}
    if slots:
        ns["__slots__"] = ("a", "b")
    cls = types.new_class("Thing", (), exec_body=lambda d: d.update(ns))
    return durable.durable(name, version=version)(cls)


DTYPES = st.sampled_from(["<f8", "<f4", "<i8", "<i4", "|u1", "|b1", "<c16", "<u8", ">f8", "<f2"])


@given(hnp.arrays(DTYPES, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4),
                  elements=None, fill=st.nothing()) | hnp.arrays("<f8", 5, elements=st.floats(allow_nan=True)))
def test_an_array_comes_back_bit_for_bit(a: np.ndarray) -> None:
    b = decode(encode(a))
    assert (b.dtype, b.shape, b.tobytes()) == (a.dtype, a.shape, a.tobytes()) and b.flags.writeable


def test_layouts_and_plain_values_come_back_as_they_were() -> None:
    f = np.asfortranarray(np.arange(6.0).reshape(2, 3))
    nan = np.frombuffer(struct.pack("<Q", 0x7FF4_0000_0000_0001), "<f8")[0]  # a signalling NaN's payload
    tree = {"f": f, "big": -(2**100), "t": (1, (2.5, "x")), "s": {1, 2}, "fs": frozenset({"a"}), "b": b"\x00",
            "ba": bytearray(b"ab"), "c": 1 + 2j, "n": None, "k": {3: "int key", (1, 2): "tuple key"},
            "np": [np.float64(-0.0), np.int32(7), np.bool_(True)], "nan": float(nan), "bool": True}
    back = decode(encode(tree))
    assert back["f"].flags.f_contiguous and np.array_equal(back["f"], f)
    assert {k: v for k, v in back.items() if k not in ("f", "np", "nan")} == {
        k: v for k, v in tree.items() if k not in ("f", "np", "nan")}
    assert [type(v) for v in back["np"]] == [np.float64, np.int32, np.bool_]
    assert np.signbit(back["np"][0]) and struct.pack("<d", back["nan"]) == struct.pack("<d", tree["nan"])
    assert type(back["t"]) is tuple and type(back["t"][1]) is tuple and back["bool"] is True


LEAVES = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=5)
          | st.binary(max_size=5) | st.complex_numbers(allow_nan=False))
KEYS = st.text(max_size=4) | st.integers() | st.tuples(st.integers(), st.text(max_size=2))


@given(st.recursive(LEAVES, lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner)
                    | st.dictionaries(KEYS, inner, max_size=4) | st.frozensets(st.integers(), max_size=3),
                    max_leaves=20))
def test_any_plain_tree_comes_back_equal_with_its_types(tree: object) -> None:
    def shape(v: object) -> object:  # types all the way down, floats by their bits (NaN == NaN)
        if isinstance(v, float):
            return ("float", struct.pack("<d", v))
        if isinstance(v, list | tuple):
            return (type(v).__name__, [shape(x) for x in v])
        if isinstance(v, dict):
            return ("dict", sorted((repr(shape(k)), shape(x)) for k, x in v.items()))
        return (type(v).__name__, v)

    assert shape(decode(encode(tree))) == shape(tree)


def test_a_generator_continues_its_stream() -> None:
    g = np.random.default_rng(42)
    g.normal(size=7)
    h = decode(encode(g))
    assert type(h.bit_generator) is type(g.bit_generator)
    assert np.array_equal(h.normal(size=20), g.normal(size=20))


def test_shared_objects_stay_shared_and_cycles_close() -> None:
    Node = make_class("test.node", 1, "tests.somewhere")
    a, b = Node(), Node()
    arr = np.zeros(3)
    a.peer, b.peer, a.arr, b.arr = b, a, arr, arr
    x, y = decode(encode([a, b]))
    assert x.peer is y and y.peer is x and x.arr is y.arr


def test_an_object_is_named_by_its_registration_not_its_module() -> None:
    """A class that moved (another module, the same registered name) reads what the old one wrote."""
    Old = make_class("test.moved", 1, "streamfed.old_place")
    o = Old()
    o.x, o.w = 3, np.array([1.0, 2.0])
    data = encode({"obj": o})
    assert b"old_place" not in data and b"Thing" not in data
    New = make_class("test.moved", 1, "streamfed.new_place")  # the same qualified name, elsewhere
    back = decode(data)["obj"]
    assert type(back) is New and back.x == 3 and back.w.tolist() == [1.0, 2.0]


def test_slots_and_getstate_setstate_are_honoured() -> None:
    S = make_class("test.slots", 1, "tests.x", slots=True)
    s = S()
    s.a = 1  # b never set: stays unset
    back = decode(encode(s))
    assert back.a == 1 and not hasattr(back, "b")

    @durable.durable("test.custom")
    class Custom:
        def __init__(self) -> None:
            self.cache = object()  # not stored: rebuilt by __setstate__
            self.n = 2

        def __getstate__(self) -> dict:
            return {"n": self.n}

        def __setstate__(self, state: dict) -> None:
            self.n, self.cache = state["n"], "rebuilt"

    back = decode(encode(Custom()))
    assert (back.n, back.cache) == (2, "rebuilt")


def test_migrations_upgrade_old_fields_one_version_at_a_time() -> None:
    V1 = make_class("test.migrated", 1, "tests.v1")
    o = V1()
    o.rate = 0.5
    data = encode(o)
    V3 = make_class("test.migrated", 3, "tests.v3")
    with pytest.raises(DurableError, match="no migration of test.migrated from schema version 1 to 2"):
        decode(data)
    migration("test.migrated", 1)(lambda f: {"eta": f["rate"]})
    migration("test.migrated", 2)(lambda f: {**f, "eta_squared": f["eta"] ** 2})
    back = decode(data)
    assert type(back) is V3 and vars(back) == {"eta": 0.5, "eta_squared": 0.25}
    make_class("test.migrated", 2, "tests.v2")  # an older build meets the newer file
    with pytest.raises(DurableError, match="schema version 3, this build knows up to 2"):
        decode(_with_version(data, 3))


def _with_version(data: bytes, version: int) -> bytes:
    """`data` (one object at version 1) rewritten to claim `version` (msgpack: a positive fixint after the name)."""
    i = data.index(b"test.migrated") + len(b"test.migrated")
    assert data[i] == 1
    return data[:i] + bytes([version]) + data[i + 1:]


def test_what_cannot_be_stored_is_refused_in_words() -> None:
    class Unregistered:
        pass

    with pytest.raises(DurableError, match=r"test_durable\.test_what_.*Unregistered: its class is not registered"):
        encode({"kind": "agent", "x": [Unregistered()]})
    with pytest.raises(DurableError, match="array of dtype object"):
        encode(np.array([None]))
    with pytest.raises(DurableError, match="cannot store a defaultdict"):
        import collections
        encode(collections.defaultdict(lambda: 1))
    make_class("test.node2", 1, "a")
    with pytest.raises(ValueError, match="durable name 'test.node2' is taken by a.Thing"):
        durable.durable("test.node2")(type("Other", (), {}))
    with pytest.raises(ValueError, match="durable name 'test.node2' is taken by a.Thing"):
        durable.durable("test.node2")(type("Thing", (), {"__module__": "b"}))  # the same name elsewhere


def forgotten(name: str) -> bytes:
    """A state body holding an object stored under `name`, whose class is then unregistered (a plug-in that is
    not loaded any more, or a file from a newer build)."""
    obj = make_class(name, 1, "tests.plugin")()
    body = encode({"kind": "agent", "x": obj})
    del durable._BY_NAME[name], durable._BY_CLASS[type(obj)]
    return body


def _file(body: bytes, version: int = FORMAT_VERSION) -> bytes:
    return MAGIC + struct.pack("<IQ", version, len(body)) + hashlib.sha256(body).digest() + body


def test_a_state_file_is_written_in_format_2_and_read_back() -> None:
    data = dumps({"kind": "agent", "w": np.arange(3.0)})
    assert struct.unpack_from("<I", data, len(MAGIC))[0] == FORMAT_VERSION == 2
    assert loads(data)["w"].tolist() == [0.0, 1.0, 2.0]
    with pytest.raises(DurableError, match="not registered"):
        dumps({"kind": "agent", "x": object()})


@pytest.mark.slow  # (the unknown name makes the reader import every module that could register it, once)
def test_a_damaged_or_foreign_format_2_file_is_never_loaded(tmp_path: Path) -> None:
    good = dumps({"kind": "agent", "w": np.arange(3.0)})
    flipped = bytearray(good)
    flipped[-5] ^= 0x01
    cases = {
        "flip": (bytes(flipped), "checksum mismatch"),
        "short": (good[:-1], "truncated"),
        "version 3": (_file(good[len(MAGIC) + 44:], 3), "format version 3, this build reads 1 and 2"),
        "unknown type": (_file(forgotten("test.gone")), "no class is registered as 'test.gone'"),
        "not msgpack": (_file(b"\xc1"), "cannot decode the body"),
        "not a record": (_file(encode([1, 2])), "not a state record"),
    }
    for what, (data, reason) in cases.items():
        p = tmp_path / f"{what}.state"
        p.write_bytes(data)
        with pytest.raises(StateError, match=reason):
            read_state(p)


def test_a_tensor_goes_through_an_array() -> None:
    """No state holds torch tensors today (URK, pFedGP and PVI keep NumPy arrays; tests/test_durable_states.py
    would refuse anything else); should one, it is stored as its array with its dtype and grad flag."""
    torch = pytest.importorskip("torch")
    t = torch.tensor([1.5, -0.0, float("nan")], dtype=torch.float64, requires_grad=True)
    p = torch.nn.Parameter(torch.arange(4.0).reshape(2, 2))
    back, bp = decode(encode([t, p]))
    assert back.dtype == torch.float64 and back.requires_grad
    assert back.detach().numpy().tobytes() == t.detach().numpy().tobytes()
    assert isinstance(bp, torch.nn.Parameter) and torch.equal(bp.detach(), p.detach())


def test_the_sensor_parser_resumes_its_order_and_duplicate_window() -> None:
    """The agent service stores its parser (columns, last timestamp, recent ids) in its state file."""
    from streamfed.fleet.columns import ColumnSpec
    from streamfed.fleet.sources import ReadingParser

    p = ReadingParser(columns=ColumnSpec.parse("site:category=a|b,rain:boolean"))
    assert p.parse(b'{"id": 1, "ts": 1000.0, "x": {"site": "b", "rain": "yes"}}').x.tolist() == [0.0, 1.0, 1.0]
    q = loads(dumps({"kind": "agent", "parser": p}))["parser"]
    assert q.parse(b'{"id": 1, "ts": 1001.0, "x": {"site": "a", "rain": "no"}}').reason == "duplicate"
    assert q.parse(b'{"id": 2, "ts": 999.0, "x": {"site": "a", "rain": "no"}}').reason == "out_of_order"
    assert q.parse(b'{"id": 3, "ts": 1002.0, "x": {"site": "a", "rain": "no"}}').x.tolist() == [1.0, 0.0, 0.0]


def test_columns_keep_their_time_zones() -> None:
    from streamfed.fleet.columns import ColumnSpec

    spec = ColumnSpec.parse("t:timestamp=Europe/Berlin|raw,u:timestamp=+08:00,v:timestamp")
    back = decode(encode(spec))
    values = ["2024-05-06T06:00:00Z", 1.7e9, "2024-01-01 23:30"]
    assert back == spec and back.encode(values).tobytes() == spec.encode(values).tobytes()


def test_a_name_not_yet_registered_is_resolved_on_demand() -> None:
    """A class registers when its module is imported: a resolver (the state reader's imports the project's
    modules) is asked for a name nobody registered before the decoder gives up."""
    data = forgotten("test.late")
    asked: list[str] = []

    def resolve(name: str) -> None:
        asked.append(name)
        if name == "test.late":
            make_class("test.late", 1, "tests.late_module")

    durable.add_resolver(resolve)
    try:
        assert type(decode(data)["x"]).__module__ == "tests.late_module" and asked == ["test.late"]
    finally:
        durable._RESOLVERS.remove(resolve)
