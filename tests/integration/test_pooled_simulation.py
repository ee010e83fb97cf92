"""Wall-clock ``geofl simulate`` runs its clients in a few long-lived worker processes.

Each client writes down, on every fit, the process it ran in, torch's thread count there
and its ``context.state`` fit counter (``apps/pool_testapp.py``), so these tests see how
the clients were laid out from the inside: N clients in fewer than N processes, state kept
across rounds, the thread cap applied in the child, and the same model as one process per
client.
"""

from __future__ import annotations

import itertools
import json
import shutil
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from geofl.storage import CheckpointRecord, CheckpointStore, open_database, queries

from .processes import run_geofl, write_config

pytest.importorskip("torch")  # the recording app reports torch's thread count

FLOWER_APP_DIR = Path(__file__).parent / "apps" / "flower_app_dir"


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _simulate(tmp_path: Path, clients: int, rounds: int, **simulation: Any) -> list[dict[str, Any]]:
    """Simulate the recording app; what its clients wrote down."""
    record_file = tmp_path / "fits.jsonl"
    config = write_config(
        tmp_path,
        run={"name": "pool", "rounds": rounds, "seed": 3},
        strategy={"name": "fedavg", "clients_per_round": clients, "min_clients": clients},
        evaluation={"every": 0},
        simulation={
            "clients": clients,
            "app": "pool_testapp:client_app",
            "node_config": {"record-file": str(record_file)},
            **simulation,
        },
    )
    result = run_geofl(tmp_path, "simulate", "-c", str(config), timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"round {rounds}/{rounds} committed" in result.stderr
    return _records(record_file)


def _by_partition(records: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    grouped: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        grouped[record["partition"]].append(record)
    return dict(grouped)


def test_pooled_clients_share_few_processes_and_keep_their_state(tmp_path: Path) -> None:
    records = _simulate(tmp_path, clients=4, rounds=3, workers=2)
    by_partition = _by_partition(records)
    assert sorted(by_partition) == [0, 1, 2, 3]
    assert len({r["pid"] for r in records}) == 2  # 4 clients, 2 worker processes
    for fits in by_partition.values():
        assert [r["fits"] for r in fits] == [1, 2, 3]  # context.state survived each round
        assert len({r["pid"] for r in fits}) == 1  # a client stays in its worker
    assert {r["threads"] for r in records} == {1}  # the default cap: one thread per process


def test_one_process_per_client_and_a_configured_thread_count(tmp_path: Path) -> None:
    records = _simulate(tmp_path, clients=3, rounds=2, pooled=False, client_threads=2)
    assert len({r["pid"] for r in records}) == 3
    assert {r["threads"] for r in records} == {2}
    assert all([r["fits"] for r in fits] == [1, 2] for fits in _by_partition(records).values())


def _final_model(directory: Path) -> dict[str, np.ndarray]:
    url = f"sqlite:///{directory / 'runs' / 'geofl.db'}"
    with open_database(url, migrate=False) as db, db.session() as session:
        row = queries.latest_checkpoint(session, 1)
        assert row is not None
        record = CheckpointRecord.from_row(row)
    weights, _ = CheckpointStore(directory / "runs" / "checkpoints").load(record)
    return weights


def _round_losses(directory: Path) -> list[float | None]:
    url = f"sqlite:///{directory / 'runs' / 'geofl.db'}"
    with open_database(url, migrate=False) as db, db.session() as session:
        return [r.train_loss for r in queries.run_detail(session, 1).rounds]


def test_pooled_and_per_process_runs_give_the_same_results(tmp_path: Path) -> None:
    pooled, separate = tmp_path / "pooled", tmp_path / "separate"
    pooled.mkdir()
    separate.mkdir()
    _simulate(pooled, clients=4, rounds=3, workers=2)
    _simulate(separate, clients=4, rounds=3, pooled=False)
    a, b = _final_model(pooled), _final_model(separate)
    assert sorted(a) == sorted(b)
    for name in a:
        np.testing.assert_allclose(a[name], b[name], rtol=1e-6, atol=0)
    assert float(a["w"].mean()) > 0  # the clients' updates arrived
    assert _round_losses(pooled) == _round_losses(separate)


_RECORDING_FLOWER_CLIENT = '''
"""flowernp's ClientApp, writing down its process, torch threads and context.state."""

import json
import os

import torch
from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from flowernp.task import num_examples, train

app = ClientApp()


@app.train()
def train_fn(msg: Message, context: Context) -> Message:
    partition_id = int(context.node_config["partition-id"])
    counter = context.state.metric_records.get("counter", MetricRecord({"fits": 0}))
    fits = int(counter["fits"]) + 1
    context.state["counter"] = MetricRecord({"fits": fits})
    line = {"partition": partition_id, "pid": os.getpid(), "threads": torch.get_num_threads(),
            "fits": fits}
    with open(os.path.join(os.getcwd(), "fits.jsonl"), "a", encoding="utf-8") as out:
        out.write(json.dumps(line) + "\\n")
    arrays = train(msg.content["arrays"], float(msg.content["config"]["lr"]), partition_id)
    metrics = MetricRecord({"num-examples": num_examples(partition_id)})
    return Message(content=RecordDict({"arrays": arrays, "metrics": metrics}), reply_to=msg)
'''


def test_flower_app_clients_are_pooled_and_keep_context_state(tmp_path: Path) -> None:
    with warnings.catch_warnings():  # flwr's import chain trips deprecation warnings
        warnings.simplefilter("ignore", DeprecationWarning)
        pytest.importorskip("flwr.clientapp")
    app_dir = tmp_path / "app"
    shutil.copytree(FLOWER_APP_DIR, app_dir, ignore=shutil.ignore_patterns("__pycache__"))
    (app_dir / "flowernp" / "client_app.py").write_text(_RECORDING_FLOWER_CLIENT)
    settings = tmp_path / "run.yaml"
    settings.write_text(
        yaml.safe_dump(
            {
                "server": {"address": "127.0.0.1:0", "heartbeat_interval_s": 0.5},
                "simulation": {"workers": 2},
            }
        )
    )
    result = run_geofl(
        tmp_path,
        "simulate",
        "--flower-app",
        str(app_dir),
        "-c",
        str(settings),
        "--run-config",
        "num-server-rounds=3 fraction-evaluate=0.0",
        timeout=240,
    )
    assert result.returncode == 0, result.stderr + result.stdout
    records = _records(tmp_path / "fits.jsonl")
    by_partition = _by_partition(records)
    assert sorted(by_partition) == [0, 1, 2]  # options.num-supernodes = 3
    assert len({r["pid"] for r in records}) == 2  # 3 clients, 2 worker processes
    for fits in by_partition.values():
        assert [r["fits"] for r in fits] == [1, 2, 3]
    assert {r["threads"] for r in records} == {1}


def test_clients_of_one_worker_take_turns_at_the_compute_slot(tmp_path: Path, serve: Any) -> None:
    """Three clients of one pool never fit at the same time (their fits sleep 0.2 s)."""
    import threading
    import time

    from geofl.client.app import Client, ClientContext
    from geofl.client.pool import PooledClient, run_pool
    from geofl.protocols.types import Config, Metrics, Weights, WeightsView

    from .conftest import run_config

    spans: list[tuple[float, float]] = []
    lock = threading.Lock()

    class Sleeper(Client):
        def fit(self, parameters: Weights, config: Config) -> tuple[WeightsView, int, Metrics]:
            began = time.monotonic()
            time.sleep(0.2)
            with lock:
                spans.append((began, time.monotonic()))
            return {k: v + 1 for k, v in parameters.items()}, 1, {}

    def factory(context: ClientContext) -> Client:
        return Sleeper()

    config = run_config(
        tmp_path,
        evaluation={"every": 0, "server": None},
        strategy={"clients_per_round": 3, "min_clients": 3},
    )
    server = serve(config)
    clients = [PooledClient(i, f"127.0.0.1:{server.port}") for i in range(3)]
    assert run_pool(factory, clients, 3, {}, reconnect_for_s=10) == 0
    assert server.wait().status == "completed"
    assert len(spans) == 3 * config.run.rounds
    ordered = sorted(spans)
    assert all(end <= next_began for (_, end), (next_began, _) in itertools.pairwise(ordered))
