"""The agent's asyncio/MQTT shell around :class:`streamfed.fleet.agent.AgentCore`: :class:`AgentService`, run
with its :class:`AgentSettings`.

* :mod:`~streamfed.runtime.agent.service` — the service: its connection, life cycle and durable state;
* :mod:`~streamfed.runtime.agent.sending` — what it sends: predictions, bounded updates, resends;
* :mod:`~streamfed.runtime.agent.receiving` — what it takes in: globals, acks, sensor messages, the stream;
* :mod:`~streamfed.runtime.agent.settings` — :class:`AgentSettings`.

The MQTT session helpers it shares with the other services are :mod:`streamfed.runtime.session`'s, the decoding
of globals it shares with the other agents of its process :mod:`streamfed.runtime.shared_globals`'.
"""

from streamfed.runtime.agent.service import AgentService
from streamfed.runtime.agent.settings import AgentSettings

__all__ = ["AgentService", "AgentSettings"]
