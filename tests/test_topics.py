"""Topic names: building, strict parsing, name validation, subscription filters."""

from __future__ import annotations

import doctest

import pytest
from hypothesis import given
from hypothesis import strategies as st
from paho.mqtt.client import topic_matches_sub

import streamfed.wire.topics as topics_module
from streamfed.wire.topics import (
    MAX_NAME_LEN,
    Channel,
    ParsedTopic,
    TopicError,
    acks_topic,
    check_name,
    global_topic,
    is_valid_name,
    name_problem,
    parse_topic,
    predictions_topic,
    sensor_topic,
    shared_filter,
    status_topic,
    topic_filter,
    try_parse_topic,
    updates_topic,
)

valid_names = st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}\Z")


def test_topic_layout() -> None:
    assert updates_topic("f", "a1") == "streamfed/v1/f/updates/a1"
    assert global_topic("f") == "streamfed/v1/f/global"
    assert predictions_topic("f", "a1") == "streamfed/v1/f/predictions/a1"
    assert status_topic("f", "a1") == "streamfed/v1/f/status/a1"
    assert acks_topic("f", "a1") == "streamfed/v1/f/acks/a1"
    assert sensor_topic("f", "a1") == "streamfed/v1/f/sensors/a1"
    assert shared_filter("agg", "f") == "$share/agg/streamfed/v1/f/updates/+"
    assert topic_filter(Channel.STATUS, "f") == "streamfed/v1/f/status/+"
    assert topic_filter("updates") == "streamfed/v1/+/updates/+"
    assert [c.retained for c in Channel] == [False, True, False, False, True, False, False, False]


@pytest.mark.parametrize("name, fragment", [
    ("", "empty"),
    ("a+b", "'+'"),
    ("a#", "'#'"),
    ("a/b", "'/'"),
    ("a\x00b", "NUL"),
    ("$SYS", "start"),
    ("-a", "start"),
    ("a b", "' '"),
    ("a:b", "':'"),
    ("é", "start"),
    ("aé", "'é'"),
    ("x" * (MAX_NAME_LEN + 1), "longer"),
    (3, "not a string"),
])
def test_invalid_names_say_why(name: object, fragment: str) -> None:
    problem = name_problem(name)
    assert problem is not None and fragment in problem
    assert not is_valid_name(name)
    with pytest.raises(TopicError) as e:
        check_name(name, "client")  # type: ignore[arg-type]
    assert e.value.reason == problem


def test_names_at_the_limit_are_valid() -> None:
    assert is_valid_name("x" * MAX_NAME_LEN)
    assert is_valid_name("Station_01.north-2")


@pytest.mark.parametrize("build", [updates_topic, predictions_topic, status_topic, acks_topic, sensor_topic])
def test_builders_refuse_bad_names(build) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(TopicError):
        build("f", "a/b")
    with pytest.raises(TopicError):
        build("f+", "a")


@given(valid_names, valid_names, st.sampled_from([c for c in Channel if c.per_client]))
def test_parse_inverts_build(fleet: str, client: str, channel: Channel) -> None:
    from streamfed.wire.topics import channel_topic

    topic = channel_topic(fleet, channel, client)
    assert parse_topic(topic) == ParsedTopic(fleet, channel, client)
    assert topic_matches_sub(topic_filter(channel, fleet), topic)
    assert topic_matches_sub(topic_filter(channel), topic)
    assert parse_topic(global_topic(fleet)) == ParsedTopic(fleet, Channel.GLOBAL, None)


@pytest.mark.parametrize("topic, fragment", [
    ("other/v1/f/global", "does not start"),
    ("xstreamfed/v1/f/global", "does not start"),
    ("streamfed/v2/f/global", "does not start"),
    ("streamfed/v1/f", "no channel"),
    ("streamfed/v1/f/weights/a1", "unknown channel"),
    ("streamfed/v1/f/global/a1", "levels"),
    ("streamfed/v1/f/updates", "levels"),
    ("streamfed/v1/f/updates/a1/x", "levels"),
    ("streamfed/v1/f/updates/", "client is empty"),
    ("streamfed/v1/+/updates/a1", "fleet contains '+'"),
    ("streamfed/v1/f/updates/#", "client contains '#'"),
    ("streamfed/v1/f/status/a\x00", "NUL"),
    ("streamfed/v1/" + "x" * 2000 + "/global", "longer"),
])
def test_parse_rejects_with_reason(topic: str, fragment: str) -> None:
    reason = try_parse_topic(topic)
    assert isinstance(reason, str) and fragment in reason
    with pytest.raises(TopicError) as e:
        parse_topic(topic)
    assert e.value.reason == reason


@given(st.text(max_size=80) | st.builds(lambda t: "streamfed/v1/" + t, st.text(max_size=60)))
def test_parse_never_raises_anything_else(topic: str) -> None:
    result = try_parse_topic(topic)
    assert isinstance(result, ParsedTopic | str)
    if isinstance(result, ParsedTopic):  # anything accepted rebuilds to exactly the same topic
        from streamfed.wire.topics import channel_topic

        assert channel_topic(result.fleet, result.channel, result.client) == topic


def test_sensor_templates() -> None:
    assert sensor_topic("f", "a1", "plant/{fleet}/{client}/x") == "plant/f/a1/x"
    for bad in ("{oops}", "a/+/{client}", "$SYS/{client}", "a//{client}", "a/{client}/#", "{0}"):
        with pytest.raises(TopicError):
            sensor_topic("f", "a1", bad)


def test_shared_and_filters_validate() -> None:
    with pytest.raises(TopicError):
        shared_filter("g/x", "f")
    with pytest.raises(TopicError):
        topic_filter("updates", "f", "a#")
    with pytest.raises(ValueError):
        topic_filter("nonsense")
    with pytest.raises(TopicError):
        from streamfed.wire.topics import channel_topic

        channel_topic("f", "global", "a1")


def test_docstring_examples() -> None:
    result = doctest.testmod(topics_module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
