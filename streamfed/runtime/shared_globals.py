"""The decoding of global payloads, shared by the agents of one process (:class:`SharedGlobals`) and used by
every agent service to install a global (:func:`install_global`)."""

from __future__ import annotations

from collections import OrderedDict

from streamfed.fleet.agent import AgentCore, GlobalResult
from streamfed.fleet.config import FleetConfig
from streamfed.wire.message import Message, ProtocolError, decode

__all__ = ["SharedGlobals", "install_global"]


class SharedGlobals:
    """Decoded global payloads, shared by the agents of one process.

    Every agent of a fleet receives the same global payload, and decoding it costs O(fleet size): the
    `included` map names every client heard, and each name is validated. One agent per process pays that
    once per global; the many agents of a load test or a gateway process (each a subscriber of its own)
    would pay it once per agent — O(agents²) per window, which at a thousand agents was the largest cost
    of the whole process. Decoded messages are immutable (read-only array views), so one decode can be
    handed to every agent whose decoding expectations (fleet configuration, kernel version) are the
    same. A rejection (:class:`ProtocolError`) is shared too. Only the last `size` payloads are kept.

    >>> cache = SharedGlobals(size=2)
    >>> cfg = FleetConfig(fleet="f", algorithm="pofmkl", n_inputs=2, n_kernels=2, n_features=3)
    >>> isinstance(cache.decode(b"\\xc1", cfg, None, "pofmkl.global"), ProtocolError), cache.hits
    (True, 0)
    >>> _ = cache.decode(b"\\xc1", cfg, None, "pofmkl.global"); cache.hits
    1
    """

    def __init__(self, size: int = 8) -> None:
        self.size = size
        self.hits = 0
        self._entries: OrderedDict[bytes, tuple[FleetConfig, str | None, str, Message | ProtocolError]] = OrderedDict()

    def decode(self, payload: bytes, cfg: FleetConfig, kernel_version: str | None,
               kind: str) -> Message | ProtocolError:
        """The decoded global (or why it is rejected), from the cache when the same payload was decoded
        with the same expectations."""
        entry = self._entries.get(payload)
        if (entry is not None and entry[1] == kernel_version and entry[2] == kind
                and (entry[0] is cfg or entry[0] == cfg)):
            self.hits += 1
            self._entries.move_to_end(payload)
            return entry[3]
        try:
            result: Message | ProtocolError = decode(payload, cfg, kernel_version=kernel_version, kinds=(kind,))
        except ProtocolError as e:
            result = e
        self._entries[payload] = (cfg, kernel_version, kind, result)
        self._entries.move_to_end(payload)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)
        return result


_SHARED_GLOBALS = SharedGlobals()  # per process: the agents of one event loop (or several) share it


def install_global(core: AgentCore, payload: bytes, shared: SharedGlobals | None = None) -> GlobalResult:
    """:meth:`AgentCore.on_global_payload`, with the decoding shared between the agents of this process
    (:class:`SharedGlobals`); the same counters and results."""
    cfg = core.cfg
    decoded = (shared or _SHARED_GLOBALS).decode(payload, cfg, core.kernel_version, cfg.global_kind)
    if isinstance(decoded, ProtocolError):
        core.counters.reject_global(decoded.reason.value)
        return GlobalResult(False, decoded.reason.value, decoded.detail)
    return core.install_global(decoded)
