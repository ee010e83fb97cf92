"""Versions of the global model that clients download, each encoded once per track.

Every client of a round downloads the same bytes, so each version is serialized into
wire chunks once and those bytes go to every client.

With downlink compression a *track* (one codec chain, e.g. per region) keeps the
model its clients actually hold, ``view_v``.  A client that holds ``view_{v-1}``
receives only the compressed difference ``x_v - view_{v-1}`` and adds it; the
server applies the same decode, so ``view_v = view_{v-1} + decode(encode(...))``
is known exactly on both sides.  What compression dropped stays in
``x_v - view_v`` and is sent with the next difference (error feedback on the
downlink).  A client without ``view_{v-1}`` receives ``view_v`` whole and exact.
Memory: O(model) per live version and track.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from geofl.protocols import serde, streams
from geofl.protocols.codecs import (
    Chain,
    CompressionRules,
    chain_for,
    decode_tensor,
    encode_tensor,
)
from geofl.protocols.tensors import EncodedTensor, Tensorish, model_bytes, spec_of
from geofl.protocols.types import Weights, WeightsView


@dataclass(frozen=True)
class Broadcast:
    """The encoded chunks of one download and what they cost."""

    chunks: list[bytes]
    wire_bytes: int
    #: What the same download would have cost uncompressed.
    raw_bytes: int
    difference: bool


@dataclass
class _Track:
    """One downlink chain's view of one version."""

    view: Weights
    difference: dict[str, Tensorish] | None
    encoded: dict[bool, asyncio.Future[Broadcast]] = field(default_factory=dict)


class ModelStore:
    """Model versions by number (the round that produced them; 0 is the initial model)."""

    def __init__(
        self,
        chunk_bytes: int = serde.DEFAULT_CHUNK_BYTES,
        *,
        tracks: tuple[Chain, ...] = ((),),
        min_bytes: int = 0,
        seed: int = 0,
    ) -> None:
        self._chunk_bytes = chunk_bytes
        self.tracks = tuple(dict.fromkeys(tracks)) or ((),)
        self._min_bytes = min_bytes
        self._seed = seed
        self._tracks: dict[int, dict[Chain, _Track]] = {}

    def put(self, version: int, weights: WeightsView) -> None:
        """Publish ``weights`` as ``version`` on every downlink track."""
        previous = self._tracks.get(version - 1, {})
        self._tracks[version] = {
            chain: self._track(version, weights, chain, previous.get(chain))
            for chain in self.tracks
        }

    async def publish(self, version: int, weights: WeightsView) -> None:
        """:meth:`put` in a worker thread (compressing a large model takes a while)."""
        await asyncio.to_thread(self.put, version, weights)

    def _track(
        self, version: int, weights: WeightsView, chain: Chain, base: _Track | None
    ) -> _Track:
        if not chain or base is None:
            return _Track(dict(weights), None)
        rules = CompressionRules(chain, self._min_bytes)
        view: Weights = {}
        difference: dict[str, Tensorish] = {}
        for index, (name, exact) in enumerate(weights.items()):
            steps = chain_for(name, exact.nbytes, rules, dtype=exact.dtype.name)
            if not steps:
                view[name] = difference[name] = exact
                continue
            delta = np.subtract(exact, base.view[name], dtype=exact.dtype)
            seed = (self._seed * 1_000_003 + version) * 65_537 + index
            payload = encode_tensor(delta, steps, seed=seed)
            decoded = decode_tensor(payload, steps, exact.dtype.name, exact.shape)
            view[name] = np.add(base.view[name], decoded, dtype=exact.dtype)
            difference[name] = EncodedTensor(payload, steps, exact.dtype.name, exact.shape, True)
        return _Track(view, difference)

    def drop(self, version: int) -> None:
        """Forget ``version`` (no client will be asked for it again)."""
        self._tracks.pop(version, None)

    def release_encoded(self, version: int) -> None:
        """Free the encoded chunks of ``version`` (re-encoded if a client still asks)."""
        for track in self._tracks.get(version, {}).values():
            track.encoded.clear()

    def view(self, version: int, chain: Chain = ()) -> WeightsView | None:
        """What clients on the ``chain`` track hold for ``version``."""
        track = self._tracks.get(version, {}).get(chain)
        return None if track is None else track.view

    async def broadcast(
        self, version: int, chain: Chain = (), base: int | None = None
    ) -> Broadcast | None:
        """The chunks for a client on ``chain`` that holds version ``base`` (or none)."""
        track = self._tracks.get(version, {}).get(chain)
        if track is None:
            return None
        difference = track.difference is not None and base == version - 1
        pending = track.encoded.get(difference)
        if pending is None:
            items = track.difference if difference and track.difference else track.view
            size = model_bytes(spec_of(track.view))
            pending = asyncio.ensure_future(
                asyncio.to_thread(self._encode, items, size, difference)
            )
            track.encoded[difference] = pending
        return await asyncio.shield(pending)

    def _encode(self, items: Mapping[str, Tensorish], size: int, difference: bool) -> Broadcast:
        chunks = list(streams.encode_chunks(items, self._chunk_bytes))
        wire = sum(len(c) for c in chunks)
        payload = sum(
            len(i.payload) if isinstance(i, EncodedTensor) else int(i.nbytes)
            for i in items.values()
        )
        return Broadcast(chunks, wire, wire - payload + size, difference)


__all__ = ["Broadcast", "ModelStore"]
