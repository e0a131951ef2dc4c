"""The algorithm families and their registry (the plug-in contract is :mod:`streamfed.algorithms.base`).

Built-in families are imported on first use (so that reading a configuration needs neither numba nor
torch); :func:`register` adds one at run time — a test, or a plug-in of your own.

>>> get("fedbnr").bayesian, "pofmkl" in names()
(True, True)
>>> get("nope")
Traceback (most recent call last):
...
KeyError: "unknown algorithm 'nope'; registered: em-kofl, fedbnr, fedbnr-halflives, fedbnr-personal, fsgp, ...vm-kofl"
"""

from __future__ import annotations

import importlib

from streamfed.algorithms.base import Algorithm, ReplayVariant

__all__ = [
    "BUILTIN", "DEFAULT", "MOVED_MODULES", "MOVED_NAMES", "Algorithm", "get", "names", "register", "unregister",
    "variant",
]

# name → "module:attribute" of its Algorithm object. A new family is one line here.
BUILTIN: dict[str, str] = {
    "pofmkl": "streamfed.algorithms.pofmkl:ALGORITHM",
    "fedbnr": "streamfed.algorithms.fedbnr:ALGORITHM",
    "fedbnr-personal": "streamfed.algorithms.fedbnr_personal:ALGORITHM",
    "fedbnr-halflives": "streamfed.algorithms.fedbnr_halflives:ALGORITHM",
    "ofskl": "streamfed.algorithms.kofl:OFSKL",
    "ofmkl-avg": "streamfed.algorithms.kofl:OFMKL_AVG",
    "vm-kofl": "streamfed.algorithms.kofl:VM_KOFL",
    "em-kofl": "streamfed.algorithms.kofl:EM_KOFL",
    "fsgp": "streamfed.algorithms.fsgp:ALGORITHM",
    "pvi": "streamfed.algorithms.pvi:ALGORITHM",
    "urk-fedbnr": "streamfed.algorithms.urk:ALGORITHM",
    "pfedgp": "streamfed.algorithms.pfedgp:ALGORITHM",
}
DEFAULT = "pofmkl"  # what the demo and the CLI run when nobody says
# Where built-in families' classes went when their modules moved, (old module, name) → new module: a state file
# written before a move pickles the old path (streamfed.fleet.persistence follows this map when it loads one).
MOVED_NAMES: dict[tuple[str, str], str] = {
    # FedBNR: learner.py split into a module per idea; agent.py's Learner became learner.py
    ("streamfed.algorithms.fedbnr.learner", "FedBNRClient"): "streamfed.algorithms.fedbnr.client",
    ("streamfed.algorithms.fedbnr.learner", "FedBNRServer"): "streamfed.algorithms.fedbnr.server",
    ("streamfed.algorithms.fedbnr.learner", "FedBNRRegressor"): "streamfed.algorithms.fedbnr.estimator",
    ("streamfed.algorithms.fedbnr.learner", "Upload"): "streamfed.algorithms.fedbnr.messages",
    ("streamfed.algorithms.fedbnr.learner", "GlobalModel"): "streamfed.algorithms.fedbnr.messages",
    ("streamfed.algorithms.fedbnr.learner", "PrequentialMetrics"): "streamfed.algorithms.fedbnr.metrics",
    ("streamfed.algorithms.fedbnr.learner", "_DefaultFeatures"): "streamfed.algorithms.fedbnr.features",
    ("streamfed.algorithms.fedbnr.learner", "_MapList"): "streamfed.algorithms.fedbnr.features",
    ("streamfed.algorithms.fedbnr.agent", "StatsLearner"): "streamfed.algorithms.fedbnr.learner",
    # personalised FedBNR likewise; fleet_halves.py became learner.py (the Learner) and aggregation.py
    ("streamfed.algorithms.fedbnr_personal.learner", "FedBNRHierClient"): "streamfed.algorithms.fedbnr_personal.client",
    ("streamfed.algorithms.fedbnr_personal.learner", "FedBNRHierServer"): "streamfed.algorithms.fedbnr_personal.server",
    ("streamfed.algorithms.fedbnr_personal.learner", "FedBNRHierMixClient"):
        "streamfed.algorithms.fedbnr_personal.mixture",
    ("streamfed.algorithms.fedbnr_personal.learner", "FedBNRHierMixServer"):
        "streamfed.algorithms.fedbnr_personal.mixture",
    ("streamfed.algorithms.fedbnr_personal.learner", "HierUpload"): "streamfed.algorithms.fedbnr_personal.messages",
    ("streamfed.algorithms.fedbnr_personal.learner", "HierGlobal"): "streamfed.algorithms.fedbnr_personal.messages",
    ("streamfed.algorithms.fedbnr_personal.fleet_halves", "PersonalLearner"):
        "streamfed.algorithms.fedbnr_personal.learner",
    ("streamfed.algorithms.fedbnr_personal.fleet_halves", "PersonalAggregation"):
        "streamfed.algorithms.fedbnr_personal.aggregation",
    ("streamfed.algorithms.fedbnr_personal.fleet_halves", "ClientSums"):
        "streamfed.algorithms.fedbnr_personal.aggregation",
    # the one template (issue 28): POF-MKL's and the baselines' learner.py split into client / server / messages /
    # estimator, fleet_halves.py into learner / aggregation / wire (agent.py's Learner became learner.py below)
    **{("streamfed.algorithms.pofmkl.learner", n): "streamfed.algorithms.pofmkl.messages"
       for n in ("KernelUpdate", "GlobalTheta")},
    ("streamfed.algorithms.pofmkl.learner", "POFMKLClient"): "streamfed.algorithms.pofmkl.client",
    ("streamfed.algorithms.pofmkl.learner", "POFMKLServer"): "streamfed.algorithms.pofmkl.server",
    ("streamfed.algorithms.pofmkl.learner", "POFMKLRegressor"):
        "streamfed.algorithms.pofmkl.estimator",
    **{("streamfed.algorithms.kofl.learner", n): "streamfed.algorithms.kofl.messages"
       for n in ("KOFLUpdate", "KOFLGlobal")},
    **{("streamfed.algorithms.kofl.learner", n): "streamfed.algorithms.kofl.client"
       for n in ("OFSKLClient", "OFMKLAvgClient", "VMKOFLClient", "EMKOFLClient")},
    ("streamfed.algorithms.kofl.learner", "KOFLServer"): "streamfed.algorithms.kofl.server",
    ("streamfed.algorithms.kofl.fleet_halves", "KOFLLearner"): "streamfed.algorithms.kofl.learner",
    ("streamfed.algorithms.kofl.fleet_halves", "KOFLAggregation"):
        "streamfed.algorithms.kofl.aggregation",
}
# Whole modules renamed to the template's names, old module → new module (same class names inside).
MOVED_MODULES: dict[str, str] = {
    "streamfed.algorithms.pofmkl.agent": "streamfed.algorithms.pofmkl.learner",
    **{f"streamfed.algorithms.{f}.agent": f"streamfed.algorithms.{f}.learner"
       for f in ("fsgp", "pvi", "urk", "pfedgp")},
    **{f"streamfed.algorithms.{f}.regressor": f"streamfed.algorithms.{f}.estimator"
       for f in ("fsgp", "pvi", "urk")},
    "streamfed.algorithms.pfedgp.classifier": "streamfed.algorithms.pfedgp.estimator",
    "streamfed.algorithms.fsgp.bound": "streamfed.algorithms.fsgp.elbo",
    "streamfed.algorithms.urk.bounds": "streamfed.algorithms.urk.robust_proposals",
}
_LOADED: dict[str, Algorithm] = {}


def names() -> list[str]:
    """Every registered algorithm's name, sorted."""
    return sorted(set(BUILTIN) | set(_LOADED))


def get(name: str) -> Algorithm:
    """The algorithm registered as `name` (`KeyError` listing the registered ones otherwise)."""
    alg = _LOADED.get(name)
    if alg is not None:
        return alg
    where = BUILTIN.get(name)
    if where is None:
        raise KeyError(f"unknown algorithm {name!r}; registered: {', '.join(names())}")
    module, _, attr = where.partition(":")
    alg = getattr(importlib.import_module(module), attr)
    if alg.name != name:
        raise RuntimeError(f"{where} is named {alg.name!r}, registered as {name!r}")
    _LOADED[name] = alg
    return alg


def register(alg: Algorithm) -> Algorithm:
    """Register `alg` under `alg.name` (replacing nothing: a taken name is a `ValueError`)."""
    if alg.name in BUILTIN or alg.name in _LOADED:
        raise ValueError(f"an algorithm named {alg.name!r} is already registered")
    _LOADED[alg.name] = alg
    return alg


def unregister(name: str) -> None:
    """Forget an algorithm registered with :func:`register` (built-ins stay)."""
    if name in BUILTIN:
        raise ValueError(f"{name!r} is built in")
    _LOADED.pop(name, None)


def variant(name: str) -> tuple[Algorithm, ReplayVariant]:
    """The replay variant called `name` (an algorithm's own name, or one of its arrangements such as
    ``local-only``) and the algorithm it belongs to."""
    for alg_name in names():
        alg = get(alg_name)
        for v in alg.replay_variants():
            if v.name == name:
                return alg, v
    raise KeyError(f"unknown algorithm {name!r} (or replay variant); choose from {', '.join(variant_names())}")


def variant_names() -> list[str]:
    """Every replay variant, in registry order."""
    return [v.name for n in names() for v in get(n).replay_variants()]


def fleet_names() -> list[str]:
    """The algorithms that run over MQTT (agent, aggregator, shards and reducer, the demo)."""
    return [n for n in names() if get(n).in_fleet]
