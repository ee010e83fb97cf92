"""A hand-driven peer beside honest clients: the set-up the hostile-input tests share.

Each of those tests runs one round with honest test clients, lets one raw
:class:`~geofl.client.connection.Connection` take a fit task and misbehave with it, and
then reads what the server recorded.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from geofl.client.connection import Connection
from geofl.protocols.v1 import geofl_pb2 as pb
from geofl.server.config import RunConfig
from geofl.server.coordinator import RunResult
from geofl.storage import open_database, queries
from geofl.storage.records import ParticipationRecord, RunDetail

from .conftest import run_config

#: A well-formed update of the test app's small model (``geofl_testapp:make_model``).
GOOD_UPDATE = {
    "w": np.ones((4, 3), np.float32),
    "b": np.ones(3, np.float32),
    "steps": np.ones((), np.int64),
}

#: What the raw peer does with its task.
Act = Callable[[Connection, pb.Task], None]


def upload_header(task: pb.Task, **fields: Any) -> pb.UploadHeader:
    """The header a correct client sends for ``task`` (a delta of 10 examples), with
    ``fields`` set over it."""
    header = pb.UploadHeader(
        task_id=task.task_id,
        round=task.round,
        attempt=1,
        status=pb.RESULT_STATUS_OK,
        update_kind=pb.UPDATE_KIND_DELTA,
        num_examples=10,
    )
    for key, value in fields.items():
        setattr(header, key, value)
    return header


def fit_task(conn: Connection) -> pb.Task:
    """The first fit task the server gives ``conn``."""
    for _ in range(100):
        task = conn.get_task(poll_timeout_s=2.0)
        if task.kind == pb.TASK_KIND_FIT:
            return task
    raise AssertionError("no fit task arrived")


def raw_client(port: int, name: str, act: Act, errors: list[BaseException]) -> threading.Thread:
    """A thread that joins as ``name``, takes one fit task and does ``act(conn, task)``;
    what it raises lands in ``errors``."""

    def body() -> None:
        conn = Connection(f"127.0.0.1:{port}")
        try:
            conn.join(name, None, {}, timeout=5)
            act(conn, fit_task(conn))
        except BaseException as exc:
            errors.append(exc)
        finally:
            conn.close()

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread


@dataclass(frozen=True)
class Intrusion:
    """How a round beside a raw peer ended, and what the raw peer saw."""

    config: RunConfig
    result: RunResult
    errors: list[BaseException]
    detail: RunDetail

    def participations_of(self, name: str) -> list[ParticipationRecord]:
        return [p for p in self.detail.participations if p.node_name == name]


def round_beside_honest_clients(
    tmp_path: Path,
    serve: Any,
    name: str,
    act: Act,
    *,
    honest: int = 2,
    wait_s: float | None = None,
    **sections: Any,
) -> Intrusion:
    """One round of ``honest`` test clients and the raw peer ``name`` (the cohort holds
    them all; ``honest`` are enough to commit). ``sections`` override the run config."""
    strategy = {"clients_per_round": honest + 1, "min_clients": honest}
    defaults: dict[str, Any] = {"run": {"rounds": 1}, "evaluation": {"every": 0}}
    strategy.update(sections.pop("strategy", {}))
    config = run_config(tmp_path, **{**defaults, **sections, "strategy": strategy})
    server = serve(config)
    for i in range(honest):
        server.add_client(i)
    errors: list[BaseException] = []
    peer = raw_client(server.port, name, act, errors)
    result: RunResult = server.wait() if wait_s is None else server.wait(timeout=wait_s)
    peer.join(10)
    with open_database(config.storage.url, migrate=False) as db, db.session() as session:
        detail = queries.run_detail(session, result.run_id)
    return Intrusion(config, result, errors, detail)
