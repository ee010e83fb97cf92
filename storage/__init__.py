"""geofl.storage: the coordinator's durable state.

SQLAlchemy models and Alembic migrations for runs, nodes, rounds, participations, link
measurements, checkpoints and events; query functions that take an explicit session; and a
content-addressed checkpoint store for model weights (safetensors, SHA-256 verified).

Typical use by the server::

    database = open_database(config.storage.url)          # migrates to head
    with database.session() as session:                   # one transaction
        run = queries.create_run(session, name, config, rounds_planned=50)
"""

from geofl.storage import queries
from geofl.storage.checkpoints import STATE_PREFIX, CheckpointRecord, CheckpointStore
from geofl.storage.database import (
    Database,
    alembic_config,
    current_revision,
    downgrade,
    head_revision,
    open_database,
    redact_url,
    upgrade,
)
from geofl.storage.errors import (
    CheckpointCorruptError,
    DatabaseURLError,
    RecordNotFoundError,
    RoundStateError,
    RunNotFoundError,
    StorageError,
    StorageUnavailableError,
)
from geofl.storage.measurements import LinkMeasurement, NodeMeasurementRecord
from geofl.storage.models import (
    Checkpoint,
    Event,
    Node,
    NodeMeasurement,
    NodeStatus,
    Participation,
    ParticipationStatus,
    Round,
    RoundPhase,
    RoundStatus,
    Run,
    RunStatus,
    StagedUpdate,
    TaskKind,
)
from geofl.storage.records import ParticipationRecord, RoundSummary, RunDetail, RunSummary
from geofl.storage.values import config_digest, jsonable

__all__ = [
    "STATE_PREFIX",
    "Checkpoint",
    "CheckpointCorruptError",
    "CheckpointRecord",
    "CheckpointStore",
    "Database",
    "DatabaseURLError",
    "Event",
    "LinkMeasurement",
    "Node",
    "NodeMeasurement",
    "NodeMeasurementRecord",
    "NodeStatus",
    "Participation",
    "ParticipationRecord",
    "ParticipationStatus",
    "RecordNotFoundError",
    "Round",
    "RoundPhase",
    "RoundStateError",
    "RoundStatus",
    "RoundSummary",
    "Run",
    "RunDetail",
    "RunNotFoundError",
    "RunStatus",
    "RunSummary",
    "StagedUpdate",
    "StorageError",
    "StorageUnavailableError",
    "TaskKind",
    "alembic_config",
    "config_digest",
    "current_revision",
    "downgrade",
    "head_revision",
    "jsonable",
    "open_database",
    "queries",
    "redact_url",
    "upgrade",
]
