"""The wire vocabulary, below the algorithms: message schemas and limits (:mod:`~streamfed.wire.schema`), the
msgpack codec with its strict validation (:mod:`~streamfed.wire.message`) and the MQTT topic tree
(:mod:`~streamfed.wire.topics`). Algorithms describe their messages with it; the fleet and the runtime move
them. It imports nothing of streamfed but itself (and the fleet configuration, for type hints only)."""
