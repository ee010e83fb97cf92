"""Inbound updates spooled to a temporary file while they stream in.

An update is only folded into the round's aggregate once every chunk of it has
arrived and passed its checks, so a client that fails mid-upload, or sends a
NaN in its last tensor, never touches the aggregate.  Spooling keeps the
server's memory O(model) however many uploads are in flight: small updates stay
in memory, large ones go to a temporary file (page cache, not process memory).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Mapping

import numpy as np
import numpy.typing as npt

from geofl.protocols.tensors import TensorSpec

#: Updates up to this size stay in memory; larger ones spill to disk.
IN_MEMORY_LIMIT = 4 << 20


class SpoolSink:
    """A :class:`geofl.protocols.serde.TensorSink` writing into a spooled file."""

    def __init__(self) -> None:
        self._file = tempfile.SpooledTemporaryFile(max_size=IN_MEMORY_LIMIT)  # noqa: SIM115
        self._layout: dict[str, tuple[TensorSpec, int]] = {}

    def begin(self, spec: TensorSpec) -> None:
        """Remember where the tensor starts."""
        self._layout[spec.name] = (spec, self._file.tell())

    def write(self, data: bytes) -> None:
        """Append a piece of the current tensor."""
        self._file.write(data)

    def end(self) -> None:
        """Nothing to finish per tensor."""

    def update(self) -> SpooledUpdate:
        """The complete update as a lazily read mapping (takes ownership of the file)."""
        return SpooledUpdate(self._file, self._layout)

    def discard(self) -> None:
        """Throw the spooled bytes away."""
        self._file.close()


class SpooledUpdate(Mapping[str, npt.NDArray[np.generic]]):
    """Tensors of one update, read from the spool one at a time on access."""

    def __init__(
        self,
        file: tempfile.SpooledTemporaryFile[bytes],
        layout: dict[str, tuple[TensorSpec, int]],
    ) -> None:
        self._file = file
        self._layout = layout

    def __getitem__(self, name: str) -> npt.NDArray[np.generic]:
        spec, offset = self._layout[name]
        self._file.seek(offset)
        data = self._file.read(spec.nbytes)
        return np.frombuffer(data, dtype=np.dtype(spec.dtype).newbyteorder("<")).reshape(spec.shape)

    def __iter__(self) -> Iterator[str]:
        return iter(self._layout)

    def __len__(self) -> int:
        return len(self._layout)

    def close(self) -> None:
        """Release the spool."""
        self._file.close()


__all__ = ["IN_MEMORY_LIMIT", "SpoolSink", "SpooledUpdate"]
