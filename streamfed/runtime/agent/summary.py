"""What an agent says when a finite source (a CSV file, JSON lines, a River dataset) ends: how many items it
read, how many it learned, how many it skipped and why, and its prequential error in the stream's own units —
and whether the run should count as failed (:meth:`RunSummary.problem`): nothing learned, or more of the
stream skipped than the configured share.

The counts are the agent's own: the items its skip watch saw (every reading, label and skip the source gave),
and the scored samples and errors of its :class:`~streamfed.fleet.telemetry.AgentStats`, whose predictions
are in the stream's units (an agent that standardises maps them back before it scores them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

__all__ = ["RunSummary"]

_NOT_SHARED = "below_privacy_floor"


@dataclass(frozen=True)
class RunSummary:
    """An agent's finite run in numbers, and its one-line account.

    >>> s = RunSummary("a1", "csv:a.csv", items=10, learned=7, skipped={"missing_feature": 3}, mse=4.0,
    ...                max_skip_share=0.5)
    >>> print(s.line())
    agent a1: csv:a.csv ended: 10 items, 7 learned, 3 skipped (missing_feature 3); MSE 4 (RMSE 2) in the stream's units
    >>> s.problem() is None, RunSummary("a1", "csv:x.csv", items=4, learned=0, skipped={"non_numeric": 4}).problem()
    (True, 'agent a1: csv:x.csv: nothing learned: all 4 items skipped (non_numeric 4)')
    """

    client: str
    source: str
    items: int
    learned: int
    skipped: dict[str, int] = field(default_factory=dict)
    mse: float = math.nan  # regression: prequential MSE in the stream's units
    accuracy: float | None = None  # classification: prequential accuracy, log loss, ECE
    log_loss: float | None = None
    ece: float | None = None
    max_skip_share: float | None = None
    not_shared: int = 0  # learned samples the stream ended below the privacy floor with (never uploaded)

    @classmethod
    def of(cls, service: Any, source: str) -> RunSummary:
        """The summary of an :class:`~streamfed.runtime.agent.AgentService` whose source has ended."""
        watch, stats = service.skip_watch, service.core.stats
        # learned, but held back below the upload floor at the end: not an input skipped (said apart)
        by_reason = {r: k for r, k in stats.skipped.items() if k and r != _NOT_SHARED}
        cls_stats = stats.classification
        return cls(client=service.client_id, source=source, items=watch.seen, learned=stats.samples,
                   skipped=dict(sorted(by_reason.items(), key=lambda rk: -rk[1])), mse=stats.mse,
                   accuracy=None if cls_stats is None else cls_stats.accuracy,
                   log_loss=None if cls_stats is None else cls_stats.log_loss,
                   ece=None if cls_stats is None else cls_stats.expected_calibration_error,
                   max_skip_share=watch.max_share, not_shared=stats.skipped.get(_NOT_SHARED, 0))

    @property
    def n_skipped(self) -> int:
        return sum(self.skipped.values())

    def _reasons(self) -> str:
        return ", ".join(f"{r} {k}" for r, k in self.skipped.items())

    def line(self) -> str:
        """The account of the run, one line."""
        text = f"agent {self.client}: {self.source} ended: {self.items} items, {self.learned} learned"
        if self.skipped:
            text += f", {self.n_skipped} skipped ({self._reasons()})"
        if self.not_shared:
            text += f", {self.not_shared} learned but not shared (below the upload floor when it ended)"
        if self.accuracy is not None:
            text += (f"; accuracy {self.accuracy:.4g}, log loss {self.log_loss:.4g}, "
                     f"ECE {self.ece:.4g}")
        elif math.isfinite(self.mse):
            text += f"; MSE {self.mse:.4g} (RMSE {math.sqrt(self.mse):.4g}) in the stream's units"
        return text

    def problem(self) -> str | None:
        """Why this run should end with a non-zero status (one line), or None: nothing learned from a
        non-empty stream, or a skipped share above `max_skip_share`."""
        where = f"agent {self.client}: {self.source}"
        if self.learned == 0 and self.items:
            why = f" ({self._reasons()})" if self.skipped else ""
            return f"{where}: nothing learned: all {self.items} items skipped{why}"
        if self.max_skip_share is not None and self.items and self.n_skipped > self.max_skip_share * self.items:
            return (f"{where}: {self.n_skipped} of {self.items} items skipped ({100 * self.n_skipped / self.items:.0f}%"
                    f" > --max-skip-share {100 * self.max_skip_share:.0f}%): {self._reasons()}")
        return None
