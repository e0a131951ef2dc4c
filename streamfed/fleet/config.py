"""Fleet and broker configuration, and the protocol schema of a fleet.

Two parts (the schema data itself — :class:`~streamfed.wire.schema.ArraySpec`, `MessageSchema`,
`ProtocolSchema` — is the wire's, :mod:`streamfed.wire.schema`):

* **Schema builders** — each algorithm (:mod:`streamfed.algorithms`) gives its own kinds from a
  :class:`FleetConfig` (`Algorithm.schemas`); :func:`common_schemas` adds the kinds every fleet has
  (status, ack, prediction). The codec never branches on a learner's name.
* **Pydantic models** — :class:`FleetConfig`, :class:`BrokerConfig`, :class:`InputsConfig` and :class:`StreamfedConfig`
  (all sections), loadable from TOML, JSON, a mapping and ``STREAMFED_<SECTION>__<FIELD>`` environment
  variables.

Shapes always come from the configuration, never from a received message: a message that disagrees
with its fleet's configuration is rejected, it does not reconfigure anyone.

No I/O here except :func:`load_config`, which reads the one file it is given.
"""

from __future__ import annotations

import json
import math
import os
import tomllib
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, SerializeAsAny, field_validator, model_validator

from streamfed.algorithms.base import Algorithm, Params
from streamfed.algorithms.dictionary import DICTIONARY_FIELDS
from streamfed.fleet.columns import Column, ColumnSpec
from streamfed.fleet.robustness import Robustness
from streamfed.wire.schema import (
    ArraySpec,
    MessageSchema,
    MetaSpec,
    ProtocolSchema,
    contributor_arrays,
    contributor_dims,
    prediction_schema,
)
from streamfed.wire.topics import Channel, name_problem

__all__ = [
    "FleetConfig",
    "PublicScales",
    "BrokerConfig",
    "StreamfedConfig",
    "InputsConfig",
    "common_schemas",
    "load_config",
    "env_overrides",
]



def common_schemas(cfg: FleetConfig) -> list[MessageSchema]:
    """Kinds every fleet has: `status`, `ack`, `prediction` (`var` only for Bayesian learners)."""
    from streamfed.algorithms import get

    return [
        MessageSchema("status", Channel.STATUS, meta=(MetaSpec("state", ("online", "offline")),)),
        # `included` = {client: highest seq with every seq up to it applied}; `missing` = seqs above
        # that mark not received yet (so the client can resend them), at most one tracking window.
        MessageSchema("ack", Channel.ACKS, (
            ArraySpec("missing", "int64", ("g",), distinct=True, nonnegative=True),
        ), {"g": (0, cfg.seq_window)}, max_included=1),
        prediction_schema(get(cfg.algorithm).bayesian, cfg.max_prediction_batch, get(cfg.algorithm).n_classes(cfg)),
        # reducer → shard: partial `meta.partial` was applied, or refused because it repeats the
        # (client, seq) pairs listed (already applied from another shard); the shard sends the rest again.
        MessageSchema("partial.ack", Channel.SHARD_ACKS, contributor_arrays(), contributor_dims(cfg, lower=0),
                      meta=(MetaSpec("partial"), MetaSpec("applied", (True, False))), max_included=cfg.max_clients),
    ]


# =========================================================================== pydantic models


_STRICT = ConfigDict(extra="forbid", frozen=True)


class PublicScales(BaseModel):
    """`[fleet.public_scales]`: declared, data-independent scales for the agents' standardisation — each input's
    `x_mean` and `x_scale`, the target's `y_mean` and `y_scale` — used instead of the running scales of the
    stream. Under differential privacy they are required with `standardise = "online"` (docs/privacy.md: the
    running scales carry one sample into every later upload). Take them from a sensor's datasheet or public
    knowledge, never from the private streams.

    >>> PublicScales(x_mean=[1000.0], x_scale=[10.0], y_mean=40.0, y_scale=5.0).y_scale
    5.0
    """

    model_config = _STRICT
    x_mean: tuple[float, ...] = Field(min_length=1)
    x_scale: tuple[float, ...] = Field(min_length=1)
    y_mean: float = Field(0.0, allow_inf_nan=False)
    y_scale: float = Field(1.0, gt=0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _valid(self) -> PublicScales:
        if len(self.x_mean) != len(self.x_scale):
            raise ValueError(f"public_scales: {len(self.x_mean)} x_mean for {len(self.x_scale)} x_scale")
        if not all(math.isfinite(v) for v in self.x_mean) or not all(math.isfinite(v) and v > 0
                                                                      for v in self.x_scale):
            raise ValueError("public_scales: x_mean must be finite and every x_scale finite and > 0")
        return self


class FleetConfig(BaseModel):
    """What every member of a fleet must agree on: the learner, its sizes and the fleet seed.

    The algorithm's own settings are `params` (its `Params` model), given in a file as a section named after it
    (`[fleet.pofmkl]`). The random-feature kernel dictionary of the families that have one (`n_kernels`,
    `n_features`, `kernels`, POF-MKL's `bin_size`: :class:`~streamfed.algorithms.dictionary.KernelDictionary`) is
    among them; given at the top of `[fleet]`, where it used to live, it is moved into `params` (an error for a
    family without such a setting).

    >>> cfg = FleetConfig(fleet="beijing", algorithm="fedbnr", n_inputs=10, n_features=8,
    ...                   kernels=["gaussian:1.0", "gaussian:2.0"])
    >>> cfg.params.n_kernels, cfg.feature_dim
    (2, 17)
    >>> {a.name: (a.dtype, a.shape) for a in cfg.message_schema("fedbnr.update").arrays}
    {'S_upper': ('float64', (2, 153)), 'b': ('float64', (2, 17)), 'n': ('float64', ()), 'q': ('float64', ())}
    >>> try:
    ...     FleetConfig(fleet="f", algorithm="fsgp", n_inputs=2, n_kernels=4)
    ... except ValueError as e:
    ...     print(e.errors()[0]["msg"])
    Value error, n_kernels: algorithm 'fsgp' has no such setting
    """

    model_config = _STRICT

    fleet: str
    algorithm: str  # a registered algorithm (streamfed.algorithms.names())
    n_inputs: int = Field(ge=1)
    seed: int = Field(0, ge=0)
    # How an agent scales its stream: "online" standardises each input and the target with the running mean
    # and standard deviation of its own past samples (the first two only set the scales) and maps predictions
    # back to the stream's units; "none" hands the learner the values as they come (for streams already on
    # unit scales, and for the replay, which normalises at the dataset layer).
    standardise: Literal["online", "none"] = "online"
    # The algorithm's own hyperparameters (its `Params` model). In a file or a mapping they may also be given
    # as a section named after the algorithm (`[fleet.pofmkl]`); sections of other algorithms are validated
    # and dropped, so one file can carry the settings of several.
    params: SerializeAsAny[Params] = Field(default_factory=Params)
    # Limits of the wire protocol (they bound message sizes, so they are part of the fleet's contract).
    max_clients: int = Field(10_000, ge=1)  # entries of a global's `included` map
    max_prediction_batch: int = Field(256, ge=1)
    seq_window: int = Field(1024, ge=1)  # out-of-order seqs tracked per client
    sensor_topic: str = "streamfed/v1/{fleet}/sensors/{client}"
    # Differential privacy of uploads (docs/privacy.md; off while dp_epsilon is None): every upload is
    # (dp_epsilon, dp_delta)-DP on its own, a per-client accountant composes them, and an agent whose next
    # upload would take it past dp_budget (ε at dp_delta) stops uploading. Labels are clipped to ±clip_label
    # (in the learner's units: standardised when the agent standardises); learners without a per-sample
    # sensitivity have each upload clipped to L2 norm clip_norm.
    dp_epsilon: float | None = Field(None, gt=0, allow_inf_nan=False)
    dp_delta: float = Field(1e-5, gt=0, lt=1)
    dp_budget: float | None = Field(None, gt=0, allow_inf_nan=False)
    clip_label: float = Field(3.0, gt=0, allow_inf_nan=False)
    clip_norm: float = Field(0.1, gt=0, allow_inf_nan=False)
    # Secure aggregation (SecAgg+, streamfed.privacy.secagg): the aggregator sees only masked uploads and their sum.
    secure_aggregation: bool = False
    # the public bound of every summed number (fixes the fixed-point scale: no sum of max_clients values overflows)
    secagg_max_abs: float = Field(1e6, gt=0, allow_inf_nan=False)
    # distributed DP (needs secure aggregation): each agent adds 1/dp_round_clients of the noise variance, so the
    # sum of a round of that many carries the whole noise; None: local DP (each upload carries all of it)
    dp_round_clients: int | None = Field(None, ge=1)
    # Under DP the upload schedule is public: one upload per dp_window *arrivals* (labelled readings and labels,
    # learned or refused), a noised dummy when a window has nothing to send, its count `n` the window's size.
    # None: the algorithm's min_upload where it has one, else 1.
    dp_window: int | None = Field(None, ge=1)
    # declared scales for standardise = "online" (required with DP; see PublicScales)
    public_scales: PublicScales | None = None
    # How far one member can move the fleet: label bound, rate limits, exact or robust aggregation
    # (streamfed.fleet.robustness; docs/reliability.md)
    robust: Robustness = Field(default_factory=Robustness)
    # The fleet's members in fleet order (the aggregator's roster: an update from anyone else is refused as
    # unknown_client). Required by the aggregator, shards and reducer on an authenticated broker (production);
    # `--clients` on their command lines overrides it.
    clients: tuple[str, ...] | None = None

    @field_validator("clients")
    @classmethod
    def _client_names(cls, v: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if v is None:
            return v
        for c in v:
            problem = name_problem(c)
            if problem:
                raise ValueError(f"client {c!r}: name {problem}")
        if len(set(v)) != len(v) or not v:
            raise ValueError("clients must be distinct and not empty")
        return v

    @field_validator("fleet")
    @classmethod
    def _fleet_name(cls, v: str) -> str:
        problem = name_problem(v)
        if problem:
            raise ValueError(f"fleet name {problem}")
        return v

    @model_validator(mode="before")
    @classmethod
    def _algorithm_params(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        from streamfed import algorithms

        data = dict(data)
        name = data.get("algorithm")
        if not isinstance(name, str):
            return data  # pydantic says what is wrong with it
        try:
            alg = algorithms.get(name)
        except KeyError as e:
            raise ValueError(e.args[0]) from None
        section: Any = {}
        for other in algorithms.names():
            if other in data:
                given = data.pop(other)
                if other == name:
                    section = given
                else:  # another family's settings: checked (a typo is an error), not kept
                    algorithms.get(other).Params.model_validate(
                        given.model_dump() if isinstance(given, BaseModel) else given)
        given = data.get("params", section)
        if isinstance(given, BaseModel) and not isinstance(given, alg.Params):
            given = given.model_dump()
        moved = {k: data.pop(k) for k in DICTIONARY_FIELDS if k in data}
        if moved:
            given = _moved_into(given, moved, alg)
        data["params"] = given if isinstance(given, alg.Params) else alg.Params.model_validate(given or {})
        return data

    @classmethod
    def from_dump(cls, dumped: Mapping[str, Any]) -> FleetConfig:
        """A configuration from a `model_dump` of any version, such as the one a state file records. Dumps
        written before the kernel dictionary moved into the families' `params` carry its fields at the top
        for every family; a family without them never read them, so they are dropped for it.

        >>> old = {"fleet": "f", "algorithm": "fsgp", "n_inputs": 2, "n_kernels": 8, "bin_size": 1, "params": {}}
        >>> FleetConfig.from_dump(old) == FleetConfig(fleet="f", algorithm="fsgp", n_inputs=2)
        True
        """
        from streamfed import algorithms

        data = dict(dumped)
        name = data.get("algorithm")
        if isinstance(name, str) and name in algorithms.names():
            fields = algorithms.get(name).Params.model_fields
            for k in DICTIONARY_FIELDS:
                if k in data and k not in fields:
                    del data[k]
        return cls.model_validate(data)

    @model_validator(mode="after")
    def _consistent(self) -> FleetConfig:
        if self.dp_round_clients is not None and not (self.secure_aggregation and self.dp_epsilon is not None):
            raise ValueError("dp_round_clients (distributed DP) needs dp_epsilon and secure_aggregation: "
                             "without it every upload would leave with a fraction of its noise")
        if self.public_scales is not None and len(self.public_scales.x_mean) != self.n_inputs:
            raise ValueError(f"public_scales declares {len(self.public_scales.x_mean)} inputs, n_inputs is "
                             f"{self.n_inputs}")
        floor = getattr(self.params, "min_upload", None)
        if self.dp_window is not None and floor is not None and self.dp_window < floor:
            raise ValueError(f"dp_window ({self.dp_window}) must be >= min_upload ({floor}): every DP upload counts "
                             "dp_window samples, and the aggregator refuses fewer than min_upload")
        if self.secure_aggregation and self.robust.aggregation == "robust":
            raise ValueError("robust aggregation screens each client's upload, which secure aggregation hides: the "
                             "two cannot be combined (docs/reliability.md; under secure aggregation only the "
                             "clients' sample counts are checked)")
        from streamfed.wire.topics import sensor_topic

        sensor_topic(self.fleet, "probe", self.sensor_topic)  # raises for a bad template
        return self

    @property
    def dp_upload_window(self) -> int:
        """Arrivals per upload under differential privacy: `dp_window`, or the algorithm's `min_upload`, or 1."""
        if self.dp_window is not None:
            return int(self.dp_window)
        return int(getattr(self.params, "min_upload", 1) or 1)

    # ---------------------------------------------------------------- derived sizes
    @property
    def feature_dim(self) -> int:
        """Features per kernel as the learner sees them (the algorithm says: `2D`, plus a bias feature...)."""
        from streamfed.algorithms import get

        return get(self.algorithm).feature_dim(self)

    # ---------------------------------------------------------------- wire schemas
    @property
    def protocol_schema(self) -> ProtocolSchema:
        """All message kinds of this fleet (computed once per distinct configuration)."""
        return _protocol_schema(self)

    def message_schema(self, kind: str) -> MessageSchema:
        """The schema of one kind (`KeyError` for a kind this fleet does not exchange)."""
        return self.protocol_schema.kinds[kind]

    def array_shapes(self, kind: str) -> dict[str, tuple[str, tuple[int | str, ...]]]:
        """`{array name: (dtype, shape)}` of a kind; variable axes appear as their names.

        >>> FleetConfig(fleet="f", algorithm="pofmkl", n_inputs=3, n_kernels=5, n_features=4,
        ...             bin_size=2).array_shapes("pofmkl.update")
        {'kernels': ('int64', ('m',)), 'delta': ('float64', ('m', 8))}
        """
        return {a.name: (a.dtype, a.shape) for a in self.message_schema(kind).arrays}

    @property
    def update_kind(self) -> str:
        """The kind of this fleet's model updates."""
        return self.protocol_schema.kinds_on(Channel.UPDATES)[0]

    @property
    def global_kind(self) -> str:
        """The kind of this fleet's global model."""
        return self.protocol_schema.kinds_on(Channel.GLOBAL)[0]

    @property
    def kernel_version(self) -> str:
        """The feature-map version every message of this fleet carries (derived, not stored)."""
        from streamfed.algorithms import get

        return get(self.algorithm).kernel_version(self)

    @property
    def partial_kind(self) -> str:
        """The kind of a shard's partial sums."""
        return self.protocol_schema.kinds_on(Channel.PARTIALS)[0]


def same_fleet(stored: Any, cfg: FleetConfig) -> bool:
    """Whether a configuration stored in a state file (its JSON dump) is `cfg`, read by this build: a setting
    added since, at its default, is the same fleet (comparing the dumps would refuse every older state).

    >>> cfg = FleetConfig(fleet="f", algorithm="fedbnr", n_inputs=2)
    >>> same_fleet(cfg.model_dump(mode="json"), cfg), same_fleet({**cfg.model_dump(mode="json"), "seed": 1}, cfg)
    (True, False)
    """
    try:
        return FleetConfig.from_dump(stored) == cfg
    except (ValueError, TypeError):  # pydantic's ValidationError is a ValueError
        return False


def _moved_into(params: Any, moved: Mapping[str, Any], alg: Algorithm) -> dict[str, Any]:
    """`params` (a mapping or the family's model) with the dictionary settings given at the top of `[fleet]`
    added; one the family does not have, or one given in both places, is an error."""
    fields = alg.Params.model_fields
    for k in moved:
        if k not in fields:
            raise ValueError(f"{k}: algorithm {alg.name!r} has no such setting")
    own = params.model_dump(exclude_unset=True) if isinstance(params, BaseModel) else dict(params or {})
    for k in moved:
        if k in own:
            raise ValueError(f"{k}: given both at the top of [fleet] and in the params of {alg.name!r}")
    return {**own, **moved}


@lru_cache(maxsize=64)
def _protocol_schema(cfg: FleetConfig) -> ProtocolSchema:
    # Keyed by value (the model is frozen and hashable), not stored on the instance: `model_copy`
    # copies an instance's __dict__, so a cached attribute would survive a changed copy.
    from streamfed.algorithms import get

    schemas = get(cfg.algorithm).schemas(cfg) + common_schemas(cfg)
    if cfg.secure_aggregation:
        from streamfed.fleet import (
            secure_aggregation as secagg,  # lazy: the fleet configuration does not need cryptography
        )

        schemas += secagg.schemas(cfg)
    kinds = {s.kind: s for s in schemas}
    if len(kinds) != len(schemas):
        raise ValueError("two schema builders define the same kind")
    return ProtocolSchema(cfg.fleet, kinds, cfg.seq_window)


class BrokerConfig(BaseModel):
    """How to reach the MQTT broker. The password is a `SecretStr` so it never shows in a repr or log.

    The port defaults to 8883 when TLS is on, 1883 otherwise. `session_expiry` (seconds) is sent as
    the MQTT v5 `SessionExpiryInterval` of persistent sessions: with 0 a v5 broker drops the session at
    disconnect even with `clean_start=False`.

    >>> b = BrokerConfig(username="a1", password="s3cret", tls_ca="/etc/streamfed/ca.crt")
    >>> b.port, b.use_tls, b.password
    (8883, True, SecretStr('**********'))
    """

    model_config = _STRICT

    host: str = "127.0.0.1"
    port: int = Field(1883, ge=1, le=65535)
    username: str | None = None
    password: SecretStr | None = None
    tls: bool = False  # TLS with the system CAs even when tls_ca is not given
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    protocol: Literal["5", "3.1.1"] = "5"
    keepalive: int = Field(30, ge=1, le=65535)
    session_expiry: int = Field(3600, ge=0, le=0xFFFFFFFF)

    @model_validator(mode="before")
    @classmethod
    def _defaults(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        data = dict(data)
        proto = data.get("protocol")
        if proto is not None:
            # TOML/env give 5, 5.0 or "5.0"; MQTT 3.1.1 has no numeric shorthand that is unambiguous.
            text = str(proto).strip().lower().removeprefix("v")
            data["protocol"] = {"5": "5", "5.0": "5", "3.1.1": "3.1.1", "311": "3.1.1"}.get(text, text)
        if "port" not in data and (data.get("tls") or data.get("tls_ca") or data.get("tls_cert")):
            data["port"] = 8883
        return data

    @model_validator(mode="after")
    def _consistent(self) -> BrokerConfig:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key go together")
        if self.password is not None and self.username is None:
            raise ValueError("a password needs a username")
        return self

    @property
    def use_tls(self) -> bool:
        return bool(self.tls or self.tls_ca or self.tls_cert)


class InputsConfig(BaseModel):
    """`[inputs]`: an agent's declared input columns (:mod:`streamfed.fleet.columns`), in vector order, each a
    `[[inputs.columns]]` table of :class:`~streamfed.fleet.columns.Column` fields (`name`, `kind`, `levels`,
    `other`, `buckets`, `timezone`, `raw`). Their encoded width must be `fleet.n_inputs`: the agent checks it
    when it starts (and says the width), not this model, so a refusal never echoes the rest of the file.

    >>> cfg = StreamfedConfig.from_toml('''
    ... [fleet]
    ... fleet = "f"
    ... algorithm = "pofmkl"
    ... n_inputs = 3
    ... [[inputs.columns]]
    ... name = "site"
    ... kind = "category"
    ... levels = ["north", "south"]
    ... [[inputs.columns]]
    ... name = "rain"
    ... kind = "boolean"
    ... ''')
    >>> cfg.inputs.spec.text, cfg.inputs.spec.width
    ('site:category=north|south,rain:boolean', 3)

    `na_values`: the CSV cells that mean "no value" (replacing the default list, :data:`streamfed.fleet.sources.
    NA_VALUES`; an empty cell always means it, a declared level never does); `max_abs`: a number beyond it is
    skipped as `too_large`. Both may be given without `columns` (an agent reading plain `--features`).
    """

    model_config = _STRICT
    columns: tuple[Column, ...] = ()
    na_values: tuple[str, ...] | None = None
    max_abs: float = Field(1e150, gt=0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _distinct(self) -> InputsConfig:
        if self.columns:
            ColumnSpec(self.columns)  # raises for a column declared twice
        return self

    @property
    def spec(self) -> ColumnSpec | None:
        """The columns as a :class:`~streamfed.fleet.columns.ColumnSpec` (layout and encoder); None when no
        column is declared."""
        return ColumnSpec(self.columns) if self.columns else None


class StreamfedConfig(BaseModel):
    """A whole configuration file: `[fleet]`, `[broker]` and, optionally, an agent's `[inputs]`.

    >>> cfg = StreamfedConfig.from_toml('''
    ... [fleet]
    ... fleet = "f"
    ... algorithm = "pofmkl"
    ... n_inputs = 3
    ... [broker]
    ... port = 1884
    ... ''', env={"STREAMFED_FLEET__SEED": "7"})
    >>> cfg.fleet.seed, cfg.broker.port, cfg.broker.protocol
    (7, 1884, '5')
    """

    model_config = _STRICT
    fleet: FleetConfig
    broker: BrokerConfig = BrokerConfig()
    inputs: InputsConfig | None = None  # declared input columns; None: plain numeric features (--features)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], env: Mapping[str, str] | None = None) -> StreamfedConfig:
        """Validate a mapping, after applying `STREAMFED_*` overrides from `env` (if given)."""
        merged = _deep_merge(dict(data), env_overrides(env)) if env is not None else dict(data)
        return cls.model_validate(merged)

    @classmethod
    def from_toml(cls, text: str, env: Mapping[str, str] | None = None) -> StreamfedConfig:
        return cls.from_mapping(tomllib.loads(text), env)

    @classmethod
    def from_json(cls, text: str, env: Mapping[str, str] | None = None) -> StreamfedConfig:
        return cls.from_mapping(json.loads(text), env)


ENV_PREFIX = "STREAMFED_"


def env_overrides(env: Mapping[str, str], prefix: str = ENV_PREFIX) -> dict[str, Any]:
    """Nested overrides from variables like `STREAMFED_BROKER__PASSWORD` or `STREAMFED_FLEET__POFMKL__ETA`.

    Only variables with a `__` after the prefix count (so `STREAMFED_APT_PACKAGES` is ignored). Values
    that look like JSON lists/objects are parsed as JSON; other strings are left to pydantic to coerce.

    >>> env_overrides({"STREAMFED_FLEET__KERNELS": '["gaussian:1.0"]', "STREAMFED_APT_PACKAGES": "x"})
    {'fleet': {'kernels': ['gaussian:1.0']}}
    """
    out: dict[str, Any] = {}
    for key, value in env.items():
        if not key.startswith(prefix) or "__" not in key[len(prefix):]:
            continue
        path = [p.lower() for p in key[len(prefix):].split("__")]
        if not all(path):
            continue
        parsed: Any = value
        if value.strip()[:1] in ("[", "{"):
            try:
                parsed = json.loads(value)
            except ValueError:
                parsed = value
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                break
        else:
            node[path[-1]] = parsed
    return out


def _deep_merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(base.get(k), Mapping):
            base[k] = _deep_merge(dict(base[k]), v)
        else:
            base[k] = v
    return base


def load_config(path: str | os.PathLike[str] | None = None,
                env: Mapping[str, str] | None = None) -> StreamfedConfig:
    """Read a `.toml` or `.json` file (or nothing), then apply `STREAMFED_*` overrides from `env`
    (default: the process environment)."""
    env = os.environ if env is None else env
    if path is None:
        return StreamfedConfig.from_mapping({}, env)
    p = Path(path)
    text = p.read_text(encoding="utf-8")
    if p.suffix.lower() == ".json":
        return StreamfedConfig.from_json(text, env)
    return StreamfedConfig.from_toml(text, env)
