"""Read Fashion-MNIST from the IDX files of the Debian package ``dataset-fashion-mnist``.

Nothing is downloaded at run time: the files come from the machine image
(``apt-get install dataset-fashion-mnist``). IDX is a tiny big-endian format (a magic
number giving the element type and rank, then one size per dimension, then the raw data),
read here with ``gzip`` and NumPy so no torchvision is needed.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path
from typing import Literal

import numpy as np
import numpy.typing as npt

__all__ = [
    "DEFAULT_DIR",
    "ENV_DIR",
    "FashionMNISTMissingError",
    "data_dir",
    "load_split",
    "read_idx",
]

#: Where the Debian package installs the files.
DEFAULT_DIR = Path("/usr/share/datasets/fashion-mnist")
#: Environment variable that points at another directory holding the same four files.
ENV_DIR = "GEOFL_FMNIST_DIR"

_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
_UBYTE = 0x08


class FashionMNISTMissingError(FileNotFoundError):
    """The data set's files are not where we look for them."""


def data_dir() -> Path:
    """The directory read: ``$GEOFL_FMNIST_DIR`` if set, else the Debian location."""
    return Path(os.environ.get(ENV_DIR, DEFAULT_DIR))


def read_idx(path: Path) -> npt.NDArray[np.uint8]:
    """Read one gzip-compressed IDX file of unsigned bytes into an array of its shape.

    Raises
    ------
    ValueError
        If the header is not an unsigned-byte IDX header or the size does not match it.
    """
    raw = gzip.decompress(path.read_bytes())
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != _UBYTE:
        raise ValueError(f"{path} is not an unsigned-byte IDX file (header {raw[:4].hex()})")
    rank = raw[3]
    header_end = 4 + 4 * rank
    shape = tuple(int(d) for d in np.frombuffer(raw[4:header_end], dtype=">u4"))
    expected = int(np.prod(shape))
    if len(raw) - header_end != expected:
        raise ValueError(
            f"{path}: header says shape {shape} ({expected} bytes), "
            f"found {len(raw) - header_end} bytes"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header_end).reshape(shape).copy()


def load_split(
    split: Literal["train", "test"],
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]:
    """Images ``(N, 28, 28)`` uint8 and labels ``(N,)`` int64 of one split.

    Raises
    ------
    FashionMNISTMissingError
        Naming the package to install (or the variable to set) if a file is missing.
    """
    if split not in _FILES:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    folder = data_dir()
    paths = [folder / name for name in _FILES[split]]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise FashionMNISTMissingError(
            f"Fashion-MNIST files not found: {', '.join(missing)}. Install them with "
            f"'apt-get install dataset-fashion-mnist', or set {ENV_DIR} to a directory "
            "holding the four *-ubyte.gz files"
        )
    images, labels = (read_idx(p) for p in paths)
    if images.ndim != 3 or labels.ndim != 1 or images.shape[0] != labels.shape[0]:
        raise ValueError(
            f"Fashion-MNIST {split}: images {images.shape} and labels {labels.shape} disagree"
        )
    return images, labels.astype(np.int64)
