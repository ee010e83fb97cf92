"""A round's updates on disk: one float64 memory-mapped file per update, read by blocks.

The rules that need every update of a round (median, trimmed mean, Krum, centered
clipping) cannot fold updates into a running sum. Holding them in memory would cost
``n x model``; here each update is written, as it arrives, to its own file of
``8 x parameters`` bytes in a fresh temporary directory, and the rule reads them back
``B`` coordinates at a time as an ``(n, B)`` block. Float64 on disk keeps the arithmetic
exact whatever the model's dtypes (an integer counter is exact in float64 below 2**53).

Memory: the process holds one block (``n x B x 8`` bytes, ``B = max(4096, 2**20 // n)``,
so about 8 MiB) plus what the rule keeps per coordinate (at most two model-sized float64
vectors). A file is mapped only while it is written, and each block only while it is
read, so the files' pages are page cache, outside the process's resident set, which the
kernel writes back and evicts under pressure. Disk: ``8 x parameters x n`` bytes, removed
when the round's accumulator is closed (or garbage-collected, or at interpreter exit).
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
import threading
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from geofl.protocols.types import Weights, WeightsView
from geofl.server.strategies._numeric import (
    BLOCK,
    F64Array,
    blocks,
    delta_dtype,
    flat,
    to_dtype,
)
from geofl.server.strategies.streaming import TensorSpecLike

__all__ = ["MIN_BLOCK", "ModelLayout", "SpilledUpdates"]

#: The fewest coordinates per block, however many updates a round has.
MIN_BLOCK = 4096


@dataclass(frozen=True)
class _Tensor:
    name: str
    dtype: np.dtype[Any]
    shape: tuple[int, ...]
    offset: int
    size: int


class ModelLayout:
    """Where each tensor of the model lies in one flat float64 vector, in model order."""

    def __init__(self, spec: Mapping[str, TensorSpecLike]) -> None:
        tensors, offset = [], 0
        for name, tensor in spec.items():
            dtype = np.dtype(tensor.dtype)
            shape = tuple(int(d) for d in tensor.shape)
            size = int(np.prod(shape, dtype=np.int64))
            tensors.append(_Tensor(name, dtype, shape, offset, size))
            offset += size
        self._tensors = tuple(tensors)
        #: Parameters in the whole model.
        self.size = offset

    def float_mask(self) -> np.ndarray[Any, np.dtype[np.bool_]]:
        """True at the coordinates of float tensors (integer counters are False)."""
        mask = np.zeros(self.size, dtype=np.bool_)
        for t in self._tensors:
            mask[t.offset : t.offset + t.size] = t.dtype.kind == "f"
        return mask

    def write(self, update: WeightsView, target: F64Array) -> None:
        """Copy ``update`` into the flat float64 ``target`` (a file's map), block by block."""
        for t in self._tensors:
            values = flat(np.asarray(update[t.name]))
            for part in blocks(t.size):
                target[t.offset + part.start : t.offset + part.stop] = values[part]

    def flatten(self, weights: WeightsView) -> F64Array:
        """``weights`` as one new float64 vector."""
        out = np.empty(self.size, dtype=np.float64)
        self.write(weights, out)
        return out

    def unflatten(self, vector: F64Array) -> Weights:
        """Split a flat float64 vector into the model's tensors, each in its delta dtype
        (integers rounded; unsigned ones signed, as :class:`StreamingMean` does)."""
        result: Weights = {}
        for t in self._tensors:
            dtype = delta_dtype(t.dtype, t.name)
            out = np.empty(t.shape, dtype=dtype)
            target = out.reshape(-1)
            for part in blocks(t.size):
                piece = vector[t.offset + part.start : t.offset + part.stop]
                target[part] = to_dtype(piece, dtype, t.name)
            result[t.name] = out
        return result


class SpilledUpdates:
    """The round's updates as memory-mapped float64 files in a private temporary directory.

    Parameters
    ----------
    layout
        The model's flat layout.
    parent
        Directory to create the round's directory in; None: the system's temporary one.
    """

    def __init__(self, layout: ModelLayout, parent: Path | None = None) -> None:
        self.layout = layout
        self.directory = Path(tempfile.mkdtemp(prefix="geofl-robust-", dir=parent))
        self._paths: list[Path] = []
        self._names = itertools.count()
        self._lock = threading.Lock()
        self._removal = weakref.finalize(self, shutil.rmtree, self.directory, True)

    def __len__(self) -> int:
        return len(self._paths)

    def append(self, update: WeightsView) -> int:
        """Write one (validated) update to a new file; return its index among the updates.

        An update counts only once its file is complete: a failed write (a full disk)
        removes the file and raises, and the other updates are unaffected.

        Raises
        ------
        OSError
            If the file cannot be created or written.
        """
        with self._lock:
            path = self.directory / f"{next(self._names)}.f64"
        shape = (max(self.layout.size, 1),)  # a memmap cannot be empty
        try:
            mapped = np.memmap(path, dtype=np.float64, mode="w+", shape=shape)
            self.layout.write(update, mapped)
            mapped.flush()
            del mapped  # unmapped: its pages stay in the page cache, out of this process
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        with self._lock:
            self._paths.append(path)
            return len(self._paths) - 1

    def block_size(self) -> int:
        """Coordinates per block: about :data:`BLOCK` float64 values in all."""
        return max(MIN_BLOCK, BLOCK // max(len(self._paths), 1))

    def parts(self) -> Iterator[slice]:
        """Consecutive coordinate ranges covering the model, one block each."""
        return blocks(self.layout.size, self.block_size())

    def block(self, part: slice, rows: Any = None) -> F64Array:
        """The ``(n, B)`` block of coordinates ``part`` (of the updates ``rows``, or all).

        Each file is mapped for just this block and unmapped at once, so the process
        holds one block of the files at a time, not the files.
        """
        paths = self._paths if rows is None else [self._paths[int(i)] for i in rows]
        out = np.empty((len(paths), part.stop - part.start), dtype=np.float64)
        if out.size == 0:
            return out
        for row, path in enumerate(paths):
            piece = np.memmap(
                path, dtype=np.float64, mode="r", offset=part.start * 8, shape=(out.shape[1],)
            )
            out[row] = piece
            del piece
        return out

    def close(self) -> None:
        """Unmap and delete the files (safe to call again)."""
        with self._lock:
            self._paths.clear()
        self._removal()
