"""`streamfed subscribe`: watch a fleet's prediction stream (a live table, or JSON lines)."""

from __future__ import annotations

import json
import time
from typing import Any

import aiomqtt
import numpy as np
from rich.console import Console
from rich.live import Live
from rich.table import Table

from streamfed.fleet.config import BrokerConfig
from streamfed.runtime.connection import client_kwargs
from streamfed.runtime.mqtt import IncomingQueue
from streamfed.wire.message import Message, ProtocolError, decode
from streamfed.wire.schema import MAX_CLASSES, ProtocolSchema, prediction_schema
from streamfed.wire.topics import Channel, topic_filter

__all__ = ["PredictionDecoder", "watch"]


class PredictionDecoder:
    """Strictly decodes `prediction` messages of a fleet without knowing its learner: a prediction
    carries `mean`, `var` for Bayesian learners and `proba` for classifiers.

    >>> import numpy as np
    >>> from streamfed.wire.message import encode, prediction_message
    >>> d = PredictionDecoder("f")
    >>> d.decode(encode(prediction_message("f", "a1", 1, np.array([0.5]), np.array([0.1])))).arrays["var"]
    array([0.1])
    """

    def __init__(self, fleet: str) -> None:
        # the prediction schema depends only on whether the learner is Bayesian and whether it classifies
        # (its class count unknown here: up to the most any classifier may have): try each
        self._schemas = [ProtocolSchema(fleet, {"prediction": prediction_schema(b, n_classes=k)})
                         for k in (None, MAX_CLASSES) for b in (False, True)]

    def decode(self, payload: bytes) -> Message:
        err: ProtocolError | None = None
        for schema in self._schemas:
            try:
                return decode(payload, schema, kinds=("prediction",))
            except ProtocolError as e:
                err = e
        assert err is not None
        raise err


def _row(msg: Message) -> dict[str, Any]:
    """One prediction as a JSON-able row (its last sample); a classifier's adds `class` (the most probable),
    `p` (its probability) and `proba` (every class's probability, by class index).

    >>> import numpy as np
    >>> from streamfed.wire.message import prediction_message
    >>> r = _row(prediction_message("f", "a1", 1, np.array([2.0]), proba=np.array([[0.1, 0.2, 0.7]])))
    >>> r["class"], r["p"], r["proba"]
    (2, 0.7, [0.1, 0.2, 0.7])
    """
    var = msg.arrays.get("var")
    row = {"client": msg.client, "seq": msg.seq, "mean": float(msg.arrays["mean"][-1]),
           "var": None if var is None else float(var[-1]), "global_version": msg.global_version, "epoch": msg.epoch,
           "reading": msg.meta.get("reading"), "latency_s": msg.meta.get("latency_s"), "created": msg.created}
    proba = msg.arrays.get("proba")
    if proba is not None:
        k = int(np.argmax(proba[-1]))
        row["class"], row["p"], row["proba"] = k, float(proba[-1][k]), [float(v) for v in proba[-1]]
    return row


# Bounds on what a watcher holds, whatever the stream: predictions received but not yet shown (the newest
# kept: a live view is about now) and the clients in the table (names beyond it are counted, not shown —
# on a development broker anyone may publish predictions under any name).
QUEUE = 4096
MAX_ROWS = 1000


def _table(fleet: str, latest: dict[str, dict[str, Any]], counts: dict[str, int], rejected: int,
           dropped: int = 0) -> Table:
    t = Table(title=f"predictions of fleet {fleet!r}")
    classifier = any("class" in r for r in latest.values())
    cols = ("client", "count", "last class", "p", "global", "age s") if classifier else (
        "client", "count", "last mean", "± sd", "global", "age s")
    for col in cols:
        t.add_column(col, justify="left" if col == "client" else "right")
    now = time.time()
    for c in sorted(latest):
        r = latest[c]
        if "class" in r:
            shown, spread = str(r["class"]), f"{r['p']:.3f}"
        else:
            shown, spread = f"{r['mean']:.4f}", ("—" if r["var"] is None else f"{r['var'] ** 0.5:.4f}")
        t.add_row(c, str(counts[c]), shown, spread, str(r["global_version"]), f"{now - r['created']:.1f}")
    t.caption = f"{rejected} malformed messages ignored" + (
        f"; {dropped} dropped unread (the watcher fell behind) or from clients beyond the first {MAX_ROWS}"
        if dropped else "")
    return t


async def watch(fleet: str, broker: BrokerConfig, console: Console, count: int | None = None,
                as_json: bool = False, client_id: str | None = None) -> int:
    """Subscribe to `streamfed/v1/<fleet>/predictions/+` until `count` predictions (or forever).

    The client id is `client_id`, else the user name when there is one — the production broker binds each
    viewer account to the client id equal to its name — else a random one."""
    dec = PredictionDecoder(fleet)
    latest: dict[str, dict[str, Any]] = {}
    counts: dict[str, int] = {}
    seen = rejected = 0
    incoming = IncomingQueue(limit=QUEUE)  # aiomqtt's own queue is unbounded
    async with aiomqtt.Client(**client_kwargs(broker, client_id or broker.username),
                              queue_type=lambda maxsize=0: incoming) as client:  # type: ignore[arg-type]
        await client.subscribe(topic_filter(Channel.PREDICTIONS, fleet), qos=1)
        live = None if as_json else Live(_table(fleet, latest, counts, 0), console=console, refresh_per_second=4)
        if live is not None:
            live.start()
        try:
            async for m in client.messages:
                try:
                    msg = dec.decode(bytes(m.payload))  # type: ignore[arg-type]
                except ProtocolError:
                    rejected += 1
                    continue
                row = _row(msg)
                seen += 1
                if as_json:  # one JSON object per line, terminal or not (for pipes and jq)
                    print(json.dumps(row), flush=True)
                else:
                    if msg.client in latest or len(latest) < MAX_ROWS:
                        latest[msg.client] = row
                        counts[msg.client] = counts.get(msg.client, 0) + 1
                    else:
                        incoming.dropped += 1
                    live.update(_table(fleet, latest, counts, rejected, incoming.dropped))  # type: ignore[union-attr]
                if count is not None and seen >= count:
                    break
        finally:
            if live is not None:
                live.stop()
    return seen
