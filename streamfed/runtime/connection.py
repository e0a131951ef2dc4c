"""How a service connects: a :class:`~streamfed.fleet.config.BrokerConfig` as `aiomqtt.Client` keyword arguments
(MQTT v5 or 3.1.1, TLS, persistent sessions). The configuration itself knows nothing of aiomqtt: the MQTT
client is the runtime's, and only the runtime imports it.

>>> from streamfed.fleet.config import BrokerConfig
>>> kw = client_kwargs(BrokerConfig(port=1884), "f.a1", persistent=True)
>>> kw["port"], kw["identifier"], kw["clean_start"], kw["properties"].SessionExpiryInterval
(1884, 'f.a1', False, 3600)
"""

from __future__ import annotations

from typing import Any

import aiomqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from streamfed.fleet.config import BrokerConfig

__all__ = ["client_kwargs"]


def client_kwargs(broker: BrokerConfig, client_id: str | None = None, *, persistent: bool = False
              ) -> dict[str, Any]:
    """Keyword arguments for `aiomqtt.Client` connecting to `broker`.

    `persistent=True` asks for a session that survives disconnects: `clean_start=False` plus
    `SessionExpiryInterval = session_expiry` on v5, `clean_session=False` on v3.1.1. A persistent
    session needs a fixed `client_id`.
    """
    if persistent and not client_id:
        raise ValueError("a persistent session needs a fixed client_id")
    v5 = broker.protocol == "5"
    kw: dict[str, Any] = {
        "hostname": broker.host,
        "port": broker.port,
        "username": broker.username,
        "password": broker.password.get_secret_value() if broker.password is not None else None,
        "identifier": client_id,
        "protocol": aiomqtt.ProtocolVersion.V5 if v5 else aiomqtt.ProtocolVersion.V311,
        "keepalive": broker.keepalive,
    }
    if broker.use_tls:
        kw["tls_params"] = aiomqtt.TLSParameters(ca_certs=broker.tls_ca, certfile=broker.tls_cert,
                                                 keyfile=broker.tls_key)
    if v5:
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = broker.session_expiry if persistent else 0
        kw["properties"] = props
        kw["clean_start"] = not persistent
    else:
        kw["clean_session"] = not persistent
    return kw
