"""Robust aggregation of summed statistics (docs/reliability.md § Bounded influence; `[fleet.robust]
aggregation = "robust"`), for any aggregation that sums uploads of samples' statistics (FedBNR, FSGP):

* **share cap** — no client's samples may exceed `share_cap` of the samples in the sums: an upload that would
  put its client over is taken *tempered*, `w · stats` with the fraction `w` that fits (:func:`share_allowance`);
  a cold-start `floor` of samples any client may hold whatever the total. The cap is `fair_share/k` for a
  fleet whose `k` members have been heard from (`fair_share = 1.5`: an honest member's fair share `1/k` with
  room for unequal rates; the roster bounds `k`, so an attacker cannot widen it under new names), or a fixed
  `share_cap` — never below `1.5/k` (:func:`effective_cap`: a fixed 0.25 would stop every member of a fleet of
  two or three from adding anything past the floor);
* **soft screening** — each client's residual ratio is followed over time (an exponential average over its
  uploads); a client whose average is over `soft` × the median of the others' averages has its uploads taken
  with weight `soft · median / average`. An honest member's residuals average close to the fleet's; a member
  biasing its labels has a ratio that grows with the square of the bias, so what it moves the global by —
  weight × bias — is largest at the threshold and falls beyond it;
* **systematic screening** — an aggregation that can tell how far a client's summed labels sit from the
  fleet's in directions its own inputs explain (:meth:`RobustShares._systematic`; FedBNR) records that level per
  client; a client over `systematic` × the median of the others' levels is weighed down by the ratio (FedBNR
  applies the weight to the client's whole sums at every global: docs/reliability.md §7.2.1). Noise averages
  out of summed statistics and a shift of the labels does not;
* **residual screening** — an upload whose mean squared residual under the current global, relative to what
  the global predicts of it, exceeds `screen` × the median of the other clients' latest ratios is taken with
  weight 0 (accepted — its sequence number counts as included — but nothing summed);
* **cold-start quorum** — nothing is summed until `quorum` clients have sent an upload (a majority of the
  roster when there is one), so the first comer does not define the global the others are screened against.

:class:`RobustShares` is the state machine; an aggregation supplies how to temper an upload, how many
samples it holds and its residual ratio (:meth:`RobustShares._ratio`). Pure Python, no algorithm named.

>>> share_allowance(10.0, 90.0, 0.25, 0.0)
16.666666666666668
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from streamfed.core.durable import durable

__all__ = ["Robust", "RobustShares", "effective_cap", "share_allowance"]

# a member's fair share 1/k with room for unequal rates: the cap of a fleet of k members is at least 1.5/k
FAIR_SHARE_SLACK = 1.5


def effective_cap(share_cap: float | None, members: int, fair_share: float | None = None) -> float:
    """The share cap of a fleet of `members`: `fair_share/members` when `fair_share` is given, else
    `share_cap`, and never below `1.5/members` (a fleet too small for the configured cap; one member holds
    everything).

    >>> effective_cap(0.25, 12), effective_cap(0.25, 3), effective_cap(0.25, 1)
    (0.25, 0.5, 1.0)
    >>> effective_cap(None, 12, 1.5), effective_cap(0.25, 12, 1.5)
    (0.125, 0.125)
    """
    if members <= 0:
        return 1.0
    floor = min(1.0, FAIR_SHARE_SLACK / members)
    if fair_share is not None:
        return max(floor, min(1.0, fair_share / members))
    return max(share_cap if share_cap is not None else 1.0, floor)


def share_allowance(held: float, total: float, cap: float, floor: float) -> float:
    """The most samples a client holding `held` of a global of `total` (its own included) may add: after
    adding `x`, `held + x <= max(cap·(total + x), floor)`, i.e. `x = max(floor − held,
    (cap·total − held)/(1 − cap), 0)` (unbounded for `cap = 1`).

    >>> share_allowance(0.0, 0.0, 0.25, 32.0)  # cold start: the floor
    32.0
    >>> share_allowance(10.0, 90.0, 0.25, 0.0)  # (22.5 − 10)/0.75: then 26.67/120 = 0.25 exactly
    16.666666666666668
    """
    if cap >= 1.0:
        return math.inf
    return max(floor - held, (cap * total - held) / (1.0 - cap), 0.0)


@durable("algorithms.Robust")
@dataclass(frozen=True)
class Robust:
    """Settings of robust aggregation of summed statistics: `share_cap` (largest share of the global's samples
    one client may hold), `floor` (samples any client may hold whatever the total: the cold start), `screen`
    (an upload whose residual ratio exceeds `screen` × the median of the other clients' latest ratios is taken
    with weight 0), `screen_clients` (how many other clients must have a ratio before screening starts),
    `fair_share` (None: the fixed `share_cap`; else the cap is `fair_share / members`) and `soft` (0: off; else a
    client whose average ratio exceeds `soft` × the others' median is down-weighted — module docstring),
    `systematic` (0: off; else the systematic screen's threshold over the median level) and `systematic_rank`
    (0: levels over every feature direction; else over the fleet's leading `systematic_rank` directions, where
    noise explains `rank/n` of a level instead of `F/n`) and `noise_floor` (FedBNR's evidence: `"fit"`, the
    median member's residual under the fit; `"leave_out"`, under the others' fit; `"off"`).

    >>> Robust(share_cap=0.25, floor=128.0).screen
    50.0
    """

    share_cap: float
    floor: float
    screen: float = 50.0
    screen_clients: int = 3
    fair_share: float | None = None
    soft: float = 0.0
    systematic: float = 2.0
    systematic_rank: int = 4
    noise_floor: str = "fit"

    @classmethod
    def of(cls, robust: Any, params: Any) -> Robust | None:
        """The settings a fleet asks for: `robust` its `[fleet.robust]` (None in exact mode), `params` the
        algorithm's, with `robust_share_floor` (None: one upload, `min_upload` — a larger cold-start floor let
        colluders hold most of the first globals), `robust_screen`, `robust_screen_clients` and, where it has
        one, `robust_soft`.

        >>> from types import SimpleNamespace as NS
        >>> Robust.of(NS(aggregation="robust", share_cap=0.25, fair_share=1.5),
        ...           NS(robust_share_floor=None, min_upload=8, robust_screen=50.0, robust_screen_clients=3)).floor
        8.0
        """
        if robust.aggregation != "robust":
            return None
        floor = params.robust_share_floor if params.robust_share_floor is not None else params.min_upload
        return cls(share_cap=robust.share_cap, floor=float(floor), screen=params.robust_screen,
                   screen_clients=params.robust_screen_clients, fair_share=robust.fair_share,
                   soft=float(getattr(params, "robust_soft", 0.0) or 0.0))


@durable("algorithms.RobustShares")
class RobustShares:
    """Share cap, residual screening and the cold-start quorum over an order-free summing server
    (`self.server.apply(item) -> bool`, `self.server.version`). Subclasses define :meth:`_samples`,
    :meth:`_tempered` and :meth:`_ratio`, call :meth:`_start_robust` at construction and
    :meth:`_check_cold_start` in `check`, and put this class before their summing window (its `take` serves exact
    mode).

    >>> class Server:
    ...     version, sums = 0, 0.0
    ...     def apply(self, up): self.sums += up[1] * up[2]; return True
    >>> class Agg(RobustShares):
    ...     def __init__(self): self.server, self.robust = Server(), Robust(0.5, floor=10.0, screen_clients=0)
    ...     def _samples(self, item): return item[1]
    ...     def _tempered(self, item, w): return (item[0], item[1], w)
    ...     def _ratio(self, item): return 1.0
    >>> a = Agg(); a._start_robust(None); a.quorum
    1
    >>> for c, n in [("a", 10.0), ("b", 10.0), ("c", 10.0), ("a", 30.0)]: a.take_robust(c, (c, n))
    >>> a.client_shares(), a.tempered  # a's 30 are taken with weight 1/3: a then holds half of the samples
    ({'a': 0.5, 'b': 0.25, 'c': 0.25}, 1)
    """

    server: Any
    robust: Robust | None = None
    _roster: int | None = None
    _dirty: bool = False

    # ---------------------------------------------------------------- what an aggregation supplies
    def _samples(self, item: Any) -> float:
        raise NotImplementedError

    def _tempered(self, item: Any, w: float) -> Any:
        """`item` to be summed with weight `w` ∈ [0, 1]."""
        raise NotImplementedError

    def _ratio(self, item: Any) -> float:
        """The upload's mean squared residual under the current global over what the global predicts of it."""
        raise NotImplementedError

    def _systematic(self, client: str, item: Any) -> float | None:
        """How far the client's labels, all its uploads with this one, sit from the current global *in a
        direction its own inputs explain* (the part of its residuals a correction of the model would fit), over
        the noise level; None: the aggregation has no such statistic (the systematic screen is off)."""
        return None

    # ---------------------------------------------------------------- the state machine
    def _start_robust(self, roster: int | None) -> None:
        """Robust mode's state, empty: per-client shares, residual levels, the cold start."""
        self._roster = roster
        robust = self.robust
        if robust is None:
            return
        self._held: dict[str, float] = {}  # per client: the samples of it in the sums (weighted)
        self._total = 0.0  # Σ _held
        self._level: dict[str, tuple[float, float]] = {}  # per client: latest residual ratio, global n then
        self._avg: dict[str, float] = {}  # per client: the average of its ratios (soft screening)
        self.screened = 0  # uploads taken with weight 0
        self.tempered = 0  # uploads taken with 0 < weight < 1 (the share cap)
        # cold start: uploads wait until `quorum` clients have sent one (then screened in order); at most
        # `floor` samples per client wait, the rest is taken with weight 0. With a roster, a majority of it:
        # the median of the first ratios is then an honest one whenever fewer than half the quorum is hostile
        q = robust.screen_clients + 1
        self.quorum = q if roster is None else min(max(q, roster // 2 + 1), roster)
        self._deferred: list[tuple[str, Any]] | None = []
        self._deferred_n: dict[str, float] = {}

    def _check_cold_start(self, client: str) -> None:
        """`ValueError` for a client that already has `floor` samples waiting for the quorum (it sends again
        later: a client cannot pile up uploads before the fleet's first global)."""
        if (self.robust is not None and self._deferred is not None
                and self._deferred_n.get(client, 0.0) >= self.robust.floor):
            raise ValueError(f"cold start: client {client!r} already has {self._deferred_n[client]:g} samples "
                             f"waiting until {self.quorum} clients have sent an upload")

    def take(self, client: str, seq: int, item: Any) -> None:
        """Robust mode's `take`, or the exact one of the class that follows this one (a summing window)."""
        if self.robust is None:
            super().take(client, seq, item)  # type: ignore[misc]
        else:
            self.take_robust(client, item)

    def take_robust(self, client: str, item: Any) -> None:
        """Robust mode's `take`."""
        assert self.robust is not None
        if self._deferred is not None:
            ratio = self._ratio(item)
            if math.isfinite(ratio):  # a non-finite ratio (nothing to compare) never enters a median
                self._level.setdefault(client, (ratio, 0.0))
            held = self._deferred_n.get(client, 0.0)
            if held < self.robust.floor:
                self._deferred.append((client, item))
                self._deferred_n[client] = held + self._samples(item)
            else:  # beyond the floor nothing more could be taken from it at the start (check refuses it)
                self._apply(client, item, 0.0)
            if len(self._level) >= self.quorum:
                waiting, self._deferred = self._deferred, None
                self._deferred_n = {}
                for c, it in waiting:
                    self._take_now(c, it)
            return
        self._take_now(client, item)

    def _take_now(self, client: str, item: Any) -> None:
        assert self.robust is not None
        w_screen = self._screen_weight(client, item)
        n = self._samples(item) * w_screen
        # the roster when there is one (an attacker cannot widen the cap by appearing under new names)
        cap = effective_cap(self.robust.share_cap, len(self._level) or (self._roster or 0), self.robust.fair_share)
        allowed = share_allowance(self._held.get(client, 0.0), self._total, cap, self.robust.floor)
        if w_screen == 0.0:
            self.screened += 1
        self._apply(client, item, w_screen * (1.0 if n <= allowed else allowed / n))

    def _apply(self, client: str, item: Any, w: float) -> None:
        if self.server.apply(self._tempered(item, w)):
            self._dirty = True
            # counted when taken (even if it waits for an earlier seq): a burst cannot outrun the cap
            n = w * self._samples(item)
            self._held[client] = self._held.get(client, 0.0) + n
            self._total += n
            if 0.0 < w < 1.0:
                self.tempered += 1

    def _screen_weight(self, client: str, item: Any) -> float:
        """0 if the upload's residual ratio under the current global is beyond `screen` × the median of the
        other clients' latest ratios (with at least `screen_clients` of them), else 1; records its ratio."""
        assert self.robust is not None
        ratio = self._ratio(item)
        n_now = self._total
        # ratios taken under globals of very different sizes are not comparable (an early global is fitted to
        # few samples): the reference is the other clients' latest ratios under a global at least half as
        # large as this one, or all of theirs when fewer than `screen_clients` are
        recent = [v for c, (v, n_at) in self._level.items() if c != client and n_at >= 0.5 * n_now]
        others = recent if len(recent) >= self.robust.screen_clients else [
            v for c, (v, _) in self._level.items() if c != client]
        if not math.isfinite(ratio):
            return 0.0
        self._level[client] = (ratio, n_now)
        if not others or len(others) < self.robust.screen_clients:
            self._follow(client, ratio)
            return 1.0
        if ratio > self.robust.screen * float(np.median(others)):
            return 0.0
        return min(self._soft_weight(client, ratio), self._systematic_weight(client, item))

    def _systematic_weight(self, client: str, item: Any) -> float:
        """1, or `systematic · median / level` for a client whose systematic level (:meth:`_systematic`) is over
        `systematic` × the median of the other clients' latest levels. Noise averages out of the level as a
        client's samples accumulate, a bias does not: a member that shifts its labels by `δ` has a level `∝ δ²`
        while an honest one's is its station's own difference from the fleet, so what it moves the global by
        (weight × δ) is at most what a member at the threshold moves it by."""
        assert self.robust is not None
        if self.robust.systematic <= 0.0:
            return 1.0
        level = self._systematic(client, item)
        if level is None or not math.isfinite(level):
            return 1.0
        levels: dict[str, float] | None = getattr(self, "_sys_level", None)
        if levels is None:  # a state written before the systematic screen
            levels = {}
            self._sys_level = levels
        levels[client] = level
        others = [v for c, v in levels.items() if c != client]
        if len(others) < self.robust.screen_clients or level <= 0.0:
            return 1.0
        return min(1.0, self.robust.systematic * float(np.median(others)) / level)

    # a client's average ratio follows its last ~5 uploads: long enough that one honest outlier does not
    # down-weight it, short enough that a client that starts biasing is caught within a few uploads
    _FOLLOW = 0.2

    def _follow(self, client: str, ratio: float) -> float:
        """The client's exponential average of its residual ratios, with `ratio` folded in."""
        avg = getattr(self, "_avg", None)
        if avg is None:  # a state written before soft screening
            avg = self._avg = {}
        a = avg[client] = (1.0 - self._FOLLOW) * avg.get(client, ratio) + self._FOLLOW * ratio
        return a

    def _soft_weight(self, client: str, ratio: float) -> float:
        """1, or `soft · median / average` for a client whose average ratio is over `soft` × the median of the
        other clients' averages (module docstring)."""
        assert self.robust is not None
        a = self._follow(client, ratio)
        soft = self.robust.soft
        others = [v for c, v in self._avg.items() if c != client]
        if soft <= 0.0 or len(others) < self.robust.screen_clients or a <= 0.0:
            return 1.0
        return min(1.0, soft * float(np.median(others)) / a)

    def scale_held(self, factor: float) -> None:
        """Scale every client's samples held in the sums (and their total) by `factor` ∈ (0, 1]: sums discounted
        in time (FedBNR's `half_life_s`) hold each sample with a weight that decays, and the shares must follow."""
        if self.robust is not None:
            self._held = {c: h * factor for c, h in self._held.items()}
            self._total *= factor

    def robust_diagnostics(self) -> dict[str, float]:
        """Uploads screened out, uploads taken with weight < 1, the largest client share of the sums."""
        if self.robust is None:
            return {}
        share = max(self._held.values()) / self._total if self._total > 0 else 0.0
        return {"screened_uploads": float(self.screened), "tempered_uploads": float(self.tempered),
                "largest_client_share": float(share)}

    def client_shares(self) -> dict[str, float]:
        """Robust mode: each client's share of the samples in the sums (empty in exact mode)."""
        if self.robust is None or self._total <= 0:
            return {}
        return {c: h / self._total for c, h in self._held.items()}
