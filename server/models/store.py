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

With ``changed_only`` (Streaming DiLoCo, where a round changes one fragment of the
model) a client that holds ``v-1`` receives only the tensors that changed between
``v-1`` and ``v``, on every track: on the uncompressed one their exact values, on a
compressed one their compressed differences (an unchanged tensor keeps its view, so
what compression dropped waits for the tensor's next change). The client keeps the other
tensors of its copy (:meth:`geofl.client.connection.Connection.download`).
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
    #: The version's exact weights, kept with ``changed_only`` to find what the next changed.
    exact: WeightsView | None = None
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
        changed_only: bool = False,
    ) -> None:
        self._chunk_bytes = chunk_bytes
        self._changed_only = changed_only
        self.tracks = tuple(dict.fromkeys(tracks)) or ((),)
        self._min_bytes = min_bytes
        self._seed = seed
        self._tracks: dict[int, dict[Chain, _Track]] = {}

    def put(self, version: int, weights: WeightsView) -> None:
        """Publish ``weights`` as ``version`` on every downlink track."""
        previous = self._tracks.get(version - 1, {})
        unchanged = self._unchanged(weights, previous)
        self._tracks[version] = {
            chain: self._track(version, weights, chain, previous.get(chain), unchanged)
            for chain in self.tracks
        }

    def _unchanged(self, weights: WeightsView, previous: Mapping[Chain, _Track]) -> frozenset[str]:
        """With ``changed_only``: the tensors equal to the previous version's."""
        before = next(iter(previous.values())).exact if previous else None
        if not self._changed_only or before is None:
            return frozenset()
        return frozenset(
            name
            for name, value in weights.items()
            if name in before and np.array_equal(value, before[name])
        )

    async def publish(self, version: int, weights: WeightsView) -> None:
        """:meth:`put` in a worker thread (compressing a large model takes a while)."""
        await asyncio.to_thread(self.put, version, weights)

    def _track(
        self,
        version: int,
        weights: WeightsView,
        chain: Chain,
        base: _Track | None,
        unchanged: frozenset[str],
    ) -> _Track:
        exact = weights if self._changed_only else None
        if base is None or (not chain and not self._changed_only):
            return _Track(dict(weights), None, exact)
        if not chain:  # changed_only: the changed tensors' exact values replace the client's
            changed: dict[str, Tensorish] = {
                name: value for name, value in weights.items() if name not in unchanged
            }
            return _Track(dict(weights), changed, exact)
        rules = CompressionRules(chain, self._min_bytes)
        view: Weights = {}
        difference: dict[str, Tensorish] = {}
        for index, (name, value) in enumerate(weights.items()):
            if name in unchanged:  # the client's copy stays as it is, and so does the view
                view[name] = base.view[name]
                continue
            steps = chain_for(name, value.nbytes, rules, dtype=value.dtype.name)
            if not steps:
                view[name] = difference[name] = value
                continue
            delta = np.subtract(value, base.view[name], dtype=value.dtype)
            seed = (self._seed * 1_000_003 + version) * 65_537 + index
            payload = encode_tensor(delta, steps, seed=seed)
            decoded = decode_tensor(payload, steps, value.dtype.name, value.shape)
            view[name] = np.add(base.view[name], decoded, dtype=value.dtype)
            difference[name] = EncodedTensor(payload, steps, value.dtype.name, value.shape, True)
        return _Track(view, difference, exact)

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
            items = track.difference if difference and track.difference is not None else track.view
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
