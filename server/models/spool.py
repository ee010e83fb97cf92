"""Inbound updates staged while they stream in, in memory up to a budget, else on disk.

An update is folded into the round's aggregate only once every chunk of it has
arrived and passed its checks, so a client that fails mid-upload, or sends a NaN
in its last tensor, never touches the aggregate.  Staging keeps one contiguous buffer
per upload while the server-wide budget allows; past it, an upload is staged in
a temporary file (page cache, not process memory).  So
the server's memory is O(model + budget) however many clients upload at once.
"""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Iterator, Mapping
from typing import IO, Any

import numpy as np
import numpy.typing as npt

from geofl.protocols.codecs import decode_tensor
from geofl.protocols.streams import Incoming

#: Default for ``server.upload_buffer_bytes``.
DEFAULT_BUDGET = 256 << 20


class MemoryBudget:
    """Bytes of staged uploads the server may hold in memory, shared by all uploads."""

    def __init__(self, limit: int = DEFAULT_BUDGET) -> None:
        self.limit = limit
        self.used = 0
        self.peak = 0
        self._lock = threading.Lock()

    def take(self, size: int) -> bool:
        """Reserve ``size`` bytes if they fit."""
        with self._lock:
            if self.used + size > self.limit:
                return False
            self.used += size
            self.peak = max(self.peak, self.used)
            return True

    def give_back(self, size: int) -> None:
        """Release a reservation."""
        with self._lock:
            self.used -= size


class SpoolSink:
    """A :class:`geofl.protocols.streams.TensorSink` staging one upload of known size.

    In memory the upload lands in one contiguous buffer, so every tensor read back is a
    zero-copy view; on disk it goes to an unnamed temporary file.
    """

    def __init__(self, budget: MemoryBudget, total_bytes: int) -> None:
        self._budget = budget
        self._total = total_bytes
        self._buffer: npt.NDArray[np.uint8] | None = None
        self._file: IO[bytes] | None = None
        if budget.take(total_bytes):
            self._buffer = np.empty(total_bytes, dtype=np.uint8)
        else:
            self._file = tempfile.TemporaryFile()  # noqa: SIM115 - closed by discard()
        self._size = 0
        self._layout: dict[str, tuple[Incoming, int]] = {}

    def begin(self, incoming: Incoming) -> None:
        """Remember where the tensor (or its codec payload) starts."""
        self._layout[incoming.spec.name] = (incoming, self._size)

    def write(self, data: bytes | memoryview) -> None:
        """Stage a piece of the current tensor (copied: ``data`` may be a reused view)."""
        end = self._size + len(data)
        if end > self._total:
            raise ValueError(f"upload exceeds its announced {self._total} bytes")
        if self._buffer is not None:
            self._buffer[self._size : end] = np.frombuffer(data, dtype=np.uint8)
        elif self._file is not None:
            self._file.write(data)
        self._size = end

    def end(self) -> None:
        """Nothing to finish per tensor."""

    def read(self, offset: int, size: int) -> bytes | memoryview:
        """``size`` staged bytes from ``offset`` (a view of the buffer when in memory)."""
        if self._buffer is not None:
            view: Any = self._buffer[offset : offset + size]  # numpy arrays are buffers
            return memoryview(view)
        if self._file is None:
            raise ValueError("the upload was discarded")
        if size == 0:
            return b""
        # Mapped, not read: the pages stay in the page cache, not in the process.
        self._file.flush()
        mapped: Any = np.memmap(self._file, dtype=np.uint8, mode="r", offset=offset, shape=(size,))
        return memoryview(mapped)

    def update(self) -> SpooledUpdate:
        """The complete update as a lazily read mapping (closing it frees the staging)."""
        return SpooledUpdate(self, self._layout)

    def discard(self) -> None:
        """Throw the staged bytes away and return the memory to the budget."""
        if self._buffer is not None:
            self._buffer = None
            self._budget.give_back(self._total)
        if self._file is not None:
            self._file.close()
            self._file = None


class SpooledUpdate(Mapping[str, npt.NDArray[np.generic]]):
    """Tensors of one update, decoded from the staging area on access (read-only views)."""

    def __init__(self, sink: SpoolSink, layout: dict[str, tuple[Incoming, int]]) -> None:
        self._sink = sink
        self._layout = layout
        self._decoded: dict[str, npt.NDArray[np.generic]] = {}

    def __getitem__(self, name: str) -> npt.NDArray[np.generic]:
        """The tensor; a compressed one is decoded once and kept until :meth:`close`.

        Raises :class:`geofl.protocols.codecs.CodecError` for a payload that does not
        decode, before anything was folded.
        """
        incoming, offset = self._layout[name]
        data = self._sink.read(offset, incoming.payload.nbytes)
        spec = incoming.spec
        if not incoming.encoded:
            dtype = np.dtype(spec.dtype).newbyteorder("<")
            return np.frombuffer(data, dtype=dtype).reshape(spec.shape)
        if name not in self._decoded:
            self._decoded[name] = decode_tensor(data, incoming.chain, spec.dtype, spec.shape)
        return self._decoded[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._layout)

    def __len__(self) -> int:
        return len(self._layout)

    def close(self) -> None:
        """Release the staging area."""
        self._decoded.clear()
        self._sink.discard()


__all__ = ["DEFAULT_BUDGET", "MemoryBudget", "SpoolSink", "SpooledUpdate"]
