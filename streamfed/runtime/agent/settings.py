"""How an agent service runs (:class:`AgentSettings`): its buffers and flow control, delivery, connection,
durability and input bounds. What the fleet is and where the broker is are not here: they are the
:class:`~streamfed.fleet.config.FleetConfig` of its core and the :class:`~streamfed.fleet.config.BrokerConfig`
it is given."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["AgentSettings"]


@dataclass(frozen=True)
class AgentSettings:
    """The settings of one :class:`~streamfed.runtime.agent.AgentService`, each with its default.

    Checked here: `prediction_qos`. The service takes the others as they are, except that it raises
    `outbox_limit`, `max_refusals` and `control_queue` to at least 1 and `wait_for_global` and
    `checkpoint_deadline` to at least 0, and resolves `drain=None` by the agent's mode; its skip watch
    refuses a `max_skip_share` outside 0..1 and a `skip_window` below 1, its sensor lane (an agent fed by
    its sensor topic) a `sensor_queue` or `sensor_queue_bytes` below 1.

    >>> AgentSettings().outbox_limit, AgentSettings(linger=0.5).linger
    (8, 0.5)
    >>> AgentSettings(prediction_qos=2)
    Traceback (most recent call last):
    ...
    ValueError: prediction_qos must be 0 or 1, got 2
    """

    # ---- outgoing: predictions and updates
    #: predictions waiting to be sent (a ring: when full, the oldest is dropped and counted)
    prediction_buffer: int = 1000
    #: updates waiting to be sent (never dropped: while full, the agent takes no more out of its learner)
    update_buffer: int = 64
    #: QoS 1 publishes awaiting their PUBACK at once (and QoS 0 predictions paho has partly written)
    max_inflight: int = 32
    #: flow control: updates sent but not yet included in a global before the learner keeps the rest
    outbox_limit: int = 8
    #: 0: each prediction is written to the socket the moment it exists; 1: through the sender, like updates
    prediction_qos: int = 0
    # ---- delivery
    #: seconds after which an update not yet included in a global is sent again
    resend_after: float = 10.0
    #: while globals are late the resend timer backs off: each timed resend that finds its update still not
    #: included doubles the wait, up to this multiple of `resend_after`; an update included resets it
    resend_backoff: float = 8.0
    #: an ack makes an update it does not name missing be sent again only once it was sent this many seconds ago
    ack_grace: float = 1.0
    #: seconds to wait, after the source ends, for the last updates to be included (None: 30 lock-step, 5 async)
    drain: float | None = None
    #: seconds to stay connected after the source ends (to receive a last global)
    linger: float = 0.0
    # ---- connection
    #: refusals by the broker in a row before `run()` raises BrokerRefused instead of retrying
    max_refusals: int = 3
    #: seconds to wait for the broker's CONNACK
    connect_timeout: float = 5.0
    #: joining a running fleet: seconds to wait, once connected, for its retained global before the first sample
    wait_for_global: float = 0.0
    # ---- durable state (with a `state_dir`)
    #: seconds an update may wait for the checkpoint that lets it out (0: a checkpoint before every update)
    checkpoint_interval: float = 0.0
    #: seconds a state that cannot be written is retried before the agent stops (CheckpointFailed)
    checkpoint_deadline: float = 30.0
    # ---- input
    #: sensor messages waiting to be learned; beyond it the oldest is dropped and counted (queue_full)
    sensor_queue: int = 4096
    #: payload bytes of the sensor messages waiting to be learned, at most
    sensor_queue_bytes: int = 8 << 20
    #: globals and acks waiting for the receiver; beyond it the oldest is dropped and counted
    control_queue: int = 256
    #: seconds between two warnings about input dropped unread, at least
    drop_log_interval: float = 10.0
    #: warn when more than this share of the last `skip_window` items was skipped (None: never)
    max_skip_share: float | None = 0.5
    #: items the skip share is taken over
    skip_window: int = 100
    # ---- the process
    #: before the stream starts, collect and freeze everything alive out of the garbage collector's view
    gc_freeze: bool = True

    def __post_init__(self) -> None:
        if self.prediction_qos not in (0, 1):
            raise ValueError(f"prediction_qos must be 0 or 1, got {self.prediction_qos!r}")
