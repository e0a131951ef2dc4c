"""The plug-in contract: what an algorithm family gives the fleet, and nothing more.

An algorithm is one package under :mod:`streamfed.algorithms` exposing an :class:`Algorithm`. The agent,
aggregator, shard and reducer cores, the replay, the demo, the CLI, the telemetry and the benchmarks only
ever talk to these three objects:

* :class:`Algorithm` — the family: its configuration model, its message kinds (wire schemas), its
  feature-map version, and factories for the two halves below. Stateless; one per family.
* :class:`Learner` — the client half an agent runs: ``predict`` / ``learn`` (prequential), ``take_update``
  (the next bounded upload, or nothing), ``install_global`` (a decoded global message), ``regret()``
  (a :class:`Regret`, same shape for every learner) and ``kernel_weights`` where it has them.
* :class:`Aggregation` — the server half: ``check`` (validate an update completely, changing nothing),
  ``take`` (into the open window), ``close_window`` / ``apply_round`` (fold into the global),
  ``global_message``; and the sharded form: ``partial`` (what a shard sends: arrays, samples, epoch),
  ``read_partial``, ``combine_partials`` and
  ``apply_partial`` (what the reducer folds in); for a family whose lock-step global depends on the order of
  its floating-point additions, ``round_partial`` (a shard's round: the updates themselves, kind ``round_kind``).

Every family writes its two halves on :class:`BaseLearner` and :class:`BaseAggregation`, which give every
member with a sensible default (``learn`` = ``begin_learn`` + ``end_learn``, ``flush`` → ``[]``,
``diagnostics`` → ``{}``, …) and *declare* the optional capabilities as class attributes (``classifier``,
``sample_sensitivity``, ``noise_aware``; ``shardable``, ``recoverable``): the cores read them, never probe for
them. A family whose update is a sum of arrays gets its schemas and its aggregation from a
:class:`~streamfed.algorithms.summed.SummedStatistics` spec.

Everything transport-level — sequence numbers, deduplication, acknowledgements, rounds by the clock or
by the roster, durable state, retries — stays in the cores, which never ask which algorithm they run.

A new algorithm is a package with an ``ALGORITHM`` object and one line in
:data:`streamfed.algorithms.BUILTIN` (or :func:`streamfed.algorithms.register` at run time):

>>> from streamfed import algorithms
>>> {"pofmkl", "fedbnr", "fedbnr-personal", "fsgp"} <= set(algorithms.names())
True
>>> alg = algorithms.get("pofmkl")
>>> alg.lockstep, alg.bayesian
(True, False)
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, TypeVar, runtime_checkable

import numpy as np
from pydantic import BaseModel, ConfigDict

from streamfed.core.durable import durable

if TYPE_CHECKING:
    from streamfed.fleet.config import FleetConfig
    from streamfed.wire.message import Message
    from streamfed.wire.schema import MessageSchema

__all__ = ["Aggregation", "Algorithm", "BaseAggregation", "BaseLearner", "Learner", "NonFiniteError", "ObservedClock",
           "Params", "Regret", "Update", "Mode", "UploadSensitivity", "WrappedLearner", "aggregation_diagnostics"]

Mode = Literal["lockstep", "async"]


class NonFiniteError(ValueError):
    """A step would have produced a non-finite value; nothing was changed or uploaded."""


class Params(BaseModel):
    """Base of every algorithm's hyperparameter model: strict (unknown keys refused) and frozen, so that
    a fleet configuration holding it stays hashable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


P = TypeVar("P", bound=Params)


def params_of(cfg: FleetConfig, kind: type[P]) -> P:
    """`cfg.params` as the family's own settings model `kind` (what a family's factories read, typed as such);
    `TypeError` if the fleet's settings are another family's.

    >>> from streamfed.fleet.config import FleetConfig
    >>> from streamfed.algorithms.fsgp import FSGPParams
    >>> params_of(FleetConfig(fleet="f", algorithm="fsgp", n_inputs=2), FSGPParams).n_inducing
    32
    """
    p = cfg.params
    if not isinstance(p, kind):
        raise TypeError(f"the fleet's settings are {type(p).__name__}, not {kind.__name__}")
    return p


@durable("algorithms.Regret")
@dataclass(frozen=True, slots=True)
class Regret:
    """A learner's regret, the same shape for every learner: after `n` samples, the cumulative squared loss
    of its prequential predictions `loss`, that of the best comparator in hindsight `best_loss` (POF-MKL:
    the best single kernel; FedBNR: the best fixed ridge predictor on the client's own data), and which
    comparator that is.

    >>> r = Regret(n=4, loss=2.0, best_loss=1.5)
    >>> r.regret, r.per_sample
    (0.5, 0.125)
    """

    n: float
    loss: float
    best_loss: float
    best: int = -1  # index of the best comparator (kernel), -1 when there is none

    @property
    def regret(self) -> float:
        return self.loss - self.best_loss

    @property
    def per_sample(self) -> float:
        return self.regret / self.n if self.n else math.nan


@durable("algorithms.Update")
@dataclass(frozen=True, slots=True)
class Update:
    """One upload's content before the envelope: the arrays of the algorithm's update kind.

    `global_version` is the global it was computed against; `seq` is set only by learners that number
    their own uploads (the agent numbers the others); `n_samples` is how many samples it summarises.

    >>> Update({"delta": np.zeros((1, 4))}, n_samples=1, global_version=0).n_numbers
    4
    """

    arrays: Mapping[str, np.ndarray]
    n_samples: int
    global_version: int
    seq: int | None = None
    epoch: int = 0

    @property
    def n_numbers(self) -> int:
        """Model numbers carried: the floating-point arrays' sizes (the paper's `M·2D`; indices not counted)."""
        return int(sum(np.asarray(a).size for a in self.arrays.values() if np.asarray(a).dtype.kind == "f"))


@runtime_checkable
class Learner(Protocol):
    """The client half an agent runs (one per client). Deterministic given its construction.

    `begin_learn` predicts the labelled sample and does whatever must happen before the prediction is
    published; `end_learn` finishes learning it. `learn` is both. A `ValueError` from either leaves the
    learner unchanged (the agent counts the sample as skipped). `observe_time(ts)` comes before them with the
    reading's time (seconds since the epoch, the sensor's or its arrival's): the one time base of a fleet, which
    learners that forget in time (FedBNR's `half_life_s`) read instead of their own clock.

    Declared capabilities (class attributes, read by the cores — never probed for):

    * `classifier`: `class_probabilities(x)` gives the class probabilities (None otherwise) and
      `last_probabilities` those of its last `begin_learn` (read instead of predicting a second time).
    * `sample_sensitivity`: `upload_sensitivity(label_bound) -> UploadSensitivity` says how far one sample (its
      label clipped to `±label_bound`) can move an upload. Differential privacy (:mod:`streamfed.privacy`)
      uses it; without it every upload is clipped as a whole.
    * `noise_aware` (a Bayesian learner): `noise_variance(x, noise_std) -> float`, what noise of that
      per-entry scale in the global adds to the predictive variance at `x` (differential privacy adds it to
      `predict`'s).

    And `pending_samples: int`, samples learned that no upload may carry yet (FedBNR: below its privacy
    floor), said at the end of a finite stream; `label_in_use`, the label as last learned when a wrapper
    changed it (clipped), None otherwise. :class:`BaseLearner` gives every one of these a default.
    """

    @property
    def global_version(self) -> int: ...
    @property
    def kernel_names(self) -> Sequence[str]: ...
    @property
    def kernel_weights(self) -> np.ndarray | None: ...
    def predict(self, x: np.ndarray) -> tuple[float, float | None]: ...
    def observe_time(self, ts: float) -> None: ...
    def begin_learn(self, x: np.ndarray, y: float) -> tuple[float, float | None]: ...
    def end_learn(self) -> None: ...
    def learn(self, x: np.ndarray, y: float) -> tuple[float, float | None]: ...
    def take_update(self) -> Update | None: ...
    def flush(self) -> list[Update]: ...
    def install_global(self, msg: Message) -> bool: ...
    def regret(self) -> Regret: ...
    def diagnostics(self) -> Mapping[str, float]: ...  # a few named numbers worth watching ({} if none)
    def warm_up(self, x: np.ndarray) -> None: ...
    # declared capabilities and their members (defaults in BaseLearner)
    classifier: bool
    sample_sensitivity: bool
    noise_aware: bool
    label_in_use: float | None
    last_probabilities: np.ndarray | None
    @property
    def pending_samples(self) -> int: ...
    def class_probabilities(self, x: np.ndarray) -> np.ndarray | None: ...
    def upload_sensitivity(self, label_bound: float) -> UploadSensitivity: ...
    def noise_variance(self, x: np.ndarray, noise_std: float) -> float: ...


@runtime_checkable
class Aggregation(Protocol):
    """The server half (one per aggregator, shard or reducer). `check` never changes anything; the item it
    returns is what `take`, `apply_round` and `partial` accept.

    `apply_round(round, items)`: in a lock-step fleet `round` is the seq every item carries; the replay
    also calls it once per step with `round` = the step for algorithms without lock-step rounds, so an
    order-free aggregation takes sequence numbers from its items, not from `round`. `close_window(order,
    mark)`: `order` ranks the fleet's clients (fold in that order for reproducible sums), `mark(client)`
    is the highest seq up to which the core has received everything from that client.

    `diagnostics() -> Mapping[str, float]`: a few named numbers worth watching (exported as
    `streamfed_aggregator_value{name=…}`, finite ones only: :func:`aggregation_diagnostics`).

    Declared capabilities (class attributes): `shardable` — it runs in shards and the reducer (`partial`,
    `read_partial`, `apply_partial`); `for_partials(role)` is called once by a shard or the reducer and may
    refuse a configuration that cannot be computed from partial sums. `recoverable` — it has
    `rebase(version, epoch)`: start over after the aggregator's state was lost (the operator's
    `--recover`, docs/reliability.md § Lost state): the global becomes `version` (above every version the
    agents have seen) with nothing in it; an aggregation whose learners re-upload their totals on a newer epoch
    (FedBNR) moves to `epoch`, so the global is rebuilt exactly. Without it the aggregator can only say that
    its state is behind. :class:`BaseAggregation` gives the defaults.

    Partials are combined by `combine_partials(totals, order)` (default: `+`, in arrival order). `round_kind`
    (None by default) — a lock-step round's global depends on the order its updates are added, so a lock-step
    shard sends a round as its clients' updates themselves (`round_partial`, message kind `round_kind`) and
    `combine_partials` / `apply_partial` add them in the fleet's `order`, as the single aggregator's
    `apply_round` does: the sharded global then equals the single aggregator's bit for bit.

    `check` also enforces the fleet's declared bounds (`cfg.robust`): the largest update an honest client can
    produce from the configuration, its labels clipped to `±label_bound` — anything beyond is a `ValueError`."""

    @property
    def version(self) -> int: ...
    def check(self, msg: Message) -> Any: ...
    def take(self, client: str, seq: int, item: Any) -> None: ...
    def pending(self) -> bool: ...
    def close_window(self, order: Mapping[str, int], mark: Callable[[str], int]) -> bool: ...
    def apply_round(self, round: int, items: Sequence[tuple[str, Any]]) -> None: ...
    def included(self) -> dict[str, int]: ...
    def global_message(self, fleet: str, sender: str, kernel_version: str) -> Message: ...
    def partial(self, items: Sequence[Any]) -> tuple[dict[str, np.ndarray], int, int]: ...
    def read_partial(self, msg: Message) -> Any: ...  # a partial's total (combine_partials adds totals)
    def combine_partials(self, totals: Sequence[Any], order: Mapping[str, int]) -> Any: ...
    def round_partial(self, items: Sequence[Any]) -> tuple[dict[str, np.ndarray], int, int]: ...
    def apply_partial(self, total: Any, n_clients: int, included: Mapping[str, int]) -> None: ...
    def warm_up(self) -> None: ...
    def diagnostics(self) -> Mapping[str, float]: ...
    shardable: bool
    recoverable: bool
    checks_sums: bool
    round_kind: str | None
    def for_partials(self, role: Literal["shard", "reducer"]) -> None: ...
    def rebase(self, version: int, epoch: int) -> None: ...
    def check_sum(self, total: Any, n_samples: int) -> None: ...  # secure aggregation's unmasked sum


@durable("algorithms.UploadSensitivity")
@dataclass(frozen=True, slots=True)
class UploadSensitivity:
    """What differential privacy must know of a learner's uploads (docs/privacy.md).

    `arrays`: the floating arrays that carry information about samples (noised); the others are public
    (counts, kernel indices) — None: every floating array. `l2`: the L2 norm by which adding or removing
    one sample (label within the bound asked for) can move those arrays together; None: not bounded per
    sample, so each upload is clipped to a norm `C` as a whole (two uploads then differ by at most `2C`).
    `scatter`: packed upper triangles of scatter matrices, by array name → matrix size; their noise is
    symmetric, and a public shift on their diagonal keeps the noisy sum positive semi-definite. `count`: the
    array holding the upload's sample count, if any (not noised: under DP's public schedule it is set to the
    schedule's count, docs/privacy.md).

    >>> UploadSensitivity(("S_upper", "b", "q"), 1.7, {"S_upper": 5}).l2
    1.7
    """

    arrays: tuple[str, ...] | None = None
    l2: float | None = None
    scatter: Mapping[str, int] = field(default_factory=dict)
    count: str | None = None


class ObservedClock:
    """The time base of a learner that forgets in time: :meth:`observe_time` records the reading's time of the
    sample that follows, :meth:`now` is the time that sample is learned at — the observed time (the fleet's one
    time base: sensors' clocks, or the arrival time of readings without one), else this process's clock. Put it
    before the learner's base class.

    >>> c = ObservedClock()
    >>> c.observe_time(1.7e9); c.now()
    1700000000.0
    >>> c.observe_time(float("nan"))
    Traceback (most recent call last):
    ValueError: time must be finite, got nan
    """

    # the time of the sample being learned, as the agent observed it (None: not told — this process's clock)
    _observed: float | None = None

    def observe_time(self, ts: float) -> None:
        """The reading's time (seconds since the epoch) of the sample that follows: with a half-life, what it is
        discounted from. A time that is not finite is refused (`ValueError`, nothing changed)."""
        ts = float(ts)
        if not math.isfinite(ts):
            raise ValueError(f"time must be finite, got {ts!r}")
        self._observed = ts

    def now(self) -> float:
        """The time a sample is learned at: the reading's time the agent observed, else this process's clock."""
        return time.time() if self._observed is None else self._observed


class BaseLearner:
    """The :class:`Learner` contract with a default for everything that has a sensible one. A family writes
    `predict`, `begin_learn` (and `end_learn` when learning is split around the published prediction),
    `take_update`, `install_global` and `regret`; it overrides the rest only where it differs, and declares
    its capabilities by setting the class attributes.

    >>> class Constant(BaseLearner):
    ...     def predict(self, x): return 1.0, None
    ...     def begin_learn(self, x, y): return self.predict(x)
    >>> lr = Constant()
    >>> lr.learn(np.zeros(1), 2.0), lr.flush(), lr.diagnostics(), lr.global_version, lr.pending_samples
    ((1.0, None), [], {}, 0, 0)
    >>> lr.classifier, lr.class_probabilities(np.zeros(1)), lr.upload_sensitivity(3.0).l2
    (False, None, None)
    """

    classifier: ClassVar[bool] = False  # class_probabilities / last_probabilities are real
    sample_sensitivity: ClassVar[bool] = False  # upload_sensitivity bounds one sample's influence
    noise_aware: ClassVar[bool] = False  # noise_variance says what the global's noise adds
    # class-level defaults (instance attributes where a learner has them; never pickled when not)
    _version: int = 0
    last_probabilities: np.ndarray | None = None
    label_in_use: float | None = None

    @property
    def global_version(self) -> int:
        """The version of the installed global (default: the `_version` attribute)."""
        return int(self._version)

    @property
    def kernel_names(self) -> Sequence[str]:
        return ()

    @property
    def kernel_weights(self) -> np.ndarray | None:
        return None

    @property
    def pending_samples(self) -> int:
        return 0

    def predict(self, x: np.ndarray) -> tuple[float, float | None]:
        raise NotImplementedError

    def observe_time(self, ts: float) -> None:
        """The time of the sample that follows (default: ignored — a learner that does not forget in time)."""

    def begin_learn(self, x: np.ndarray, y: float) -> tuple[float, float | None]:
        raise NotImplementedError

    def end_learn(self) -> None:
        """Finish learning the sample of `begin_learn` (default: `begin_learn` did everything)."""

    def learn(self, x: np.ndarray, y: float) -> tuple[float, float | None]:
        out = self.begin_learn(x, y)
        self.end_learn()
        return out

    def take_update(self) -> Update | None:
        raise NotImplementedError

    def flush(self) -> list[Update]:
        """What must leave before the process does (default: nothing; below a privacy floor nothing may)."""
        return []

    def install_global(self, msg: Message) -> bool:
        raise NotImplementedError

    def regret(self) -> Regret:
        raise NotImplementedError

    def diagnostics(self) -> Mapping[str, float]:
        return {}

    def warm_up(self, x: np.ndarray) -> None:
        """Run the learning path once on a copy (whatever compiles or allocates lazily does it now)."""
        copy.deepcopy(self).learn(x, 0.0)

    def class_probabilities(self, x: np.ndarray) -> np.ndarray | None:
        return None

    def upload_sensitivity(self, label_bound: float) -> UploadSensitivity:
        return UploadSensitivity()

    def noise_variance(self, x: np.ndarray, noise_std: float) -> float:
        return 0.0


class WrappedLearner(BaseLearner):
    """A learner around another one (`inner`): every member of the contract, the declared capabilities
    included, is the inner learner's until a wrapper overrides it.

    >>> class Noisy(WrappedLearner):
    ...     def __init__(self, inner): self.inner = inner
    >>> class Classifier(BaseLearner):
    ...     classifier = True
    >>> Noisy(Classifier()).classifier, Noisy(BaseLearner()).classifier
    (True, False)
    """

    inner: Learner

    @property  # type: ignore[misc]
    def classifier(self) -> bool:  # type: ignore[override]
        return bool(self.inner.classifier)

    @property  # type: ignore[misc]
    def sample_sensitivity(self) -> bool:  # type: ignore[override]
        return bool(self.inner.sample_sensitivity)

    @property  # type: ignore[misc]
    def noise_aware(self) -> bool:  # type: ignore[override]
        return bool(self.inner.noise_aware)

    # a wrapper that sets these itself shadows them with a class attribute of its own
    @property  # type: ignore[misc]
    def label_in_use(self) -> float | None:  # type: ignore[override]
        return self.inner.label_in_use

    @property  # type: ignore[misc]
    def last_probabilities(self) -> np.ndarray | None:  # type: ignore[override]
        return self.inner.last_probabilities

    @property
    def global_version(self) -> int:
        return self.inner.global_version

    @property
    def kernel_names(self) -> Sequence[str]:
        return self.inner.kernel_names

    @property
    def kernel_weights(self) -> np.ndarray | None:
        return self.inner.kernel_weights

    @property
    def pending_samples(self) -> int:
        return int(self.inner.pending_samples)

    def predict(self, x: np.ndarray) -> tuple[float, float | None]:
        return self.inner.predict(x)

    def observe_time(self, ts: float) -> None:
        self.inner.observe_time(ts)

    def begin_learn(self, x: np.ndarray, y: float) -> tuple[float, float | None]:
        return self.inner.begin_learn(x, y)

    def end_learn(self) -> None:
        self.inner.end_learn()

    def take_update(self) -> Update | None:
        return self.inner.take_update()

    def flush(self) -> list[Update]:
        return self.inner.flush()

    def install_global(self, msg: Message) -> bool:
        return self.inner.install_global(msg)

    def regret(self) -> Regret:
        return self.inner.regret()

    def diagnostics(self) -> Mapping[str, float]:
        return self.inner.diagnostics()

    def warm_up(self, x: np.ndarray) -> None:
        self.inner.warm_up(x)

    def class_probabilities(self, x: np.ndarray) -> np.ndarray | None:
        return self.inner.class_probabilities(x)

    def upload_sensitivity(self, label_bound: float) -> UploadSensitivity:
        return self.inner.upload_sensitivity(label_bound)

    def noise_variance(self, x: np.ndarray, noise_std: float) -> float:
        return self.inner.noise_variance(x, noise_std)


class BaseAggregation:
    """The :class:`Aggregation` contract with its defaults: `version` from the `_version` attribute, no
    diagnostics, nothing to warm up, and the declared capabilities — `shardable` (True: `partial`,
    `read_partial`, `apply_partial` are real; `for_partials` refuses a shard or reducer role otherwise) and
    `recoverable` (False: no `rebase`) and `checks_sums` (False: `check_sum` accepts every sum), and
    `round_kind` (None: partials are sums, added in any order by `combine_partials`).

    >>> BaseAggregation().diagnostics(), BaseAggregation.shardable, BaseAggregation.recoverable
    ({}, True, False)
    >>> BaseAggregation().combine_partials([np.ones(2), np.full(2, 2.0)], {}).tolist(), BaseAggregation.round_kind
    ([3.0, 3.0], None)
    """

    shardable: ClassVar[bool] = True
    recoverable: ClassVar[bool] = False
    checks_sums: ClassVar[bool] = False
    round_kind: ClassVar[str | None] = None
    _version: int = 0

    @property
    def version(self) -> int:
        return int(self._version)

    def diagnostics(self) -> Mapping[str, float]:
        return {}

    def warm_up(self) -> None:
        """Run what compiles or allocates lazily (default: nothing)."""

    def for_partials(self, role: Literal["shard", "reducer"]) -> None:
        """Told once that it serves a shard or the reducer (default: refused unless `shardable`)."""
        if not self.shardable:
            raise ValueError(f"{type(self).__name__} cannot run in a sharded fleet (shards and a reducer)")

    def rebase(self, version: int, epoch: int) -> None:
        raise NotImplementedError(f"{type(self).__name__} cannot rebuild its global from its agents")

    def partial(self, items: Sequence[Any]) -> tuple[dict[str, np.ndarray], int, int]:
        raise NotImplementedError(f"{type(self).__name__} has no partial sums")

    def read_partial(self, msg: Message) -> Any:
        raise NotImplementedError(f"{type(self).__name__} has no partial sums")

    def combine_partials(self, totals: Sequence[Any], order: Mapping[str, int]) -> Any:
        """Partials' totals (what `read_partial` gave) as one: their sum, in the order given (`order`, the
        fleet's client ranks, is for a `round_kind` family, whose totals are not sums)."""
        out = totals[0]
        for t in totals[1:]:
            out = out + t
        return out

    def round_partial(self, items: Sequence[Any]) -> tuple[dict[str, np.ndarray], int, int]:
        """A lock-step shard's round as kind `round_kind` (each item's own arrays, in the order of the
        contributor lists); only for a family with a `round_kind`."""
        raise NotImplementedError(f"{type(self).__name__} sends lock-step rounds as sums (`partial`)")

    def apply_partial(self, total: Any, n_clients: int, included: Mapping[str, int]) -> None:
        raise NotImplementedError(f"{type(self).__name__} has no partial sums")

    def check_sum(self, total: Any, n_samples: int) -> None:
        """`ValueError` unless `total` (what `read_partial` gave) could be the sum of honest uploads of `n_samples`
        samples in all — the declared bounds of a secure-aggregation round, whose single uploads the aggregator
        never sees (docs/privacy.md). Default: every sum passes (`checks_sums` False)."""


def aggregation_diagnostics(aggregation: Aggregation) -> dict[str, float]:
    """An aggregation's diagnostics, finite values only (what the metrics export)."""
    return {str(k): float(v) for k, v in aggregation.diagnostics().items() if math.isfinite(float(v))}


@dataclass(frozen=True)
class ReplayVariant:
    """One row of the replay's comparison: a name, a description, and how it is arranged."""

    name: str
    title: str
    arrangement: Literal["federated", "local", "centralised"] = "federated"
    options: Mapping[str, Any] = field(default_factory=dict)


class Algorithm:
    """An algorithm family. Subclasses set the class attributes and implement the factories.

    `lockstep`: it can run the paper's lock-step rounds (a round = every client's seq-`r` update);
    otherwise it is order-free and always aggregates in windows. `bayesian`: predictions carry a
    variance. `cheap_regret`: `Learner.regret()` is cheap enough to read every few samples (else the
    agent reads it once per upload). `in_fleet`: it runs over MQTT (the paper's comparison baselines
    run in the replay only). `task`: ``"regression"`` (a real target; predictions are a mean and maybe a
    variance) or ``"classification"`` (the target is a class index 0, 1, …; the prediction's mean is the most
    probable class) — the agents standardise a regression target only.
    """

    name: ClassVar[str]
    title: ClassVar[str]
    Params: ClassVar[type[Params]]
    task: ClassVar[Literal["regression", "classification"]] = "regression"
    lockstep: ClassVar[bool] = False
    bayesian: ClassVar[bool] = False
    cheap_regret: ClassVar[bool] = True
    in_fleet: ClassVar[bool] = True
    robust_by_default: ClassVar[bool] = False

    # ---------------------------------------------------------------- configuration and wire
    def feature_dim(self, cfg: FleetConfig) -> int:
        """Features per kernel as the learner sees them (for the families whose wire schemas need it)."""
        raise NotImplementedError(f"algorithm {self.name!r} declares no feature dimension")

    def schemas(self, cfg: FleetConfig) -> list[MessageSchema]:
        """Its message kinds: exactly one on `updates`, one on `global`, one on `partials`."""
        raise NotImplementedError

    def kernel_version(self, cfg: FleetConfig) -> str:
        """The feature-map version every message of this fleet carries."""
        raise NotImplementedError

    # ---------------------------------------------------------------- the two halves
    def learner(self, cfg: FleetConfig, client_id: str, index: int, mode: Mode = "async") -> Learner:
        """The client half of agent `client_id`, the `index`-th client of the fleet."""
        raise NotImplementedError

    def aggregation(self, cfg: FleetConfig, *, max_abs: float = 1e100, check_stats: bool = True) -> Aggregation:
        """The server half. Every value of an accepted update is bounded by `max_abs`; `check_stats=False`
        lets through statistics that are not those of real samples (noised or masked uploads)."""
        raise NotImplementedError

    # ---------------------------------------------------------------- evaluation
    def replay_variants(self) -> list[ReplayVariant]:
        """The rows this family contributes to `streamfed replay` (default: itself, federated)."""
        return [ReplayVariant(self.name, self.title)]

    def estimator(self, **params: Any) -> Any:
        """Its River estimator (a fleet of one)."""
        raise NotImplementedError

    def task_of(self, cfg: FleetConfig) -> Literal["regression", "classification"]:
        """The task of this configuration: `task`, unless a parameter makes the family a classifier (PVI's
        Bernoulli likelihood). A classification target is a class label and is never standardised."""
        return self.task

    def n_classes(self, cfg: FleetConfig) -> int | None:
        """A classifier's number of classes (its params' `n_classes`); None for a regressor."""
        if self.task != "classification":
            return None
        return int(cfg.params.n_classes)  # type: ignore[attr-defined]

    def demo_settings(self) -> dict[str, Any]:
        """Fleet-configuration fields (and `params`) that make a good live demo of it on the Beijing streams."""
        return {}

    def __repr__(self) -> str:
        return f"<algorithm {self.name}>"
