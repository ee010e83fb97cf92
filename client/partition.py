"""Split a data set among simulated clients: IID, label-skewed, by shards or by region.

Federated benchmarks need heterogeneous clients. The usual model (Hsu et al., 2019) draws,
for each class, the share each client gets from ``Dirichlet(alpha)``: small ``alpha`` gives
each client few classes, large ``alpha`` approaches IID. McMahan et al. (2017) sort the
samples by label and deal each client a few contiguous shards, so most clients see only
one or two classes. The region split applies the Dirichlet model to regions instead of
clients, then splits each region's pool IID, so clients of one region resemble each other.

Everything here is pure NumPy with an explicit seed, so every process of a simulation
computes the same split independently, and it lives in the client package because client
apps split their own data. A split that would leave a client with no data raises
:class:`PartitionError` naming the client, the settings and a fix.

When the simulator splits the data itself (``simulation.partition``), it writes every
client's indices to one partition file and tells each client its path in the node config;
:func:`assigned_indices` reads a client's share from it. The file is NumPy's ``.npz``
holding plain integer arrays, read with ``allow_pickle=False``, so loading it runs no code.
"""

from __future__ import annotations

import math
import os
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import numpy.typing as npt
from numpy.lib.npyio import NpzFile

from geofl.client.app import ClientContext
from geofl.protocols.errors import GeoflError

__all__ = [
    "PARTITION_FILE_FORMAT",
    "PARTITION_FILE_KEY",
    "PartitionError",
    "PartitionFile",
    "PartitionFileError",
    "assigned_indices",
    "dirichlet_partition",
    "iid_partition",
    "label_histogram",
    "read_partition_file",
    "region_partition",
    "require_data",
    "shard_partition",
    "write_partition_file",
]

IndexArray = npt.NDArray[np.int64]


class PartitionError(GeoflError, ValueError):
    """A split that cannot give every client data; the message names the fix."""


def _check_counts(n_samples: int, num_partitions: int) -> None:
    if num_partitions < 1:
        raise ValueError(f"num_partitions must be >= 1, got {num_partitions}")
    if n_samples < num_partitions:
        raise PartitionError(
            f"cannot split {n_samples} samples into {num_partitions} non-empty partitions: "
            "more clients than samples; use fewer clients or more data"
        )


def _check_alpha(alpha: float) -> None:
    if not (math.isfinite(alpha) and alpha > 0):
        raise ValueError(f"alpha must be a positive finite number, got {alpha}")


def require_data(parts: Sequence[IndexArray], settings: str, fix: str) -> None:
    """Raise unless every partition holds at least one sample.

    Parameters
    ----------
    parts
        One index array per client.
    settings
        The split's settings as the user wrote them, e.g. ``"dirichlet(alpha=0.01)"``.
    fix
        What the user could change, e.g. ``"raise alpha or use fewer clients"``.

    Raises
    ------
    PartitionError
        Naming the first client without data and how many others share its fate.
    """
    empty = [client for client, part in enumerate(parts) if part.size == 0]
    if empty:
        others = f" (and {len(empty) - 1} more)" if len(empty) > 1 else ""
        raise PartitionError(
            f"client {empty[0]}{others} of {len(parts)} gets no samples with {settings}; {fix}"
        )


def iid_partition(n_samples: int, num_partitions: int, seed: int) -> list[IndexArray]:
    """Shuffle ``range(n_samples)`` and cut it into near-equal parts.

    Returns
    -------
    list of ndarray
        ``num_partitions`` sorted int64 index arrays, disjoint, covering every sample once;
        sizes differ by at most one.
    """
    _check_counts(n_samples, num_partitions)
    order = np.random.default_rng(seed).permutation(n_samples).astype(np.int64)
    return [np.sort(part) for part in np.array_split(order, num_partitions)]


def _as_labels(labels: npt.ArrayLike) -> npt.NDArray[np.int64]:
    array = np.asarray(labels)
    if array.ndim != 1:
        raise ValueError(f"labels must be one-dimensional, got shape {array.shape}")
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"labels must be integers, got dtype {array.dtype}")
    if array.size and array.min() < 0:
        raise ValueError("labels must be non-negative class indices")
    return array.astype(np.int64)


def _dirichlet_once(
    labels: npt.NDArray[np.int64], num_partitions: int, alpha: float, rng: np.random.Generator
) -> list[IndexArray]:
    chunks: list[list[IndexArray]] = [[] for _ in range(num_partitions)]
    for cls in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == cls)).astype(np.int64)
        shares = rng.dirichlet(np.full(num_partitions, alpha))
        cuts = (np.cumsum(shares)[:-1] * members.size).astype(np.int64)
        for part, piece in enumerate(np.split(members, cuts)):
            chunks[part].append(piece)
    return [np.sort(np.concatenate(c)) for c in chunks]


def dirichlet_partition(
    labels: npt.ArrayLike,
    num_partitions: int,
    alpha: float,
    seed: int,
    min_size: int = 10,
    max_tries: int = 100,
) -> list[IndexArray]:
    """Split samples so each class is spread over partitions by ``Dirichlet(alpha)``.

    Parameters
    ----------
    labels
        One class index per sample.
    num_partitions
        How many clients to split among.
    alpha
        Concentration; smaller means more label skew (0.1 is severe, 100 nearly IID).
    seed
        Seed of the generator; the same arguments always give the same split.
    min_size
        Smallest acceptable partition; draws that leave a client with fewer samples are
        redrawn, since a client without data cannot train.
    max_tries
        How many draws to attempt before giving up.

    Returns
    -------
    list of ndarray
        Sorted int64 index arrays, disjoint, covering every sample exactly once.

    Raises
    ------
    ValueError
        On invalid arguments, or if no draw within ``max_tries`` satisfies ``min_size``.
    """
    array = _as_labels(labels)
    _check_counts(array.size, num_partitions)
    _check_alpha(alpha)
    if min_size < 0 or min_size * num_partitions > array.size:
        raise ValueError(
            f"min_size={min_size} is impossible for {array.size} samples in "
            f"{num_partitions} partitions"
        )
    if max_tries < 1:
        raise ValueError(f"max_tries must be >= 1, got {max_tries}")
    rng = np.random.default_rng(seed)
    sizes = np.zeros(num_partitions, dtype=np.int64)
    for _ in range(max_tries):
        parts = _dirichlet_once(array, num_partitions, alpha, rng)
        sizes = np.array([part.size for part in parts], dtype=np.int64)
        if sizes.min() >= min_size:
            return parts
    raise PartitionError(
        f"no Dirichlet(alpha={alpha}) split of {array.size} samples into {num_partitions} "
        f"partitions gave every partition >= {min_size} samples in {max_tries} tries "
        f"(last draw: client {int(sizes.argmin())} got {int(sizes.min())}); raise alpha, "
        "lower min_size or use fewer partitions"
    )


def shard_partition(
    labels: npt.ArrayLike, num_partitions: int, shards_per_client: int, seed: int
) -> list[IndexArray]:
    """McMahan et al.'s pathological non-IID split: sort by label, deal shards.

    The samples, shuffled and then stably sorted by label, are cut into
    ``num_partitions * shards_per_client`` near-equal shards; a seeded permutation deals
    ``shards_per_client`` of them to each client. With 2 shards each, most clients hold
    one or two classes.

    Returns
    -------
    list of ndarray
        Sorted int64 index arrays, disjoint, covering every sample exactly once, none empty.

    Raises
    ------
    PartitionError
        If there are fewer samples than shards (some shard, so some client, would be empty).
    ValueError
        On malformed labels or counts below 1.
    """
    array = _as_labels(labels)
    _check_counts(array.size, num_partitions)
    if shards_per_client < 1:
        raise ValueError(f"shards_per_client must be >= 1, got {shards_per_client}")
    num_shards = num_partitions * shards_per_client
    if num_shards > array.size:
        raise PartitionError(
            f"shards(per_client={shards_per_client}) for {num_partitions} clients needs "
            f"{num_shards} shards but there are only {array.size} samples, so some client "
            "would get no data; lower per_client or use fewer clients"
        )
    rng = np.random.default_rng(seed)
    shuffled = rng.permutation(array.size).astype(np.int64)
    # The shuffle makes the order within one label random; the stable sort keeps it.
    by_label = shuffled[np.argsort(array[shuffled], kind="stable")]
    shards = np.array_split(by_label, num_shards)
    deal = rng.permutation(num_shards).reshape(num_partitions, shards_per_client)
    return [np.sort(np.concatenate([shards[s] for s in hand])) for hand in deal]


def _region_pools(
    labels: npt.NDArray[np.int64],
    weights: npt.NDArray[np.float64],
    alpha: float,
    rng: np.random.Generator,
) -> list[IndexArray]:
    """Divide each label's samples among regions by a Dirichlet draw scaled by ``weights``.

    Scaling by the regions' client shares keeps each region's pool, in expectation, in
    proportion to its clients, so a large region is not starved by the draw alone.
    """
    chunks: list[list[IndexArray]] = [[] for _ in weights]
    for cls in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == cls)).astype(np.int64)
        mix = weights * rng.dirichlet(np.full(weights.size, alpha))
        cuts = (np.cumsum(mix / mix.sum())[:-1] * members.size).astype(np.int64)
        for region, piece in enumerate(np.split(members, cuts)):
            chunks[region].append(piece)
    return [np.concatenate(c) if c else np.zeros(0, np.int64) for c in chunks]


def _region_once(
    labels: npt.NDArray[np.int64],
    members: Sequence[Sequence[int]],
    alpha: float,
    rng: np.random.Generator,
) -> list[IndexArray]:
    num_clients = sum(len(m) for m in members)
    weights = np.array([len(m) for m in members], dtype=np.float64) / num_clients
    parts: list[IndexArray] = [np.zeros(0, np.int64)] * num_clients
    for clients, pool in zip(members, _region_pools(labels, weights, alpha, rng), strict=True):
        pieces = np.array_split(rng.permutation(pool), len(clients))
        for client, piece in zip(clients, pieces, strict=True):
            parts[client] = np.sort(piece).astype(np.int64)
    return parts


def region_partition(
    labels: npt.ArrayLike,
    client_regions: Sequence[str],
    alpha: float,
    seed: int,
    max_tries: int = 100,
) -> list[IndexArray]:
    """Skew the label mix per region, then split each region's pool IID among its clients.

    For each label, its samples are divided among the regions by a ``Dirichlet(alpha)``
    draw, weighted by each region's share of the clients; each region's pool is then
    shuffled and cut into near-equal parts, one per client of the region.

    Parameters
    ----------
    labels
        One class index per sample.
    client_regions
        The region of each client (its length is the number of clients), e.g. from the
        simulator's link model.
    alpha
        Concentration; smaller means each region sees fewer labels.
    seed
        Seed of the generator; the same arguments always give the same split.
    max_tries
        Draws to attempt before giving up on giving every client data.

    Returns
    -------
    list of ndarray
        Sorted int64 index arrays, one per client, disjoint, covering every sample once.

    Raises
    ------
    PartitionError
        If no draw within ``max_tries`` gives every client at least one sample, naming the
        client and its region.
    """
    array = _as_labels(labels)
    _check_counts(array.size, len(client_regions))
    _check_alpha(alpha)
    if max_tries < 1:
        raise ValueError(f"max_tries must be >= 1, got {max_tries}")
    names = list(dict.fromkeys(client_regions))
    members = [[c for c, r in enumerate(client_regions) if r == name] for name in names]
    rng = np.random.default_rng(seed)
    parts: list[IndexArray] = []
    for _ in range(max_tries):
        parts = _region_once(array, members, alpha, rng)
        if min(part.size for part in parts) > 0:
            return parts
    empty = next(c for c, part in enumerate(parts) if part.size == 0)
    raise PartitionError(
        f"client {empty} (region {client_regions[empty]!r}) of {len(client_regions)} gets no "
        f"samples with by_region(alpha={alpha}) over {array.size} samples in {max_tries} "
        "draws; raise alpha or use fewer clients"
    )


def label_histogram(
    labels: npt.ArrayLike, parts: list[IndexArray], num_classes: int | None = None
) -> npt.NDArray[np.int64]:
    """Count each class in each partition, to inspect or report a split's skew.

    Returns
    -------
    ndarray
        Shape ``(len(parts), num_classes)``; ``num_classes`` defaults to ``max(labels) + 1``.
    """
    array = _as_labels(labels)
    seen = int(array.max()) + 1 if array.size else 0
    classes = seen if num_classes is None else num_classes
    if classes < seen:
        raise ValueError(f"num_classes={num_classes} but labels go up to {seen - 1}")
    hist = np.zeros((len(parts), classes), dtype=np.int64)
    for row, part in enumerate(parts):
        hist[row] = np.bincount(array[part], minlength=classes)
    return hist


#: Node-config key holding the path of the simulator's partition file.
PARTITION_FILE_KEY = "partition-file"
#: Written into every partition file; a reader refuses any other.
PARTITION_FILE_FORMAT = 1
_PARTITION_KEYS = frozenset({"format", "indices", "offsets"})
# Errors np.load raises on a truncated, foreign or tampered file.
_UNREADABLE = (OSError, EOFError, ValueError, KeyError, zipfile.BadZipFile)


class PartitionFileError(GeoflError, ValueError):
    """A partition file that is missing, corrupt, or holds no share for this client."""


@dataclass(frozen=True)
class PartitionFile:
    """Every client's indices, concatenated, and where each client's run starts.

    Client ``i`` holds ``indices[offsets[i]:offsets[i + 1]]``; ``offsets`` has one more
    entry than there are clients, starts at 0 and ends at ``indices.size``.
    """

    indices: IndexArray
    offsets: IndexArray

    @property
    def num_clients(self) -> int:
        """How many clients the file splits the data among."""
        return int(self.offsets.size - 1)

    def share(self, client: int) -> IndexArray:
        """A copy of client ``client``'s indices (the cached arrays stay untouched)."""
        if not 0 <= client < self.num_clients:
            raise PartitionFileError(
                f"partition-id {client} is outside 0..{self.num_clients - 1} of the partition file"
            )
        return self.indices[self.offsets[client] : self.offsets[client + 1]].copy()


def write_partition_file(path: Path, parts: Sequence[IndexArray]) -> None:
    """Store ``parts`` (one index array per client) at ``path`` as a partition file.

    The file is written beside ``path`` and renamed over it, so a reader sees the old file
    or the new one, never half of one.

    Raises
    ------
    ValueError
        If there are no parts or an index array is not one-dimensional.
    """
    if not parts:
        raise ValueError("a partition file needs at least one client")
    if any(np.ndim(part) != 1 for part in parts):
        raise ValueError("every client's indices must be a one-dimensional array")
    sizes = np.array([len(part) for part in parts], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    indices = np.concatenate([np.asarray(part, dtype=np.int64) for part in parts])
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as stream:
            np.savez(
                stream,
                allow_pickle=False,
                format=np.int64(PARTITION_FILE_FORMAT),
                indices=indices,
                offsets=offsets,
            )
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def read_partition_file(path: str | Path) -> PartitionFile:
    """The partition file at ``path``, loaded once per process while it is unchanged.

    Thousands of simulated clients share a worker process; each asks for the same file,
    so it is cached by path, inode, modification time and size (a rewritten file is read
    again).

    Raises
    ------
    PartitionFileError
        If the file is missing, is not a partition file, or is inconsistent.
    """
    where = Path(path)
    try:
        stat = where.stat()
    except OSError as exc:
        raise PartitionFileError(
            f"partition file {where} cannot be read ({exc.strerror}); the simulator writes "
            "it before starting clients for simulation.partition, so it was moved or deleted"
        ) from None
    identity = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
    return _load_partition_file(str(where.resolve()), identity)


@lru_cache(maxsize=8)
def _load_partition_file(path: str, identity: tuple[int, int, int]) -> PartitionFile:
    """Parse and check a partition file; ``identity`` (inode, mtime, size) keys the cache."""
    try:
        # Our own handle: np.load leaks the one it opens when the zip is damaged.
        with open(path, "rb") as stream:
            arrays = _partition_arrays(path, np.load(stream, allow_pickle=False))
    except PartitionFileError:
        raise
    except _UNREADABLE as exc:
        raise PartitionFileError(f"{path} is not a readable partition file: {exc}") from None
    problem = _partition_file_problem(arrays)
    if problem:
        raise PartitionFileError(f"{path} is a corrupt partition file: {problem}")
    # The dtype is checked, so astype copies nothing; it only tells the type checker.
    indices, offsets = (arrays[key].astype(np.int64, copy=False) for key in ("indices", "offsets"))
    for array in (indices, offsets):
        array.flags.writeable = False  # shared by every client of the process
    return PartitionFile(indices=indices, offsets=offsets)


def _partition_arrays(path: str, loaded: object) -> dict[str, npt.NDArray[np.generic]]:
    """The arrays of a loaded ``.npz``, refusing anything else np.load can return."""
    if not isinstance(loaded, NpzFile):
        raise PartitionFileError(f"{path} is not a partition file: not an .npz archive")
    with loaded as archive:
        if set(archive.files) != _PARTITION_KEYS:
            raise PartitionFileError(
                f"{path} is not a partition file: it holds {sorted(archive.files)}, "
                f"expected {sorted(_PARTITION_KEYS)}"
            )
        return {key: archive[key] for key in _PARTITION_KEYS}


def _partition_file_problem(arrays: dict[str, npt.NDArray[np.generic]]) -> str | None:
    """What is inconsistent about a partition file's arrays, or None if nothing is."""
    version, indices, offsets = arrays["format"], arrays["indices"], arrays["offsets"]
    integral = np.issubdtype(version.dtype, np.integer)
    if version.shape != () or not integral or int(version) != PARTITION_FILE_FORMAT:
        return f"format {version.tolist()!r}, this geofl reads format {PARTITION_FILE_FORMAT}"
    if indices.dtype != np.int64 or offsets.dtype != np.int64:
        return f"indices are {indices.dtype} and offsets {offsets.dtype}, expected int64"
    if indices.ndim != 1 or offsets.ndim != 1 or offsets.size < 2:
        return "indices must be one-dimensional and offsets name at least one client"
    if offsets[0] != 0 or offsets[-1] != indices.size or np.any(np.diff(offsets) < 0):
        return f"offsets must rise from 0 to {indices.size}, the number of indices"
    if indices.size and indices.min() < 0:
        return "indices must be non-negative"
    return None


def assigned_indices(context: ClientContext) -> IndexArray | None:
    """This client's sample indices as the simulator split them, or None if it did not.

    Reads the file named by node config ``partition-file`` and picks the share of
    ``partition-id``. Without ``partition-file`` the simulator made no split
    (``simulation.partition`` unset) and the app partitions its data itself.

    Raises
    ------
    PartitionFileError
        If the file is missing or corrupt, or ``partition-id`` is absent, out of range or
        disagrees with ``num-partitions``.
    """
    path = context.node_config.get(PARTITION_FILE_KEY)
    if path is None:
        return None
    if not isinstance(path, str) or not path:
        raise PartitionFileError(f"node config {PARTITION_FILE_KEY} must be a path, got {path!r}")
    plan = read_partition_file(path)
    client = context.node_config.get("partition-id")
    if isinstance(client, bool) or not isinstance(client, int):
        raise PartitionFileError(
            f"node config partition-id must be an integer to pick a share of {path}, got {client!r}"
        )
    expected = context.node_config.get("num-partitions", plan.num_clients)
    if expected != plan.num_clients:
        raise PartitionFileError(
            f"{path} splits the data among {plan.num_clients} clients but this client was "
            f"told num-partitions={expected!r}; the file belongs to another run"
        )
    return plan.share(client)
