"""Versions of the global model that clients may download, encoded once each.

Every client of a round downloads the same bytes, so each version is serialized
into wire chunks once, on its first download, and those bytes are sent to every
client: the server does not copy and checksum the model once per client.
Memory: the weights plus one encoded copy per live version (at most two).
"""

from __future__ import annotations

import asyncio

from geofl.protocols import serde
from geofl.protocols.types import WeightsView


class ModelStore:
    """Model versions by number (the round that produced them; 0 is the initial model)."""

    def __init__(self, chunk_bytes: int = serde.DEFAULT_CHUNK_BYTES) -> None:
        self._chunk_bytes = chunk_bytes
        self._weights: dict[int, WeightsView] = {}
        self._encoded: dict[int, asyncio.Future[list[bytes]]] = {}

    def put(self, version: int, weights: WeightsView) -> None:
        """Publish ``weights`` as ``version``."""
        self._weights[version] = weights
        self._encoded.pop(version, None)

    def drop(self, version: int) -> None:
        """Forget ``version`` (no client will be asked for it again)."""
        self._weights.pop(version, None)
        self._encoded.pop(version, None)

    def get(self, version: int) -> WeightsView | None:
        """The weights of ``version``, if still published."""
        return self._weights.get(version)

    async def encoded(self, version: int) -> list[bytes] | None:
        """The serialized chunks of ``version``; encoded by the first caller, shared after."""
        weights = self._weights.get(version)
        if weights is None:
            return None
        pending = self._encoded.get(version)
        if pending is None:
            pending = asyncio.ensure_future(
                asyncio.to_thread(lambda: list(serde.encode_chunks(weights, self._chunk_bytes)))
            )
            self._encoded[version] = pending
        return await asyncio.shield(pending)


__all__ = ["ModelStore"]
