"""Query functions for the coordinator's state, all taking an explicit session first.

Every function takes the caller's :class:`~sqlalchemy.orm.Session` and neither commits
nor rolls back: the caller decides what one unit of work is
(``with database.session() as session: ...``). Committing a round is one such unit: the
checkpoint row, the round's totals and the run's ``last_committed_round`` change
together or not at all.

Timestamps default to the current UTC time; a simulation on a virtual clock passes
``now=`` (aware datetimes only). Status, phase and kind arguments take the enums in
:mod:`geofl.storage.models` or their string values. Read queries return frozen records
(:mod:`geofl.storage.records`) with ``to_dict()``; writes return the ORM rows, which stay
readable after the session ends.

The functions live in :mod:`~geofl.storage.runs`, :mod:`~geofl.storage.rounds`,
:mod:`~geofl.storage.reports`, :mod:`~geofl.storage.exports`,
:mod:`~geofl.storage.measurements`, :mod:`~geofl.storage.events` and
:mod:`~geofl.storage.staged`; this module is the
one place to import them from.
"""

from __future__ import annotations

from geofl.storage.events import EventRecord, events_of
from geofl.storage.exports import (
    iter_participations,
    participation_cells,
    participation_metric_keys,
    region_traffic_by_round,
    run_nodes,
)
from geofl.storage.measurements import (
    latest_measurements,
    measurements_of,
    record_measurements,
)
from geofl.storage.reports import (
    checkpoints_of,
    get_run,
    latest_checkpoint,
    list_runs,
    rounds_of,
    run_detail,
    run_summary,
)
from geofl.storage.rounds import (
    commit_round,
    fail_round,
    participation_values,
    record_participation,
    record_participations,
    set_round_phase,
    start_round,
)
from geofl.storage.runs import (
    add_event,
    create_run,
    find_resumable_run,
    finish_run,
    latest_run_named,
    mark_node,
    mark_run_nodes,
    reopen_run,
    upsert_node,
    upsert_nodes,
)
from geofl.storage.staged import (
    StagedUpdateRecord,
    clear_staged,
    clear_staged_round,
    clear_staged_tasks,
    consumed_tasks,
    stage_update,
    staged_updates,
)

__all__ = [
    "EventRecord",
    "StagedUpdateRecord",
    "add_event",
    "checkpoints_of",
    "clear_staged",
    "clear_staged_round",
    "clear_staged_tasks",
    "commit_round",
    "consumed_tasks",
    "create_run",
    "events_of",
    "fail_round",
    "find_resumable_run",
    "finish_run",
    "get_run",
    "iter_participations",
    "latest_checkpoint",
    "latest_measurements",
    "latest_run_named",
    "list_runs",
    "mark_node",
    "mark_run_nodes",
    "measurements_of",
    "participation_cells",
    "participation_metric_keys",
    "participation_values",
    "record_measurements",
    "record_participation",
    "record_participations",
    "region_traffic_by_round",
    "reopen_run",
    "rounds_of",
    "run_detail",
    "run_nodes",
    "run_summary",
    "set_round_phase",
    "stage_update",
    "staged_updates",
    "start_round",
    "upsert_node",
    "upsert_nodes",
]
