"""Link measurements per round: write the server's estimates, read them back.

After each round the server stores what it had measured of every node it knows
(round-trip time, downlink and uplink throughput, compute speed, availability) in
``node_measurements``, one row per (round, node). A restarted coordinator seeds its
estimator from :func:`latest_measurements`; ``geofl runs show`` prints them. Like the
other query modules, every function takes the caller's session and only flushes;
:mod:`geofl.storage.queries` re-exports them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy import Select, func, select
from sqlalchemy.orm import Session

from geofl.storage.errors import RecordNotFoundError
from geofl.storage.models import Node, NodeMeasurement, Round
from geofl.storage.reports import get_run

__all__ = [
    "LinkMeasurement",
    "NodeMeasurementRecord",
    "latest_measurements",
    "measurements_of",
    "record_measurements",
]

#: Estimate fields that are non-negative floats or ``None``.
_RATES = ("rtt_s", "down_bps", "up_bps", "samples_per_s")


class LinkMeasurement(Protocol):
    """What :func:`record_measurements` stores for one node (read-only attributes).

    :class:`geofl.server.scheduling.LinkEstimate` and :class:`NodeMeasurementRecord` both
    have this shape, so an estimator's snapshot is stored as is and stored rows load back
    into an estimator.
    """

    @property
    def node_id(self) -> int:
        """The node the values describe."""
        ...

    @property
    def rtt_s(self) -> float | None:
        """Round-trip time, seconds."""
        ...

    @property
    def down_bps(self) -> float | None:
        """Server-to-node throughput, bit/s."""
        ...

    @property
    def up_bps(self) -> float | None:
        """Node-to-server throughput, bit/s."""
        ...

    @property
    def samples_per_s(self) -> float | None:
        """Training speed, samples per second."""
        ...

    @property
    def availability(self) -> float | None:
        """Smoothed fraction of tasks that did not end dropped or late, in [0, 1]."""
        ...

    @property
    def observations(self) -> int:
        """How many tasks went into the estimates."""
        ...

    @property
    def last_round(self) -> int | None:
        """The newest round whose tasks went into the estimates."""
        ...


@dataclass(frozen=True)
class NodeMeasurementRecord:
    """One stored row: a node's estimates after a round, with the node's name and region."""

    round_id: int
    round_number: int
    node_id: int
    node_name: str
    node_region: str | None
    rtt_s: float | None
    down_bps: float | None
    up_bps: float | None
    samples_per_s: float | None
    availability: float | None
    observations: int
    last_round: int | None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict of this record."""
        return dataclasses.asdict(self)


def _checked(item: LinkMeasurement, index: int) -> dict[str, Any]:
    """The column values of one estimate, or ValueError naming the bad field."""
    where = f"estimates[{index}] (node {item.node_id})"
    values: dict[str, Any] = {"node_id": item.node_id}
    for name in (*_RATES, "availability"):
        value = getattr(item, name)
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{where}: {name} must be a finite number >= 0, got {value!r}")
        values[name] = None if value is None else float(value)
    if values["availability"] is not None and values["availability"] > 1:
        raise ValueError(f"{where}: availability must be at most 1, got {item.availability!r}")
    if item.observations < 0:
        raise ValueError(f"{where}: observations must be >= 0, got {item.observations}")
    if item.last_round is not None and item.last_round < 0:
        raise ValueError(f"{where}: last_round must be >= 0, got {item.last_round}")
    values["observations"], values["last_round"] = item.observations, item.last_round
    return values


def _validated(estimates: Sequence[LinkMeasurement]) -> dict[int, dict[str, Any]]:
    by_node: dict[int, dict[str, Any]] = {}
    for index, item in enumerate(estimates):
        if item.node_id in by_node:
            raise ValueError(f"estimates[{index}]: node {item.node_id} appears twice")
        by_node[item.node_id] = _checked(item, index)
    return by_node


def _require_nodes_of_run(session: Session, run_id: int, node_ids: set[int]) -> None:
    if not node_ids:
        return
    statement = select(Node.id).where(Node.run_id == run_id, Node.id.in_(node_ids))
    missing = node_ids - set(session.scalars(statement))
    if missing:
        raise RecordNotFoundError(f"nodes {sorted(missing)} are not part of run {run_id}")


def record_measurements(
    session: Session, round_id: int, estimates: Sequence[LinkMeasurement]
) -> list[NodeMeasurement]:
    """Store each node's estimates as they stood after round ``round_id``.

    Keyed by (round, node): recording a node again for the same round overwrites its row,
    so a retried write is idempotent. Rows of nodes not in ``estimates`` are left alone.
    Every argument is checked before the session is touched.

    Returns
    -------
    list[NodeMeasurement]
        The rows, in the order of ``estimates``.

    Raises
    ------
    ValueError
        A node appears twice, or a value is negative, not finite, or an availability
        above 1 (the message names the entry and the field).
    RecordNotFoundError
        No such round, or a node that is not part of the round's run.
    """
    by_node = _validated(estimates)
    round_row = session.get(Round, round_id)
    if round_row is None:
        raise RecordNotFoundError(f"round id {round_id} does not exist")
    _require_nodes_of_run(session, round_row.run_id, set(by_node))
    existing = {
        row.node_id: row
        for row in session.scalars(
            select(NodeMeasurement).where(
                NodeMeasurement.round_id == round_id, NodeMeasurement.node_id.in_(by_node)
            )
        )
    }
    rows: list[NodeMeasurement] = []
    for node_id, values in by_node.items():
        row = existing.get(node_id)
        if row is None:
            row = NodeMeasurement(round_id=round_id)
            session.add(row)
        for name, value in values.items():
            setattr(row, name, value)
        rows.append(row)
    session.flush()
    return rows


def _joined(run_id: int) -> Select[NodeMeasurement, int, str, str | None]:
    return (
        select(NodeMeasurement, Round.number, Node.name, Node.region)
        .join(Round, NodeMeasurement.round_id == Round.id)
        .join(Node, NodeMeasurement.node_id == Node.id)
        .where(Round.run_id == run_id)
    )


def _record(
    row: NodeMeasurement, number: int, name: str, region: str | None
) -> NodeMeasurementRecord:
    return NodeMeasurementRecord(
        round_id=row.round_id,
        round_number=number,
        node_id=row.node_id,
        node_name=name,
        node_region=region,
        rtt_s=row.rtt_s,
        down_bps=row.down_bps,
        up_bps=row.up_bps,
        samples_per_s=row.samples_per_s,
        availability=row.availability,
        observations=row.observations,
        last_round=row.last_round,
    )


def _records(
    session: Session, statement: Select[NodeMeasurement, int, str, str | None]
) -> list[NodeMeasurementRecord]:
    return [
        _record(row, number, name, region)
        for row, number, name, region in session.execute(statement)
    ]


def measurements_of(
    session: Session, run_id: int, round: int | None = None
) -> list[NodeMeasurementRecord]:
    """A run's stored measurements, by round number then node id.

    With ``round`` (a round number, not an id), only that round's rows.

    Raises
    ------
    RunNotFoundError
        No such run.
    """
    get_run(session, run_id)
    statement = _joined(run_id).order_by(Round.number, NodeMeasurement.node_id)
    if round is not None:
        statement = statement.where(Round.number == round)
    return _records(session, statement)


def latest_measurements(session: Session, run_id: int) -> list[NodeMeasurementRecord]:
    """Each node's newest stored measurement in a run, by node id.

    A node that was not measured in the last round keeps the row of the last round it
    was measured in (its ``round_number`` says which), so this is what a restarted
    coordinator should load into its estimator.

    Raises
    ------
    RunNotFoundError
        No such run.
    """
    get_run(session, run_id)
    newest = (
        select(NodeMeasurement.node_id, func.max(Round.number).label("number"))
        .join(Round, NodeMeasurement.round_id == Round.id)
        .where(Round.run_id == run_id)
        .group_by(NodeMeasurement.node_id)
        .subquery()
    )
    statement = (
        _joined(run_id)
        .join(
            newest,
            (newest.c.node_id == NodeMeasurement.node_id) & (newest.c.number == Round.number),
        )
        .order_by(NodeMeasurement.node_id)
    )
    return _records(session, statement)
