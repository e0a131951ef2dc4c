"""Which aggregation a fleet's aggregator runs, and the line it says at start-up about whom it trusts.

`[fleet.robust] aggregation` is `"exact"`, `"robust"` or `"auto"` (the default). Auto is the defaults' choice:

* on an **authenticated broker** (a production fleet: TLS and dynamic-security accounts, `broker_config/`) a family
  whose robust aggregation costs nothing measurable in an attack-free run (`Algorithm.robust_by_default`, FedBNR
  and FSGP: docs/reliability.md § Bounded influence) aggregates **robustly** — share caps and residual screening;
* everything else aggregates **exactly**: a development broker (anyone on it could publish anything, so the
  fleet is trusted by construction), a family whose robust rule costs accuracy, secure aggregation (robust
  screening needs each client's upload, which SecAgg hides; its sums are checked against the clients' declared
  bounds instead) and shards (they send partial sums, not uploads).

An explicit `"exact"` or `"robust"` is kept as given (robust with secure aggregation is refused by the
configuration itself). The line names the choice and what it trusts, so exact mode is never silent.

>>> from streamfed.fleet.config import FleetConfig
>>> cfg = FleetConfig(fleet="f", algorithm="fedbnr", n_inputs=2)
>>> cfg.robust.aggregation
'auto'
>>> resolved, line = resolve_aggregation(cfg, authenticated=True)
>>> resolved.robust.aggregation, line.split(":")[0]
('robust', 'robust aggregation')
>>> resolve_aggregation(cfg, authenticated=False)[0].robust.aggregation
'exact'
"""

from __future__ import annotations

from streamfed.algorithms import get
from streamfed.fleet.config import FleetConfig

__all__ = ["resolve_aggregation"]


def resolve_aggregation(fleet: FleetConfig, *, authenticated: bool, sharded: bool = False
                        ) -> tuple[FleetConfig, str]:
    """`fleet` with `robust.aggregation` "exact" or "robust" (auto resolved as the module says), and the start-up
    line saying which and what it trusts. `authenticated`: the broker has accounts (a production fleet);
    `sharded`: a shard or reducer (partial sums only)."""
    r = fleet.robust
    mode, why = r.aggregation, "as configured"
    if mode == "auto":
        alg = get(fleet.algorithm)
        if fleet.secure_aggregation:
            mode, why = "exact", "auto: secure aggregation hides each client's upload from screening"
        elif sharded:
            mode, why = "exact", "auto: shards combine partial sums, not uploads"
        elif not authenticated:
            mode, why = "exact", "auto: a development broker without accounts"
        elif not alg.robust_by_default:
            mode, why = "exact", f"auto: {alg.name}'s robust rule is an explicit choice (it costs accuracy)"
        else:
            mode, why = "robust", "auto: a production broker"
    resolved = fleet.model_copy(update={"robust": r.model_copy(update={"aggregation": mode})})
    bounds = f"labels within ±{r.label_bound:g}, ≤ {r.max_sample_rate:g} samples/s per client" + (
        "" if r.rates_declared else " (a generic limit: declare [fleet.robust] sensor_rate)")
    if mode == "robust":
        cap = (f"{r.fair_share:g}× a fair share" if r.fair_share is not None else f"a {r.share_cap:g} share")
        return resolved, (f"robust aggregation: summed statistics capped at {cap} per member and "
                          f"screened, updates clipped and trimmed ({r.trim:g} a side), {bounds}; trusts no single "
                          f"member, not equal to the centralised model ({why})")
    trust = ("the masked sums are checked against the clients' declared bounds" if fleet.secure_aggregation
             else "a hostile member's damage is bounded, not removed")
    return resolved, f"exact aggregation: every member trusted within the declared bounds ({bounds}); {trust} ({why})"
