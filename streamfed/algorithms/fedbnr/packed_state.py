"""Where a FedBNR client keeps its per-sample state: ONE float64 buffer (layout: :mod:`._layout`), so that a
prequential step is one compiled call with three arguments (numba's dispatcher costs ~0.1 µs per array
argument).

:class:`PackedState`, the base of :class:`~.client.FedBNRClient`, allocates the buffer, binds the client's
arrays (`_ra`, `sigma`, `lam`, the pending statistics, …) as views of its blocks and its running scalars
(`_n_work`, `_n_pend`, …) as properties on its header. Pickled, the buffer travels alone and the views are
bound again on load; a client pickled before the buffer existed (each array and scalar its own attribute)
is migrated into it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from streamfed.algorithms.fedbnr import _layout as lay

__all__ = ["STAGE", "PackedState"]

STAGE = 32  # pending rows folded into the scatter at once


class PackedState:
    """The packed buffer of a client with `n_kernels` kernels of `dim` features (and, on the default RFF map,
    `_fast = (frequencies, scratch, n_inputs)`, whose frequencies the packed kernels read from the buffer).

    >>> import pickle
    >>> from streamfed.algorithms.fedbnr.client import FedBNRClient
    >>> c = FedBNRClient(n_inputs=1, n_features=2)
    >>> c.learn(np.zeros(1), 1.0)
    >>> twin = pickle.loads(pickle.dumps(c))
    >>> twin.predict(np.ones(1)) == c.predict(np.ones(1)), twin.n_pending
    (True, 1)
    """

    n_kernels: int
    dim: int
    _fast: tuple[np.ndarray, np.ndarray, int] | None

    # the views (bound by _bind_views; declared here for readers and the type checker)
    _ra: np.ndarray
    _s_pend: np.ndarray
    _b_pend: np.ndarray
    _stage: np.ndarray
    _stage_y: np.ndarray
    _work: np.ndarray
    _phi: np.ndarray
    _means: np.ndarray
    _vars: np.ndarray
    _logw: np.ndarray
    sigma: np.ndarray
    _inv_sigma: np.ndarray
    lam: np.ndarray
    _refresh: np.ndarray
    _pdiag: np.ndarray
    _wt: np.ndarray
    _lazy: np.ndarray
    _bound: np.ndarray

    # attribute → block of the buffer it is a view of
    _VIEWS = {"_ra": "ra", "_s_pend": "s_pend", "_b_pend": "b_pend", "_stage": "stage", "_stage_y": "stage_y",
              "_work": "work", "_phi": "phi", "_means": "means", "_vars": "vars", "_logw": "logw",
              "sigma": "sigma", "_inv_sigma": "inv_sigma", "lam": "lam", "_refresh": "refresh",
              "_pdiag": "pdiag", "_wt": "wt", "_lazy": "lazy", "_bound": "bound"}

    def _allocate(self) -> None:
        """A zeroed buffer with its header written and the views bound (`n_kernels`, `dim`, `_fast` set)."""
        kk, f = self.n_kernels, self.dim
        d, nd = (0, 0) if self._fast is None else self._fast[0].shape
        self._layout, size = lay.packed_layout(kk, f, STAGE, d, nd)
        self._buf = np.zeros(size)
        lay.write_header(self._buf, self._layout, kk, f, STAGE, d, nd)
        self._bind_views()
        if self._fast is not None:
            self._wt[...] = self._fast[0]  # a copy of the (constant) frequencies, for the packed kernels

    def _bind_views(self) -> None:
        kk, f = self.n_kernels, self.dim
        shapes = {"ra": (kk, f + 1, f + 1), "s_pend": (kk, f, f), "b_pend": (kk, f), "stage": (kk, f, STAGE),
                  "phi": (kk, f), "pdiag": (kk, f)}
        if self._fast is not None:
            shapes["wt"] = self._fast[0].shape
        for attr, block in self._VIEWS.items():
            view = self._buf[slice(*self._layout[block])]
            self.__dict__[attr] = view.reshape(shapes[block]) if block in shapes else view

    def __getstate__(self) -> dict:
        # The views are rebuilt on load: pickled, each would be copied and cut off the buffer.
        state = dict(self.__dict__)
        for attr in self._VIEWS:
            state.pop(attr, None)
        return state

    def __setstate__(self, state: dict) -> None:
        if "_buf" not in state:  # pickled before the packed buffer (separate arrays and scalars)
            state = self._migrate_state(state)
        else:
            state = self._extend_buffer(state)
        self.__dict__.update(state)
        self._bind_views()

    _SCALARS = {"_n_work": lay.H_N_WORK, "_q_work": lay.H_Q_WORK, "_staged": lay.H_STAGED,
                "_n_pend": lay.H_N_PEND, "_q_pend": lay.H_Q_PEND, "_refresh_j": lay.H_REFRESH_J,
                "_sqrt_gamma": lay.H_SQRT_GAMMA, "_logw_dirty": lay.H_DIRTY}

    @staticmethod
    def _extend_buffer(state: dict) -> dict:
        """A buffer of an earlier layout (fewer blocks: they are only ever appended) padded with the new blocks,
        zeroed (no kernel lazy), and its header's offsets written."""
        buf = state["_buf"]
        kk, f, b, d, nd = (int(buf[s]) for s in (lay.H_K, lay.H_F, lay.H_B, lay.H_D, lay.H_ND))
        layout, size = lay.packed_layout(kk, f, b, d, nd)
        if buf.shape[0] == size:
            return state
        grown = np.zeros(size)
        grown[:buf.shape[0]] = buf
        lay.write_header(grown, layout, kk, f, b, d, nd)
        return {**state, "_buf": grown, "_layout": layout}

    @classmethod
    def _migrate_state(cls, state: dict) -> dict:
        """A state of the earlier layout (each array and scalar its own attribute) in the packed layout."""
        state = dict(state)
        kk, f = int(state["n_kernels"]), int(state["dim"])
        fast = state.get("_fast")
        d, nd = (0, 0) if fast is None else fast[0].shape
        layout, size = lay.packed_layout(kk, f, STAGE, d, nd)
        buf = np.zeros(size)
        lay.write_header(buf, layout, kk, f, STAGE, d, nd)
        for attr, block in cls._VIEWS.items():
            if attr == "_wt":
                value = None if fast is None else fast[0]
            elif attr in ("_lazy", "_bound"):
                continue  # zeros: no kernel lazy
            else:
                value = state.pop(attr, None)
            if value is not None:
                buf[slice(*layout[block])] = np.asarray(value, dtype=np.float64).reshape(-1)
        for attr, slot in cls._SCALARS.items():
            buf[slot] = float(state.pop(attr, 0.0))
        buf[lay.H_GAMMA] = float(state["forgetting"])
        state.pop("_inv_sigma", None)
        state["_layout"], state["_buf"] = layout, buf
        return state

    def _header_property(slot: int, kind: type = float) -> property:  # type: ignore[misc]  # noqa: N805
        def get(self: PackedState) -> Any:
            return kind(self._buf[slot])

        def put(self: PackedState, value: Any) -> None:
            self._buf[slot] = value

        return property(get, put)

    # Running scalars, stored in the packed buffer's header.
    _n_work = _header_property(lay.H_N_WORK)
    _q_work = _header_property(lay.H_Q_WORK)
    _staged = _header_property(lay.H_STAGED, int)
    _n_pend = _header_property(lay.H_N_PEND, int)
    _q_pend = _header_property(lay.H_Q_PEND)
    _refresh_j = _header_property(lay.H_REFRESH_J, int)
    _sqrt_gamma = _header_property(lay.H_SQRT_GAMMA)
    _logw_dirty = _header_property(lay.H_DIRTY, bool)
    del _header_property
