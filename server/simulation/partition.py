"""The ``simulation.partition`` setting applied to a data set, and its label histogram.

The splitting algorithms live in :mod:`geofl.client.partition`: they are pure NumPy that
client apps already import to split their own data, and the client package must not
depend on the server. This module is the simulator's side: it turns a
:class:`~geofl.server.config.simulation.PartitionConfig` into a call of the right one,
checks that every client gets data before anything starts, and renders the split's label
histogram for the terminal. :func:`prepare_partitions` does all of that for a run: it
reads the labels from ``simulation.labels``, splits them, and writes one partition file
that every client reads its share from (see :func:`geofl.client.partition.assigned_indices`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import numpy as np
import numpy.typing as npt
from rich.console import RenderableType
from rich.table import Table

from geofl.client.partition import (
    PARTITION_FILE_KEY,
    IndexArray,
    PartitionError,
    dirichlet_partition,
    iid_partition,
    label_histogram,
    region_partition,
    require_data,
    shard_partition,
    write_partition_file,
)
from geofl.protocols.types import Scalar
from geofl.server.config.errors import ConfigError, ConfigProblem
from geofl.server.config.models import RunConfig
from geofl.server.config.simulation import PartitionConfig
from geofl.server.models.loading import UserCodeError, import_object

__all__ = [
    "PARTITION_FILE_NAME",
    "PartitionError",
    "PartitionPlan",
    "describe_partition",
    "label_histogram",
    "label_skew",
    "load_labels",
    "partition_data",
    "prepare_partitions",
    "render_label_histogram",
]

#: Beyond this many clients the histogram is shown as per-label statistics.
DEFAULT_MAX_ROWS = 20
#: Name of the partition file :func:`prepare_partitions` writes into its directory.
PARTITION_FILE_NAME = "partition.npz"
_FIX = {
    "iid": "use fewer clients or more data",
    "dirichlet": "raise alpha, use fewer clients, or choose iid or shards",
    "shards": "lower per_client or use fewer clients",
    "by_region": "raise alpha or use fewer clients",
}


def describe_partition(config: PartitionConfig) -> str:
    """The setting as written, e.g. ``dirichlet(alpha=0.5)``, for messages and captions."""
    params = getattr(config, config.scheme).model_dump()
    inner = ", ".join(f"{key}={value}" for key, value in params.items())
    return f"{config.scheme}({inner})"


def partition_data(
    config: PartitionConfig,
    labels: npt.ArrayLike,
    num_clients: int,
    seed: int,
    client_regions: Sequence[str] | None = None,
) -> list[IndexArray]:
    """Split ``labels``' indices among ``num_clients`` clients as ``config`` says.

    Parameters
    ----------
    config
        The ``simulation.partition`` section.
    labels
        One class index per sample.
    num_clients
        How many clients to split among.
    seed
        Seed of the split (the run's seed).
    client_regions
        Each client's region (e.g. ``LinkModel.client_regions``); needed by ``by_region``.

    Returns
    -------
    list of ndarray
        One sorted int64 index array per client; disjoint, covering every sample, none empty.

    Raises
    ------
    PartitionError
        If some client would get no data, naming it, the setting and a fix.
    ValueError
        On malformed labels, or ``by_region`` without ``client_regions`` of the right length.
    """
    array = np.asarray(labels)
    settings = f"partition {describe_partition(config)} of {array.size} samples"
    try:
        parts = _split(config, array, num_clients, seed, client_regions)
    except PartitionError as exc:
        raise PartitionError(f"{settings}: {exc}") from None
    require_data(parts, settings, _FIX[config.scheme])
    return parts


def _split(
    config: PartitionConfig,
    labels: npt.NDArray[np.generic],
    num_clients: int,
    seed: int,
    client_regions: Sequence[str] | None,
) -> list[IndexArray]:
    if config.dirichlet is not None:
        return dirichlet_partition(labels, num_clients, config.dirichlet.alpha, seed, min_size=1)
    if config.shards is not None:
        return shard_partition(labels, num_clients, config.shards.per_client, seed)
    if config.by_region is not None:
        if client_regions is None or len(client_regions) != num_clients:
            got = "none" if client_regions is None else str(len(client_regions))
            raise ValueError(
                f"partition by_region needs the region of each of the {num_clients} clients "
                f"(simulation.regions), got {got}"
            )
        return region_partition(labels, client_regions, config.by_region.alpha, seed)
    return iid_partition(labels.size, num_clients, seed)


def label_skew(histogram: npt.NDArray[np.int64]) -> float:
    """Mean over clients of the largest label's share of the client's data.

    ``1 / num_labels`` for a perfectly balanced split, 1 when every client holds a single
    label; clients without data are left out.
    """
    totals = histogram.sum(axis=1)
    held = totals > 0
    if not held.any():
        return 0.0
    return float(np.mean(histogram[held].max(axis=1) / totals[held]))


def render_label_histogram(
    histogram: npt.NDArray[np.int64],
    max_rows: int = DEFAULT_MAX_ROWS,
    title: str = "label histogram",
) -> Table:
    """A clients x labels table of counts; statistics per label when there are many clients.

    Up to ``max_rows`` clients get one row each. Beyond that the table has rows ``min``,
    ``median``, ``max`` and ``total`` per label instead, so a 10,000-client split stays
    one screen. The caption gives the client count and :func:`label_skew`.
    """
    clients, labels = histogram.shape
    table = Table(
        title=title,
        caption=f"{clients} clients, mean top-label share {label_skew(histogram):.2f}",
    )
    table.add_column("client" if clients <= max_rows else "", justify="right")
    for label in range(labels):
        table.add_column(str(label), justify="right")
    table.add_column("total", justify="right", style="bold")
    rows = _client_rows(histogram) if clients <= max_rows else _summary_rows(histogram)
    for name, values in rows:
        table.add_row(name, *(_count(v) for v in values))
    return table


def _count(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.1f}"


def _client_rows(histogram: npt.NDArray[np.int64]) -> list[tuple[str, list[float]]]:
    return [
        (str(client), [*map(float, row), float(row.sum())]) for client, row in enumerate(histogram)
    ]


def _summary_rows(histogram: npt.NDArray[np.int64]) -> list[tuple[str, list[float]]]:
    with_total = np.column_stack([histogram, histogram.sum(axis=1)]).astype(np.float64)
    return [
        ("min", list(with_total.min(axis=0))),
        ("median", list(np.median(with_total, axis=0))),
        ("max", list(with_total.max(axis=0))),
        ("total", list(with_total.sum(axis=0))),
    ]


@dataclass(frozen=True)
class PartitionPlan:
    """The simulator's split of a run's data, written and ready for the clients.

    Attributes
    ----------
    path
        The partition file holding every client's indices.
    node_config
        Entries to add to every simulated client's node config so that
        :func:`~geofl.client.partition.assigned_indices` finds its share (the simulator
        already gives each client ``partition-id`` and ``num-partitions``).
    histogram
        The split's label histogram, ready for a rich console.
    num_clients
        How many clients the data is split among.
    """

    path: Path
    node_config: dict[str, Scalar]
    histogram: RenderableType
    num_clients: int


def prepare_partitions(
    config: RunConfig,
    source: str,
    directory: Path,
    client_regions: Sequence[str] | None,
) -> PartitionPlan | None:
    """Split the run's data as ``simulation.partition`` says and write the partition file.

    Called before any process starts, so a split that cannot give every client data stops
    the run with the configuration's own vocabulary, not a crash in some client.

    Parameters
    ----------
    config
        The run configuration; ``run.seed`` seeds the split.
    source
        Where the configuration came from (its file), for error messages.
    directory
        Where to write :data:`PARTITION_FILE_NAME`; created if missing.
    client_regions
        Each client's region (``LinkModel.client_regions``); needed by ``by_region``.

    Returns
    -------
    PartitionPlan or None
        None when ``simulation.partition`` is unset (each app partitions its own data).

    Raises
    ------
    ConfigError
        Naming ``simulation.labels`` if it is missing, cannot be loaded or returns no usable
        labels, or ``simulation.partition`` if the split leaves a client without data.
    """
    simulation = config.simulation
    if simulation.partition is None:
        return None
    labels = load_labels(simulation.labels, source)
    parts = _partition_or_explain(simulation.partition, labels, config, source, client_regions)
    path = directory / PARTITION_FILE_NAME
    write_partition_file(path, parts)
    title = f"label histogram: {describe_partition(simulation.partition)}"
    return PartitionPlan(
        path=path,
        node_config={PARTITION_FILE_KEY: str(path)},
        histogram=render_label_histogram(label_histogram(labels, parts), title=title),
        num_clients=len(parts),
    )


def load_labels(spec: str | None, source: str) -> npt.NDArray[np.int64]:
    """Call the ``simulation.labels`` callable; one non-negative class index per sample.

    Raises
    ------
    ConfigError
        At ``simulation.labels``: unset, not importable, not callable, failing, or
        returning something other than a non-empty one-dimensional array of class indices.
    """
    if spec is None:
        _fail(
            source,
            "simulation.labels",
            "simulation.partition needs the training labels to split: set simulation.labels "
            "to a callable 'module:attr' returning one class index per training sample",
        )
    try:
        function = import_object(spec)
    except UserCodeError as exc:
        _fail(source, "simulation.labels", str(exc))
    if not callable(function):
        _fail(source, "simulation.labels", f"{spec!r} is not callable")
    try:
        result = function()
    except Exception as exc:  # user code: any failure becomes a configuration problem
        _fail(source, "simulation.labels", f"{spec}() failed: {type(exc).__name__}: {exc}")
    return _as_class_indices(spec, result, source)


def _as_class_indices(spec: str, result: object, source: str) -> npt.NDArray[np.int64]:
    array = np.asarray(result)
    if array.ndim != 1 or array.size == 0:
        shape = "x".join(map(str, array.shape)) or "a scalar"
        _fail(
            source,
            "simulation.labels",
            f"{spec}() must return a non-empty one-dimensional array of labels, got shape {shape}",
        )
    if not np.issubdtype(array.dtype, np.integer):
        _fail(
            source,
            "simulation.labels",
            f"{spec}() must return integer class indices, got dtype {array.dtype}",
        )
    if array.min() < 0:
        _fail(
            source,
            "simulation.labels",
            f"{spec}() must return non-negative class indices, got {array.min()}",
        )
    return array.astype(np.int64)


def _partition_or_explain(
    scheme: PartitionConfig,
    labels: npt.NDArray[np.int64],
    config: RunConfig,
    source: str,
    client_regions: Sequence[str] | None,
) -> list[IndexArray]:
    clients, seed = config.simulation.clients, config.run.seed
    try:
        return partition_data(scheme, labels, clients, seed, client_regions)
    except PartitionError as exc:
        # The splitters phrase their fix for their own callers (e.g. "lower min_size");
        # say what to change in the configuration too, unless they already did.
        fix = _FIX[scheme.scheme]
        hint = "" if fix in str(exc) else f"; in simulation.partition: {fix}"
        _fail(source, "simulation.partition", f"{exc}{hint}")
    except ValueError as exc:
        _fail(source, "simulation.partition", str(exc))


def _fail(source: str, path: str, message: str) -> NoReturn:
    raise ConfigError([ConfigProblem(source=source, path=path, message=message)])
