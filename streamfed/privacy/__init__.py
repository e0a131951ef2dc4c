"""Privacy of uploads (docs/privacy.md): pure, deterministic building blocks, one concept per module.

* :mod:`.dp` — per-sample clipping, the Gaussian mechanism, the noisy FedBNR posterior's safeguards;
* :mod:`.accountant` — a per-client privacy accountant over every upload (``dp_accounting``);
* :mod:`.fixed_point` — float64 vectors as integers in `Z_{2^64}` (sums exact, wrapping arithmetic);
* :mod:`.shamir` — Shamir secret sharing over a prime field;
* :mod:`.secagg` — secure aggregation (SecAgg / SecAgg+) as an in-process round object.

A leaf: nothing here imports the rest of streamfed but :mod:`streamfed.core`, nor torch, numba or the network
stack. The glue lives in the fleet: :mod:`streamfed.fleet.private_learner` (DP around any learner that declares
its upload's sensitivity) and :mod:`streamfed.fleet.secure_aggregation` (the `secagg.*` messages and the halves
the agent and aggregator cores hold).

>>> from streamfed.privacy import fixed_point
>>> fixed_point.decode(fixed_point.encode([0.5, -0.25], 16), 16).tolist()
[0.5, -0.25]
"""
