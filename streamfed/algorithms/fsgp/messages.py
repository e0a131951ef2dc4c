"""What FSGP's halves exchange, before the envelope (docs/algorithms.md, "FSGP"): a client's
:class:`Upload` (delta statistics, and perhaps a proposal of new hyperparameters) and the server's
:class:`GlobalModel` (summed statistics under the `(θ, σ, Z)` of version `epoch`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from streamfed.algorithms.fsgp.kernels import Hyper
from streamfed.algorithms.fsgp.posterior import Stats
from streamfed.core.durable import durable

__all__ = ["GlobalModel", "TemperedUpload", "Upload"]


@durable("fsgp.Upload")
@dataclass(frozen=True)
class Upload:
    """Delta statistics of at least `min_upload` samples under version `stats.epoch`, numbered `seq` by
    its client, and optionally the client's locally fitted `proposal` with its FedAvg `weight` (the
    samples it was fitted on).

    >>> import numpy as np
    >>> up = Upload("a", 1, 0, Stats.zeros(2))
    >>> up.epoch, up.proposal is None, up.weight
    (0, True, 0.0)
    """

    client: str
    seq: int
    base_version: int
    stats: Stats
    proposal: Hyper | None = None
    weight: float = 0.0
    # with forgetting (`half_life_s`, :mod:`streamfed.core.discount`): the time the statistics are discounted to,
    # and the raw number of samples they summarise (`stats.n` is then a discounted count, not a whole number);
    # count 0: no forgetting
    time: float = 0.0
    count: int = 0

    @property
    def epoch(self) -> int:
        return int(self.stats.epoch)

    @property
    def n_samples(self) -> float:
        """The samples it summarises (the raw count with forgetting): what the privacy floor counts."""
        return float(self.count) if self.count else float(self.stats.n)


@durable("fsgp.GlobalModel")
@dataclass(frozen=True)
class GlobalModel:
    """The summed statistics of every included upload, carried to the current `(θ, σ, Z)` (`hyper`, version
    `epoch`), and `included` (per client: the highest seq with every seq up to it summed).

    >>> import numpy as np
    >>> g = GlobalModel(1, 0, Hyper.initial("se", np.zeros((2, 1))), Stats.zeros(2), {"a": 1})
    >>> g.version, g.included
    (1, {'a': 1})
    """

    version: int
    epoch: int
    hyper: Hyper
    stats: Stats
    included: dict[str, int] = field(default_factory=dict)
    time: float = 0.0  # with forgetting: the reference time the statistics are discounted to


@durable("fsgp.TemperedUpload")
@dataclass(frozen=True)
class TemperedUpload(Upload):
    """An upload summed with `share` ∈ [0, 1] (robust mode's share cap and screening): the server sums
    `share · stats` and weighs its proposal `share · weight`. `share = 0`: accepted — its seq counts as
    included — but nothing summed.

    >>> TemperedUpload("a", 1, 0, Stats.zeros(2), share=0.5).share
    0.5

    (Fields after `weight` — `time`, `count`, `share` — are given by keyword.)
    """

    share: float = 1.0
