"""Differential privacy for any learner of the plug-in contract (docs/privacy.md): a wrapper that clips
labels, noises uploads with the Gaussian mechanism calibrated to the learner's declared sensitivity
(its `upload_sensitivity`, when it declares `sample_sensitivity`), accounts every upload, and stops
uploading — it keeps learning and predicting — once the next upload would exceed the budget.

It never asks which algorithm it wraps. Learners that declare a per-sample L2 bound (FedBNR's
statistics) are noised at that bound; the others have each upload clipped to `clip_norm` as a whole and
are noised at `2·clip_norm`. Local DP: `noise_share = 1`. Distributed DP behind secure aggregation:
each of `n` clients adds the share `1/n` of the variance, so only the unmasked sum carries the full
noise; the accountant then records the multiplier the *sum* has.

**The public schedule** (`window`, what an agent uses): uploads are not cut when the learner has one — that
would let one sample shift every later upload — but after every `window` *arrivals* (:meth:`arrival`, once per
labelled reading, learned or refused). At each close the learner's pending update leaves, or a noised *dummy*
(zeros of an upload's shape) when it has none, so neighbouring streams make the same uploads at the same
arrivals; each says `n = window` (its count array and `n_samples`), and uploads are numbered here.

>>> from streamfed import algorithms
>>> from streamfed.fleet.config import FleetConfig
>>> cfg = FleetConfig(fleet="f", algorithm="fedbnr", n_inputs=1, n_features=3, kernels=["gaussian:1.0"],
...                   params={"min_upload": 2})
>>> private = PrivateLearner(algorithms.get("fedbnr").learner(cfg, "a", 0), epsilon=1.0, delta=1e-5,
...                          budget=1.5, label_bound=3.0, rng=0)
>>> for y in (1.0, 2.0, 50.0, 0.0):
...     _ = private.learn(np.array([0.1]), y)
...     up = private.take_update()
...     if up is not None: print(float(up.arrays["n"]), round(private.epsilon, 2))
2.0 1.09
>>> private.exhausted  # a second upload would have made ε > 2
True

On the public schedule, a window of two arrivals whose one reading was refused still uploads, counting two:

>>> scheduled = PrivateLearner(algorithms.get("fedbnr").learner(cfg, "a", 0), epsilon=1.0, delta=1e-5,
...                            window=2, n_inputs=1, rng=0)
>>> _ = scheduled.learn(np.array([0.1]), 1.0); scheduled.arrival()
>>> scheduled.arrival()  # a refused reading: an arrival without a sample
>>> up = scheduled.take_update()
>>> up.seq, up.n_samples, float(up.arrays["n"])
(1, 2, 2.0)
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
from typing import Any

import numpy as np

from streamfed.algorithms.base import Learner, Update, UploadSensitivity, WrappedLearner
from streamfed.core.durable import durable
from streamfed.privacy import dp
from streamfed.privacy.accountant import Method, PrivacyAccountant
from streamfed.wire.message import Message
from streamfed.wire.schema import ArraySpec, MessageSchema

__all__ = ["PrivateLearner"]

log = logging.getLogger(__name__)


@durable("fleet.PrivateLearner")
class PrivateLearner(WrappedLearner):
    """A :class:`~streamfed.algorithms.base.Learner` whose uploads are `(epsilon, delta)`-DP each, composed
    by a :class:`~streamfed.privacy.accountant.PrivacyAccountant` and capped at `budget` (ε at `delta`;
    None: no cap). See the module docstring; `rng` seeds the noise only in tests (default: OS entropy);
    `noise_multiplier` replaces the one `epsilon` implies (e.g. calibrated for a stream's composition).

    >>> from streamfed import algorithms
    >>> from streamfed.fleet.config import FleetConfig
    >>> cfg = FleetConfig(fleet="f", algorithm="pofmkl", n_inputs=1, n_kernels=2, n_features=2)
    >>> p = PrivateLearner(algorithms.get("pofmkl").learner(cfg, "a", 0, "lockstep"), epsilon=2.0, delta=1e-5,
    ...                    clip_norm=0.1, rng=0)
    >>> p.sensitivity.l2 is None, p.l2, round(p.z, 3)  # no per-sample bound: uploads clipped whole, Δ₂ = 2C
    (True, 0.2, 1.994)
    """

    def __init__(self, inner: Learner, *, epsilon: float, delta: float, budget: float | None = None,
                 label_bound: float = 3.0, clip_norm: float = 1.0, noise_share: float = 1.0,
                 method: Method = "rdp", rng: np.random.Generator | int | None = None,
                 client: str = "", noise_multiplier: float | None = None, clip_labels: bool = True,
                 window: int | None = None, n_inputs: int | None = None,
                 schema: MessageSchema | None = None) -> None:
        if not (epsilon > 0 and 0 < delta < 1 and label_bound > 0 and clip_norm > 0 and 0 < noise_share <= 1):
            raise ValueError("need epsilon > 0, 0 < delta < 1, label_bound > 0, clip_norm > 0, 0 < noise_share <= 1")
        if budget is not None and not budget > 0:
            raise ValueError(f"budget must be > 0, got {budget!r}")
        self.inner = inner
        self.client = client
        self.label_bound = float(label_bound)
        # a classifier's label is a class index: clipping it would change the class (its uploads have no
        # per-sample bound through the label, they are clipped whole)
        self.clip_labels = bool(clip_labels)
        self.clip_norm = float(clip_norm)
        self.budget = budget
        # without a per-sample bound the upload is clipped whole; a count array it names is the schedule's, not noised
        self.sensitivity = (inner.upload_sensitivity(label_bound) if inner.sample_sensitivity
                            else _clipped_whole(inner, label_bound))
        self.l2 = self.sensitivity.l2 if self.sensitivity.l2 is not None else 2.0 * self.clip_norm
        # one upload is (ε, δ)-DP — or the multiplier is given (calibrated for a whole stream's composition)
        self.z = dp.noise_multiplier(epsilon, delta) if noise_multiplier is None else float(noise_multiplier)
        if not (self.z > 0 and math.isfinite(self.z)):
            raise ValueError(f"noise multiplier must be finite and > 0, got {self.z!r}")
        self.noise_share = float(noise_share)
        self.std = self.z * self.l2 * math.sqrt(self.noise_share)  # this client's share of the noise
        self.accountant = PrivacyAccountant(delta, method)
        # the upload kind's declared sign constraints (`schema`): a noised array is projected onto them, so that
        # an honest agent never makes an upload its own codec refuses (a noised `q = Σy²` below 0)
        self.constraints: dict[str, ArraySpec] = {} if schema is None else {
            a.name: a for a in schema.arrays if a.dtype.startswith("float") and (a.nonnegative or a.positive
                                                                               or a.simplex)}
        self.rng = np.random.default_rng(rng)
        self.exhausted = False
        self.global_uploads = 0  # noised uploads summed in the installed global (its `included` seqs)
        # the public schedule (module docstring): None uploads whenever the learner has one (the replay's rows)
        if window is not None and not (int(window) >= 1 and n_inputs is not None and int(n_inputs) >= 1):
            raise ValueError("a DP upload window needs window >= 1 and n_inputs")
        self.window = None if window is None else int(window)
        self.arrivals = 0
        self.ready: list[Update] = []  # privatised uploads of closed windows, oldest first
        self.uploaded = 0  # this wrapper's numbering of its scheduled uploads
        # (own seq, the inner's newest seq up to it): the globals' marks translated for a self-numbering learner
        self._marks: list[tuple[int, int]] = [(0, 0)]
        self._template = None if self.window is None else self._make_template(int(n_inputs))  # type: ignore[arg-type]
        if self.window is not None and self._template is None:
            log.warning("agent %s: its learner made no upload from made-up samples (it uploads on the server's "
                        "rounds): no DP upload window, its own schedule applies (docs/privacy.md)",
                        client or "?")
            self.window = None

    # ---------------------------------------------------------------- privacy state
    @property
    def epsilon(self) -> float:
        """ε spent so far (at the accountant's δ)."""
        return self.accountant.epsilon()

    @property
    def delta(self) -> float:
        return self.accountant.delta

    def _privatise(self, up: Update) -> Update:
        names = self.sensitivity.arrays
        if names is None:
            names = tuple(k for k, v in up.arrays.items()
                          if np.asarray(v).dtype.kind == "f" and k != self.sensitivity.count)
        arrays = dict(up.arrays)
        if self.sensitivity.l2 is None:  # no per-sample bound: clip the upload as a whole
            flat = np.concatenate([np.asarray(arrays[k], dtype=np.float64).ravel() for k in names])
            norm = float(np.linalg.norm(flat))
            if not math.isfinite(norm):
                raise dp_error("an upload holds a non-finite value")
            if norm > self.clip_norm:
                for k in names:
                    arrays[k] = np.asarray(arrays[k], dtype=np.float64) * (self.clip_norm / norm)
        noisy = dp.add_gaussian_noise(arrays, names, self.std, self.rng)
        for k, dim in self.sensitivity.scatter.items():
            # a public shift on the diagonal keeps the noisy sum positive semi-definite (privacy.dp)
            diag = _diagonal_positions(int(dim))
            noisy[k] = np.array(noisy[k], dtype=np.float64)
            noisy[k][..., diag] += dp.psd_shift(int(dim), self.std)
        for k in names:
            spec = getattr(self, "constraints", {}).get(k)  # (states pickled before `constraints` existed)
            if spec is not None:
                noisy[k] = _project(np.asarray(noisy[k], dtype=np.float64), spec)
        self.accountant.spend(self.z)
        if getattr(self, "window", None) is None:
            return Update(noisy, up.n_samples, up.global_version, up.seq, up.epoch)
        # the schedule's count, not the data's (module docstring)
        if self.sensitivity.count is not None and self.sensitivity.count in noisy:
            noisy[self.sensitivity.count] = np.full_like(np.asarray(noisy[self.sensitivity.count], dtype=np.float64),
                                                         float(self.window))
        self.uploaded += 1
        return Update(noisy, int(self.window), up.global_version, self.uploaded, up.epoch)

    # ---------------------------------------------------------------- the public schedule
    def arrival(self) -> None:
        """One arrival (a labelled reading, learned or refused) has been handled: every `window` of them closes an
        upload — the learner's pending one, or a dummy — queued for :meth:`take_update`."""
        if getattr(self, "window", None) is None:
            return
        self.arrivals += 1
        if self.arrivals % self.window or not self._may_upload():  # type: ignore[operator]
            return
        try:
            up = self.inner.take_update()
        except ValueError as e:  # a statistic not finite: the samples stay pending, a dummy keeps the schedule
            log.warning("agent %s: upload not made (%s): a dummy leaves in its place", self.client or "?", e)
            up = None
        if up is not None and up.seq is not None:
            self._marks.append((self.uploaded + 1, int(up.seq)))
        self.ready.append(self._privatise(self._dummy() if up is None else up))

    def _dummy(self) -> Update:
        """An upload of nothing: zeros of an upload's shape (the public template), at the learner's global."""
        t = self._template
        assert t is not None
        arrays = {k: (np.zeros_like(v) if np.asarray(v).dtype.kind == "f" else v) for k, v in t.arrays.items()}
        return Update(arrays, 0, int(self.inner.global_version), None, int(t.epoch))

    def _make_template(self, n_inputs: int) -> Update | None:
        """The shape of an upload, from a throw-away copy of the learner taught a few made-up samples (before any
        real one is seen: it depends on the configuration only). None for a learner whose uploads follow the
        server's rounds rather than its samples (pFedGP's proposals): it keeps its own schedule."""
        twin = copy.deepcopy(self.inner)
        for _ in range(4 * int(self.window or 1) + 64):
            try:
                twin.learn(np.zeros(n_inputs), 1.0)
                up = twin.take_update()
            except ValueError:
                return None
            if up is not None:
                return up
        return None

    def _may_upload(self) -> bool:
        if self.exhausted:
            return False
        if self.accountant.can_spend(self.z, self.budget):
            return True
        self.exhausted = True
        log.warning("agent %s: privacy budget ε = %g (δ = %g) reached after %d uploads (ε spent %.3f): it stops "
                    "uploading and keeps learning and predicting locally", self.client or "?", self.budget,
                    self.delta, self.accountant.uploads, self.epsilon)
        return False

    # ---------------------------------------------------------------- the Learner contract (the rest: the inner's)
    def noise_std(self) -> float:
        """Per-entry scale of the noise summed in the installed global: `U` uploads of std `s` each give `√U·s`
        (every client of the fleet noises alike; the shares of distributed DP are in `s`)."""
        return self.std * math.sqrt(self.global_uploads)

    def _with_noise(self, x: np.ndarray, out: tuple[float, float | None]) -> tuple[float, float | None]:
        # a Bayesian learner that can say what the global's noise adds to its predictive variance gets it added
        mean, var = out
        if var is None or not self.inner.noise_aware or not self.global_uploads:
            return out
        extra = float(self.inner.noise_variance(x, self.noise_std()))
        return mean, var + extra if math.isfinite(extra) and extra >= 0 else var

    def predict(self, x: np.ndarray) -> tuple[float, float | None]:
        return self._with_noise(x, self.inner.predict(x))

    def begin_learn(self, x: np.ndarray, y: float) -> tuple[float, float | None]:
        y = dp.clip_label(y, self.label_bound) if self.clip_labels else y
        return self._with_noise(x, self.inner.begin_learn(x, y))

    def take_update(self) -> Update | None:
        if getattr(self, "window", None) is not None:  # the schedule's uploads, made at their arrival
            return self.ready.pop(0) if self.ready else None
        if not self._may_upload():
            return None  # what is pending stays in the learner: it never leaves
        up = self.inner.take_update()
        return None if up is None else self._privatise(up)

    def flush(self) -> list[Update]:
        if getattr(self, "window", None) is not None:
            # closed windows only: what is pending waits for its window (a partial one would be data-dependent)
            out, self.ready = self.ready, []
            return out
        if not self._may_upload():
            return []
        out = []
        for up in self.inner.flush():
            if out and not self._may_upload():
                break  # the rest is dropped with the process: it may not leave
            out.append(self._privatise(up))
        return out

    def install_global(self, msg: Message) -> bool:
        uploads = sum(int(v) for v in msg.included.values())
        if getattr(self, "window", None) is not None and self.client in msg.included:
            msg = self._translated(msg)
        installed = self.inner.install_global(msg)
        if installed:
            self.global_uploads = uploads
        return installed

    def _translated(self, msg: Message) -> Message:
        """`msg` with this client's mark in the learner's own numbering (uploads are numbered here, dummies
        included): the newest of its uploads up to the mark."""
        mark = int(msg.included[self.client])
        self.uploaded = max(self.uploaded, mark)  # a restart without state must not reuse numbers already summed
        older = [m for m in self._marks if m[0] <= mark]
        inner_mark = older[-1][1] if older else self._marks[0][1]
        self._marks = [(mark, inner_mark)] + [m for m in self._marks if m[0] > mark]
        return dataclasses.replace(msg, included={**msg.included, self.client: inner_mark})

    def diagnostics(self) -> dict[str, float]:
        # the learner's own numbers (FedBNR's log evidence, POF-MKL's overflow count) are statistics of the raw
        # samples, outside the noise: under DP only what the accountant says is exported
        return {"dp_epsilon": self.epsilon, "dp_uploads": float(self.accountant.uploads)}

    def __getattr__(self, name: str) -> Any:
        # only reached for attributes this wrapper lacks: a family learner's own (the contract is WrappedLearner's)
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)


def _clipped_whole(inner: Learner, label_bound: float) -> UploadSensitivity:
    """What a learner without a per-sample bound names, if it says: its count array (PVI's factor `n`) and the
    arrays that carry its samples (None: every floating one; FSGP with forgetting leaves its public `time` out)."""
    try:
        s = inner.upload_sensitivity(label_bound)
    except ValueError:
        return UploadSensitivity()
    return UploadSensitivity(arrays=s.arrays, count=s.count)


def _project(v: np.ndarray, spec: ArraySpec) -> np.ndarray:
    """`v` projected onto the set its wire spec allows (nonnegative, positive, rows on the simplex). A function of
    the noised value and the public schema alone: post-processing, which costs no privacy.

    >>> _project(np.array([-0.5, 2.0]), ArraySpec("q", "float64", (2,), nonnegative=True)).tolist()
    [0.0, 2.0]
    >>> _project(np.array([[-1.0, 1.0, 3.0]]), ArraySpec("p", "float64", (1, 3), simplex=True)).tolist()
    [[0.0, 0.25, 0.75]]
    """
    if spec.simplex:
        v = np.maximum(v, 0.0)
        total = v.sum(axis=-1, keepdims=True)
        uniform = np.full_like(v, 1.0 / max(v.shape[-1], 1)) if v.ndim else v
        return np.where(total > 0, v / np.where(total > 0, total, 1.0), uniform)
    if spec.positive:
        return np.maximum(v, np.finfo(np.float64).tiny)
    return np.maximum(v, 0.0)


def dp_error(detail: str) -> ValueError:
    return ValueError(f"differential privacy: {detail}")


def _diagonal_positions(f: int) -> np.ndarray:
    """Positions of the diagonal in a packed upper triangle (numpy.triu_indices order)."""
    rows, cols = np.triu_indices(f)
    return np.flatnonzero(rows == cols)
