#!/usr/bin/env python3
"""An example sensor adapter: read a sensor, publish its readings to a streamfed agent's sensor topic.

The agent (`streamfed agent --source mqtt`) subscribes to `streamfed/v1/<fleet>/sensors/<client>` and
expects JSON readings (see edge/README.md, "The sensor message format")::

    {"id": "7f3a-12", "ts": 1700000000.25, "x": {"PM2.5": 0.12, "PM10": 0.2, ...}}
    {"id": "7f3a-12", "ts": 1700000000.25, "x": [0.12, 0.2, ...], "y": 0.31}    # label included
    {"label_for": "7f3a-12", "y": 0.31}                                          # a delayed label

Sources: a simulated sensor (`--source simulated`, inputs `x0 … x{n-1}`), a vendored Beijing
air-quality station (`--source beijing --station Dongsi`, the ten inputs PM2.5 … WSPM and the CO
target, normalised as in the paper), or any CSV file (`--source csv:PATH --target COL --features A,B`).

Labels: `--delay-labels 0` sends each label inside its reading, `--delay-labels N` sends the reading
without it and the label as a `label_for` message N readings later (the remaining ones at the end),
`--delay-labels -1` never sends labels (prediction only).

Publishing is MQTT QoS 1, in order, each message after the previous one's PUBACK. When the broker is
unreachable the adapter retries the unacknowledged message with backoff; a reading that arrives twice
is dropped by the agent (same id). Ids are `<run>-<n>`, `<run>` new for every start, so a restarted
adapter never reuses an id the agent still remembers.

    python edge/sensor_adapter.py --host 127.0.0.1 --port 1883 --fleet beijing-air --client station-01 \\
        --source beijing --station Aotizhongxin --rate 2 --delay-labels 5
    python edge/sensor_adapter.py --config /etc/streamfed/fleet/agent.toml --client station-01 --source beijing

With `--config` the broker section (TLS, user name, `STREAMFED_BROKER__PASSWORD`) and the fleet's name
and sensor topic come from the agent's configuration; on a production broker the adapter logs in as
the agent's user, whom the ACL lets write its own sensors topic.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import gzip
import io
import json
import logging
import math
import os
import secrets
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import aiomqtt
import numpy as np

from streamfed.fleet.config import BrokerConfig, load_config
from streamfed.runtime.connection import client_kwargs
from streamfed.wire.topics import DEFAULT_SENSOR_TEMPLATE, sensor_topic

__all__ = [
    "Sample",
    "beijing_samples",
    "csv_samples",
    "main",
    "publish_messages",
    "run",
    "sensor_messages",
    "simulated_samples",
]

log = logging.getLogger("streamfed.sensor_adapter")

Sample = tuple[dict[str, Any], float | None]  # (inputs by name, label or None)
Message = Mapping[str, Any] | bytes | str
_NA = frozenset({"", "NA", "N/A", "NaN", "nan", "NULL", "null", "None", "?", "-"})


# --------------------------------------------------------------------------- sensors


def simulated_samples(n_inputs: int = 10, seed: int = 0) -> Iterator[Sample]:
    """An endless simulated sensor: slowly drifting inputs `x0 … x{n-1}` and a smooth noisy target.

    >>> x, y = next(simulated_samples(3))
    >>> sorted(x), isinstance(y, float)
    (['x0', 'x1', 'x2'], True)
    """
    rng = np.random.default_rng(seed)
    w = rng.normal(size=n_inputs) / math.sqrt(n_inputs)
    state = rng.normal(size=n_inputs)
    while True:
        state = 0.95 * state + 0.3 * rng.normal(size=n_inputs)  # AR(1): neighbouring readings are alike
        y = float(np.sin(state @ w) + 0.1 * rng.normal())
        yield {f"x{i}": float(v) for i, v in enumerate(state)}, y


def beijing_samples(station: str = "Aotizhongxin", normalisation: str = "paper") -> Iterator[Sample]:
    """A vendored Beijing air-quality station, in time order: inputs PM2.5 … WSPM, target CO.

    >>> x, y = next(beijing_samples("Dongsi"))
    >>> list(x)[:3], 0.0 <= y <= 1.0
    (['PM2.5', 'PM10', 'SO2'], True)
    """
    from streamfed.evaluation.datasets import load_beijing

    stream = load_beijing(normalisation=normalisation, split="station")[station]
    for row, y in zip(stream.X, stream.y, strict=True):
        yield dict(zip(stream.feature_names, row.tolist(), strict=True)), float(y)


def _cell(text: str | None) -> Any:
    if text is None or text.strip() in _NA:
        return None  # JSON null: the agent counts it as a missing feature
    try:
        return float(text)
    except ValueError:
        return text  # sent as is: the agent counts it as non-numeric


def csv_samples(path: str | Path, target: str | None, features: Sequence[str]) -> Iterator[Sample]:
    """Rows of a CSV file (`.gz` too). Cells are sent as numbers; NA cells as null and other text as
    is, so that the agent skips and counts them (by reason) rather than this adapter hiding them.

    >>> import tempfile
    >>> with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
    ...     _ = f.write("a,b,y\\n1,2,3\\nNA,x,4\\n")
    >>> list(csv_samples(f.name, "y", ["a", "b"]))
    [({'a': 1.0, 'b': 2.0}, 3.0), ({'a': None, 'b': 'x'}, 4.0)]
    >>> os.unlink(f.name)
    """
    p = Path(path)
    raw = gzip.open(p, "rb") if p.suffix == ".gz" else open(p, "rb")  # noqa: SIM115 - closed below
    with io.TextIOWrapper(raw, encoding="utf-8", newline="") as fh:
        for row in csv.DictReader(fh):
            label = _cell(row.get(target)) if target else None
            yield {f: _cell(row.get(f)) for f in features}, (label if isinstance(label, float) else None)


# --------------------------------------------------------------------------- messages


def sensor_messages(samples: Iterable[Sample], *, delay_labels: int = 0, count: int | None = None,
                    id_prefix: str | None = None, as_list: bool = False,
                    clock: Callable[[], float] = time.time) -> Iterator[dict[str, Any]]:
    """Reading and label messages in publishing order.

    `delay_labels`: 0 puts the label in its reading, N > 0 sends it as `{"label_for": id, "y": …}` after
    N more readings (labels still pending when the samples end follow at once), a negative value
    never sends labels. `as_list` sends `x` as a list in the samples' key order. Timestamps come from
    `clock` when the message is made, never decreasing (a clock stepped back would make the agent skip
    readings as out of order).

    >>> msgs = sensor_messages([({"a": 1.0}, 0.5), ({"a": 2.0}, 0.7)], delay_labels=1, id_prefix="t",
    ...                        clock=lambda: 10.0)
    >>> [m.get("id", m.get("label_for")) for m in msgs]
    ['t-0', 't-1', 't-0', 't-1']
    """
    prefix = id_prefix if id_prefix is not None else secrets.token_hex(3)
    pending: deque[tuple[str, float]] = deque()
    last_ts = -math.inf
    for i, (x, y) in enumerate(samples):
        if count is not None and i >= count:
            break
        last_ts = max(last_ts, clock())
        rid = f"{prefix}-{i}"
        msg: dict[str, Any] = {"id": rid, "ts": last_ts, "x": list(x.values()) if as_list else dict(x)}
        if y is not None and delay_labels == 0:
            msg["y"] = y
        yield msg
        if y is not None and delay_labels > 0:
            pending.append((rid, y))
            if len(pending) > delay_labels:
                rid0, y0 = pending.popleft()
                yield {"label_for": rid0, "y": y0}
    while pending:
        rid0, y0 = pending.popleft()
        yield {"label_for": rid0, "y": y0}


def _payload(msg: Message) -> bytes:
    if isinstance(msg, bytes):
        return msg
    if isinstance(msg, str):
        return msg.encode()
    # allow_nan: a broken sensor's NaN goes out as the JSON extension `NaN`, and the agent counts it
    return json.dumps(msg, separators=(",", ":")).encode()


async def publish_messages(broker: BrokerConfig, topic: str, messages: Iterable[Message], *,
                           rate: float | None = None, client_id: str | None = None,
                           max_retry_delay: float = 10.0, stop: asyncio.Event | None = None) -> int:
    """Publish messages (mappings as JSON; bytes and str as given) with QoS 1, in order; returns the
    number acknowledged. `rate` paces readings (messages with an `id`) to that many per second; labels
    go out as soon as they are due. A lost connection is retried with backoff up to `max_retry_delay`
    seconds, resending the message whose PUBACK had not arrived. Setting `stop` ends it after the message
    in flight (cancelling also works, but a cancellation can be lost inside a timed wait on Python 3.11)."""
    period = 1.0 / rate if rate and rate > 0 else 0.0
    loop = asyncio.get_running_loop()
    next_t = loop.time()
    sent, backoff = 0, 0.1
    it = iter(messages)
    current: bytes | None = None
    is_reading = False
    while True:
        try:
            async with aiomqtt.Client(**client_kwargs(broker, client_id)) as client:
                backoff = 0.1
                while True:
                    if stop is not None and stop.is_set():
                        return sent
                    if current is None:
                        msg = next(it, None)
                        if msg is None:
                            return sent
                        current = _payload(msg)
                        is_reading = isinstance(msg, Mapping) and "id" in msg
                        if is_reading and period:
                            await asyncio.sleep(max(0.0, next_t - loop.time()))
                            next_t = max(next_t, loop.time()) + period  # after a stall: no burst to catch up
                    await client.publish(topic, current, qos=1)  # returns once the PUBACK is in
                    current = None
                    sent += 1
        except aiomqtt.MqttError as e:
            log.warning("sensor adapter: %s; retrying in %.1f s", e, backoff)
            await asyncio.sleep(backoff)
            backoff = min(2 * backoff, max_retry_delay)


# --------------------------------------------------------------------------- command line


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", type=Path, help="the agent's TOML configuration (broker, fleet, sensor topic)")
    p.add_argument("--host", help="broker host (default 127.0.0.1, or the configuration's)")
    p.add_argument("--port", type=int, help="broker port (default 1883, or the configuration's)")
    p.add_argument("--username", help="broker user (default on a production broker: <client>.sensor, the adapter's "
                                      "own account from the roster's sensor_adapters)")
    p.add_argument("--tls-ca", help="CA certificate: connect with TLS")
    p.add_argument("--fleet", help="fleet name (default: the configuration's)")
    p.add_argument("--client", required=True, help="the agent's client name")
    p.add_argument("--source", default="simulated", help="simulated, beijing or csv:PATH")
    p.add_argument("--station", default="Aotizhongxin", help="Beijing station")
    p.add_argument("--target", help="CSV: label column")
    p.add_argument("--features", help="CSV: comma-separated input columns")
    p.add_argument("--n-inputs", type=int, help="simulated: inputs (default: the fleet's n_inputs, or 10)")
    p.add_argument("--rate", type=float, default=1.0, help="readings per second (0: as fast as possible)")
    p.add_argument("--count", type=int, help="stop after this many readings")
    p.add_argument("--delay-labels", type=int, default=0, metavar="N",
                   help="0: label inside the reading; N: as label_for N readings later; -1: no labels")
    p.add_argument("--as-list", action="store_true", help="send x as a list in schema order")
    p.add_argument("--id-prefix", help="reading id prefix (default: random per run)")
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def _samples(args: argparse.Namespace, n_inputs: int) -> Iterator[Sample]:
    if args.source == "simulated":
        return simulated_samples(args.n_inputs or n_inputs)
    if args.source == "beijing":
        return beijing_samples(args.station)
    if args.source.startswith("csv:"):
        if not args.features:
            raise SystemExit("a CSV source needs --features (and --target for labels)")
        return csv_samples(args.source[4:], args.target, [f.strip() for f in args.features.split(",")])
    raise SystemExit(f"unknown source {args.source!r}: simulated, beijing or csv:PATH")


async def run(args: argparse.Namespace) -> int:
    """What `main` runs: build the broker settings, the topic and the messages, and publish them."""
    template, n_inputs = DEFAULT_SENSOR_TEMPLATE, 10
    if args.config is not None:
        cfg = load_config(args.config)  # applies STREAMFED_BROKER__PASSWORD & co. from the environment
        broker, fleet = cfg.broker, args.fleet or cfg.fleet.fleet
        template, n_inputs = cfg.fleet.sensor_topic, cfg.fleet.n_inputs
        if broker.username is not None and args.username is None:
            # the production broker gives the adapter its own account, bound to <fleet>.<client>.sensor
            broker = BrokerConfig.model_validate(broker.model_dump() | {"username": f"{args.client}.sensor"})
    else:
        if not args.fleet:
            raise SystemExit("--fleet is needed without --config")
        password = os.environ.get("STREAMFED_BROKER__PASSWORD")
        user = args.username or (f"{args.client}.sensor" if password else None)
        broker = BrokerConfig(host="127.0.0.1", username=user, password=password, tls_ca=args.tls_ca)
        fleet = args.fleet
    update = {k: v for k, v in (("host", args.host), ("port", args.port), ("username", args.username))
              if v is not None}
    if update:
        broker = BrokerConfig.model_validate(broker.model_dump() | update)
    topic = sensor_topic(fleet, args.client, template)
    msgs = sensor_messages(_samples(args, n_inputs), delay_labels=args.delay_labels, count=args.count,
                           id_prefix=args.id_prefix, as_list=args.as_list)
    log.info("publishing to %s on %s:%d", topic, broker.host, broker.port)
    return await publish_messages(broker, topic, msgs, rate=args.rate, client_id=f"{fleet}.{args.client}.sensor")


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the process exit status."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(message)s")
    try:
        sent = asyncio.run(run(args))
    except KeyboardInterrupt:
        return 130
    print(f"published {sent} messages", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
