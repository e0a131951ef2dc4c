"""MQTT topic names of a streamfed fleet, and strict parsing of them.

Layout (protocol version 1, docs/architecture.md "Fleet protocol in brief")::

    streamfed/v1/<fleet>/updates/<client>      agent → aggregator, QoS 1
    streamfed/v1/<fleet>/global                aggregator → all, retained
    streamfed/v1/<fleet>/acks/<client>         aggregator → one agent: which seqs are included
    streamfed/v1/<fleet>/predictions/<client>  agent → anyone
    streamfed/v1/<fleet>/status/<client>       agent, retained; last will = "offline"
    streamfed/v1/<fleet>/sensors/<client>      sensor input (default; configurable template)

Fleet and client names are *stricter* than MQTT requires: ASCII letters, digits, ``_ - .``, first
character alphanumeric, at most :data:`MAX_NAME_LEN` characters. A name is at once a topic level, an
MQTT client id, a Mosquitto user name (whose password file uses ``:`` as separator and whose ACL
substitutes ``%u``), a Prometheus label value and part of file names — one conservative alphabet is
safe in all of them. In particular ``+ # /`` (wildcards, level separator), NUL and a leading ``$``
(broker-internal topics) can never appear.

Everything here is pure string work, no I/O.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import NamedTuple

__all__ = [
    "PREFIX",
    "MAX_NAME_LEN",
    "DEFAULT_SENSOR_TEMPLATE",
    "Channel",
    "ParsedTopic",
    "TopicError",
    "name_problem",
    "is_valid_name",
    "check_name",
    "updates_topic",
    "global_topic",
    "predictions_topic",
    "status_topic",
    "acks_topic",
    "sensor_topic",
    "channel_topic",
    "topic_filter",
    "shared_filter",
    "parse_topic",
    "try_parse_topic",
]

PREFIX = "streamfed/v1"
MAX_NAME_LEN = 64
DEFAULT_SENSOR_TEMPLATE = "streamfed/v1/{fleet}/sensors/{client}"
# MQTT caps a topic at 65535 UTF-8 bytes; templates are user input, so bound them well below that.
_MAX_TOPIC_LEN = 1024

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")
_GROUP_RE = _NAME_RE  # shared-subscription group names follow the same rules


class Channel(StrEnum):
    """The topic level after the fleet name.

    >>> Channel("updates").per_client, Channel.GLOBAL.per_client, Channel.STATUS.retained
    (True, False, True)
    """

    UPDATES = "updates"
    GLOBAL = "global"
    ACKS = "acks"
    PREDICTIONS = "predictions"
    STATUS = "status"
    SENSORS = "sensors"
    PARTIALS = "partials"  # aggregator shard → reducer: partial sums (the client level is the shard)
    SHARD_ACKS = "shard_acks"  # reducer → one shard: which of its partials were applied

    @property
    def per_client(self) -> bool:
        """Whether the topic ends with a client name."""
        return self is not Channel.GLOBAL

    @property
    def retained(self) -> bool:
        """Whether messages on this channel are published with the retain flag."""
        return self in (Channel.GLOBAL, Channel.STATUS)


class TopicError(ValueError):
    """A topic or name is not acceptable; :attr:`reason` says why, in words.

    >>> try:
    ...     check_name("a/b")
    ... except TopicError as e:
    ...     print(e.reason)
    contains '/' (MQTT level separator)
    """

    def __init__(self, reason: str, value: str = "") -> None:
        super().__init__(f"{reason}: {value!r}" if value else reason)
        self.reason = reason
        self.value = value


_FORBIDDEN = {"+": "MQTT single-level wildcard", "#": "MQTT multi-level wildcard",
              "/": "MQTT level separator", "\x00": "NUL"}


def name_problem(name: object) -> str | None:
    """Why `name` is not a valid fleet/client name, or `None` if it is.

    >>> name_problem("station-12"), name_problem("a+b"), name_problem("")
    (None, "contains '+' (MQTT single-level wildcard)", 'is empty')
    """
    if not isinstance(name, str):
        return f"is not a string ({type(name).__name__})"
    if not name:
        return "is empty"
    if len(name) > MAX_NAME_LEN:
        return f"is longer than {MAX_NAME_LEN} characters ({len(name)})"
    for ch, what in _FORBIDDEN.items():
        if ch in name:
            return f"contains {ch!r} ({what})"
    if _NAME_RE.fullmatch(name) is None:
        if not (name[0].isascii() and name[0].isalnum()):
            return f"must start with an ASCII letter or digit, starts with {name[0]!r}"
        bad = next(ch for ch in name if not (ch.isascii() and (ch.isalnum() or ch in "_.-")))
        return f"contains {bad!r}; allowed: ASCII letters, digits, '_', '-', '.'"
    return None


def is_valid_name(name: object) -> bool:
    """`True` when `name` is a valid fleet/client name.

    >>> is_valid_name("a1"), is_valid_name("$SYS")
    (True, False)
    """
    return name_problem(name) is None


def check_name(name: str, what: str = "name") -> str:
    """`name` itself, or :class:`TopicError` with the reason (`what` names it in the message)."""
    problem = name_problem(name)
    if problem is not None:
        raise TopicError(problem, f"{what} {name!r}" if isinstance(name, str) else what)
    return name


# --------------------------------------------------------------------------- building topics


def channel_topic(fleet: str, channel: Channel | str, client: str | None = None) -> str:
    """`streamfed/v1/<fleet>/<channel>[/<client>]`, names validated.

    >>> channel_topic("f", "acks", "a1")
    'streamfed/v1/f/acks/a1'
    """
    ch = Channel(channel)
    check_name(fleet, "fleet")
    if not ch.per_client:
        if client is not None:
            raise TopicError(f"the {ch.value} topic has no client level", client)
        return f"{PREFIX}/{fleet}/{ch.value}"
    if client is None:
        raise TopicError(f"the {ch.value} topic needs a client name")
    check_name(client, "client")
    return f"{PREFIX}/{fleet}/{ch.value}/{client}"


def updates_topic(fleet: str, client: str) -> str:
    """Where `client` publishes its model updates.

    >>> updates_topic("beijing", "station-01")
    'streamfed/v1/beijing/updates/station-01'
    """
    return channel_topic(fleet, Channel.UPDATES, client)


def global_topic(fleet: str) -> str:
    """The retained global-model topic of a fleet.

    >>> global_topic("beijing")
    'streamfed/v1/beijing/global'
    """
    return channel_topic(fleet, Channel.GLOBAL)


def acks_topic(fleet: str, client: str) -> str:
    """Where the aggregator tells `client` which of its sequence numbers are included."""
    return channel_topic(fleet, Channel.ACKS, client)


def predictions_topic(fleet: str, client: str) -> str:
    """Where `client` publishes its predictions."""
    return channel_topic(fleet, Channel.PREDICTIONS, client)


def status_topic(fleet: str, client: str) -> str:
    """`client`'s retained status (its last will sets it to offline)."""
    return channel_topic(fleet, Channel.STATUS, client)


def sensor_topic(fleet: str, client: str, template: str = DEFAULT_SENSOR_TEMPLATE) -> str:
    """The sensor-input topic of `client`, from a template with `{fleet}` and `{client}` fields.

    The result must be a concrete topic (no wildcards, no empty level, no NUL).

    >>> sensor_topic("f", "a1")
    'streamfed/v1/f/sensors/a1'
    >>> sensor_topic("f", "a1", "site/{client}/readings")
    'site/a1/readings'
    """
    check_name(fleet, "fleet")
    check_name(client, "client")
    try:
        topic = template.format(fleet=fleet, client=client)
    except (KeyError, IndexError, ValueError) as e:
        raise TopicError(f"bad sensor topic template ({e})", template) from None
    _check_concrete(topic)
    return topic


def _check_concrete(topic: str) -> None:
    if not topic or len(topic) > _MAX_TOPIC_LEN:
        raise TopicError(f"topic must have 1..{_MAX_TOPIC_LEN} characters", topic)
    for ch in "+#\x00":
        if ch in topic:
            raise TopicError(f"topic contains {ch!r} ({_FORBIDDEN[ch]})", topic)
    if topic.startswith("$"):
        raise TopicError("topic starts with '$' (reserved for the broker)", topic)
    if "" in topic.split("/"):
        raise TopicError("topic has an empty level", topic)


# --------------------------------------------------------------------------- subscriptions


def topic_filter(channel: Channel | str, fleet: str = "+", client: str = "+") -> str:
    """A subscription filter; `"+"` for fleet or client means every one.

    >>> topic_filter("updates", "f")
    'streamfed/v1/f/updates/+'
    >>> topic_filter("global")
    'streamfed/v1/+/global'
    """
    ch = Channel(channel)
    if fleet != "+":
        check_name(fleet, "fleet")
    if not ch.per_client:
        return f"{PREFIX}/{fleet}/{ch.value}"
    if client != "+":
        check_name(client, "client")
    return f"{PREFIX}/{fleet}/{ch.value}/{client}"


def shared_filter(group: str, fleet: str, channel: Channel | str = Channel.UPDATES) -> str:
    """MQTT v5 shared subscription: the broker spreads the channel's messages over the group.

    >>> shared_filter("aggregators", "f")
    '$share/aggregators/streamfed/v1/f/updates/+'
    """
    check_name(group, "share group")
    return f"$share/{group}/{topic_filter(channel, fleet)}"


# --------------------------------------------------------------------------- parsing


class ParsedTopic(NamedTuple):
    """A recognised streamfed topic (`client` is `None` for the global topic).

    >>> parse_topic("streamfed/v1/f/updates/a1")
    ParsedTopic(fleet='f', channel=<Channel.UPDATES: 'updates'>, client='a1')
    """

    fleet: str
    channel: Channel
    client: str | None


def try_parse_topic(topic: object) -> ParsedTopic | str:
    """A :class:`ParsedTopic`, or the reason (a string) why `topic` is not a streamfed v1 topic.

    >>> try_parse_topic("streamfed/v1/f/global")
    ParsedTopic(fleet='f', channel=<Channel.GLOBAL: 'global'>, client=None)
    >>> try_parse_topic("streamfed/v1/f/updates/a#")
    "client contains '#' (MQTT multi-level wildcard)"
    """
    if not isinstance(topic, str):
        return f"topic is not a string ({type(topic).__name__})"
    if len(topic) > _MAX_TOPIC_LEN:
        return f"topic is longer than {_MAX_TOPIC_LEN} characters"
    root, sep, rest = topic.partition(f"{PREFIX}/")
    if root or not sep:
        return f"topic does not start with {PREFIX}/"
    levels = rest.split("/")
    if len(levels) < 2:
        return "topic has no channel level"
    fleet, channel = levels[0], levels[1]
    problem = name_problem(fleet)
    if problem is not None:
        return f"fleet {problem}"
    try:
        ch = Channel(channel)
    except ValueError:
        return f"unknown channel {channel!r}"
    expected = 3 if ch.per_client else 2
    if len(levels) != expected:
        return f"{ch.value} topic must have {expected + 2} levels, has {len(levels) + 2}"
    if not ch.per_client:
        return ParsedTopic(fleet, ch, None)
    problem = name_problem(levels[2])
    if problem is not None:
        return f"client {problem}"
    return ParsedTopic(fleet, ch, levels[2])


def parse_topic(topic: str) -> ParsedTopic:
    """Like :func:`try_parse_topic` but raises :class:`TopicError` (with `.reason`) on failure."""
    result = try_parse_topic(topic)
    if isinstance(result, str):
        raise TopicError(result, topic if isinstance(topic, str) else "")
    return result
