"""PVI on the wire (docs/algorithms.md, "PVI"). Sizes: `k = M_k` pseudo-observations (`M` for CPO),
`P = |φ|` (`M·d` for ``hvm``, plus `d + 2` when `β` is learned), `f` factors.

* ``pvi.update`` — one factor: `n`, `m (k)`, `log_s (k)`, DPO `V (k, d)`, `phi_nat1`, `phi_nat2 (P)`
  (when `P > 0`), FedAvg's local `Z (M, d)`: at most `M_k(d + 2) + 2Md` numbers (plus `2(d + 2)` with
  learned `β`, plus `Md` for FedAvg), whatever the client's data.
* ``pvi.global`` — every client's factor (`slot` indexes the sorted names of `included`, whose seqs are
  the factors'), the point `Z (M, d)` and `beta (d + 2)`.
* ``pvi.partial`` — a shard's latest factor per client (`fslot`, `fseq`), with the contributors.

>>> from streamfed.fleet.config import FleetConfig
>>> cfg = FleetConfig(fleet="f", algorithm="pvi", n_inputs=2, params={"n_inducing": 3, "n_pseudo": 4})
>>> {k: s for k, (_, s) in cfg.array_shapes("pvi.update").items()}
{'n': (), 'm': (4,), 'log_s': (4,), 'V': (4, 2), 'phi_nat1': (6,), 'phi_nat2': (6,)}
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from streamfed.algorithms.base import params_of
from streamfed.algorithms.pvi import PVIParams
from streamfed.algorithms.pvi.factors import DiagGauss, Factor
from streamfed.algorithms.pvi.state import GlobalQ
from streamfed.wire.message import Message
from streamfed.wire.schema import ArraySpec, MessageSchema, MetaSpec, contributor_arrays, contributor_dims
from streamfed.wire.topics import Channel

if TYPE_CHECKING:
    from streamfed.fleet.config import FleetConfig

__all__ = ["GLOBAL", "PARTIAL", "UPDATE", "factor_arrays", "global_message", "read_factor", "read_global",
           "read_table", "schemas", "sizes", "table_arrays"]

UPDATE, GLOBAL, PARTIAL = "pvi.update", "pvi.global", "pvi.partial"


def sizes(p: Any, d: int) -> tuple[int, int, int]:
    """`(M, M_k, |φ|)` of parameters `p` and `d` inputs."""
    m = int(p.n_inducing)
    k = m if p.parameterisation == "cpo" else int(p.n_pseudo)
    phi = (m * d if p.inducing == "hvm" else 0) + (d + 2 if p.learn_beta else 0)
    return m, k, phi


def _factor_specs(p: Any, d: int, lead: tuple[str, ...]) -> tuple[ArraySpec, ...]:
    m, k, phi = sizes(p, d)
    out = [ArraySpec("n", "float64", lead, nonnegative=True), ArraySpec("m", "float64", (*lead, k)),
           ArraySpec("log_s", "float64", (*lead, k))]
    if p.parameterisation == "dpo":
        out.append(ArraySpec("V", "float64", (*lead, k, d)))
    if phi:
        out += [ArraySpec("phi_nat1", "float64", (*lead, phi)), ArraySpec("phi_nat2", "float64", (*lead, phi))]
    return tuple(out)


def schemas(cfg: FleetConfig) -> list[MessageSchema]:
    p, d = params_of(cfg, PVIParams), cfg.n_inputs
    m = int(p.n_inducing)
    local_z = (ArraySpec("Z", "float64", (m, d)),) if p.inducing == "fedavg" else ()
    point = (ArraySpec("Z", "float64", (m, d)), ArraySpec("beta", "float64", (d + 2,)))
    slots = {"f": (0, int(p.max_factors))}  # "f": factors ("c" is the contributor lists' own dimension)
    fz = (ArraySpec("Zk", "float64", ("f", m, d)),) if p.inducing == "fedavg" else ()
    return [
        MessageSchema(UPDATE, Channel.UPDATES, _factor_specs(p, d, ()) + local_z),
        MessageSchema(GLOBAL, Channel.GLOBAL, (ArraySpec("slot", "int64", ("f",), nonnegative=True),)
                      + _factor_specs(p, d, ("f",)) + point, slots, max_included=cfg.max_clients),
        MessageSchema(PARTIAL, Channel.PARTIALS, (ArraySpec("fslot", "int64", ("f",), nonnegative=True),
                                                  ArraySpec("fseq", "int64", ("f",), nonnegative=True))
                      + _factor_specs(p, d, ("f",)) + fz + contributor_arrays(),
                      {**slots, **contributor_dims(cfg)}, meta=(MetaSpec("round"),), max_included=cfg.max_clients),
    ]


def factor_arrays(f: Factor) -> dict[str, np.ndarray]:
    """One factor's update arrays."""
    out = {"n": np.asarray(float(f.n)), "m": f.m.copy(), "log_s": f.log_s.copy()}
    if f.V is not None:
        out["V"] = f.V.copy()
    if f.phi is not None:
        out.update(phi_nat1=f.phi.nat1.copy(), phi_nat2=f.phi.nat2.copy())
    if f.Z is not None:
        out["Z"] = f.Z.copy()
    return out


def read_factor(msg: Message) -> Factor:
    """A decoded ``pvi.update`` (the codec has checked shapes and finiteness)."""
    if msg.kind != UPDATE:
        raise ValueError(f"expected a {UPDATE!r} message, got {msg.kind!r}")
    a = msg.arrays
    phi = DiagGauss(a["phi_nat1"], a["phi_nat2"]) if "phi_nat1" in a else None
    return Factor(msg.client, int(msg.seq), float(a["n"]), a.get("V"), a["m"], a["log_s"], phi, a.get("Z"))


def table_arrays(factors: Sequence[Factor], names: Sequence[str], p: Any, d: int, *, local_z: bool = False
                 ) -> dict[str, np.ndarray]:
    """Factors stacked along a first axis; `slot[i]` indexes `names` (sorted)."""
    m, k, phi = sizes(p, d)
    index = {c: i for i, c in enumerate(names)}
    c = len(factors)
    out = {"slot": np.array([index[f.client] for f in factors], dtype=np.int64),
           "n": np.array([f.n for f in factors], dtype=np.float64).reshape(c),
           "m": np.array([f.m for f in factors]).reshape(c, k),
           "log_s": np.array([f.log_s for f in factors]).reshape(c, k)}
    if p.parameterisation == "dpo":
        out["V"] = np.array([f.V for f in factors]).reshape(c, k, d)
    if phi:
        out["phi_nat1"] = np.array([f.phi.nat1 for f in factors if f.phi is not None]).reshape(c, phi)
        out["phi_nat2"] = np.array([f.phi.nat2 for f in factors if f.phi is not None]).reshape(c, phi)
    if local_z:
        out["Zk"] = np.array([f.Z for f in factors]).reshape(c, m, d)
    return out


def read_table(arrays: Mapping[str, np.ndarray], names: Sequence[str], seqs: Sequence[int], slot: str = "slot"
               ) -> list[Factor]:
    """Factors from stacked arrays; `seqs[i]` is the `i`-th factor's seq."""
    idx = np.asarray(arrays[slot], dtype=np.int64)
    if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= len(names) or len(set(idx.tolist())) != idx.size):
        raise ValueError("factor slots out of range or repeated")
    out = []
    for i, j in enumerate(idx.tolist()):
        phi = DiagGauss(arrays["phi_nat1"][i], arrays["phi_nat2"][i]) if "phi_nat1" in arrays else None
        V = arrays["V"][i] if "V" in arrays else None
        Z = arrays["Zk"][i] if "Zk" in arrays else None
        out.append(Factor(names[j], int(seqs[i]), float(arrays["n"][i]), V, arrays["m"][i], arrays["log_s"][i],
                          phi, Z))
    return out


def global_message(fleet: str, sender: str, g: GlobalQ, included: Mapping[str, int], p: Any, kernel_version: str,
                   created: float | None = None) -> Message:
    names = sorted(g.factors)
    arrays = table_arrays([g.factors[c] for c in names], names, p, g.d)
    arrays.update(Z=g.Z.copy(), beta=g.beta.copy())
    inc = {c: int(included[c]) for c in names}
    return Message(fleet, sender, GLOBAL, g.version, g.version, kernel_version, int(round(g.n_samples)),
                   time.time() if created is None else float(created), arrays, {}, inc, 0)


def read_global(msg: Message, template: GlobalQ) -> GlobalQ:
    """The state a ``pvi.global`` carries (kernel, mode and `φ` layout from `template`)."""
    if msg.kind != GLOBAL:
        raise ValueError(f"expected a {GLOBAL!r} message, got {msg.kind!r}")
    names = sorted(msg.included)
    slot = np.asarray(msg.arrays["slot"], dtype=np.int64)
    seqs = [int(msg.included[names[j]]) for j in slot.tolist() if 0 <= j < len(names)]
    if len(seqs) != slot.size:
        raise ValueError("factor slots out of range")
    factors = read_table(msg.arrays, names, seqs)
    return GlobalQ(int(msg.global_version), template.kind, np.array(msg.arrays["Z"]), np.array(msg.arrays["beta"]),
                   template.inducing, template.learn_beta, {f.client: f for f in factors})
