"""The sending half of the agent service (:class:`Sending`, a part of
:class:`~streamfed.runtime.agent.service.AgentService`): predictions, the outgoing buffer, flow control and
delivery. The settings named here are :class:`~streamfed.runtime.agent.settings.AgentSettings` fields.

Predictions are a live stream: by default (`prediction_qos=0`) each is published at QoS 0 the moment
it exists — written to the socket (Nagle off) before its sample is learned (FedBNR) or its update taken
from the error feedback, built, encoded or sent; the agent's :attr:`AgentService.latencies` run from the
sample's arrival to that write. With `prediction_qos=1` they go through the sender like updates and the
latency runs to the PUBACK.

Outgoing buffer (bounded; memory never grows without bound):

* predictions that cannot go out at once (no connection, older ones still waiting, QoS 1) wait in a
  ring of `prediction_buffer` entries — when it is full the **oldest prediction is dropped** and
  counted (`dropped_predictions`): a late prediction is worth little;
* updates are **never dropped**: at most `update_buffer` messages wait; while that is full the agent
  stops taking updates out of the learner — POF-MKL (async) keeps accumulating them in its
  error-feedback buffer (fixed size `N·2D`), FedBNR keeps its pending statistics (fixed size `K·F²`),
  a lock-step POF-MKL agent has at most one update in flight by construction. The same holds while
  `outbox_limit` updates are sent but not yet included in a global.

Delivery: an update stays in the core's outbox until a global that includes it is installed; it is sent
again when an `ack` from the aggregator shows it does not hold it (the aggregator acks every client
when it (re)connects or comes online, and clients with gaps after each global) — at once if the ack
names it missing or it was sent over `ack_grace` seconds before, else it is probably still on its way
and its timer decides — and when it has waited `resend_after` seconds. The aggregator drops
duplicates, so the effect is exactly once. The timer backs off while globals are late: a timed resend
whose update is still not included doubles the wait (up to `resend_backoff` × `resend_after`), the next
update a global includes resets it. An aggregator behind its input by more than `resend_after` would
otherwise get every outstanding update of every agent again each period: its backlog only grew (at 2,500
light agents, 214k resends for 37k new updates; benchmarks/results/fleet_10k.md). When its source ends
the agent stays up to `drain` seconds for its updates to be included.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from typing import TYPE_CHECKING, Any

import aiomqtt
import paho.mqtt.client as mqtt

from streamfed.runtime.mqtt import paho_of, pending_publishes
from streamfed.runtime.session import OP_TIMEOUT, PubackWatch, publish_now
from streamfed.wire.message import Message, encode, status_message
from streamfed.wire.topics import predictions_topic, status_topic, updates_topic

if TYPE_CHECKING:
    from streamfed.fleet.agent import AgentCore, Prediction
    from streamfed.fleet.persistence import StateStore
    from streamfed.runtime.agent.settings import AgentSettings

__all__ = ["Sending"]

log = logging.getLogger(__name__)
_WAKE = 0.25  # an idle sender with a partly written prediction looks again this often
# An idle sender sleeps until its next deadline (a resend timer, the drain); in any case it looks again
# this often. (A fixed short wake-up was four timers a second per agent: with a thousand agents in one
# loop, the timer heap alone was a few per cent of the process.)
_IDLE_MAX = 5.0


class _Puback:
    """A publish's completion as the agent's sender sees it: aiomqtt's PUBACK callback calls `set()` on
    what its table of pending publishes holds for the message id; this wakes the sender."""

    __slots__ = ("done", "_wake")

    def __init__(self, wake: asyncio.Event) -> None:
        self.done = False
        self._wake = wake

    def set(self) -> None:
        self.done = True
        self._wake.set()


class Sending:
    """What an :class:`~streamfed.runtime.agent.service.AgentService` sends, and when: its predictions, as they
    come or from their ring buffer, and its updates, bounded, resent until a global includes them.

    A part of the service, not an object of its own: :meth:`_init_sending` sets up the state below, and the
    sender reads the service's (its core, its stop event, the updates its checkpoint holds back)."""

    # the service's, read here
    core: AgentCore
    fleet: str
    client_id: str
    drain: float
    store: StateStore | None
    _fresh: list[Message]
    _stop: asyncio.Event
    _source_done_at: float | None

    def _init_sending(self, s: AgentSettings) -> None:
        self.predictions: deque[Message] = deque(maxlen=s.prediction_buffer)
        self.prediction_qos = s.prediction_qos  # 0 or 1 (AgentSettings checks it)
        self._client: aiomqtt.Client | None = None  # while a session is up: live predictions go straight out
        self._pred_inflight = 0  # buffered predictions the sender is publishing
        self._writing: deque[tuple[Any, Message, int]] = deque()  # QoS 0 predictions paho has partly written
        self._predictions_topic = predictions_topic(self.fleet, self.client_id)
        self._updates_topic = updates_topic(self.fleet, self.client_id)
        self.updates: deque[Message] = deque()
        self.update_buffer = s.update_buffer
        self.outbox_limit = max(1, int(s.outbox_limit))
        self.max_inflight = s.max_inflight
        self.dropped_predictions = 0
        self.resend_after = s.resend_after
        self._resend_max = s.resend_after * max(1.0, float(s.resend_backoff))
        self._resend_wait = s.resend_after  # the timer's current wait (backs off while globals are late)
        self._resend_oldest: int | None = None  # the oldest update outstanding when the wait was last set
        self._work = asyncio.Event()  # something to send, a PUBACK, a lost connection, stop(): the sender looks
        self.latencies: deque[float] = deque(maxlen=10_000)  # sample arrival → prediction published
        self.on_prediction = None  # optional callback(Prediction) for live views
        self._sent_at: dict[int, float] = {}  # update seq → when it was last handed to the broker
        self._resend_due = math.inf  # (monotonic) no resend timer expires before this
        self._inflight: set[int] = set()
        self._receiver_error_logged = False

    async def _send(self, client: aiomqtt.Client, receiver: asyncio.Task[None] | None = None,
                    watch: PubackWatch | None = None) -> None:
        """Publish buffered messages, oldest first, with up to `max_inflight` QoS 1 publishes awaiting
        their PUBACK at once (one at a time would cap an agent at one message per round trip). A message
        leaves its buffer only when acknowledged; on a lost connection the unacknowledged ones go back
        to the front, in order, and are sent again (the aggregator drops duplicates by seq).

        Each message is handed to paho here and written to the socket at once when nothing else waits
        (:func:`publish_now`), and its PUBACK is a flag that paho's callback sets (through aiomqtt's table
        of pending publishes) — not a task per publish around aiomqtt's `publish()`, which wraps its own
        wait in another task and a timeout, and whose write waits for a socket writer to be added (a
        wake-up of the loop through its self-pipe, two `epoll_ctl`s). With a thousand agents in one
        process that machinery cost more than the messages. A PUBACK not seen within `OP_TIMEOUT`
        seconds still ends the session, as aiomqtt's timeout did."""
        paho: mqtt.Client = paho_of(client)
        pending = pending_publishes(client)  # mid → what aiomqtt's on_publish calls .set() on
        loop = asyncio.get_running_loop()
        inflight: dict[int, tuple[_Puback, deque[Message], Message, int, float]] = {}  # by mid
        if receiver is not None:
            receiver.add_done_callback(lambda _: self._work.set())  # a lost connection wakes the sender
        try:
            while True:
                if receiver is not None and receiver.done() and self._receiver_failed(receiver):
                    return
                for mid in [mid for mid, entry in inflight.items() if entry[0].done]:
                    _, queue, msg, nbytes, _ = inflight.pop(mid)
                    if queue is self.predictions:
                        self._pred_inflight -= 1
                    if watch is not None and watch.refused:
                        queue.appendleft(msg)  # not delivered: it stays ours
                        watch.check()
                    self._sent(queue is self.updates, msg, nbytes)
                while (self.updates or self.predictions) and len(inflight) < self.max_inflight:
                    # oldest first: a sample's prediction (made before its update) goes out ahead of it
                    ups, preds = self.updates, self.predictions
                    queue = ups if ups and (not preds or ups[0].created <= preds[0].created) else preds
                    msg = queue[0]
                    payload = encode(msg)
                    if queue is self.updates:
                        topic, qos = self._updates_topic, 1
                    else:
                        topic, qos = self._predictions_topic, self.prediction_qos
                    info = publish_now(paho, topic, payload, qos)
                    if info.rc != mqtt.MQTT_ERR_SUCCESS:  # the connection is gone: the message stays first
                        raise aiomqtt.MqttCodeError(info.rc, "Could not publish message")
                    queue.popleft()
                    if info.is_published():  # QoS 0, written
                        self._sent(queue is self.updates, msg, len(payload))
                        continue
                    done = _Puback(self._work)
                    pending[info.mid] = done
                    inflight[info.mid] = (done, queue, msg, len(payload), loop.time())
                    if queue is self.updates:
                        self._inflight.add(msg.seq)
                    else:
                        self._pred_inflight += 1
                if inflight:
                    if any(entry[0].done for entry in inflight.values()):
                        continue
                    oldest = min(entry[4] for entry in inflight.values())
                    if loop.time() - oldest > OP_TIMEOUT:
                        raise aiomqtt.MqttError("Operation timed out")  # as aiomqtt's publish() would
                    await self._wait_work(OP_TIMEOUT - (loop.time() - oldest) + 0.01)  # PUBACKs wake it
                    continue
                self._check_written()
                if self._finished() or self._stop.is_set():
                    return
                self._resend_overdue()
                if self.core.secagg is not None:  # start or restart a round when updates wait
                    self._secagg(self.core.secagg_tick())
                if self.core.status_changed:  # e.g. the privacy budget ran out: the retained status says so
                    self.core.status_changed = False
                    paho.publish(status_topic(self.fleet, self.client_id), encode(status_message(
                        self.fleet, self.client_id, "online", meta=self.core.status_meta())), 1, True)
                if self.updates or self.predictions:
                    continue
                await self._wait_work(self._idle_timeout())
        finally:
            for mid, (_, queue, msg, _, _) in sorted(inflight.items(), key=lambda kv: -kv[1][2].seq):
                pending.pop(mid, None)
                queue.appendleft(msg)  # back to the front, lowest seq first
            self._inflight.clear()
            self._pred_inflight = 0

    async def _wait_work(self, timeout: float) -> None:
        """Until there is something to do (`_work` set) or `timeout` seconds have passed. A timer handle
        rather than wait_for(), which wraps the wait in a task of its own: with a thousand agents in one
        loop, that was four thousand tasks a second doing nothing."""
        if self._work.is_set():
            self._work.clear()
            return
        timer = asyncio.get_running_loop().call_later(max(0.0, timeout), self._work.set)
        try:
            await self._work.wait()
        finally:
            timer.cancel()
            self._work.clear()

    def _receiver_failed(self, receiver: asyncio.Task[None]) -> bool:
        """A receiver that ended: the connection is gone (raise, to reconnect), or it died of a bug —
        say so once, loudly (it is not restarted: the message that killed it could kill it again)."""
        exc = None if receiver.cancelled() else receiver.exception()
        if isinstance(exc, aiomqtt.MqttError):
            raise exc
        if exc is not None and not self._receiver_error_logged:
            self._receiver_error_logged = True
            log.error("agent %s: the receiver stopped on an error; no globals, acks or sensor readings are "
                      "taken any more", self.client_id, exc_info=exc)
        return False

    def _sent(self, is_update: bool, msg: Message, nbytes: int) -> None:
        if is_update:
            self._inflight.discard(msg.seq)
            now = time.monotonic()
            self._sent_at[msg.seq] = now
            self._resend_due = min(self._resend_due, now + self._resend_wait)
            self.core.counters.updates += 1
            self.core.counters.bytes_uploaded += nbytes
            self.core.stats.uploaded(nbytes)
            self._sync_hold()
        else:
            self.latencies.append(max(0.0, time.time() - msg.created + float(msg.meta.get("latency_s", 0.0))))

    def _sync_hold(self) -> None:
        held = self.core.hold_uploads
        self.core.hold_uploads = (len(self.updates) + len(self._fresh) >= self.update_buffer
                                  or len(self.core.outbox) >= self.outbox_limit)
        if held and not self.core.hold_uploads and self.core.steps:
            # room again (a global included some): what the learner kept meanwhile leaves now, not at the next
            # sample (a paused or finished stream would keep it)
            self._queue(None, self.core.take_held())

    def _backpressure(self) -> bool:
        """The broker is not taking updates as fast as they come: stop reading the source for a while."""
        return len(self.updates) >= self.update_buffer

    def _secagg(self, msgs: list[Message]) -> None:
        """Queue secure-aggregation messages (not write-ahead: a round lost in a crash is simply run again)."""
        if msgs:
            self.updates.extend(msgs)
            self._work.set()

    def resend(self, msgs: list[Message]) -> int:
        """Queue updates again unless they are waiting or in flight already; returns how many were."""
        if self.core.secagg is not None:  # an update never leaves unmasked
            return 0
        waiting = {m.seq for m in self.updates} | self._inflight | {m.seq for m in self._fresh}
        again = [m for m in msgs if m.seq not in waiting and m.seq in self.core.outbox]
        if again:
            self.updates.extendleft(reversed(again))  # the oldest first, ahead of newer ones
            self.core.counters.resent += len(again)
            self._work.set()
        return len(again)

    def _idle_timeout(self) -> float:
        """How long an idle sender may sleep: until the next resend timer or the drain deadline (new
        messages, PUBACKs, globals, acks and stop() wake it anyway)."""
        if self._writing:
            return _WAKE
        due = self._resend_due
        if self._source_done_at is not None:
            due = min(due, self._source_done_at + self.drain)
        return min(_IDLE_MAX, max(0.0, due - time.monotonic()))

    def _resend_overdue(self) -> None:
        if not self.core.outbox:
            self._sent_at.clear()
            self._resend_due = math.inf
            return
        oldest = min(self.core.outbox)
        if oldest != self._resend_oldest:  # a global included our oldest: globals are coming, no backoff
            self._resend_oldest, self._resend_wait = oldest, self.resend_after
            self._resend_due = min(self._sent_at.values(), default=math.inf) + self._resend_wait
        now = time.monotonic()
        if now < self._resend_due:  # the scan below is per call: with many agents, it showed
            return
        for seq in [s for s in self._sent_at if s not in self.core.outbox]:
            del self._sent_at[seq]
        wait = self._resend_wait
        overdue = [self.core.outbox[s] for s in sorted(self._sent_at) if now - self._sent_at[s] >= wait]
        if overdue and (n := self.resend(overdue)):
            log.info("agent %s: %d updates not included after %.0fs, sent again (next wait %.0fs)", self.client_id,
                     n, wait, min(2 * wait, self._resend_max))
            self._resend_wait = min(2 * wait, self._resend_max)
        self._resend_due = min(self._sent_at.values(), default=math.inf) + self._resend_wait

    def _buffer_prediction(self, msg: Message) -> None:
        if len(self.predictions) == self.predictions.maxlen:
            self.dropped_predictions += 1  # deque(maxlen) drops the oldest on append
        self.predictions.append(msg)
        self._work.set()

    def _emit(self, pred: Prediction) -> None:
        """Publish a prediction now. At QoS 0 it is written to the socket before this returns
        (:func:`publish_now`); if the socket takes only part of it, aiomqtt's writer sends the rest and
        the prediction counts as published when that is seen. Older predictions still waiting, no
        connection, or QoS 1: it joins the ring buffer the sender drains (in order, oldest dropped when
        full)."""
        msg = self.core.prediction_message(pred)
        self._publish_prediction(msg)
        if self.on_prediction is not None:  # a live view: after the publish, whatever it costs
            self.on_prediction(pred)

    def _publish_prediction(self, msg: Message) -> None:
        paho = paho_of(self._client)
        # `_writing` (and paho's queue behind it) is bounded: a socket that takes predictions slower than
        # they come sends them to the ring, which drops the oldest and counts it
        if (paho is None or self.prediction_qos != 0 or self.predictions or self._pred_inflight
                or len(self._writing) >= self.max_inflight or not paho.is_connected()):
            self._buffer_prediction(msg)
            return
        payload = encode(msg)
        info = publish_now(paho, self._predictions_topic, payload)
        if info.rc != mqtt.MQTT_ERR_SUCCESS:  # the connection just went: sent after the reconnect
            self._buffer_prediction(msg)
            return
        self._check_written()
        if info.is_published():
            self._sent(False, msg, len(payload))
        else:
            self._writing.append((info, msg, len(payload)))

    def _check_written(self) -> None:
        """Predictions whose last bytes aiomqtt's socket writer sent since: published now."""
        while self._writing and self._writing[0][0].is_published():
            _, msg, nbytes = self._writing.popleft()
            self._sent(False, msg, nbytes)

    def _queue(self, pred: Prediction | None, msgs: list[Message]) -> None:
        if pred is not None:
            self._buffer_prediction(self.core.prediction_message(pred))
            if self.on_prediction is not None:
                self.on_prediction(pred)
        if msgs:
            if self.store is None:
                self.updates.extend(msgs)
            else:
                self._fresh.extend(msgs)  # write-ahead: sendable once a checkpoint covers them
        self._sync_hold()
        self._work.set()
