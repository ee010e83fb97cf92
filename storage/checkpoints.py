"""Content-addressed model checkpoints in safetensors files.

A checkpoint is one ``<sha256>.safetensors`` file holding the global model and, under
the ``__state__/`` prefix, any extra tensors the server needs to resume (a server
optimizer's moments, error-feedback state). The database stores the file's relative
path, digest and size; loading verifies both, so a truncated or bit-flipped file is
reported instead of silently resuming from garbage. Files are written atomically
(temporary file, fsync, rename), so a crash never leaves a half-written checkpoint
under its final name. No pickle is involved anywhere.

Short-lived files written on the hot path (staged updates: every accepted fit update,
before its ack) are checked by CRC-32 instead (``checksum="crc32"``): zlib-ng's CRC costs
about 0.6 ms per 40 MB where SHA-256 costs 30-36 ms, and a CRC catches what the check is
for, a torn or corrupted file. Such a file is not content-addressed (two different files
may share a CRC): it gets a unique name.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
import safetensors.numpy
from safetensors import SafetensorError, safe_open
from zlib_ng import zlib_ng

from geofl.protocols.types import Weights, WeightsView
from geofl.storage.errors import CheckpointCorruptError

if TYPE_CHECKING:
    from geofl.storage.models import Checkpoint

__all__ = ["STATE_PREFIX", "CheckpointRecord", "CheckpointStore", "Checksum"]

#: How a file's integrity is recorded: its SHA-256 (content-addressed name) or CRC-32.
Checksum = Literal["sha256", "crc32"]

#: Name prefix of extra (non-model) tensors inside a checkpoint file.
STATE_PREFIX = "__state__/"
_ORDER_KEY = "geofl.order"
_FORMAT_KEY = "geofl.format"
_RUN_KEY = "geofl.run_id"
_FORMAT = "1"
_SUFFIX = ".safetensors"
#: Prefix of a file being written: ``.tmp-<pid>-<random>.safetensors``.
_TEMPORARY = ".tmp-"
_CHUNK = 1 << 20
_DTYPES = frozenset(
    np.dtype(name)
    for name in (
        "bool",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "float32",
        "float64",
    )
)


@dataclass(frozen=True)
class CheckpointRecord:
    """Where a checkpoint lives and what it must hash to.

    Attributes
    ----------
    path:
        File name relative to the store's directory.
    sha256:
        Hex SHA-256 of the whole file; None for a file checked by ``crc32`` instead.
    size_bytes:
        File size in bytes.
    num_tensors:
        Model tensors plus extra-state tensors in the file.
    crc32:
        CRC-32 of the whole file, for a file saved with ``checksum="crc32"``.
    """

    path: str
    sha256: str | None
    size_bytes: int
    num_tensors: int
    crc32: int | None = None

    @classmethod
    def from_row(cls, row: Checkpoint) -> CheckpointRecord:
        """Build a record from a ``checkpoints`` table row."""
        return cls(row.path, row.sha256, row.size_bytes, row.num_tensors)


class CheckpointStore:
    """Saves and loads checkpoints in one directory (created on first save).

    Parameters
    ----------
    directory:
        Folder holding the ``<sha256>.safetensors`` files.
    """

    def __init__(self, directory: Path | str) -> None:
        self.directory = Path(directory)

    def save(
        self,
        run_id: int,
        round: int,
        weights: WeightsView,
        extra: WeightsView | None = None,
        *,
        checksum: Checksum = "sha256",
    ) -> CheckpointRecord:
        """Write ``weights`` (and ``extra`` state) to one file and return its record.

        ``run_id`` and ``round`` are kept in the file's metadata so an orphaned file
        can still be traced. Arrays are not modified. ``checksum="crc32"``: the record
        holds the file's CRC-32 and the file a unique name (see the module docstring).

        Raises
        ------
        ValueError
            A tensor has an unsupported dtype, or a name collides with the state prefix.
        """
        tensors = _flatten(weights, extra or {})
        metadata = {
            _FORMAT_KEY: _FORMAT,
            _ORDER_KEY: json.dumps(list(tensors)),
            _RUN_KEY: str(run_id),
            "geofl.round": str(round),
        }
        self.directory.mkdir(parents=True, exist_ok=True)
        temporary = self.directory / f"{_TEMPORARY}{os.getpid()}-{uuid.uuid4().hex}{_SUFFIX}"
        try:
            safetensors.numpy.save_file(tensors, temporary, metadata=metadata)
            _fsync_file(temporary)
            count = len(tensors)
            if checksum == "crc32":
                crc, size = _crc32(temporary)
                record = CheckpointRecord(f"{uuid.uuid4().hex}{_SUFFIX}", None, size, count, crc)
            else:
                digest, size = _digest(temporary)
                record = CheckpointRecord(f"{digest}{_SUFFIX}", digest, size, count)
            os.replace(temporary, self.directory / record.path)
        finally:
            temporary.unlink(missing_ok=True)
        _fsync_directory(self.directory)
        return record

    def discard_partial_writes(self) -> int:
        """Delete the half-written files of processes that are gone; how many there were.

        A process killed inside :meth:`save` leaves its temporary file behind (never a
        half-written checkpoint: the rename is the last step). Each temporary names its
        writer's process id, so a live writer's file (another run sharing the folder) is
        kept.
        """
        if not self.directory.is_dir():
            return 0
        removed = 0
        for path in self.directory.glob(f"{_TEMPORARY}*{_SUFFIX}"):
            writer = path.name.removeprefix(_TEMPORARY).split("-", 1)[0]
            if writer.isdigit() and _alive(int(writer)):
                continue
            path.unlink(missing_ok=True)
            removed += 1
        return removed

    def discard_run_files(self, run_id: int, keep: Collection[str] = ()) -> int:
        """Delete run ``run_id``'s files (by their metadata) but those named in ``keep``.

        For a folder whose files are only needed while their rows exist (staged updates):
        a file written for a row that was never recorded names its run all the same. Other
        runs' files, temporaries and files whose metadata cannot be read are left alone.
        Returns how many files went.
        """
        if not self.directory.is_dir():
            return 0
        removed = 0
        for path in self.directory.glob(f"*{_SUFFIX}"):
            if path.name.startswith(_TEMPORARY) or path.name in keep:
                continue
            if _run_of(path) == str(run_id):
                path.unlink(missing_ok=True)
                removed += 1
        return removed

    def load(self, record: CheckpointRecord) -> tuple[Weights, Weights]:
        """Read a checkpoint after verifying its size and SHA-256 (or CRC-32).

        Returns
        -------
        tuple
            ``(weights, extra)``, each in the order given to :meth:`save`; ``extra`` is
            empty if none was saved.

        Raises
        ------
        CheckpointCorruptError
            The file is missing, has the wrong size or digest, or cannot be parsed.
        """
        path = self.path_of(record)
        if not path.is_file():
            raise CheckpointCorruptError(str(path), "file is missing")
        _verify(path, record)
        try:
            return _read(path)
        except (SafetensorError, ValueError, KeyError) as exc:
            raise CheckpointCorruptError(str(path), f"unreadable: {exc}") from exc

    def delete(self, record: CheckpointRecord) -> bool:
        """Remove a checkpoint's file (its database row stays as history)."""
        try:
            self.path_of(record).unlink()
        except FileNotFoundError:
            return False
        return True

    def path_of(self, record: CheckpointRecord) -> Path:
        """Absolute location of a record's file; refuses paths that leave the directory."""
        relative = Path(record.path)
        if relative.is_absolute() or ".." in relative.parts:
            raise CheckpointCorruptError(record.path, "path is outside the checkpoint directory")
        return self.directory / relative


def _flatten(weights: WeightsView, extra: WeightsView) -> dict[str, np.ndarray]:
    tensors: dict[str, np.ndarray] = {}
    for name, array in weights.items():
        if name.startswith(STATE_PREFIX):
            raise ValueError(f"tensor name {name!r} uses the reserved prefix {STATE_PREFIX!r}")
        tensors[name] = _prepare(name, array)
    for name, array in extra.items():
        tensors[STATE_PREFIX + name] = _prepare(STATE_PREFIX + name, array)
    return tensors


def _prepare(name: str, array: np.ndarray) -> np.ndarray:
    array = np.asarray(array)
    native = array.dtype.newbyteorder("=")
    if native not in _DTYPES:
        raise ValueError(f"tensor {name!r} has unsupported dtype {array.dtype}")
    # safetensors writes raw little-endian, C-ordered bytes.  ascontiguousarray turns a
    # 0-d array into shape (1,), so the shape is put back.
    return np.ascontiguousarray(array, dtype=native.newbyteorder("<")).reshape(array.shape)


def _read(path: Path) -> tuple[Weights, Weights]:
    with safe_open(path, framework="np") as handle:
        metadata = handle.metadata() or {}
    if metadata.get(_FORMAT_KEY) != _FORMAT:
        raise ValueError(f"not a geofl checkpoint (format {metadata.get(_FORMAT_KEY)!r})")
    order: list[str] = json.loads(metadata[_ORDER_KEY])
    loaded = safetensors.numpy.load_file(path)
    if sorted(order) != sorted(loaded):
        raise ValueError("tensor names do not match the recorded order")
    weights: Weights = {}
    extra: Weights = {}
    for name in order:
        if name.startswith(STATE_PREFIX):
            extra[name.removeprefix(STATE_PREFIX)] = loaded[name]
        else:
            weights[name] = loaded[name]
    return weights, extra


def _run_of(path: Path) -> str | None:
    """The run a file's metadata names, or None if its header cannot be read."""
    try:
        with safe_open(path, framework="np") as handle:
            metadata = handle.metadata() or {}
    except (SafetensorError, OSError):
        return None
    return metadata.get(_RUN_KEY)


def _verify(path: Path, record: CheckpointRecord) -> None:
    """Raise :class:`CheckpointCorruptError` unless ``path`` has the record's size and digest."""
    if record.sha256 is None and record.crc32 is None:
        raise CheckpointCorruptError(str(path), "the record holds neither SHA-256 nor CRC-32")
    if record.sha256 is not None:
        digest, size = _digest(path)
        found, recorded, name = digest, record.sha256, "SHA-256"
    else:
        crc, size = _crc32(path)
        found, recorded, name = f"{crc:08x}", f"{record.crc32:08x}", "CRC-32"
    if size != record.size_bytes:
        raise CheckpointCorruptError(
            str(path), f"size is {size} bytes, recorded {record.size_bytes}"
        )
    if found != recorded:
        raise CheckpointCorruptError(str(path), f"{name} is {found}, recorded {recorded}")


def _chunks(path: Path) -> Iterator[bytes]:
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            yield chunk


def _crc32(path: Path) -> tuple[int, int]:
    crc = size = 0
    for chunk in _chunks(path):
        crc = zlib_ng.crc32(chunk, crc)
        size += len(chunk)
    return int(crc), size


def _digest(path: Path) -> tuple[str, int]:
    sha = hashlib.sha256()
    size = 0
    for chunk in _chunks(path):
        sha.update(chunk)
        size += len(chunk)
    return sha.hexdigest(), size


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _fsync_file(path: Path) -> None:
    with path.open("rb+") as handle:
        os.fsync(handle.fileno())


def _fsync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
