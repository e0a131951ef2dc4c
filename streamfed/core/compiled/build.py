"""Compile the kernels of :data:`streamfed.core.compiled.ENTRIES` ahead of time (numba's `pycc`).

Each entry is exported as a thin function that calls the numba dispatcher, so the kernel keeps its own
options (`fastmath`, `error_model`, inlining) and is compiled by the same numba pipeline as under the
JIT; the export's return type is the one numba infers for the table's argument types. Code is generated
for this machine's CPU (as the JIT does), which is why the CPU is part of the build's name.

`numba.pycc` is deprecated upstream (it still ships with numba 0.68). When it goes, this module is the
one to replace; the table, the guards and the backend choice in :mod:`streamfed.core.compiled` stay.

>>> from streamfed.core.compiled.build import numba_signature
>>> [str(t) for t in numba_signature(("!f8[2]", "i8"))]
['array(float64, 2d, C)', 'int64']
"""

from __future__ import annotations

import importlib
import os
import shutil
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from streamfed.core.compiled import ENTRIES, build_key, build_path, kernel_dir, module_name, parse_arg


def numba_signature(args: tuple[str, ...]) -> tuple[Any, ...]:
    """The numba argument types of a table entry."""
    from numba.core import types

    scalars = {"f8": types.float64, "i8": types.int64, "u1": types.uint8}
    out = []
    for code in args:
        base, nd, _ = parse_arg(code)
        out.append(scalars[base] if nd == 0 else types.Array(scalars[base], nd, "C"))
    return tuple(out)


def build(force: bool = False, verbose: bool = False) -> Path:
    """Compile every entry into the build for the current sources; returns its path (an existing build
    is kept unless `force`). Writes to a temporary folder, then renames, so a reader never sees half a file."""
    import llvmlite.binding as ll
    from numba.core.errors import NumbaPendingDeprecationWarning

    with warnings.catch_warnings():  # pycc is pending deprecation (see the module's docstring)
        warnings.simplefilter("ignore", NumbaPendingDeprecationWarning)
        from numba.pycc import CC

    key = build_key()
    target = build_path(key)
    if target.is_file() and not force:
        return target
    kernel_dir().mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NumbaPendingDeprecationWarning)
        cc = CC(module_name(key))
    cc.target_cpu = ll.get_host_cpu_name()
    cc.verbose = verbose
    for entry in ENTRIES:
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
            print(f"compiled {len(ENTRIES)} kernels in {time.perf_counter() - t0:.1f} s")
        part = Path(tmp) / target.name
        os.replace(part, target)
    return target


def clean(keep_current: bool = True) -> list[Path]:
    """Delete builds of other sources (all of them unless `keep_current`); returns what was deleted."""
    current = build_path().name
    gone = []
    for p in kernel_dir().glob("_streamfed_kernels_*"):
        if keep_current and p.name == current:
            continue
        if p.is_dir():
            shutil.rmtree(p)
        else:
            p.unlink()
        gone.append(p)
    return gone
