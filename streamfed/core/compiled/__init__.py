"""Where the learners get their compiled loops: an ahead-of-time build, or numba's JIT.

The per-sample kernels are numba functions, written to be read against docs/algorithms.md. Run through
numba's JIT they need numba and LLVM in the process: ~140 MB of an edge agent's resident memory before it
learns anything. `streamfed kernels build` (:mod:`streamfed.core.compiled.build`) compiles the same
functions ahead of time, with numba, into one extension module; a process that finds a build made from the
current sources loads it and never imports numba.

Kernels come in groups, and each owner registers its own with :func:`register`: this module registers the
core's (``features``, from ``streamfed/core/_feature_kernels.py``); an algorithm family registers its group
from its ``_compiled`` module (``kern = register("pofmkl", ENTRIES, SOURCES)``), which its learner imports.
A group's table (:class:`Entry`) is the one list of its functions called from Python, with their argument
types. An ahead-of-time function does no type checking of its own (a wrong dtype or layout would be read
as raw memory), so each is called through a guard that checks every argument against the table and
raises `TypeError` — the JIT would have compiled a new specialisation instead.

A build is one extension module holding every group registered when it was made (`streamfed kernels
build` registers all the algorithm families' groups first), with an index: one link per group, named by
the group and a hash of its table, its kernel sources (and what they import), this mechanism's sources,
the numba, llvmlite and numpy versions, the Python version and the CPU, pointing at the module. So a group
finds its build without knowing the others, a stale build is never loaded, and a process loads the one
module however many groups it uses. Which backend, decided per group when it registers:
``STREAMFED_KERNELS=auto`` (default: the group's build if there is one for its sources, else the JIT),
``aot`` (the build or an `ImportError`) or ``jit``. Builds live in ``STREAMFED_KERNEL_DIR`` (default
``$XDG_CACHE_HOME/streamfed/kernels``). :func:`backend` says what the process runs on.

>>> from streamfed.core import compiled
>>> compiled.backend() in ("aot", "jit", "mixed"), "features" in compiled.groups()
(True, True)
>>> import numpy as np
>>> out = np.empty((1, 2))
>>> compiled.features.rff_transform_into(np.zeros((1, 1)), np.zeros(1), np.empty(2), out)
>>> out.tolist()
[[0.0, 1.0]]
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.machinery
import importlib.metadata
import importlib.util
import operator
import os
import platform
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType, ModuleType, SimpleNamespace
from typing import Any

import numpy as np

__all__ = ["ENTRIES", "SOURCES", "Entry", "Group", "backend", "build_key", "build_path", "features", "groups",
           "kernel_dir", "load_aot", "register"]

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


# The core's own group: the feature maps' kernels (streamfed.core.features uses them) and the online
# standardiser's (streamfed.core.standardise).
_FK = "streamfed.core._feature_kernels"
_SK = "streamfed.core._scale_kernels"
ENTRIES: tuple[Entry, ...] = (
    Entry("features", _FK, "rff_transform_into", ("f8[2]", "f8[1]", "!f8[1]", "!f8[2]")),
    Entry("features", _FK, "rff_transform_many", ("f8[2]", "f8[2]", "!f8[3]")),
    Entry("features", _SK, "standardise_row", ("f8[1]", "f8[1]", "i8", "f8", "f8[1]", "!f8[1]")),
    Entry("features", _SK, "welford_row", ("f8[1]", "f8[1]", "i8", "f8[1]", "!f8[1]", "!f8[1]")),
)
# What a group's build is made from, as paths under the streamfed package (or absolute): its kernel
# sources and what they import. The mechanism's own sources are part of every group's build.
SOURCES: tuple[str, ...] = ("core/_feature_kernels.py", "core/numerics.py", "core/_scale_kernels.py")
MECHANISM: tuple[str, ...] = ("core/compiled/__init__.py", "core/compiled/build.py")

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


@functools.cache
def _toolchain() -> bytes:
    """What every build also depends on: numba/llvmlite/numpy versions, Python, platform and CPU."""
    parts = []
    for dist in ("numba", "llvmlite", "numpy"):
        try:
            parts.append(f"{dist}={importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            parts.append(f"{dist}=none")
    parts.append(f"{sys.version}|{sys.implementation.cache_tag}|{platform.machine()}")
    parts.append(_cpu_signature())
    return "".join(parts).encode()


def source_key(group: str, entries: Iterable[Entry], sources: Iterable[str]) -> str:
    """Hash naming a group's build: the group, its table, its sources and the mechanism's, the toolchain."""
    h = hashlib.sha256(group.encode())
    h.update(repr(tuple(entries)).encode())
    for rel in (*MECHANISM, *sources):
        h.update(rel.encode())
        h.update((_PKG / rel).read_bytes())
    h.update(_toolchain())
    return h.hexdigest()[:20]


def kernel_dir() -> Path:
    """Folder of the builds: ``STREAMFED_KERNEL_DIR``, else ``$XDG_CACHE_HOME/streamfed/kernels``."""
    env = os.environ.get("STREAMFED_KERNEL_DIR")
    if env:
        return Path(env)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "streamfed" / "kernels"


BUILD_PREFIX = "_streamfed_kernels_"  # of the builds (extension modules) and of their index (links)
EXTENSION_SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


@dataclass(frozen=True)
class Group:
    """A registered group of kernels: its table, its sources, the backend it runs on and its functions."""

    name: str
    entries: tuple[Entry, ...]
    sources: tuple[str, ...]
    backend: str  # "aot" or "jit"
    namespace: SimpleNamespace

    def key(self) -> str:
        """Hash of what its build is made from (read from the files now)."""
        return source_key(self.name, self.entries, self.sources)

    def build_path(self, key: str | None = None) -> Path:
        """Its entry in the index of builds, for its current sources: a link to the extension module that
        holds its functions (present or not)."""
        return kernel_dir() / f"{BUILD_PREFIX}{self.name}_{key or self.key()}{EXTENSION_SUFFIX}"


_REGISTRY: dict[str, Group] = {}


def groups() -> MappingProxyType[str, Group]:
    """The registered groups, by name, in the order they registered."""
    return MappingProxyType(_REGISTRY)


def build_key(group: str = "features") -> str:
    """Hash naming the build of a registered group's current sources."""
    return _REGISTRY[group].key()


def build_path(group: str = "features") -> Path:
    """A registered group's entry in the index of builds, for its current sources (present or not)."""
    return _REGISTRY[group].build_path()


def backend() -> str:
    """What this process runs its registered kernels on: ``"aot"`` (every group on its ahead-of-time
    build), ``"jit"`` (none) or ``"mixed"``. Groups register when their owner is imported: import the
    learners first."""
    used = {g.backend for g in _REGISTRY.values()}
    return used.pop() if len(used) == 1 else "mixed"


def __getattr__(name: str) -> Any:
    if name == "BACKEND":  # the former constant, for older callers (benchmarks): read `backend()` instead
        return backend()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
    exec("\n".join(lines), ns)  # noqa: S102 - code generated from a kernel table
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


def load_aot(path: Path) -> ModuleType:
    """The extension module of a build: `path` is the module or a link to it (a group's entry in the index);
    `ImportError` if there is none. A module is loaded once, whichever groups' links lead to it."""
    if not path.is_file():
        raise ImportError(f"no ahead-of-time kernel build at {path} (run `streamfed kernels build`)")
    path = path.resolve()
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


def aot_namespace(entries: Iterable[Entry], mod: ModuleType) -> SimpleNamespace:
    """The guarded functions of a group's build."""
    return SimpleNamespace(**{e.name: _guard(getattr(mod, e.export_name), e) for e in entries})


def jit_namespace(entries: Iterable[Entry]) -> SimpleNamespace:
    """numba's JIT dispatchers of a group (imports numba)."""
    return SimpleNamespace(**{e.name: getattr(importlib.import_module(e.module), e.name) for e in entries})


def _mode() -> str:
    mode = os.environ.get("STREAMFED_KERNELS", "auto").strip().lower()
    if mode not in ("auto", "aot", "jit"):
        raise ValueError(f"STREAMFED_KERNELS must be auto, aot or jit, not {mode!r}")
    return mode


def register(group: str, entries: Iterable[Entry], sources: Iterable[str]) -> SimpleNamespace:
    """Register a group of kernels and return its functions: the guarded ones of its build when there is
    one for its current sources (and ``STREAMFED_KERNELS`` is not ``jit``), else numba's JIT dispatchers
    (`ImportError` under ``STREAMFED_KERNELS=aot``). `sources` are the files its kernels are made from
    (paths under the streamfed package, or absolute). Registering the same table again returns the same
    functions; another table under a taken name is a `ValueError`."""
    entries, sources = tuple(entries), tuple(sources)
    if not group.isidentifier():
        raise ValueError(f"a kernel group's name must be an identifier, not {group!r}")
    if any(e.group != group for e in entries):
        raise ValueError(f"every entry of group {group!r} must say so: {[e for e in entries if e.group != group]}")
    old = _REGISTRY.get(group)
    if old is not None:
        if (old.entries, old.sources) != (entries, sources):
            raise ValueError(f"a different kernel group named {group!r} is already registered")
        return old.namespace
    probe = Group(group, entries, sources, "jit", SimpleNamespace())
    mode = _mode()
    chosen = None
    if mode != "jit":
        try:
            chosen = Group(group, entries, sources, "aot", aot_namespace(entries, load_aot(probe.build_path())))
        except ImportError as exc:
            if mode == "aot":
                raise ImportError(f"STREAMFED_KERNELS=aot: kernel group {group!r}: {exc}") from exc
    if chosen is None:
        chosen = Group(group, entries, sources, "jit", jit_namespace(entries))
    _REGISTRY[group] = chosen
    return chosen.namespace


features: SimpleNamespace = register("features", ENTRIES, SOURCES)
