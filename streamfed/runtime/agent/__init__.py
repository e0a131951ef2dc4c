"""The agent's asyncio/MQTT shell around :class:`streamfed.fleet.agent.AgentCore`: :class:`AgentService`, run
with its :class:`AgentSettings`."""

from streamfed.runtime.agent.service import AgentService
from streamfed.runtime.agent.settings import AgentSettings

__all__ = ["AgentService", "AgentSettings"]
