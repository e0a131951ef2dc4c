"""Privacy of uploads (docs/privacy.md): pure, deterministic building blocks, one concept per module.

* :mod:`.dp` — per-sample clipping, the Gaussian mechanism, the noisy FedBNR posterior's safeguards;
* :mod:`.accountant` — a per-client privacy accountant over every upload (``dp_accounting``);
* :mod:`.fixed_point` — float64 vectors as integers in `Z_{2^64}` (sums exact, wrapping arithmetic);
* :mod:`.shamir` — Shamir secret sharing over a prime field;
* :mod:`.secagg` — secure aggregation (SecAgg / SecAgg+) as an in-process round object;
* :mod:`.learner` — the plug-in glue: any learner that declares its upload's sensitivity gets DP.

Nothing here imports torch, numba or the network stack.

>>> from streamfed.privacy import fixed_point
>>> fixed_point.decode(fixed_point.encode([0.5, -0.25], 16), 16).tolist()
[0.5, -0.25]
"""
