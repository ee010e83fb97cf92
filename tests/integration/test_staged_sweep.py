"""A run that ends keeps nothing staged, even an update no version took in.

A FedBuff coordinator killed with more updates staged than its remaining versions fold
(arrivals after the buffer was full are staged too) is restarted: its last version takes
the oldest K, and the rest are never folded. Once the run has completed, no staged row
and no staged file of it is left.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np

from geofl.server.coordinator import Coordinator, RunResult
from geofl.server.models.staging import STAGED_DIRECTORY
from geofl.server.nodes.outcomes import DeltaUpdate, Outcome
from geofl.server.nodes.registry import TaskRecord
from geofl.storage import open_database, queries

from .conftest import run_config

STAGED = 3  # updates on version 0 staged before the "kill"; the one version takes K = 2


def test_updates_no_version_took_in_are_dropped_when_the_run_completes(tmp_path: Path) -> None:
    config = run_config(
        tmp_path,
        run={"rounds": 1},
        model="geofl_testapp:make_float_model",
        strategy={"clients_per_round": 2, "min_clients": 1},
        evaluation={"every": 0, "server": "geofl_testapp:server_evaluate"},
        schedule={
            "mode": "async",
            "deadline_s": 20,
            "wait_for_clients_s": 5,
            "fedbuff": {"buffer_size": 2, "concurrency": 2, "updates": 1},
        },
    )

    async def killed() -> None:
        """A first coordinator accepts three updates, then stops without ending the run."""
        coordinator = Coordinator(config)
        nodes = coordinator.join_nodes([(f"site-{i}", None) for i in range(STAGED)])
        loop = asyncio.get_running_loop()
        for index, node_id in enumerate(nodes):
            task = TaskRecord(
                task_id=100 + index,
                node_id=node_id,
                kind="fit",
                round=1,
                model_version=0,
                config={},
                deadline=time.time() + 20,
                future=loop.create_future(),
                issued_at=time.time(),
            )
            shift = float(index + 1)
            update = {"w": np.full((4, 3), shift, np.float32), "b": np.full(3, shift, np.float32)}
            outcome = Outcome("ok", num_examples=10, payload=DeltaUpdate(update))
            await coordinator.uploads.stage(task, outcome)
        await coordinator.stop()

    async def restarted() -> RunResult:
        coordinator = Coordinator(config)
        await coordinator.start()
        return await coordinator.run()

    asyncio.run(killed())
    result = asyncio.run(restarted())
    assert result.status == "completed", result.error
    with open_database(config.storage.url, migrate=False) as db, db.session() as session:
        detail = queries.run_detail(session, result.run_id)
        staged = queries.staged_updates(session, result.run_id)
    fits = [p for p in detail.participations if p.kind == "fit" and p.status == "ok"]
    assert sorted(p.task_id for p in fits) == [100, 101]  # the oldest K made version 1
    assert staged == []
    staged_dir = Path(config.storage.checkpoints) / STAGED_DIRECTORY
    assert not list(staged_dir.glob("*.safetensors"))
