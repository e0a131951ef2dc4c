"""Compile the registered kernel groups of :mod:`streamfed.core.compiled` ahead of time (numba's `pycc`).

A build is ONE extension module holding every group registered in this process (the core's own, and
those of the modules imported before: `streamfed kernels build` imports every algorithm family's
``_compiled`` module first), named by a hash of the groups' own hashes, plus an index: one link per group,
``_streamfed_kernels_<group>_<its hash><suffix>``, to that module. A group finds its build through its link,
knowing nothing of the others. One module rather than one per group: `pycc` spends ~2.5 s and ~0.7 MB of
support code on every module, so per-group modules doubled the build time and an agent would map one
such copy per group it uses.

Each entry is exported as a thin function that calls the numba dispatcher, so the kernel keeps its own
options (`fastmath`, `error_model`, inlining) and is compiled by the same numba pipeline as under the
JIT; the export's return type is the one numba infers for the table's argument types. Code is generated
for this machine's CPU (as the JIT does), which is why the CPU is part of the build's name.

`numba.pycc` is deprecated upstream (it still ships with numba 0.68). When it goes, this module is the
one to replace; the tables, the index, the guards and the backend choice in :mod:`streamfed.core.compiled` stay.

>>> from streamfed.core.compiled.build import numba_signature
>>> [str(t) for t in numba_signature(("!f8[2]", "i8"))]
['array(float64, 2d, C)', 'int64']
"""

from __future__ import annotations

import hashlib
import importlib
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from streamfed.core.compiled import BUILD_PREFIX, EXTENSION_SUFFIX, Entry, groups, kernel_dir, parse_arg


def numba_signature(args: tuple[str, ...]) -> tuple[Any, ...]:
    """The numba argument types of a table entry."""
    from numba.core import types

    scalars = {"f8": types.float64, "i8": types.int64, "u1": types.uint8}
    out = []
    for code in args:
        base, nd, _ = parse_arg(code)
        out.append(scalars[base] if nd == 0 else types.Array(scalars[base], nd, "C"))
    return tuple(out)


def _module_name(keys: dict[str, str]) -> str:
    """The build's module name: a hash of the groups it holds and their hashes."""
    joined = "|".join(f"{name}:{key}" for name, key in sorted(keys.items()))
    return f"{BUILD_PREFIX}{hashlib.sha256(joined.encode()).hexdigest()[:20]}"


def _link(link: Path, target: Path) -> None:
    """Point `link` at `target` (same folder, relative) atomically: a reader sees the old link or the new."""
    tmp = link.with_name(f".{link.name}.{os.getpid()}")
    tmp.unlink(missing_ok=True)
    os.symlink(target.name, tmp)
    os.replace(tmp, link)


def build(force: bool = False, verbose: bool = False, names: Iterable[str] | None = None) -> dict[str, Path]:
    """Compile every registered group (or those `names`) into one build and link each group's entry of the
    index to it; returns those entries, by group. Nothing is compiled when every group already has a build
    of its current sources, unless `force`. Writes to a temporary folder, then renames, so a reader never
    sees half a file."""
    todo = [groups()[n] for n in (groups() if names is None else names)]
    keys = {g.name: g.key() for g in todo}
    links = {g.name: g.build_path(keys[g.name]) for g in todo}
    # every group built, and into one module: groups whose builds came from different source trees (another
    # checkout sharing the cache) would load several modules, each with every kernel — the memory a build saves
    if not force and all(p.is_file() for p in links.values()) and len({p.resolve() for p in links.values()}) == 1:
        return links
    exports = [e.export_name for g in todo for e in g.entries]
    if len(set(exports)) != len(exports):
        raise ValueError(f"two kernels export the same name: {sorted({n for n in exports if exports.count(n) > 1})}")
    module = _module_name(keys)
    target = kernel_dir() / f"{module}{EXTENSION_SUFFIX}"
    kernel_dir().mkdir(parents=True, exist_ok=True)
    if force or not target.is_file():
        _compile(module, target, [e for g in todo for e in g.entries], verbose)
    for link in links.values():
        _link(link, target)
    return links


def _compile(module: str, target: Path, entries: list[Entry], verbose: bool) -> None:
    import llvmlite.binding as ll
    from numba.core.errors import NumbaPendingDeprecationWarning

    with warnings.catch_warnings():  # pycc is pending deprecation (see the module's docstring)
        warnings.simplefilter("ignore", NumbaPendingDeprecationWarning)
        from numba.pycc import CC

        cc = CC(module)
    cc.target_cpu = ll.get_host_cpu_name()
    cc.verbose = verbose
    for entry in entries:
        fn = getattr(importlib.import_module(entry.module), entry.name)
        argtypes = numba_signature(entry.args)
        fn.compile(argtypes)
        ret = fn.overloads[argtypes].signature.return_type
        names = [f"a{i}" for i in range(len(argtypes))]
        ns: dict[str, Any] = {"_fn": fn}
        exec(f"def export({', '.join(names)}):\n    return _fn({', '.join(names)})", ns)  # noqa: S102
        cc.export(entry.export_name, ret(*argtypes))(ns["export"])
    with tempfile.TemporaryDirectory(dir=kernel_dir()) as tmp:
        cc.output_dir = tmp
        cc.output_file = target.name
        t0 = time.perf_counter()
        cc.compile()
        if verbose:
            print(f"compiled {len(entries)} kernels in {time.perf_counter() - t0:.1f} s")
        os.replace(Path(tmp) / target.name, target)


def clean(keep_current: bool = True) -> list[Path]:
    """Delete builds of other sources and their links (all of them unless `keep_current`); returns what was
    deleted. Only the groups registered in this process are current: register them all first."""
    keep: set[Path] = set()
    if keep_current:
        for g in groups().values():
            link = g.build_path()
            if link.is_file():
                keep |= {link, link.resolve()}
    gone = []
    for p in sorted(kernel_dir().glob(f"{BUILD_PREFIX}*")):
        if p in keep or (not p.is_symlink() and p.resolve() in keep):
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()
        gone.append(p)
    return gone
