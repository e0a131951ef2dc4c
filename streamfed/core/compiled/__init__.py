"""Where the learners get their compiled loops: an ahead-of-time build, or numba's JIT.

The per-sample kernels are numba functions (`streamfed/core/_feature_kernels.py`,
`streamfed/algorithms/pofmkl/_kernels.py`, `streamfed/algorithms/fedbnr/_kernels.py`,
`streamfed/algorithms/fsgp/_kernels.py`), written to be read
against docs/algorithms.md. Run through numba's JIT they need numba and LLVM in the process: ~140 MB of
an edge agent's resident memory before it learns anything. `streamfed kernels build`
(:mod:`streamfed.core.compiled.build`) compiles the same functions ahead of time, with numba, into one
extension module; a process that finds a build made from the current sources loads it and never
imports numba.

The table below is the one list of functions called from Python, with their argument types. An
ahead-of-time function does no type checking of its own (a wrong dtype or layout would be read as
raw memory), so each is called through a guard that checks every argument against the table and
raises `TypeError` — the JIT would have compiled a new specialisation instead.

Which backend: ``STREAMFED_KERNELS=auto`` (default: the build if there is one for these sources,
else the JIT), ``aot`` (the build or an error) or ``jit``. Builds live in ``STREAMFED_KERNEL_DIR``
(default ``$XDG_CACHE_HOME/streamfed/kernels``), named by a hash of the kernel sources, the numba,
llvmlite and numpy versions, the Python version and the CPU, so a stale build is never loaded.

>>> from streamfed.core import compiled
>>> compiled.BACKEND in ("aot", "jit")
True
>>> import numpy as np
>>> out = np.empty(1)
>>> ok = compiled.pofmkl.row_sq_norms(np.array([[3.0, 4.0]]), out)
>>> bool(ok), float(out[0])
(True, 25.0)
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import importlib.metadata
import importlib.util
import operator
import os
import platform
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import numpy as np

__all__ = ["BACKEND", "ENTRIES", "Entry", "build_key", "build_path", "features", "fedbnr", "fsgp", "kernel_dir",
           "load_aot", "pofmkl"]

_PKG = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Entry:
    """One kernel called from Python: `group.name` is `module.name`, with argument types `args`.

    Argument codes: ``f8``/``i8`` a float64/int64 scalar; ``f8[2]`` a C-contiguous float64 array
    of 2 dimensions (``i8[1]``, ``u1[1]``… likewise); a leading ``!`` marks an array the kernel writes.
    """

    group: str
    module: str
    name: str
    args: tuple[str, ...]

    @property
    def export_name(self) -> str:
        return f"{self.group}__{self.name}"


_FK = "streamfed.core._feature_kernels"
_PK = "streamfed.algorithms.pofmkl._kernels"
_BK = "streamfed.algorithms.fedbnr._kernels"
_GK = "streamfed.algorithms.fsgp._kernels"

ENTRIES: tuple[Entry, ...] = (
    Entry("features", _FK, "rff_transform_into", ("f8[2]", "f8[1]", "!f8[1]", "!f8[2]")),
    Entry("features", _FK, "rff_transform_many", ("f8[2]", "f8[2]", "!f8[3]")),
    Entry("pofmkl", _PK, "pofmkl_step_packed", ("f8[2]", "f8[1]", "f8", "!f8[1]", "!i8[1]")),
    Entry("pofmkl", _PK, "pofmkl_predict",
          ("f8[2]", "f8[1]", "f8[2]", "f8[1]", "!f8[1]", "!f8[1]", "!f8[1]", "!f8[1]", "f8")),
    Entry("pofmkl", _PK, "accumulate_checked", ("!f8[2]", "i8[1]", "f8[2]")),
    Entry("pofmkl", _PK, "row_sq_norms", ("f8[2]", "!f8[1]")),
    Entry("fedbnr", _BK, "all_finite", ("f8[1]",)),
    Entry("fedbnr", _BK, "same_vector", ("f8[1]", "f8[1]")),
    Entry("fedbnr", _BK, "solve_rt", ("f8[2]", "f8[1]", "!f8[1]", "i8")),
    Entry("fedbnr", _BK, "log_evidence_from_factor", ("f8[2]", "f8", "f8", "f8")),
    Entry("fedbnr", _BK, "predict_mixture", ("f8[3]", "f8[2]", "f8[1]", "f8[1]", "!f8[1]", "!f8[1]", "!f8[1]")),
    Entry("fedbnr", _BK, "rff_bias_features", ("f8[2]", "f8[1]", "!f8[1]", "!f8[2]")),
    Entry("fedbnr", _BK, "flush", ("!f8[3]", "!f8[2]", "f8[3]", "f8[1]", "i8")),
    Entry("fedbnr", _BK, "learn_batch",
          ("!f8[3]", "!f8[3]", "!f8[2]", "!f8[3]", "!f8[1]", "i8", "f8[3]", "f8[1]", "f8[1]", "f8[1]", "f8", "f8",
           "!f8[1]", "i8", "!f8[1]", "!f8[1]", "!f8[1]")),
    Entry("fedbnr", _BK, "packed_predict", ("!f8[1]", "f8[1]")),
    Entry("fedbnr", _BK, "packed_learn", ("!f8[1]", "f8")),
    Entry("fedbnr", _BK, "packed_step", ("!f8[1]", "f8[1]", "f8")),
    Entry("fsgp", _GK, "covariance_column", ("f8[2]", "f8[1]", "f8", "i8", "f8[1]", "!f8[1]")),
    Entry("fsgp", _GK, "step",
          ("f8[2]", "f8[1]", "f8[1]", "i8", "f8[1]", "f8", "f8[2]", "!f8[2]", "!f8[2]", "i8", "i8", "!f8[1]",
           "!f8[1]")),
)
GROUPS = ("features", "pofmkl", "fedbnr", "fsgp")

# What a build is made from: the kernel sources (and what they import), this table and the builder.
SOURCES = ("core/_feature_kernels.py", "core/numerics.py", "algorithms/pofmkl/_kernels.py",
           "algorithms/pofmkl/_layout.py", "algorithms/fedbnr/_kernels.py", "algorithms/fedbnr/_layout.py",
           "algorithms/fsgp/_kernels.py",
           "core/compiled/__init__.py", "core/compiled/build.py")

_DTYPES = {"f8": np.dtype(np.float64), "i8": np.dtype(np.int64), "u1": np.dtype(np.uint8)}


def parse_arg(code: str) -> tuple[str, int, bool]:
    """`(dtype code, ndim (0 for a scalar), written)` of an argument code."""
    written = code.startswith("!")
    code = code.lstrip("!")
    if "[" in code:
        base, nd = code[:-1].split("[")
        return base, int(nd), written
    return code, 0, written


def _cpu_signature() -> str:
    """The CPU model and its flags: a build uses the host's instruction set (AVX2, FMA…)."""
    try:
        with open("/proc/cpuinfo") as fh:
            lines = [ln for ln in fh if ln.startswith(("model name", "flags", "Features", "CPU part"))]
        return "".join(sorted(set(lines)))
    except OSError:
        return platform.processor() or platform.machine()


def build_key() -> str:
    """Hash naming a build: sources, table, numba/llvmlite/numpy versions, Python, platform and CPU."""
    h = hashlib.sha256()
    for rel in SOURCES:
        h.update(rel.encode())
        h.update((_PKG / rel).read_bytes())
    for dist in ("numba", "llvmlite", "numpy"):
        try:
            h.update(f"{dist}={importlib.metadata.version(dist)}".encode())
        except importlib.metadata.PackageNotFoundError:
            h.update(f"{dist}=none".encode())
    h.update(f"{sys.version}|{sys.implementation.cache_tag}|{platform.machine()}".encode())
    h.update(_cpu_signature().encode())
    return h.hexdigest()[:20]


def kernel_dir() -> Path:
    """Folder of the builds: ``STREAMFED_KERNEL_DIR``, else ``$XDG_CACHE_HOME/streamfed/kernels``."""
    env = os.environ.get("STREAMFED_KERNEL_DIR")
    if env:
        return Path(env)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "streamfed" / "kernels"


def module_name(key: str | None = None) -> str:
    return f"_streamfed_kernels_{key or build_key()}"


def build_path(key: str | None = None) -> Path:
    """Where the build of these sources is (or would be)."""
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    return kernel_dir() / f"{module_name(key)}{suffix}"


def _guard(fn: Callable[..., Any], entry: Entry) -> Callable[..., Any]:
    """`fn` behind a check of every argument against `entry.args` (generated code: one `if` per
    argument, so the cost is a few attribute reads per array)."""
    lines, checks = [], []
    names = [f"a{i}" for i in range(len(entry.args))]
    ns: dict[str, Any] = {"_fn": fn, "_ndarray": np.ndarray, "_bad": _bad_argument, "_entry": entry,
                          "_float": float, "_index": operator.index}
    call = []
    for i, code in enumerate(entry.args):
        base, nd, written = parse_arg(code)
        a = names[i]
        if nd == 0:
            call.append(f"_float({a})" if base == "f8" else f"_index({a})")
            continue
        ns[f"_dt{i}"] = _DTYPES[base]
        cond = (f"type({a}) is not _ndarray or {a}.ndim != {nd} or ({a}.dtype is not _dt{i} and {a}.dtype != _dt{i})"
                f" or not {a}.flags.c_contiguous")
        if written:
            cond += f" or not {a}.flags.writeable"
        checks.append(f"    if {cond}:\n        _bad(_entry, {i}, {a})")
        call.append(a)
    lines.append(f"def {entry.name}({', '.join(names)}):")
    lines += checks
    lines.append(f"    return _fn({', '.join(call)})")
    exec("\n".join(lines), ns)  # noqa: S102 - code generated from the fixed table above
    guarded = ns[entry.name]
    guarded.__doc__ = f"{entry.module}.{entry.name}, ahead-of-time build (arguments checked)."
    guarded.__wrapped__ = fn
    return guarded


def _bad_argument(entry: Entry, i: int, value: Any) -> None:
    base, nd, written = parse_arg(entry.args[i])
    want = f"a C-contiguous{' writable' if written else ''} {_DTYPES[base]} array of {nd} dimension(s)"
    if isinstance(value, np.ndarray):
        got = (f"{value.dtype} array of shape {value.shape}, C-contiguous={value.flags.c_contiguous}, "
               f"writable={value.flags.writeable}")
    else:
        got = type(value).__name__
    raise TypeError(f"{entry.module}.{entry.name}: argument {i} must be {want}, got {got}")


def load_aot(path: Path | None = None) -> ModuleType:
    """The extension module of the build for the current sources (`ImportError` if there is none)."""
    path = path or build_path()
    if not path.is_file():
        raise ImportError(f"no ahead-of-time kernel build at {path} (run `streamfed kernels build`)")
    name = path.name.split(".")[0]
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    sys.modules[name] = mod
    return mod


def aot_namespaces(mod: ModuleType) -> dict[str, SimpleNamespace]:
    """The guarded functions of a build, by group."""
    out = {g: SimpleNamespace() for g in GROUPS}
    for e in ENTRIES:
        setattr(out[e.group], e.name, _guard(getattr(mod, e.export_name), e))
    return out


def jit_namespaces() -> dict[str, SimpleNamespace]:
    """numba's JIT dispatchers, by group (imports numba)."""
    out = {g: SimpleNamespace() for g in GROUPS}
    for e in ENTRIES:
        setattr(out[e.group], e.name, getattr(importlib.import_module(e.module), e.name))
    return out


def _select() -> tuple[str, dict[str, SimpleNamespace]]:
    mode = os.environ.get("STREAMFED_KERNELS", "auto").strip().lower()
    if mode not in ("auto", "aot", "jit"):
        raise ValueError(f"STREAMFED_KERNELS must be auto, aot or jit, not {mode!r}")
    if mode != "jit":
        try:
            return "aot", aot_namespaces(load_aot())
        except ImportError as exc:
            if mode == "aot":
                raise ImportError(f"STREAMFED_KERNELS=aot: {exc}") from exc
    return "jit", jit_namespaces()


BACKEND, _NS = _select()
features: SimpleNamespace = _NS["features"]
pofmkl: SimpleNamespace = _NS["pofmkl"]
fedbnr: SimpleNamespace = _NS["fedbnr"]
fsgp: SimpleNamespace = _NS["fsgp"]
