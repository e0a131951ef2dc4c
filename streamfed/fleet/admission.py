"""Per-client rate limits at the aggregator and the shards: token buckets on samples and on uploads.

A client may send on average `max_sample_rate` samples and `max_upload_rate` uploads per second, with
bursts of `sample_burst` samples and `upload_burst` uploads (a backlog after a reconnect, a CSV read at
full speed). A bucket holds at most `burst` tokens, refills at `rate` per second of the aggregator's clock
and starts full; an upload takes one upload token and `n_samples` sample tokens, or nothing if either is
short. The refusal is `rate_limited`: an honest agent keeps the upload in its outbox and sends it again, so a
fast client is slowed, never loses data, and cannot make itself more than `rate × elapsed + burst` samples of
the global (issue: one client sent 194k uploads in 20 s and became 99.5% of the global).

Nothing here reads the updates' content: each algorithm's `check` ties `n_samples` to it (FedBNR: the
statistics' `n`), which makes "n ≤ elapsed time × rate" a bound on what a client can claim.
"""

from __future__ import annotations

from dataclasses import dataclass

from streamfed.fleet.robustness import Robustness

__all__ = ["Admission", "TokenBucket"]


@dataclass(slots=True)
class TokenBucket:
    """`rate` tokens per second up to `burst`, starting full.

    >>> b = TokenBucket(rate=2.0, burst=4.0, tokens=4.0, at=0.0)
    >>> b.take(3.0, now=0.0), b.take(3.0, now=0.0), b.take(3.0, now=1.0)
    (True, False, True)
    """

    rate: float
    burst: float
    tokens: float
    at: float

    def level(self, now: float) -> float:
        """Tokens available at `now` (a clock that went backwards refills nothing)."""
        return min(self.burst, self.tokens + max(0.0, now - self.at) * self.rate)

    def take(self, n: float, now: float) -> bool:
        """Take `n` tokens if there are enough (then True), else change nothing."""
        level = self.level(now)
        if n > level:
            return False
        self.tokens, self.at = level - n, max(self.at, now)
        return True


class Admission:
    """Every client's two buckets. `admit(client, n_samples, now)` takes both or neither.

    >>> adm = Admission(Robustness(max_sample_rate=10.0, sample_burst=20.0, max_upload_rate=1.0, upload_burst=2.0))
    >>> [adm.admit("a", 5, now=0.0) for _ in range(3)]  # the third upload finds the upload bucket empty
    [True, True, False]
    >>> adm.admit("a", 25, now=100.0)  # more samples than any burst: never, however long it waits
    False
    >>> adm.admit("b", 20, now=0.0)  # buckets are per client
    True
    """

    def __init__(self, limits: Robustness) -> None:
        self.limits = limits
        self._samples: dict[str, TokenBucket] = {}
        self._uploads: dict[str, TokenBucket] = {}

    def admit(self, client: str, n_samples: int, now: float) -> bool:
        lim = self.limits
        samples = self._samples.get(client)
        if samples is None:
            samples = self._samples[client] = TokenBucket(lim.max_sample_rate, lim.sample_burst, lim.sample_burst, now)
            self._uploads[client] = TokenBucket(lim.max_upload_rate, lim.upload_burst, lim.upload_burst, now)
        uploads = self._uploads[client]
        n = float(max(int(n_samples), 0))
        have, slots = samples.level(now), uploads.level(now)
        if n > have or slots < 1.0:
            return False
        # what TokenBucket.take does with the levels just computed (this runs for every update)
        samples.tokens, samples.at = have - n, max(samples.at, now)
        uploads.tokens, uploads.at = slots - 1.0, max(uploads.at, now)
        return True

    # a restarted aggregator resumes its buckets: a restart must not hand every client a fresh burst
    def to_dict(self) -> dict[str, tuple[float, float, float, float]]:
        return {c: (b.tokens, b.at, self._uploads[c].tokens, self._uploads[c].at) for c, b in self._samples.items()}

    def load(self, state: dict[str, tuple[float, float, float, float]]) -> None:
        lim = self.limits
        self._samples = {c: TokenBucket(lim.max_sample_rate, lim.sample_burst, min(s, lim.sample_burst), a)
                         for c, (s, a, _, _) in state.items()}
        self._uploads = {c: TokenBucket(lim.max_upload_rate, lim.upload_burst, min(u, lim.upload_burst), b)
                         for c, (_, _, u, b) in state.items()}
