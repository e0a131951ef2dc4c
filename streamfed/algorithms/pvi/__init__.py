"""PVI for federated sparse GPs: inducing inputs as an auxiliary variable (HVM) with decoupled
pseudo-observations (DPO), asynchronous and streaming (docs/algorithms.md, "PVI"; ALGORITHMS §7).

* :mod:`.factors` (factors as arrays), :mod:`.state` (the global `q ∝ p · Π t_k`),
  :mod:`.posterior` (`q(u | Z, β)`, NumPy), :mod:`.likelihoods` (Gaussian, Bernoulli);
* :mod:`.free_energy` (the local free energy, torch), :mod:`.refine` (a client's Adam step).

torch is imported only by :mod:`.free_energy` and :mod:`.refine`.
"""
