"""SQLAlchemy 2.0 models: runs, nodes, rounds, participations, measurements, checkpoints, events.

The schema is the coordinator's durable state: a coordinator killed at any point
restarts, reads these tables, and carries on. Timestamps are always timezone-aware UTC
(SQLite stores them naive, :class:`UTCDateTime` restores the zone). Relationships are
``lazy="raise"`` so every query states what it loads. The hand-written migrations
(``migrations/versions/0001_initial.py`` and the later revisions) must match these
classes exactly; a test compares them.
"""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    false,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

__all__ = [
    "Base",
    "Checkpoint",
    "Event",
    "Node",
    "NodeMeasurement",
    "NodeStatus",
    "Participation",
    "ParticipationStatus",
    "Round",
    "RoundPhase",
    "RoundStatus",
    "Run",
    "RunStatus",
    "StagedUpdate",
    "TaskKind",
    "UTCDateTime",
    "utcnow",
]

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class RunStatus(StrEnum):
    """Life cycle of a run: ``running`` until it ends one of four ways.

    ``completed``: its rounds ran and at least one committed; ``failed``: no round
    committed, or an error ended it; ``cancelled``: an operator stopped it (``geofl runs
    stop``); ``interrupted``: SIGINT/SIGTERM stopped the coordinator, and the run resumes
    when it is started again (as a ``running`` run left by a crash does).
    """

    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    INTERRUPTED = "interrupted"

    @property
    def resumable(self) -> bool:
        """Whether a coordinator started on the same configuration carries this run on."""
        return self in (RunStatus.RUNNING, RunStatus.INTERRUPTED)


class NodeStatus(StrEnum):
    """Whether a client node is connected."""

    ONLINE = "online"
    OFFLINE = "offline"
    SHUTDOWN = "shutdown"


class RoundStatus(StrEnum):
    """Life cycle of a round; only ``committed`` rounds are final."""

    RUNNING = "running"
    COMMITTED = "committed"
    FAILED = "failed"
    ABORTED = "aborted"


class RoundPhase(StrEnum):
    """Phases of a synchronous round, in order."""

    SELECT = "select"
    ADVERTISE = "advertise"  # secure aggregation: key advertisement
    SHARE = "share"  # secure aggregation: secret sharing
    BROADCAST = "broadcast"
    FIT = "fit"
    UNMASK = "unmask"  # secure aggregation: reconstruction of the masks
    AGGREGATE = "aggregate"
    EVALUATE = "evaluate"
    COMMIT = "commit"


class TaskKind(StrEnum):
    """What a client was asked to do."""

    FIT = "fit"
    EVALUATE = "evaluate"
    ADVERTISE = "advertise"
    SHARE = "share"
    UNMASK = "unmask"


class ParticipationStatus(StrEnum):
    """Outcome of one task attempt on one client."""

    OK = "ok"
    FAILED = "failed"
    REJECTED = "rejected"
    LATE = "late"
    DROPPED = "dropped"


def utcnow() -> datetime:
    """Return the current time as an aware UTC datetime."""
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """``DateTime(timezone=True)`` that refuses naive input and returns aware UTC values.

    PostgreSQL keeps the zone; SQLite drops it, so values read back are tagged UTC.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        """Convert to UTC on the way in; a naive datetime is ambiguous and rejected."""
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value.isoformat()} given; use an aware UTC time")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        """Tag naive values (SQLite) as UTC and normalise aware ones to UTC."""
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


def _in(column: str, enum: type[StrEnum]) -> str:
    values = ", ".join(f"'{member.value}'" for member in enum)
    return f"{column} IN ({values})"


class Base(DeclarativeBase):
    """Declarative base with a naming convention so constraint names are stable."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map: ClassVar[dict[Any, Any]] = {dict[str, Any]: JSON, datetime: UTCDateTime}


class Run(Base):
    """One federated training run (one YAML configuration, many rounds)."""

    __tablename__ = "runs"
    __table_args__ = (CheckConstraint(_in("status", RunStatus), name="status"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), index=True)
    status: Mapped[str] = mapped_column(String(16))
    config: Mapped[dict[str, Any]]
    config_sha256: Mapped[str] = mapped_column(String(64))
    rounds_planned: Mapped[int] = mapped_column(Integer)
    last_committed_round: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    simulated_clock: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
    finished_at: Mapped[datetime | None]
    error: Mapped[str | None] = mapped_column(Text)

    nodes: Mapped[list[Node]] = relationship(back_populates="run", lazy="raise")
    rounds: Mapped[list[Round]] = relationship(back_populates="run", lazy="raise")


class Node(Base):
    """A client node; its primary key is the node id the client is given."""

    __tablename__ = "nodes"
    __table_args__ = (
        UniqueConstraint("run_id", "name"),
        CheckConstraint(_in("status", NodeStatus), name="status"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(200))
    region: Mapped[str | None] = mapped_column(String(100))
    node_config: Mapped[dict[str, Any]]
    first_seen: Mapped[datetime]
    last_seen: Mapped[datetime]
    status: Mapped[str] = mapped_column(String(16))

    run: Mapped[Run] = relationship(back_populates="nodes", lazy="raise")


class Checkpoint(Base):
    """Address and digest of a global model saved after a round."""

    __tablename__ = "checkpoints"
    __table_args__ = (Index("ix_checkpoints_run_id_round", "run_id", "round"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    round: Mapped[int] = mapped_column(Integer)
    path: Mapped[str] = mapped_column(String(500))
    sha256: Mapped[str] = mapped_column(String(64))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    num_tensors: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Round(Base):
    """One round of a run: its phase, timings, traffic, metrics and checkpoint."""

    __tablename__ = "rounds"
    __table_args__ = (
        UniqueConstraint("run_id", "number"),
        CheckConstraint(_in("status", RoundStatus), name="status"),
        CheckConstraint(_in("phase", RoundPhase), name="phase"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    number: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16))
    phase: Mapped[str] = mapped_column(String(16))
    started_at: Mapped[datetime]
    finished_at: Mapped[datetime | None]
    duration_s: Mapped[float | None] = mapped_column(Float)
    cohort_target: Mapped[int] = mapped_column(Integer)
    num_selected: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    num_succeeded: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    num_failed: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    bytes_up: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    bytes_down: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    #: What the same traffic would have been without compression.
    bytes_up_raw: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    bytes_down_raw: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    train_loss: Mapped[float | None] = mapped_column(Float)
    fit_metrics: Mapped[dict[str, Any]] = mapped_column(default=dict)
    eval_loss: Mapped[float | None] = mapped_column(Float)
    eval_metrics: Mapped[dict[str, Any]] = mapped_column(default=dict)
    server_eval_loss: Mapped[float | None] = mapped_column(Float)
    server_eval_metrics: Mapped[dict[str, Any]] = mapped_column(default=dict)
    phase_durations: Mapped[dict[str, Any]] = mapped_column(default=dict)
    checkpoint_id: Mapped[int | None] = mapped_column(
        ForeignKey("checkpoints.id", ondelete="SET NULL")
    )
    error: Mapped[str | None] = mapped_column(Text)
    #: The run's privacy spent after this round: ε at the run's δ (null without privacy).
    #: Deferred, so that ``geofl runs show`` still reads a database from before 0007.
    epsilon: Mapped[float | None] = mapped_column(Float, deferred=True)

    run: Mapped[Run] = relationship(back_populates="rounds", lazy="raise")
    checkpoint: Mapped[Checkpoint | None] = relationship(lazy="raise")
    participations: Mapped[list[Participation]] = relationship(
        back_populates="round", lazy="raise", passive_deletes=True
    )


class Participation(Base):
    """One task attempt by one node in one round, and what came of it."""

    __tablename__ = "participations"
    __table_args__ = (
        UniqueConstraint("round_id", "task_id", "attempt"),
        CheckConstraint(_in("kind", TaskKind), name="kind"),
        CheckConstraint(_in("status", ParticipationStatus), name="status"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    round_id: Mapped[int] = mapped_column(ForeignKey("rounds.id", ondelete="CASCADE"))
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"), index=True)
    task_id: Mapped[int] = mapped_column(BigInteger)
    kind: Mapped[str] = mapped_column(String(16))
    attempt: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    status: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(Text)
    num_examples: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    bytes_up: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    bytes_down: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    #: What the same traffic would have been without compression.
    bytes_up_raw: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    bytes_down_raw: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    compute_s: Mapped[float | None] = mapped_column(Float)
    duration_s: Mapped[float | None] = mapped_column(Float)
    loss: Mapped[float | None] = mapped_column(Float)
    metrics: Mapped[dict[str, Any]] = mapped_column(default=dict)
    started_at: Mapped[datetime]
    finished_at: Mapped[datetime | None]

    round: Mapped[Round] = relationship(back_populates="participations", lazy="raise")
    node: Mapped[Node] = relationship(lazy="raise")


class Event(Base):
    """A notable happening (resume, node joined, error) for the run's audit log."""

    __tablename__ = "events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int | None] = mapped_column(
        ForeignKey("runs.id", ondelete="CASCADE"), index=True
    )
    round: Mapped[int | None] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(64))
    message: Mapped[str] = mapped_column(Text)
    data: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class NodeMeasurement(Base):
    """What the server had measured of one node's link and compute after one round.

    The values are the smoothed estimates of
    :class:`geofl.server.scheduling.LinkEstimator` (seconds, bit/s, samples/s, and a
    fraction for availability); each is ``NULL`` until it was first observed.
    """

    __tablename__ = "node_measurements"
    __table_args__ = (UniqueConstraint("round_id", "node_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    round_id: Mapped[int] = mapped_column(ForeignKey("rounds.id", ondelete="CASCADE"))
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"), index=True)
    rtt_s: Mapped[float | None] = mapped_column(Float)
    down_bps: Mapped[float | None] = mapped_column(Float)
    up_bps: Mapped[float | None] = mapped_column(Float)
    samples_per_s: Mapped[float | None] = mapped_column(Float)
    availability: Mapped[float | None] = mapped_column(Float)
    observations: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    #: The newest round whose tasks went into the estimates.
    last_round: Mapped[int | None] = mapped_column(Integer)


class StagedUpdate(Base):
    """A fit update the server accepted and acknowledged, not yet folded into a commit.

    Written before the client hears ``accepted``: the update's tensors are a safetensors
    file (``path``, ``crc32``, ``size_bytes``, as a checkpoint record; rows written before
    revision 0009 have a ``sha256`` instead) and these columns
    are what its participation row will say. A coordinator restarted in the middle of
    round ``round`` folds these again (after re-checking the checksum) instead of asking
    their nodes to train again. Rows go when their round commits or fails (FedBuff:
    when the version their update went into does). One row per task (revision 0008).
    """

    __tablename__ = "staged_updates"
    __table_args__ = (UniqueConstraint("run_id", "task_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    round: Mapped[int] = mapped_column(Integer)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"))
    task_id: Mapped[int] = mapped_column(BigInteger)
    model_version: Mapped[int] = mapped_column(Integer)
    path: Mapped[str] = mapped_column(String(500))
    sha256: Mapped[str | None] = mapped_column(String(64))
    crc32: Mapped[int | None] = mapped_column(BigInteger)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    num_tensors: Mapped[int] = mapped_column(Integer)
    num_examples: Mapped[int] = mapped_column(Integer)
    loss: Mapped[float | None] = mapped_column(Float)
    metrics: Mapped[dict[str, Any]] = mapped_column(default=dict)
    compute_s: Mapped[float | None] = mapped_column(Float)
    bytes_up: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    bytes_up_raw: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    bytes_down: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    bytes_down_raw: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    started_at: Mapped[datetime | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
