"""An embedded broker for the demo: Mosquitto when its binary is installed, else an in-process one.

* **Mosquitto** (preferred): started from `broker_config/mosquitto/dev.conf` (found beside the
  package in a source checkout), with the listener moved to a free loopback port and persistence off
  (the demo's state is thrown away), run by :class:`streamfed.runtime.mosquitto.Mosquitto` (its output in
  the work directory's `mosquitto.log`). Full MQTT v5, persistent sessions, retained messages.
* **amqtt** (fallback, `pip install 'streamfed[inprocess]'`): a pure-Python broker inside the demo's
  process. Its limits: MQTT 3.1.1 only (no v5 properties or reason codes), it shares the demo's CPU,
  and it loses acknowledged QoS 1 messages when a publisher disconnects right after publishing — fine
  for a demo, never for durability.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from dataclasses import dataclass
from pathlib import Path

from streamfed.fleet.config import BrokerConfig
from streamfed.runtime.mosquitto import Mosquitto, find_mosquitto, free_port

__all__ = ["EmbeddedBroker", "dev_config", "find_mosquitto", "free_port"]  # the last two: from .mosquitto

_DEV_CONF = Path(__file__).resolve().parents[2] / "broker_config" / "mosquitto" / "dev.conf"
_FALLBACK_CONF = """per_listener_settings false
listener {port} 127.0.0.1
allow_anonymous true
max_packet_size 16777216
max_queued_messages 10000
"""


def dev_config(port: int) -> str:
    """The development config with its listener on `port` and persistence off."""
    if _DEV_CONF.exists():
        text = _DEV_CONF.read_text()
        text = re.sub(r"^listener\s+\d+.*$", f"listener {port} 127.0.0.1", text, flags=re.M)
        text = re.sub(r"^(persistence(_location|_file)?|autosave_interval)\b.*$", "", text, flags=re.M)
        return text + "\npersistence false\n"
    return _FALLBACK_CONF.format(port=port)


@dataclass
class EmbeddedBroker:
    """Start with :meth:`start` (async), stop with :meth:`stop`; :attr:`description` says which."""

    kind: str = ""
    port: int = 0
    description: str = ""
    _mosquitto: Mosquitto | None = None
    _amqtt: object | None = None

    @property
    def config(self) -> BrokerConfig:
        return BrokerConfig(host="127.0.0.1", port=self.port, protocol="5" if self.kind == "mosquitto" else "3.1.1")

    async def start(self) -> EmbeddedBroker:
        binary = find_mosquitto()
        if binary:
            mosquitto = Mosquitto(dev_config, prefix="streamfed-demo-")  # a free port, retried if taken
            try:
                await asyncio.to_thread(mosquitto.start)
            except BaseException:
                mosquitto.close()
                raise
            self._mosquitto, self.port = mosquitto, mosquitto.port or 0
            self.kind = "mosquitto"
            self.description = (f"Mosquitto ({binary}) on 127.0.0.1:{self.port}, MQTT v5, "
                                f"config from {_DEV_CONF if _DEV_CONF.exists() else 'the built-in dev config'}")
            return self
        self.port = free_port()
        try:
            from amqtt.broker import Broker  # type: ignore[import-not-found]
        except ImportError:
            raise RuntimeError("no broker available: install Mosquitto (`apt-get install mosquitto`, or "
                               "`bash scripts/setup.sh`) or the in-process fallback "
                               "(`pip install 'streamfed[inprocess]'`)") from None
        broker = Broker({"listeners": {"default": {"type": "tcp", "bind": f"127.0.0.1:{self.port}"}},
                         "plugins": {"amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}}})
        await broker.start()
        self._amqtt = broker
        self.kind = "amqtt"
        self.description = (f"in-process amqtt broker on 127.0.0.1:{self.port} (Mosquitto not found). Limits: "
                            "MQTT 3.1.1 only, shares this process's CPU, may lose acknowledged QoS 1 messages "
                            "when a publisher disconnects right after publishing — a demo, not durable")
        return self

    async def stop(self) -> None:
        if self._mosquitto is not None:
            await asyncio.to_thread(self._mosquitto.close)
            self._mosquitto = None
        if self._amqtt is not None:
            with contextlib.suppress(Exception):
                await self._amqtt.shutdown()  # type: ignore[attr-defined]
            self._amqtt = None
