"""The random-feature kernel dictionary: the settings shared by the families that learn over a dictionary of
random-Fourier-feature kernels (POF-MKL, its baselines, FedBNR, personalised FedBNR; docs/algorithms.md §2).

Their `Params` extend :class:`KernelDictionary`, so in a configuration file these settings sit in the family's
section with its other hyperparameters (`[fleet.pofmkl] n_kernels = 16`); the fleet configuration also takes
them at the top of `[fleet]`, as it always has, and moves them there (:mod:`streamfed.fleet.config`).

`kernels` are kernel specs (`"gaussian:0.5"`, `"laplacian:1.0"`, ...), kept in their canonical text (part of the
frequency derivation, so of the fleet's kernel version); without them the dictionary is
`standardised_dictionary(n_kernels, n_inputs)` (bandwidths around `√(2d)`) when the agents standardise their
streams, else `gaussian_dictionary(n_kernels)` (`[0.05, 5]`, for inputs normalised to norm ≤ 1 as in the
POF-MKL paper). `n_kernels` follows `kernels` when only they are given.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pydantic import Field, field_validator, model_validator

from streamfed.algorithms.base import Params

if TYPE_CHECKING:
    from streamfed.core.features import RFFBank
    from streamfed.fleet.config import FleetConfig

__all__ = ["DICTIONARY_FIELDS", "KernelDictionary", "dictionary_of", "kernel_specs", "rff_bank"]

# Every field a family's Params may take from the top of `[fleet]` (where they lived before they were the
# families'): KernelDictionary's, and POF-MKL's bin size.
DICTIONARY_FIELDS = ("n_kernels", "n_features", "kernels", "bin_size")


class KernelDictionary(Params):
    """`N` random-feature kernels of `D` frequencies each: the base of the `Params` of every family that learns
    over such a dictionary.

    >>> d = KernelDictionary(kernels=["gaussian:1", "laplacian:0.5"], n_features=4)
    >>> d.n_kernels, d.kernels, d.dim
    (2, ('gaussian:1.0', 'laplacian:0.5'), 8)
    >>> KernelDictionary(n_kernels=2).kernel_specs(n_inputs=3, standardise="none")
    ('gaussian:0.05', 'gaussian:5.0')
    """

    n_kernels: int = Field(8, ge=1)  # N
    n_features: int = Field(50, ge=1)  # D: random features per kernel, 2D numbers each
    kernels: tuple[str, ...] | None = None

    @field_validator("kernels")
    @classmethod
    def _kernel_specs(cls, v: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if v is None:
            return None
        if not v:
            raise ValueError("kernels, when given, must not be empty")
        from streamfed.core.features import KernelSpec  # lazy: reading a configuration needs no numba

        keys = tuple(KernelSpec.parse(s).key for s in v)  # canonical text: part of frequency derivation
        if len(set(keys)) != len(keys):
            raise ValueError(f"kernels are repeated: {list(keys)}")
        return keys

    @model_validator(mode="before")
    @classmethod
    def _n_kernels_from_kernels(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and data.get("kernels") and "n_kernels" not in data:
            data = dict(data)
            data["n_kernels"] = len(data["kernels"])
        return data

    @model_validator(mode="after")
    def _consistent(self) -> KernelDictionary:
        if self.kernels is not None and len(self.kernels) != self.n_kernels:
            raise ValueError(f"n_kernels={self.n_kernels} but {len(self.kernels)} kernels are listed")
        return self

    @property
    def dim(self) -> int:
        """Numbers per kernel's features, `2D`."""
        return 2 * self.n_features

    def kernel_specs(self, n_inputs: int, standardise: str) -> tuple[str, ...]:
        """The dictionary as canonical spec strings, for `n_inputs` inputs scaled as `standardise` says
        (`"online"`: unit variance; otherwise as they come)."""
        if self.kernels is not None:
            return self.kernels
        from streamfed.core.features import gaussian_dictionary, standardised_dictionary

        if standardise == "online":
            return tuple(s.key for s in standardised_dictionary(self.n_kernels, n_inputs))
        return tuple(s.key for s in gaussian_dictionary(self.n_kernels))


def dictionary_of(cfg: FleetConfig) -> KernelDictionary:
    """The dictionary settings of a fleet whose family learns over one (`TypeError` otherwise)."""
    if not isinstance(cfg.params, KernelDictionary):
        raise TypeError(f"algorithm {cfg.algorithm!r} has no kernel dictionary")
    return cfg.params


def kernel_specs(cfg: FleetConfig) -> tuple[str, ...]:
    """The fleet's dictionary as canonical spec strings, for its inputs as its agents scale them.

    >>> from streamfed.fleet.config import FleetConfig
    >>> kernel_specs(FleetConfig(fleet="f", algorithm="fedbnr", n_inputs=2, kernels=["gaussian:2"]))
    ('gaussian:2.0',)
    """
    return dictionary_of(cfg).kernel_specs(cfg.n_inputs, cfg.standardise)


def rff_bank(cfg: FleetConfig) -> RFFBank:
    """The fleet's dictionary as one :class:`~streamfed.core.features.RFFBank`, frequencies from the fleet seed.

    >>> from streamfed.fleet.config import FleetConfig
    >>> rff_bank(FleetConfig(fleet="f", algorithm="pofmkl", n_inputs=2, n_kernels=3, n_features=4)).frequencies.shape
    (3, 4, 2)
    """
    from streamfed.core.features import KernelSpec, RFFBank

    specs = [KernelSpec.parse(s) for s in kernel_specs(cfg)]
    return RFFBank(specs, dictionary_of(cfg).n_features, cfg.n_inputs, seed=cfg.seed)
