"""pFedGP on the wire. The envelope's `epoch` is the network version.

* ``pfedgp.update`` — one chunk of a proposal: `chunk (≤ max_chunk_bytes / 8)`, `part = (proposal seq, chunk
  index, chunk count, whole length)`, `weight` (samples the local update saw). It counts no samples of any
  statistics (`n_samples = 0`): only the network is shared.
* ``pfedgp.global`` — the shared parameters `theta` (network, then the inducing inputs).
* ``pfedgp.partial`` — a shard's weighted sum of the complete proposals it received (`delta_sum`, `weight`,
  `proposers`), with their `(client, seq)` pairs.

>>> from streamfed.fleet.config import FleetConfig
>>> cfg = FleetConfig(fleet="f", algorithm="pfedgp", n_inputs=2,
...                   params={"widths": [3], "n_omega": 2, "max_chunk_bytes": 64})
>>> {k: s for k, (_, s) in cfg.array_shapes("pfedgp.update").items()}
{'chunk': ('p',), 'part': (4,), 'weight': ()}
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

from streamfed.algorithms.base import Update, params_of
from streamfed.algorithms.chunks import Chunk
from streamfed.algorithms.pfedgp import PFedGPParams
from streamfed.algorithms.pfedgp.messages import ChunkItem, PFedGPGlobal
from streamfed.wire.message import Message
from streamfed.wire.schema import ArraySpec, MessageSchema, MetaSpec, contributor_arrays, contributor_dims
from streamfed.wire.topics import Channel

if TYPE_CHECKING:
    from streamfed.fleet.config import FleetConfig

__all__ = ["GLOBAL", "PARTIAL", "UPDATE", "chunk_update", "global_message", "max_chunk_numbers", "read_global",
           "read_update", "schemas"]

UPDATE, GLOBAL, PARTIAL = "pfedgp.update", "pfedgp.global", "pfedgp.partial"


def max_chunk_numbers(max_chunk_bytes: int) -> int:
    """Float64 numbers a chunk may carry."""
    return max(1, int(max_chunk_bytes) // 8)


def schemas(cfg: FleetConfig) -> list[MessageSchema]:
    from streamfed.algorithms.pfedgp import layout_of

    n = layout_of(cfg).n_params
    p = min(max_chunk_numbers(params_of(cfg, PFedGPParams).max_chunk_bytes), n)
    return [
        MessageSchema(UPDATE, Channel.UPDATES, (
            ArraySpec("chunk", "float64", ("p",)), ArraySpec("part", "int64", (4,), nonnegative=True),
            ArraySpec("weight", "float64", (), nonnegative=True)), {"p": (1, p)}),
        MessageSchema(GLOBAL, Channel.GLOBAL, (ArraySpec("theta", "float64", (n,)),), max_included=cfg.max_clients),
        MessageSchema(PARTIAL, Channel.PARTIALS, (
            ArraySpec("delta_sum", "float64", (n,)), ArraySpec("weight", "float64", (), nonnegative=True),
            ArraySpec("proposers", "float64", (), nonnegative=True), *contributor_arrays()),
            contributor_dims(cfg), meta=(MetaSpec("round"),), max_included=cfg.max_clients),
    ]


def chunk_update(chunk: Chunk, weight: float, seq: int, base_version: int, epoch: int) -> Update:
    """One chunk of a proposal as an upload."""
    part = np.array([chunk.seq, chunk.index, chunk.count, chunk.total], dtype=np.int64)
    return Update({"chunk": np.array(chunk.data, dtype=np.float64), "part": part, "weight": np.asarray(float(weight))},
                  0, int(base_version), seq=int(seq), epoch=int(epoch))


def read_update(msg: Message) -> ChunkItem:
    """A decoded `pfedgp.update` as the chunk it carries (`ValueError` for a malformed one)."""
    if msg.kind != UPDATE:
        raise ValueError(f"expected a {UPDATE!r} message, got {msg.kind!r}")
    if msg.n_samples != 0:
        raise ValueError("a chunk update counts no samples")
    a = msg.arrays
    seq, index, count, total = (int(v) for v in a["part"])
    chunk = Chunk(seq, index, count, total, np.array(a["chunk"], dtype=np.float64))
    return ChunkItem(msg.client, int(msg.seq), int(msg.global_version), int(msg.epoch), chunk, float(a["weight"]))


def global_message(fleet: str, sender: str, g: PFedGPGlobal, kernel_version: str, created: float | None = None
                   ) -> Message:
    return Message(fleet, sender, GLOBAL, g.version, g.version, kernel_version, 0,
                   time.time() if created is None else float(created), {"theta": np.array(g.theta, dtype=np.float64)},
                   {}, dict(g.included), int(g.epoch))


def read_global(msg: Message) -> PFedGPGlobal:
    if msg.kind != GLOBAL:
        raise ValueError(f"expected a {GLOBAL!r} message, got {msg.kind!r}")
    return PFedGPGlobal(int(msg.global_version), int(msg.epoch), np.array(msg.arrays["theta"], dtype=np.float64),
                        dict(msg.included))
