"""A server-side service's messages of a `carried` kind survive a lost connection (streamfed.runtime.service):
the ones taken by the publisher but not acknowledged by the broker go out first in the next session; other kinds
are left to their own resend (on_connect, timers) and are not sent twice."""

from __future__ import annotations

import asyncio
import signal
import time

from streamfed.fleet.sharding import contributors_fields
from streamfed.runtime.service import MqttService, Outgoing
from streamfed.wire.message import Message, ack_message
from tests.brokers import start_or_fail


class Recorder(MqttService):
    """Publishes what it is given (emit) and records what the broker acknowledged."""

    carried = frozenset({"partial.ack"})

    def __init__(self, broker, client_id: str) -> None:
        super().__init__(broker, client_id, tick=0.05)
        self.acknowledged: list[tuple[str, str, int]] = []

    def subscriptions(self) -> list[str]:
        return ["carry/none"]

    def route(self, msg: Message) -> Outgoing:
        return Outgoing(f"carry/{msg.kind}/{msg.client}")

    def handle(self, topic, payload: bytes) -> list[Message]:
        return []

    def on_published(self, msg: Message, at: float) -> None:
        self.acknowledged.append((msg.kind, msg.client, msg.seq))


def partial_ack(shard: str, seq: int) -> Message:
    included, owner, seqs = contributors_fields([])
    return Message("f", shard, "partial.ack", seq, global_version=0, arrays={"owner": owner, "seqs": seqs},
                   meta={"partial": seq, "applied": True}, included=included)


async def _wait(cond, timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        await asyncio.sleep(0.02)


def test_a_carried_kind_taken_before_the_broker_died_is_published_in_the_next_session():
    with start_or_fail("dev") as broker:
        svc = Recorder(broker.broker_config(), "f.carry")

        async def scenario() -> None:
            runner = asyncio.create_task(svc.run())
            await _wait(svc.connected.is_set)
            svc.emit([partial_ack("s0", 1)])
            await _wait(lambda: svc.acknowledged)  # the normal path
            proc = broker.proc
            assert proc is not None
            # Frozen: the publisher hands the next messages to paho and waits for PUBACKs that never come; then the
            # broker dies with them (SIGKILL: nothing saved) and a new one starts on the same port.
            proc.send_signal(signal.SIGSTOP)
            svc.emit([partial_ack("s0", 2), ack_message("f", "a0", 3, [], seq=3, global_version=0),
                      partial_ack("s1", 7)])
            await asyncio.sleep(0.3)
            proc.kill()
            proc.wait()
            await _wait(lambda: not svc.connected.is_set())
            broker.restart()
            await _wait(lambda: len(svc.acknowledged) >= 3)
            await asyncio.sleep(0.5)  # anything else would have gone out by now
            svc.stop()
            await runner

        asyncio.run(scenario())
    assert svc.acknowledged == [("partial.ack", "s0", 1), ("partial.ack", "s0", 2), ("partial.ack", "s1", 7)]
    assert svc.reconnects >= 1
