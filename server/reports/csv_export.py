"""``geofl runs export RUN --csv DIR``: a run's rounds and participations as CSV files.

Two files, one row per round (``rounds.csv``) and one per task attempt
(``participations.csv``), with the fixed columns of :data:`ROUND_COLUMNS` and
:data:`PARTICIPATION_COLUMNS` (each with the sentence ``docs/reports.md`` prints) followed
by one column per metric name the run reported (``fit_metrics.accuracy``,
``metrics.loss``...). Cells: empty for a missing value, ISO 8601 UTC for times, Python's
shortest round-tripping form for floats, ``true``/``false`` for booleans and JSON for a
metric that is not a scalar. Participations are streamed, so a run of any length exports
in flat memory.
"""

from __future__ import annotations

import csv
import json
import operator
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from geofl.server.reports.output import prepare_output_folder
from geofl.storage import Database, queries
from geofl.storage.exports import ExportedParticipation
from geofl.storage.records import RoundSummary

__all__ = [
    "DYNAMIC_ROUND_PREFIXES",
    "FILES",
    "PARTICIPATIONS_FILE",
    "PARTICIPATION_COLUMNS",
    "PARTICIPATION_METRICS_PREFIX",
    "ROUNDS_FILE",
    "ROUND_COLUMNS",
    "Column",
    "ExportResult",
    "cell",
    "columns_markdown",
    "export_csv",
]

ROUNDS_FILE = "rounds.csv"
PARTICIPATIONS_FILE = "participations.csv"


@dataclass(frozen=True)
class Column:
    """A fixed CSV column: its header, what it holds, and the record field it comes from."""

    name: str
    description: str
    field: str


def _columns(*spec: tuple[str, str, str]) -> tuple[Column, ...]:
    return tuple(Column(name, description, field) for name, field, description in spec)


_TRAFFIC = (
    ("bytes_up", "bytes_up", "bytes sent to the server (client to server), as on the wire"),
    ("bytes_down", "bytes_down", "bytes sent to the client(s), as on the wire"),
    ("bytes_up_raw", "bytes_up_raw", "what bytes_up would have been without compression"),
    ("bytes_down_raw", "bytes_down_raw", "what bytes_down would have been without compression"),
)

ROUND_COLUMNS = _columns(
    ("run_id", "", "the run's id (the same on every row)"),
    ("round", "number", "round number, from 1"),
    ("status", "status", "running, committed, failed or aborted; only committed is final"),
    ("phase", "phase", "the last phase the round reached (select ... commit)"),
    (
        "started_at",
        "started_at",
        "when the round began, ISO 8601 UTC (simulated on the virtual clock)",
    ),
    ("finished_at", "finished_at", "when it committed or failed; empty while running"),
    ("duration_s", "duration_s", "finished_at - started_at in seconds"),
    ("cohort_target", "cohort_target", "how many clients the round wanted"),
    ("num_selected", "num_selected", "distinct fit tasks handed out"),
    ("num_succeeded", "num_succeeded", "fit tasks with an ok attempt"),
    ("num_failed", "num_failed", "num_selected - num_succeeded"),
    *(
        (name, field, f"{text}, all of the round's tasks (set by the commit: 0 if it failed)")
        for name, field, text in _TRAFFIC
    ),
    ("train_loss", "train_loss", "aggregated training loss of the fit results"),
    ("eval_loss", "eval_loss", "aggregated loss of the federated (client-side) evaluation"),
    ("server_eval_loss", "server_eval_loss", "loss of the server-side evaluation"),
    ("checkpoint_id", "checkpoint_id", "id of the model checkpoint the commit saved"),
    ("error", "error", "why the round failed or was aborted"),
)

#: Round columns added per name found in the run, in this order: ``PREFIX.NAME``.
DYNAMIC_ROUND_PREFIXES = (
    ("fit_metrics", "aggregated metrics of the fit results"),
    ("eval_metrics", "aggregated metrics of the federated evaluation"),
    ("server_eval_metrics", "metrics of the server-side evaluation"),
    ("phase_durations", "seconds the round spent in each phase"),
)

PARTICIPATION_COLUMNS = _columns(
    ("run_id", "", "the run's id (the same on every row)"),
    ("round", "round_number", "round number the task belongs to"),
    ("node_id", "node_id", "the node's id in this run"),
    ("node_name", "node_name", "the node's name (unique within the run)"),
    ("node_region", "node_region", "the node's region; empty when it has none"),
    ("task_id", "task_id", "the task's id; a retried task keeps it"),
    ("kind", "kind", "fit, evaluate, or a secure-aggregation stage (advertise, share, unmask)"),
    ("attempt", "attempt", "attempt number of the task, from 1"),
    ("status", "status", "ok, failed, rejected, late or dropped"),
    ("reason", "reason", "why the attempt was not ok"),
    ("num_examples", "num_examples", "examples the client used"),
    *((name, field, f"{text}, this attempt") for name, field, text in _TRAFFIC),
    ("compute_s", "compute_s", "seconds the client reported computing"),
    ("duration_s", "duration_s", "seconds from handing the task out to its outcome"),
    ("loss", "loss", "the loss the client reported"),
    ("started_at", "started_at", "when the task was handed out"),
    ("finished_at", "finished_at", "when its outcome was recorded"),
)

#: Participation columns added per metric name found in the run: ``metrics.NAME``.
PARTICIPATION_METRICS_PREFIX = "metrics"


@dataclass(frozen=True)
class ExportResult:
    """What an export wrote."""

    rounds_csv: Path
    participations_csv: Path
    rounds: int
    participations: int


def cell(value: object) -> str:
    """One CSV cell (see the module docstring for the formats)."""
    if type(value) in (str, int, float):  # the common case, first
        return str(value)
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    return str(value)


class _Fixed:
    """Reads a record's fixed columns in one go; only times need converting, since the csv
    writer already writes None as an empty cell and numbers as ``str()`` does."""

    def __init__(self, columns: Sequence[Column], run_id: int, sample: object) -> None:
        if columns[0].field or not all(c.field for c in columns[1:]):
            raise ValueError("the run id must be the first column and only that one")
        fields = [c.field for c in columns[1:]]
        self.run_id = run_id
        self.values = operator.attrgetter(*fields)
        self.times = [i for i, f in enumerate(fields) if f.endswith("_at")]
        self.cells = [i for i, f in enumerate(fields) if not f.endswith("_at")]
        self.check(sample)

    def check(self, sample: object) -> None:
        """Guard for the shortcut: every non-time column is a scalar the writer handles."""
        values = self.values(sample)
        for i in self.cells:
            if not isinstance(values[i], str | int | float | None) or isinstance(values[i], bool):
                raise TypeError(f"column value {values[i]!r} needs cell()")

    def __call__(self, record: object) -> list[object]:
        values: list[object] = [self.run_id, *self.values(record)]
        for i in self.times:
            values[i + 1] = cell(values[i + 1])
        return values


def _fixed(columns: Sequence[Column], record: object, run_id: int) -> list[object]:
    return _Fixed(columns, run_id, record)(record)


def _names(rounds: Iterable[RoundSummary], attribute: str) -> list[str]:
    found: set[str] = set()
    for r in rounds:
        found.update(getattr(r, attribute))
    return sorted(found)


def _write(path: Path, header: list[str], rows: Iterator[list[object]]) -> int:
    count = 0
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        for row in rows:
            writer.writerow(row)
            count += 1
    return count


def _round_rows(
    rounds: Sequence[RoundSummary], run_id: int, dynamic: list[tuple[str, list[str]]]
) -> Iterator[list[object]]:
    for r in rounds:
        extra = [cell(getattr(r, prefix).get(name)) for prefix, names in dynamic for name in names]
        yield _fixed(ROUND_COLUMNS, r, run_id) + extra


def _participation_rows(
    rows: Iterator[ExportedParticipation], run_id: int, metric_names: list[str]
) -> Iterator[list[object]]:
    fixed: _Fixed | None = None
    for p in rows:
        fixed = fixed or _Fixed(PARTICIPATION_COLUMNS, run_id, p)
        metrics = p.metrics
        yield fixed(p) + [cell(metrics.get(name)) for name in metric_names]


def _header(columns: Sequence[Column], dynamic: list[tuple[str, list[str]]]) -> list[str]:
    return [c.name for c in columns] + [
        f"{prefix}.{name}" for prefix, names in dynamic for name in names
    ]


def export_csv(db: Database, run_id: int, folder: Path) -> ExportResult:
    """Write ``rounds.csv`` and ``participations.csv`` of run ``run_id`` into ``folder``.

    The run is looked up before the folder is created, so a wrong id leaves nothing
    behind.

    Raises
    ------
    geofl.storage.RunNotFoundError
        No run has this id.
    ReportError
        ``folder`` exists and is not an empty folder.
    """
    with db.session() as session:
        rounds = queries.rounds_of(session, queries.get_run(session, run_id).id)
        prepare_output_folder(folder)
        dynamic = [(prefix, _names(rounds, prefix)) for prefix, _ in DYNAMIC_ROUND_PREFIXES]
        rounds_csv = folder / ROUNDS_FILE
        written_rounds = _write(
            rounds_csv, _header(ROUND_COLUMNS, dynamic), _round_rows(rounds, run_id, dynamic)
        )
        metric_names = queries.participation_metric_keys(session, run_id)
        per_task = [(PARTICIPATION_METRICS_PREFIX, metric_names)]
        participations_csv = folder / PARTICIPATIONS_FILE
        written = _write(
            participations_csv,
            _header(PARTICIPATION_COLUMNS, per_task),
            _participation_rows(queries.iter_participations(session, run_id), run_id, metric_names),
        )
    return ExportResult(rounds_csv, participations_csv, written_rounds, written)


#: For docs and tests: ``(file, fixed columns, dynamic prefixes with their meaning)``.
FILES: tuple[tuple[str, tuple[Column, ...], tuple[tuple[str, str], ...]], ...] = (
    (ROUNDS_FILE, ROUND_COLUMNS, DYNAMIC_ROUND_PREFIXES),
    (
        PARTICIPATIONS_FILE,
        PARTICIPATION_COLUMNS,
        ((PARTICIPATION_METRICS_PREFIX, "metrics the client reported"),),
    ),
)


def columns_markdown() -> str:
    """The column tables of ``docs/reports.md`` (a test checks the page holds this text)."""
    lines: list[str] = []
    for file, columns, dynamic in FILES:
        lines += [f"`{file}`:", "", "| column | what it holds |", "|---|---|"]
        lines += [f"| `{c.name}` | {c.description} |" for c in columns]
        lines += [f"| `{prefix}.NAME` | {text}, one column per NAME |" for prefix, text in dynamic]
        lines.append("")
    return "\n".join(lines)
