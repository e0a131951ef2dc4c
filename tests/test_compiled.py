"""The ahead-of-time kernel build (`streamfed.core.compiled`): it computes what numba's JIT computes, its
guards turn a wrong argument into a `TypeError` instead of a read of raw memory, a stale build is
never loaded, each kernel group (the core's, each family's, one registered later) finds its own build,
and an agent that has a build runs without numba (the point: memory)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import streamfed.algorithms.fedbnr._compiled
import streamfed.algorithms.fsgp._compiled
import streamfed.algorithms.pofmkl._compiled  # noqa: F401  (the families register their kernel groups)
from streamfed.core import compiled
from streamfed.core.compiled.build import build, clean

ROOT = Path(__file__).resolve().parents[1]
GROUPS = dict(compiled.groups())  # the core's and the three families'
ENTRIES = [e for g in GROUPS.values() for e in g.entries]


def test_every_family_registers_its_own_group():
    assert set(GROUPS) == {"features", "pofmkl", "fedbnr", "fsgp"}
    assert all(e.module.startswith("streamfed.core.") for e in GROUPS["features"].entries)
    for name in ("pofmkl", "fedbnr", "fsgp"):
        # a family's kernels live in its own private modules (FedBNR: the learner's and the upload check's)
        assert all(e.module.startswith(f"streamfed.algorithms.{name}._") for e in GROUPS[name].entries)
        assert any(e.module == f"streamfed.algorithms.{name}._kernels" for e in GROUPS[name].entries)
    used = {g.backend for g in GROUPS.values()}
    assert compiled.backend() == (used.pop() if len(used) == 1 else "mixed")
    assert compiled.BACKEND == compiled.backend()  # the former constant, still read by the benchmarks


@pytest.fixture(scope="module")
def aot():
    """The guarded functions of the build for the current sources (built here if missing), by group."""
    paths = build()
    assert set(paths) == set(GROUPS) and len({p.resolve() for p in paths.values()}) == 1  # one module
    return SimpleNamespace(**{name: compiled.aot_namespace(g.entries, compiled.load_aot(paths[name]))
                              for name, g in GROUPS.items()})


@pytest.fixture(scope="module")
def jit():
    return SimpleNamespace(**{name: compiled.jit_namespace(g.entries) for name, g in GROUPS.items()})


# A fixed workload through the learners' public API, run once per backend in a fresh process.
WORKLOAD = r"""
import json, sys
import numpy as np
from streamfed.core import compiled
from streamfed.core.features import RFFBank, gaussian_dictionary
from streamfed.algorithms.fedbnr.client import FedBNRClient
from streamfed.algorithms.fedbnr.server import FedBNRServer
from streamfed.algorithms.fsgp.client import FSGPClient
from streamfed.algorithms.fsgp.design import gaussian_design
from streamfed.algorithms.fsgp.kernels import Hyper
from streamfed.algorithms.pofmkl.client import POFMKLClient
from streamfed.algorithms.pofmkl.server import POFMKLServer
out = {"backend": compiled.backend(), "numba": None}
rng = np.random.default_rng(7)
X = rng.uniform(-2, 2, (600, 5)); y = np.sin(X.sum(axis=1)) + 0.1 * rng.standard_normal(600)
X.flags.writeable = False  # as the datasets hand them out
bank = RFFBank(gaussian_dictionary(6), 20, 5, seed=3)
client = POFMKLClient(bank, 0.05, 1e-4, 0.2, 2, rng=np.random.default_rng(1))
server = POFMKLServer(6, bank.dim)
preds, deltas = [], []
for t in range(600):
    preds.append(client.predict(X[t]))
    yhat, up = client.step(np.array(X[t]) if t % 2 else X[t], y[t])
    preds.append(yhat)
    deltas.append(up.delta.ravel().tolist())
    server.apply_round([up])
    if t % 50 == 49:
        client.set_global(server.global_params(), t)
out["pofmkl_preds"] = preds
out["pofmkl_theta"] = client.theta.ravel().tolist()
out["pofmkl_logw"] = client.logw.tolist()
out["pofmkl_server"] = server.theta.ravel().tolist()
out["features_many"] = bank.transform_many(X[:40]).ravel().tolist()
for k, forgetting in ((1, 1.0), (3, 0.995)):
    c = FedBNRClient(n_inputs=5, n_features=15, bandwidth=[0.5, 1.0, 2.0][:k], sigma=0.3, lam=1.0,
                     forgetting=forgetting, min_upload=50)
    means = []
    for t in range(300):
        means.append(list(c.predict(X[t])))
        means.append(list(c.learn_predict(X[t], y[t])))
    m, v = c.learn_many(np.array(X[300:450]), y[300:450])
    up = c.make_upload()
    srv = FedBNRServer.for_client(c)
    srv.apply(up)
    c.apply_global(srv.publish())
    means.append(list(c.predict(X[500])))
    out[f"fedbnr{k}_preds"] = means
    out[f"fedbnr{k}_batch"] = m.tolist() + v.tolist()
for kind in ("se", "matern52"):
    g = FSGPClient(Hyper.initial(kind, gaussian_design(8, 5), sigma=0.3), min_upload=10_000,
                   learn_hyperparameters=False)
    out[f"fsgp_{kind}"] = [v for t in range(200) for v in (*g.predict(X[t]), *g.learn(X[t], y[t]))]
out["numba"] = "numba" in sys.modules
print(json.dumps(out))
"""


def run_workload(backend: str) -> dict:
    env = {**os.environ, "STREAMFED_KERNELS": backend}
    res = subprocess.run([sys.executable, "-c", WORKLOAD], capture_output=True, text=True, cwd=ROOT, env=env,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_the_build_computes_what_the_jit_computes(aot):
    """Every learner path (POF-MKL steps, predictions, globals, the server's sums; FedBNR with one and
    three kernels, forgetting, the batch path, uploads and globals; FSGP's per-sample step) gives the
    same numbers."""
    a, j = run_workload("aot"), run_workload("jit")
    assert (a["backend"], j["backend"]) == ("aot", "jit")
    assert a["numba"] is False and j["numba"] is True  # the build really ran without numba
    for key in a:
        if key in ("backend", "numba"):
            continue
        got, want = np.asarray(a[key], dtype=float), np.asarray(j[key], dtype=float)
        assert got.shape == want.shape and got.size > 0, key
        assert np.all(np.isfinite(got)), key
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-13, err_msg=key)


def _valid_args(entry: compiled.Entry) -> list:
    args = []
    for code in entry.args:
        base, nd, _ = compiled.parse_arg(code)
        if nd == 0:
            args.append(1.0 if base == "f8" else 1)
        else:
            args.append(np.zeros((2,) * nd, dtype={"f8": np.float64, "i8": np.int64, "u1": np.uint8}[base]))
    return args


def _corrupt(arr: np.ndarray, how: str) -> object:
    if how == "dtype":
        return arr.astype(np.float32 if arr.dtype != np.float32 else np.float64)
    if how == "ndim":
        return arr.reshape(-1) if arr.ndim > 1 else arr.reshape(1, -1)
    if how == "strided":
        big = np.zeros(tuple(2 * s for s in arr.shape), dtype=arr.dtype)
        return big[tuple(slice(None, None, 2) for _ in arr.shape)]
    if how == "readonly":
        ro = arr.copy()
        ro.flags.writeable = False
        return ro
    if how == "list":
        return arr.tolist()
    return None


@settings(max_examples=60, deadline=None)
@given(i=st.integers(0, len(ENTRIES) - 1), pos=st.integers(0, 30),
       how=st.sampled_from(["dtype", "ndim", "strided", "readonly", "list", "none"]))
def test_a_wrong_argument_is_a_type_error_not_a_memory_read(aot, i, pos, how):
    entry = ENTRIES[i]
    arrays = [k for k, c in enumerate(entry.args) if compiled.parse_arg(c)[1] > 0]
    k = arrays[pos % len(arrays)]
    written = compiled.parse_arg(entry.args[k])[2]
    if how == "readonly" and not written:
        return  # reading a read-only array is fine
    args = _valid_args(entry)
    before = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    args[k] = _corrupt(args[k], how)
    with pytest.raises(TypeError, match=rf"{entry.name}: argument {k} must be"):
        getattr(getattr(aot, entry.group), entry.name)(*args)
    for j_, (a, b) in enumerate(zip(args, before, strict=True)):
        if j_ != k and isinstance(a, np.ndarray):
            np.testing.assert_array_equal(a, b)  # nothing was written


def test_guards_pass_scalars_and_kernel_errors_through(aot, jit):
    """Scalars are converted (an int where a float is expected), and the kernels' own checks still
    raise their `ValueError` (a short scratch buffer) on both backends."""
    wt = np.ones((3, 8))
    out = np.empty((2, 8))
    for ns in (aot, jit):
        with pytest.raises(ValueError, match="scratch"):
            ns.features.rff_transform_into(wt, np.zeros(3), np.empty(4), out)
    ra = np.eye(3)
    assert aot.fedbnr.log_evidence_from_factor(ra, 2, 1, 1) == jit.fedbnr.log_evidence_from_factor(ra, 2.0, 1.0, 1.0)
    with pytest.raises(TypeError):
        aot.fedbnr.solve_rt(ra, np.ones(3), np.empty(3), "2")


def test_a_build_is_named_by_its_sources(tmp_path, monkeypatch):
    """Changing one byte of a kernel source names a different build of that group only, so a stale one is
    never loaded; `STREAMFED_KERNELS=aot` without a build is a clear error, `auto` falls back to the JIT."""
    keys = {name: compiled.build_key(name) for name in GROUPS}
    copy = tmp_path / "streamfed"
    for rel in {*compiled.MECHANISM, *(s for g in GROUPS.values() for s in g.sources)}:
        (copy / rel).parent.mkdir(parents=True, exist_ok=True)
        (copy / rel).write_bytes((compiled._PKG / rel).read_bytes())
    monkeypatch.setattr(compiled, "_PKG", copy)
    assert {name: compiled.build_key(name) for name in GROUPS} == keys
    src = copy / "algorithms" / "pofmkl" / "_kernels.py"
    src.write_text(src.read_text() + "\n# one more line\n")
    changed = {name for name in GROUPS if compiled.build_key(name) != keys[name]}
    assert changed == {"pofmkl"}
    src = copy / "core" / "_feature_kernels.py"  # the families' kernels import the core's: all change
    src.write_text(src.read_text() + "\n# one more line\n")
    assert all(compiled.build_key(name) != keys[name] for name in GROUPS)
    empty = tmp_path / "no-builds"
    with pytest.raises(ImportError, match="no ahead-of-time kernel build"):
        compiled.load_aot(empty / "x.so")
    for mode, rc, needle in (("aot", 1, "STREAMFED_KERNELS=aot: kernel group 'features'"), ("auto", 0, "jit")):
        env = {**os.environ, "STREAMFED_KERNELS": mode, "STREAMFED_KERNEL_DIR": str(empty)}
        res = subprocess.run([sys.executable, "-c", "import streamfed.core.compiled as c; print(c.backend())"],
                             capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
        assert res.returncode == rc and needle in (res.stdout + res.stderr), res.stderr[-2000:]


def test_each_group_finds_its_build_through_the_index(aot, tmp_path, monkeypatch):
    """A group whose link is missing runs on the JIT (or is an error under `aot`) while the others load the
    build; `clean` keeps the current build and its links and deletes the rest."""
    kdir = tmp_path / "kernels"
    kdir.mkdir()
    module = GROUPS["features"].build_path().resolve()
    (kdir / module.name).write_bytes(module.read_bytes())
    for name in ("features", "fedbnr"):  # the pofmkl and fsgp links are missing
        (kdir / GROUPS[name].build_path().name).symlink_to(module.name)
    stale = kdir / f"{compiled.BUILD_PREFIX}0123456789abcdef0123{compiled.EXTENSION_SUFFIX}"
    stale.write_bytes(b"")
    (kdir / f"{compiled.BUILD_PREFIX}pofmkl_0123456789abcdef0123{compiled.EXTENSION_SUFFIX}").symlink_to(stale.name)
    script = ("import sys\nimport streamfed.algorithms.fedbnr.client, streamfed.algorithms.pofmkl.learner\n"
              "from streamfed.core import compiled\n"
              "print(compiled.backend(), {n: g.backend for n, g in compiled.groups().items()})")
    for mode in ("auto", "aot"):
        res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=300,
                             env={**os.environ, "STREAMFED_KERNELS": mode, "STREAMFED_KERNEL_DIR": str(kdir)})
        if mode == "auto":
            assert res.returncode == 0, res.stderr[-3000:]
            assert res.stdout.split()[0] == "mixed"
            assert "'features': 'aot', 'fedbnr': 'aot', 'pofmkl': 'jit'" in res.stdout, res.stdout
        else:
            assert res.returncode == 1 and "STREAMFED_KERNELS=aot: kernel group 'pofmkl'" in res.stderr, res.stderr
    monkeypatch.setenv("STREAMFED_KERNEL_DIR", str(kdir))
    gone = {p.name for p in clean()}
    assert gone == {stale.name, f"{compiled.BUILD_PREFIX}pofmkl_0123456789abcdef0123{compiled.EXTENSION_SUFFIX}"}
    assert sorted(p.name for p in kdir.iterdir()) == sorted(
        [module.name, GROUPS["features"].build_path().name, GROUPS["fedbnr"].build_path().name])


FAKE_KERNELS = """
import numba


@numba.njit(cache=False)
def scaled_sum(x, a):
    s = 0.0
    for v in x:
        s += a * v
    return s
"""


@pytest.mark.slow  # over 2 s: outside the pure tier, in every full run
def test_a_group_registered_after_the_core_loads_its_own(tmp_path, monkeypatch):
    """A kernel group registered later (a plug-in family) runs on the JIT until it has a build, then on its
    own build — guarded like the others — without touching the groups already registered."""
    monkeypatch.setattr(compiled, "_REGISTRY", dict(compiled._REGISTRY))  # forget the fake group afterwards
    monkeypatch.setenv("STREAMFED_KERNEL_DIR", str(tmp_path / "kernels"))
    monkeypatch.setenv("STREAMFED_KERNELS", "auto")
    monkeypatch.syspath_prepend(str(tmp_path))
    src = tmp_path / "streamfed_fake_kernels.py"
    src.write_text(FAKE_KERNELS)
    entries = (compiled.Entry("fake", "streamfed_fake_kernels", "scaled_sum", ("f8[1]", "f8")),)
    before = {name: g.namespace for name, g in compiled.groups().items()}
    ns = compiled.register("fake", entries, (str(src),))
    assert compiled.groups()["fake"].backend == "jit"
    assert ns.scaled_sum(np.arange(4.0), 2) == 12.0
    assert compiled.register("fake", entries, (str(src),)) is ns  # again: the same functions
    with pytest.raises(ValueError, match="already registered"):
        compiled.register("fake", entries[:0], (str(src),))
    assert compiled.backend() in ("jit", "mixed")
    paths = build(names=["fake"])
    assert paths["fake"].is_file() and paths["fake"].is_symlink()
    monkeypatch.setattr(compiled, "_REGISTRY", {k: v for k, v in compiled._REGISTRY.items() if k != "fake"})
    ns = compiled.register("fake", entries, (str(src),))
    assert compiled.groups()["fake"].backend == "aot"
    assert ns.scaled_sum(np.arange(4.0), 2) == 12.0
    with pytest.raises(TypeError, match="scaled_sum: argument 0 must be"):
        ns.scaled_sum(np.arange(4), 2.0)
    assert {name: g.namespace for name, g in compiled.groups().items() if name != "fake"} == before
    with pytest.raises(ValueError, match="identifier"):
        compiled.register("fake-2", (), ())


AGENT = r"""
import sys
import numpy as np
import streamfed.runtime.agent  # noqa: F401
from streamfed.fleet.agent import AgentCore
from streamfed.fleet.config import FleetConfig
from streamfed.fleet.sources import Reading
extra = {"bin_size": 2} if sys.argv[1] == "pofmkl" else {}  # M: POF-MKL's setting only
cfg = FleetConfig(standardise="none",
                  fleet="m", algorithm=sys.argv[1], n_inputs=4, n_kernels=3, n_features=16, **extra)
core = AgentCore(cfg, "a1", 0)
core.warm_up()
rng = np.random.default_rng(0)
for i in range(200):
    core.on_reading(Reading(f"r{i}", rng.uniform(-1, 1, 4), 0.0, float(rng.normal())))
maps = open("/proc/self/maps").read()
print("numba" in sys.modules, "llvmlite" in maps, "numba" in maps)
"""


@pytest.mark.parametrize("algorithm", ["pofmkl", "fedbnr"])
def test_an_agent_with_a_build_never_loads_numba_or_llvm(aot, algorithm):
    for mode, want in (("auto", "False False False"), ("jit", "True True True")):
        res = subprocess.run([sys.executable, "-c", AGENT, algorithm], capture_output=True, text=True, cwd=ROOT,
                             env={**os.environ, "STREAMFED_KERNELS": mode}, timeout=300)
        assert res.returncode == 0, res.stderr[-3000:]
        assert res.stdout.strip().splitlines()[-1] == want, (mode, res.stdout)


def test_an_agent_runs_where_writable_memory_can_never_become_executable(aot, tmp_path):
    """What the systemd unit's `MemoryDenyWriteExecute=yes` enforces, enforced here by the kernel itself
    (`prctl(PR_SET_MDWE)`, Linux ≥ 6.3) before anything is imported: an agent on the build learns; on the
    JIT it cannot even import numba (LLVM must make the code it writes executable)."""
    mdwe = ("import ctypes, sys\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            "assert libc.prctl(65, 1, 0, 0, 0) == 0, ctypes.get_errno()  # PR_SET_MDWE, REFUSE_EXEC_GAIN\n")
    script = tmp_path / "agent_mdwe.py"
    script.write_text(mdwe + AGENT)
    ok = subprocess.run([sys.executable, str(script), "pofmkl"], capture_output=True, text=True, cwd=ROOT,
                        env={**os.environ, "STREAMFED_KERNELS": "aot"}, timeout=300)
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert ok.stdout.strip().splitlines()[-1] == "False False False"
    jit = subprocess.run([sys.executable, str(script), "pofmkl"], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "STREAMFED_KERNELS": "jit"}, timeout=300)
    assert jit.returncode != 0 and "executable memory" in jit.stderr, jit.stderr[-3000:]
