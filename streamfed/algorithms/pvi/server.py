"""The server half of PVI for sparse GPs (docs/algorithms.md §7): `q ∝ p · Π_k t_k`
kept as every client's latest factor, versioned.

* **Asynchronous** (`asynchronous=True`): a factor is applied as it arrives, `q ← q · (t_new / t_old)^ρ`.
* **Synchronous**: factors wait until the window closes and are then applied together (parallel PVI,
  where damping `ρ < 1` keeps simultaneous updates from overshooting).

A factor replaces its client's previous one, so updates are idempotent per `(client, seq)`: a seq not
above the client's applied one is a duplicate or superseded, and is dropped (`False`). Damping is exact
on natural parameters — `t(φ)` and CPO factors: `t ← t_old^{1-ρ} t_new^ρ`. A power of a DPO factor is not
a DPO factor of the same size (it is the union of both pseudo-observation sets), so DPO runs undamped,
as the paper's experiments do (its Appendix D). FedAvg on `Z` (paper Algorithm 1): the global `Z` moves
to `(N - N_k)/N · Z + N_k/N · Z_k` with each applied factor.

Every factor is checked before anything changes: shapes, bounded values, and that `q(φ)` stays a
density (a factor with too negative a precision is refused).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from streamfed.algorithms.pvi.factors import DiagGauss, Factor
from streamfed.algorithms.pvi.state import GlobalQ
from streamfed.core.durable import durable

__all__ = ["PVIServer"]


@durable("pvi.PVIServer")
class PVIServer:
    """Every client's latest factor; `publish()` versions the state.

    >>> g = GlobalQ.initial("se", np.zeros((2, 1)), np.zeros(3), "fixed")
    >>> server = PVIServer(g, n_pseudo=1)
    >>> f = Factor("a", 2, 5.0, np.zeros((1, 1)), np.ones(1), np.zeros(1))
    >>> server.receive(f), server.receive(replace(f, seq=1)), server.receive(f)  # seq 1 superseded, 2 repeated
    (True, False, False)
    >>> server.publish().version, server.included
    (1, {'a': 2})
    """

    def __init__(self, state: GlobalQ, *, n_pseudo: int, parameterisation: str = "dpo", damping: float = 1.0,
                 asynchronous: bool = True, max_factors: int = 64, max_abs: float = 1e100) -> None:
        if not 0.0 < damping <= 1.0:
            raise ValueError(f"damping ρ must be in (0, 1], got {damping!r}")
        if parameterisation == "dpo" and damping < 1.0:
            raise ValueError("a power of a DPO factor is not a DPO factor of the same size: use ρ = 1 with DPO")
        if parameterisation not in ("dpo", "cpo"):
            raise ValueError(f"unknown parameterisation {parameterisation!r}")
        self.state = state
        self.n_pseudo = state.m if parameterisation == "cpo" else int(n_pseudo)
        self.parameterisation = parameterisation
        self.damping = float(damping)
        self.asynchronous = bool(asynchronous)
        self.max_factors = int(max_factors)
        self.max_abs = float(max_abs)
        self.included: dict[str, int] = {}
        self._window: dict[str, Factor] = {}
        self._changed = False
        self.superseded = 0

    @property
    def version(self) -> int:
        return int(self.state.version)

    def validate(self, f: Factor) -> None:
        """`ValueError` unless `f` fits this fleet and keeps `q(φ)` proper; changes nothing."""
        g = self.state
        if f.n_pseudo != self.n_pseudo:
            raise ValueError(f"factor has {f.n_pseudo} pseudo-observations, the fleet {self.n_pseudo}")
        if (f.V is None) != (self.parameterisation == "cpo"):
            raise ValueError(f"a {'CPO' if f.V is None else 'DPO'} factor in a {self.parameterisation} fleet")
        if f.V is not None and f.V.shape != (self.n_pseudo, g.d):
            raise ValueError(f"V has shape {f.V.shape}, expected {(self.n_pseudo, g.d)}")
        if (f.phi is None) != (g.phi_size == 0) or (f.phi is not None and f.phi.size != g.phi_size):
            raise ValueError(f"t(φ) must have {g.phi_size} entries")
        if (f.Z is None) != (g.inducing != "fedavg") or (f.Z is not None and f.Z.shape != g.Z.shape):
            raise ValueError("a local Z comes with FedAvg on Z only, shaped as Z")
        arrays = [f.m, f.log_s] + [a for a in (f.V, f.Z) if a is not None]
        if f.phi is not None:
            arrays += [f.phi.nat1, f.phi.nat2]
        if max(float(np.max(np.abs(a))) if a.size else 0.0 for a in arrays) > self.max_abs or f.n > self.max_abs:
            raise ValueError(f"a value is beyond ±{self.max_abs:g}")
        if f.client not in g.factors and len(g.factors) >= self.max_factors:
            raise ValueError(f"the state already holds {self.max_factors} clients' factors")
        if f.phi is not None:
            q = g.q_phi(exclude=f.client) * self._damped(g.factors.get(f.client), f).phi  # type: ignore[operator]
            if not q.proper:
                raise ValueError("the factor would make q(φ) improper")

    def _damped(self, old: Factor | None, new: Factor) -> Factor:
        rho = self.damping
        if rho == 1.0 or old is None:
            return new
        phi = new.phi
        if phi is not None and old.phi is not None:
            phi = old.phi.power(1.0 - rho) * phi.power(rho)
        # CPO (DPO is refused at construction): t(u) = N(u; m, s) has natural parameters m/s, 1/s
        p_old, p_new = np.exp(-old.log_s), np.exp(-new.log_s)
        prec = (1.0 - rho) * p_old + rho * p_new
        m = ((1.0 - rho) * p_old * old.m + rho * p_new * new.m) / prec
        return replace(new, m=m, log_s=-np.log(prec), phi=phi)

    def receive(self, f: Factor) -> bool:
        """Take a factor (validated): applied now (asynchronous) or at the window's end. `False` for a
        duplicate or superseded seq."""
        if f.seq <= self.included.get(f.client, 0) or f.seq <= getattr(self._window.get(f.client), "seq", 0):
            self.superseded += 1
            return False
        self.validate(f)
        if self.asynchronous:
            self._apply(f)
        else:
            self._window[f.client] = f
        return True

    def _apply(self, f: Factor) -> None:
        g = self.state
        damped = self._damped(g.factors.get(f.client), f)
        new = g.with_factor(damped)
        if g.inducing == "fedavg" and f.Z is not None:
            n = new.n_samples
            w = f.n / n if n > 0 else 1.0
            new = replace(new, Z=(1.0 - w) * g.Z + w * f.Z)
        self.state = new
        self.included[f.client] = int(f.seq)
        self._changed = True

    def pending(self) -> bool:
        return bool(self._window) or self._changed

    def close_window(self) -> bool:
        """Apply the window's factors (in client order) and publish; `False` when nothing changed."""
        for c in sorted(self._window):
            f = self._window[c]
            if f.client in self.state.factors or len(self.state.factors) < self.max_factors:
                self._apply(f)
        self._window = {}
        if not self._changed:
            return False
        self.publish()
        return True

    def publish(self) -> GlobalQ:
        """The next version of the state."""
        self.state = replace(self.state, version=self.state.version + 1)
        self._changed = False
        return self.state

    def phi_summary(self) -> DiagGauss | None:
        return self.state.q_phi() if self.state.phi_size else None
