"""Byte-level text every machine already has: the running interpreter's standard library.

The ``.py`` files under the directory of :mod:`os` (third-party ``site-packages`` and
``dist-packages`` left out) are the corpus. A fixed share of files, chosen by a hash of
their relative path, is held out for validation; the rest is split among the sites by
**top-level package** (``asyncio``, ``email``, ``test``, ``json.py``...), each package
whole to one site, balanced by bytes with a greedy rule. Sites therefore see different
code (non-IID, as data centres' data would differ) and the split depends only on the file
list: the same interpreter gives the same split in every process.

Nothing is downloaded; the corpus is whatever the interpreter ships (about 30 MB for
CPython 3.11 with its test suite, less on distributions that package the tests apart).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import numpy.typing as npt

from geofl.protocols.errors import GeoflError

__all__ = [
    "HELD_OUT_EVERY",
    "Corpus",
    "CorpusError",
    "corpus",
    "held_out",
    "is_held_out",
    "site_bytes",
    "site_packages",
    "stdlib_root",
    "validation_windows",
]

#: One file in this many (by path hash) is held out for validation.
HELD_OUT_EVERY = 20
_SKIPPED_PARTS = frozenset({"site-packages", "dist-packages", "__pycache__"})

ByteArray = npt.NDArray[np.uint8]


class CorpusError(GeoflError, ValueError):
    """The standard library cannot provide the requested split."""


def stdlib_root() -> Path:
    """The directory holding the interpreter's pure-Python standard library."""
    return Path(os.__file__).resolve().parent


@dataclass(frozen=True)
class Corpus:
    """Relative paths of the corpus: the held-out files and each package's training files."""

    root: Path
    held_out: tuple[str, ...]
    #: Top-level package (or module) name -> its training files, sorted.
    packages: dict[str, tuple[str, ...]]
    #: Bytes of each package's training files.
    sizes: dict[str, int]


def is_held_out(relative: str) -> bool:
    """Whether a file (path relative to the library root, ``/``-separated) is for validation."""
    digest = hashlib.sha256(relative.encode("utf-8")).digest()
    return int.from_bytes(digest[:4], "little") % HELD_OUT_EVERY == 0


def _package_of(relative: str) -> str:
    return relative.split("/", 1)[0].removesuffix(".py")


@lru_cache(maxsize=2)
def corpus(root: Path | None = None) -> Corpus:
    """Scan the library once per process (sorted, so every process sees the same list)."""
    base = stdlib_root() if root is None else root
    files = sorted(
        path.relative_to(base).as_posix()
        for path in base.rglob("*.py")
        if not _SKIPPED_PARTS.intersection(path.relative_to(base).parts)
    )
    if not files:
        raise CorpusError(f"no .py files under {base}: cannot build the geo_lm corpus")
    held = tuple(f for f in files if is_held_out(f))
    packages: dict[str, list[str]] = {}
    for relative in files:
        if not is_held_out(relative):
            packages.setdefault(_package_of(relative), []).append(relative)
    sizes = {
        name: sum((base / f).stat().st_size for f in members) for name, members in packages.items()
    }
    return Corpus(base, held, {k: tuple(v) for k, v in packages.items()}, sizes)


def site_packages(num_sites: int, root: Path | None = None) -> list[list[str]]:
    """The top-level packages of each site: largest first, each to the lightest site.

    Raises
    ------
    CorpusError
        If there are fewer packages than sites (some site would get no data).
    """
    if num_sites < 1:
        raise CorpusError(f"num-sites must be >= 1, got {num_sites}")
    found = corpus(root)
    if len(found.packages) < num_sites:
        raise CorpusError(
            f"the library at {found.root} has {len(found.packages)} top-level packages, "
            f"fewer than the {num_sites} sites"
        )
    order = sorted(found.sizes, key=lambda name: (-found.sizes[name], name))
    sites: list[list[str]] = [[] for _ in range(num_sites)]
    load = [0] * num_sites
    for name in order:
        lightest = min(range(num_sites), key=lambda i: (load[i], i))
        sites[lightest].append(name)
        load[lightest] += found.sizes[name]
    return [sorted(names) for names in sites]


def _read(root: Path, files: tuple[str, ...] | list[str]) -> ByteArray:
    """The files' bytes, concatenated in the given order."""
    return np.frombuffer(b"".join((root / f).read_bytes() for f in files), dtype=np.uint8)


@lru_cache(maxsize=8)
def site_bytes(site: int, num_sites: int, root: Path | None = None) -> ByteArray:
    """Site ``site``'s training text (its packages' files, concatenated)."""
    if not 0 <= site < num_sites:
        raise CorpusError(f"site {site} is outside 0..{num_sites - 1}")
    found = corpus(root)
    files = [f for name in site_packages(num_sites, root)[site] for f in found.packages[name]]
    return _read(found.root, files)


@lru_cache(maxsize=2)
def held_out(root: Path | None = None) -> ByteArray:
    """The validation text: every held-out file, concatenated."""
    found = corpus(root)
    return _read(found.root, found.held_out)


def validation_windows(count: int, length: int, root: Path | None = None) -> ByteArray:
    """``count`` fixed windows of ``length + 1`` bytes, spread evenly over the held-out text.

    Raises
    ------
    CorpusError
        If the held-out text is shorter than the windows need.
    """
    text = held_out(root)
    span = length + 1
    if count < 1 or text.size < count * span:
        raise CorpusError(
            f"the held-out text has {text.size} bytes, too few for {count} windows of {span}"
        )
    starts = np.linspace(0, text.size - span, count).astype(np.int64)
    return np.stack([text[s : s + span] for s in starts])
