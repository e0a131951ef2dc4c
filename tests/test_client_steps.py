"""`ClientSteps` (POF-MKL's per-client step book behind the declared bound): its bookkeeping as first written —
a walk over every recorded seq for the later ones, a sort to evict — kept here as the reference the faster
one must match on any stream of uploads: in order, out of order, repeated, forgotten, beyond KEEP."""

from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamfed.algorithms.pofmkl.aggregation import ClientSteps


class _Reference(ClientSteps):
    def record(self, seq: int, n: int, kernels: Sequence[int], allowed: Sequence[int]) -> None:
        if seq in self.recent:
            return
        self.total += n
        later = [j for j in self.recent if j > seq]
        exact = seq > self.top - self.KEEP
        cum = self.total - sum(self.recent[j][0] for j in later)
        for p in kernels:
            if exact and seq > self.mark_seq[p]:
                self.mark_seq[p], self.mark_cum[p] = seq, cum
        self.recent[seq] = (int(n), {int(p): int(k) for p, k in zip(kernels, allowed, strict=True)})
        self.top = max(self.top, seq)
        if len(self.recent) > self.KEEP:
            for j in sorted(self.recent)[: len(self.recent) - self.KEEP]:
                del self.recent[j]


# an agent's stream: seqs mostly rising one by one (so the book fills past KEEP), some late or repeated,
# and now and then a global folds everything up to some seq in (forget)
_op = st.tuples(st.sampled_from(["up"] * 12 + ["forget"]), st.integers(-4, 1), st.integers(1, 4),
                st.sets(st.integers(0, 3), min_size=1, max_size=3))


@pytest.mark.slow
@given(ops=st.lists(_op, min_size=50, max_size=250))
@settings(max_examples=40, deadline=None)
def test_client_steps_match_the_reference_bookkeeping(ops: list) -> None:
    fast, ref = ClientSteps(4), _Reference(4)
    for i, (kind, jitter, n, kernels) in enumerate(ops):
        seq = max(1, i + jitter)
        if kind == "forget":
            fast.forget(seq - 80)
            ref.forget(seq - 80)
            continue
        ks = sorted(kernels)
        try:
            want = ref.allowance(seq, n, ks)
        except ValueError:
            try:
                fast.allowance(seq, n, ks)
            except ValueError:
                continue
            raise AssertionError("the reference refused a repeat the fast book took") from None
        got = fast.allowance(seq, n, ks)
        assert np.array_equal(got, want)
        fast.record(seq, n, ks, want.tolist())
        ref.record(seq, n, ks, want.tolist())
        assert (fast.total, fast.top, fast.recent) == (ref.total, ref.top, ref.recent)
        assert np.array_equal(fast.mark_seq, ref.mark_seq) and np.array_equal(fast.mark_cum, ref.mark_cum)
