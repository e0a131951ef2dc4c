"""The client half of pFedGP: a personal GP-Tree classifier on the shared embedding, streaming.

* A bounded budget of labelled samples per class (:mod:`.budget`, raw inputs, never uploaded); with
  `max_budget`, bounded as a whole too (a new class shrinks the others' share).
* The personal GP is refreshed on the budget's embeddings when it is due — every `refresh_every` samples that
  changed the budget, and as soon as a class is new (which rebuilds the tree) or the network changed — and the
  work credit (:mod:`.cost`, `work_per_sample` units earned per sample) is not in debt; each node's Gibbs chains
  continue where they were (`gibbs_steps` sweeps; `burn_in` for fresh chains). Predictions in between use the
  last refresh, embedded with the network it was made with. A refresh's work is charged to the credit, so the
  work per sample is bounded by the budget, not by the classes or samples seen (`work_per_sample = None`: no
  bound, every refresh runs when due).
* Where torch is installed and `learn_kernel`: every `fit_every` samples (when its credit allows), a local update
  of the shared parameters on the budget (:func:`~.training.fit_local`), charged the same way to a credit of its
  own (then refreshes and local updates each earn half of `work_per_sample`); the delta to the
  current version is split into chunks of at most `max_chunk_numbers` (:mod:`streamfed.algorithms.chunks`) and
  queued; `take_update` hands out one chunk per call, numbered `seq`. A new local update waits until the previous
  one is sent.
* A global of a newer network version replaces the parameters; the budget is re-embedded and the tree rebuilt
  (fresh chains) at the next refresh; queued chunks of the old version are dropped.

Predictions are class-probability vectors over `n_classes`, mixed in the log domain with the uniform one at
weight `smoothing` (a class the client has not seen — its GP models only its own — gets `smoothing /
n_classes`; none is exactly 0 or 1; uniform before any sample). `grow` adds classes (a River estimator's new
labels).

>>> from streamfed.algorithms.urk.network import URKArch
>>> from streamfed.algorithms.pfedgp.network import Layout, initial_theta, omega_of
>>> layout = Layout(URKArch(n_inputs=2, widths=(), n_omega=8))
>>> c = PFedGPClient(layout, initial_theta(layout, 0), omega_of(layout, 0), n_classes=3, learn_kernel=False)
>>> c.predict(np.zeros(2)).round(3).tolist()
[0.333, 0.333, 0.333]
>>> for t in range(12):
...     _ = c.learn(np.array([(t % 2) * 2.0 - 1.0, 0.0]), 2 * (t % 2))
>>> p = c.predict(np.array([1.0, 0.0]))
>>> int(np.argmax(p)), 0 < float(p[1]) < 1e-6, bool(abs(p.sum() - 1) < 1e-12)
(2, True, True)
"""

from __future__ import annotations

import copy
import importlib.util
import math
import zlib
from collections import deque

import numpy as np

from streamfed.algorithms.base import NonFiniteError, Update
from streamfed.algorithms.chunks import split_vector
from streamfed.algorithms.pfedgp.budget import ClassBudget
from streamfed.algorithms.pfedgp.cost import WorkCredit, fit_work, predict_work
from streamfed.algorithms.pfedgp.messages import PFedGPGlobal
from streamfed.algorithms.pfedgp.network import Layout, gp_inputs, inducing_of
from streamfed.algorithms.pfedgp.personal import GPTree
from streamfed.algorithms.pfedgp.wire import chunk_update
from streamfed.core.durable import durable

__all__ = ["PFedGPClient", "class_label", "torch_available"]

#: Probabilities are floored here when scoring the log loss (a class the GP does not know has probability 0).
LOG_FLOOR = 1e-15


def torch_available() -> bool:
    """Whether this process can train the network: torch importable."""
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):  # hidden on purpose (a blocking import hook)
        return False


def class_label(y: float, n_classes: int) -> int:
    """`y` as a class index in `[0, n_classes)`; `ValueError` for anything else (a fraction, NaN, out of range)."""
    v = float(y)
    if not (math.isfinite(v) and v == math.floor(v) and 0 <= v < n_classes):
        raise ValueError(f"label {y!r} is not a class in [0, {n_classes})")
    return int(v)


@durable("pfedgp.PFedGPClient")
class PFedGPClient:
    """One client (see the module docstring)."""

    # class-level defaults: a client stored before the work credit existed restores unbounded, as it ran
    credit: WorkCredit = WorkCredit(None)
    fit_credit: WorkCredit = WorkCredit(None)
    smoothing: float = 0.0
    model_theta: np.ndarray | None = None
    last_refresh = last_fit = 0
    predict_units = refresh_units = fit_units = 0.0

    def __init__(self, layout: Layout, theta: np.ndarray, om: np.ndarray, *, n_classes: int, client_id: str = "client",
                 budget: int = 32, lengthscale: float = 1.0, outputscale: float = 8.0, chains: int = 8,
                 gibbs_steps: int = 2, burn_in: int = 10, refresh_every: int = 1, learn_kernel: bool = True,
                 objective: str = "predictive", fit_every: int = 64, fit_steps: int = 5, learning_rate: float = 0.01,
                 train_chains: int = 4, max_chunk_numbers: int = 512, seed: int = 0, max_budget: int | None = None,
                 work_per_sample: float | None = None, smoothing: float = 1e-6) -> None:
        if n_classes < 2 or min(budget, chains, gibbs_steps, refresh_every, fit_every, fit_steps,
                                max_chunk_numbers) < 1:
            raise ValueError("n_classes >= 2; budget, chains, steps and intervals >= 1")
        if not 0.0 <= float(smoothing) < 1.0:
            raise ValueError(f"smoothing must be in [0, 1), got {smoothing!r}")
        self.layout, self.n_classes, self.client_id = layout, int(n_classes), str(client_id)
        self.omega = np.asarray(om, dtype=np.float64)
        self.theta = np.array(theta, dtype=np.float64)
        self.gp_args = {"lengthscale": float(lengthscale), "outputscale": float(outputscale), "chains": int(chains),
                        "steps": int(gibbs_steps), "burn_in": int(burn_in)}
        self.refresh_every = int(refresh_every)
        self.trains = bool(learn_kernel) and torch_available()
        self.objective, self.fit_every, self.fit_steps = objective, int(fit_every), int(fit_steps)
        self.learning_rate, self.train_chains = float(learning_rate), int(train_chains)
        self.max_chunk_numbers = int(max_chunk_numbers)
        self._seed = [int(seed), zlib.crc32(self.client_id.encode())]
        self._rng = np.random.default_rng([*self._seed, 1])
        self.budget = ClassBudget(layout.arch.n_inputs, int(budget), [*self._seed, 2], total=max_budget)
        share = None if work_per_sample is None else float(work_per_sample) / (2.0 if self.trains else 1.0)
        self.credit, self.fit_credit = WorkCredit(share), WorkCredit(share)  # refreshes', local updates'
        self.smoothing = float(smoothing)
        self.model_theta = self.theta.copy()  # the network the personal GP was refreshed with
        self.last_refresh = self.last_fit = 0  # samples learnt at the last refresh, the last local update
        self.predict_units = self.refresh_units = self.fit_units = 0.0  # work done, by kind (cost.py's units)
        self.model = self._new_model()
        self.epoch = self.global_version = 0
        self.next_seq = self.next_proposal = 1
        self.queue: deque[Update] = deque()
        self.n = self.n_fits = self.n_proposals = self.refreshes = 0
        self.loss = 0.0  # prequential log loss
        self.correct = 0
        self.counts = np.zeros(self.n_classes)
        self._stale = False  # samples kept since the last refresh

    def _new_model(self) -> GPTree:
        inducing = inducing_of(self.layout, self.theta) if self.layout.n_inducing else None
        return GPTree(**self.gp_args, inducing=inducing, seed=int(self._rng.integers(2**63)),
                      dim=self.layout.gp_dim)

    # ------------------------------------------------------------------ predicting
    def embed(self, X: np.ndarray) -> np.ndarray:
        """The GP inputs of `X` with the network in use (the embedding, then the linear part's inputs)."""
        return gp_inputs(self.layout, self.theta, self.omega, X)

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Class probabilities `(n_classes,)` of input `x`."""
        return self.predict_many(np.asarray(x, dtype=np.float64).reshape(1, -1))[0]

    def predict_many(self, X: np.ndarray) -> np.ndarray:
        """Class probabilities `(T, n_classes)` of the rows of `X`."""
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != self.layout.arch.n_inputs or not np.all(np.isfinite(X)):
            raise NonFiniteError(f"expected finite inputs of {self.layout.arch.n_inputs} values")
        if not self.model.classes:
            return np.full((X.shape[0], self.n_classes), 1.0 / self.n_classes)
        logp = np.full((X.shape[0], self.n_classes), -np.inf)
        theta = self.theta if self.model_theta is None else self.model_theta
        logp[:, list(self.model.classes)] = self.model.log_proba(gp_inputs(self.layout, theta, self.omega, X))
        self.predict_units += X.shape[0] * predict_work(self.model.node_sizes, chains=self.model.chains)
        if self.smoothing > 0:  # the mixture (1 − λ) p + λ / n_classes, in the log domain
            logp = np.logaddexp(math.log1p(-self.smoothing) + logp, math.log(self.smoothing / self.n_classes))
        out = np.exp(logp)
        if not np.all(np.isfinite(out)):  # never publish what is not a probability
            raise NonFiniteError("class probabilities are not finite")
        return out

    def grow(self, n_classes: int) -> None:
        """Admit classes up to `n_classes` (never fewer than now): labels `n_classes − 1` and below become valid."""
        if n_classes > self.n_classes:
            self.counts = np.concatenate([self.counts, np.zeros(int(n_classes) - self.n_classes)])
            self.n_classes = int(n_classes)

    # ------------------------------------------------------------------ learning
    def learn(self, x: np.ndarray, y: float, probs: np.ndarray | None = None) -> np.ndarray:
        """Learn one labelled sample; returns the probabilities predicted before it. A `ValueError` (bad input,
        bad label, a refresh that would not be finite) leaves everything unchanged."""
        x = np.asarray(x, dtype=np.float64).reshape(-1)
        c = class_label(y, self.n_classes)
        p = self.predict(x) if probs is None else np.asarray(probs, dtype=np.float64)
        budget = copy.deepcopy(self.budget)  # the sample joins a copy: a failed refresh changes nothing
        kept = budget.add(x, c)
        stale = self._stale or kept
        credit = copy.deepcopy(self.credit)
        credit.earn()
        changed = budget.classes != self.model.classes or not self._current()
        due = changed or (stale and self.n + 1 - self.last_refresh >= self.refresh_every)
        if due and credit.allows():
            work = self._refresh(budget)
            credit.charge(work)
            self.refresh_units += work
            self.last_refresh, stale = self.n + 1, False
        self.budget, self._stale, self.credit = budget, stale, credit
        self.n += 1
        self.counts[c] += 1
        self.loss += -math.log(max(float(p[c]), LOG_FLOOR))
        self.correct += int(int(np.argmax(p)) == c)
        if self.trains:
            self.fit_credit.earn()
            if self.n - self.last_fit >= self.fit_every and self.fit_credit.allows():
                self.last_fit = self.n
                work = fit_work(self.model.node_sizes, chains=self.train_chains, steps=self.fit_steps)
                fits = self.n_fits
                self.fit()
                if self.n_fits > fits:  # it ran (whether or not it proposed)
                    self.fit_credit.charge(work)
                    self.fit_units += work
        return p

    def _current(self) -> bool:
        """Whether the personal GP was refreshed with the network in use."""
        return self.model_theta is None or np.array_equal(self.model_theta, self.theta)

    def refresh(self, rebuild: bool = False) -> None:
        """Refresh the personal GP on the budget's embeddings (continuing the chains), whatever the credit."""
        work = self._refresh(self.budget, rebuild)
        self.credit.charge(work)
        self.refresh_units += work
        self.last_refresh, self._stale = self.n, False

    def _refresh(self, budget: ClassBudget, rebuild: bool = False) -> float:
        """Fit the personal GP to `budget`; a new network gets a new model (fresh chains, a new tree). Its work."""
        X, y, ids = budget.arrays()
        model = self.model
        if not self._current():
            model, rebuild = self._new_model(), True
        work = model.fit(self.embed(X), y, ids, rebuild=rebuild)  # installs nothing if it raises
        self.model, self.model_theta = model, self.theta.copy()
        self.refreshes += 1
        return work

    def fit(self) -> bool:
        """The local update of the shared parameters on the budget; its delta, chunked, joins the queue."""
        if self.queue or len(self.budget) < 2:
            return False
        from streamfed.algorithms.pfedgp.training import fit_local

        X, y, _ = self.budget.arrays()
        new = fit_local(self.layout, self.theta, self.omega, X, y, rng=self._rng, steps=self.fit_steps,
                        learning_rate=self.learning_rate, objective=self.objective,
                        lengthscale=self.gp_args["lengthscale"], outputscale=self.gp_args["outputscale"],
                        chains=self.train_chains, gibbs_steps=self.gp_args["steps"] + 1)
        self.n_fits += 1
        if new is None:
            return False
        for ch in split_vector(self.next_proposal, new - self.theta, self.max_chunk_numbers):
            self.queue.append(chunk_update(ch, float(len(self.budget)), 0, 0, self.epoch))
        self.next_proposal += 1
        self.n_proposals += 1
        return True

    def take_update(self) -> Update | None:
        """The next chunk of the proposal being sent, numbered; None when there is none."""
        if not self.queue:
            return None
        c = self.queue.popleft()
        out = Update(c.arrays, 0, self.global_version, seq=self.next_seq, epoch=c.epoch)
        self.next_seq += 1
        return out

    # ------------------------------------------------------------------ globals
    def apply_global(self, g: PFedGPGlobal) -> bool:
        """Install a global; `False` (nothing changed) for one not newer than the installed one or of an older
        network version. A newer version replaces the parameters and re-embeds the budget."""
        if g.version <= self.global_version or g.epoch < self.epoch:
            return False
        theta = np.asarray(g.theta, dtype=np.float64)
        if theta.shape != self.theta.shape or not np.all(np.isfinite(theta)):
            raise ValueError(f"global parameters of shape {theta.shape} or not finite")
        if g.epoch == self.epoch and not np.array_equal(theta, self.theta):
            raise ValueError(f"global version {g.version} changes the network without a new network version")
        inc = int(g.included.get(self.client_id, 0))
        if g.epoch > self.epoch:
            self.theta = theta.copy()
            self.epoch = int(g.epoch)
            self.queue.clear()  # deltas relative to the old network: void
            if not len(self.budget):
                self.model, self.model_theta = self._new_model(), self.theta.copy()
            elif self.credit.allows():  # else at the next refresh the credit allows; predictions keep the old one
                self.refresh(rebuild=True)
        self.global_version = int(g.version)
        self.next_seq = max(self.next_seq, inc + 1)
        return True

    # ------------------------------------------------------------------ regret
    def regret(self) -> dict[str, float]:
        """Prequential log loss, and that of the best fixed class-probability vector in hindsight (the
        empirical class frequencies: `n · H(counts / n)`)."""
        if self.n == 0:
            return {"n": 0.0, "loss": 0.0, "best_loss": 0.0}
        f = self.counts[self.counts > 0] / self.n
        return {"n": float(self.n), "loss": float(self.loss), "best_loss": float(-self.n * np.sum(f * np.log(f)))}
