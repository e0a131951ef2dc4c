"""Every use of aiomqtt's and paho's internals, in one place.

aiomqtt (2.x) is the MQTT client of the runtime; a few things the runtime needs are not in its public API:
the paho client it wraps (to write a QoS 0 prediction to the socket at once, to turn Nagle off, to watch
PUBACK reason codes, which `publish()` does not surface), its table of pending publishes (to wait for
PUBACKs without a task per message), its incoming queue (to take the messages already waiting in one
step), and the texts of MQTT 3.1.1 CONNACK codes. Each accessor degrades to `None` (or a plain text)
when a later aiomqtt moves them, so the runtime falls back to the public API instead of breaking; this
module is the one to revisit on an aiomqtt upgrade (pinned `>=2.5,<3`).

>>> paho_of(object()) is None, incoming_drain(object()) is None
(True, True)
>>> connect_refusal_text(5)
'Not authorised'
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["connect_refusal_text", "incoming_drain", "paho_of", "pending_publishes"]


def paho_of(client: Any) -> Any | None:
    """The paho `Client` inside an aiomqtt client (None if there is none)."""
    return getattr(client, "_client", None)


def pending_publishes(client: Any) -> dict[int, Any]:
    """aiomqtt's table mid → the event its `on_publish` callback sets when the PUBACK arrives."""
    table = getattr(client, "_pending_publishes", None)
    if not isinstance(table, dict):
        raise RuntimeError("this aiomqtt has no table of pending publishes (aiomqtt >= 2.5, < 3 expected)")
    return table


def incoming_drain(client: Any) -> Callable[[], Any] | None:
    """A function returning the next message already received (`asyncio.QueueEmpty` when none), or None."""
    return getattr(getattr(client, "_queue", None), "get_nowait", None)


def connect_refusal_text(rc: int) -> str:
    """The text of an MQTT 3.1.1 CONNACK return code."""
    import aiomqtt

    table = getattr(aiomqtt.exceptions, "_CONNECT_RC_STRINGS", {})
    return str(table.get(rc, f"return code {rc}"))

