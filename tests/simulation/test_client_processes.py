"""How a wall-clock simulation lays its clients out over processes, and their command lines."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from geofl.client.pool import PooledClient, parse_client, run_pool
from geofl.server.simulation.client_processes import (
    THREAD_VARIABLES,
    ClientLaunch,
    ClientTarget,
    start_clients,
    thread_env,
    worker_count,
    worker_members,
    worker_name,
)
from geofl.server.simulation.processes import ProcessGroup


class RecordingGroup(ProcessGroup):
    """A process group that records what it would start instead of starting it."""

    def __init__(self) -> None:
        super().__init__()
        self.commands: list[tuple[str, list[str], dict[str, str]]] = []

    def start(
        self, name: str, command: Sequence[str], env: Mapping[str, str] | None = None
    ) -> None:
        self.commands.append((name, list(command), dict(env or {})))


def _targets(n: int, port: int = 5000) -> list[ClientTarget]:
    return [ClientTarget(i, port) for i in range(n)]


def test_clients_are_dealt_round_robin_over_the_workers() -> None:
    groups = worker_members(_targets(5), 2)
    assert [[t.index for t in g] for g in groups] == [[0, 2, 4], [1, 3]]
    assert [[t.index for t in g] for g in worker_members(_targets(2), 4)] == [[0], [1]]


def test_a_worker_is_named_after_its_clients_and_long_lists_are_cut() -> None:
    assert worker_name([1, 3]) == "clients 1,3"
    assert worker_name(list(range(0, 100, 2))) == "clients 0,2,4,6,8,...,98 (50)"


def test_worker_count_defaults_to_the_cores_and_never_exceeds_the_clients() -> None:
    assert worker_count(3, 10) == 3
    assert worker_count(8, 2) == 2
    assert worker_count(0, 5) == 1
    assert 1 <= worker_count(None, 100) <= 100


def test_thread_cap_is_in_the_environment_and_zero_leaves_it_alone() -> None:
    capped = thread_env(1, {"PATH": "/bin", "OMP_NUM_THREADS": "8"})
    assert all(capped[name] == "1" for name in THREAD_VARIABLES)
    assert capped["PATH"] == "/bin"
    assert thread_env(0, {"OMP_NUM_THREADS": "8"}) == {"OMP_NUM_THREADS": "8"}


def test_pooled_launch_starts_one_pool_process_per_worker() -> None:
    group = RecordingGroup()
    launch = ClientLaunch(
        app="pkg.mod:app",
        clients=5,
        node_config={"flag": True},
        threads=2,
        workers=2,
        env={"PATH": "/bin"},
    )
    targets = [ClientTarget(i, 6000 + i, "eu" if i % 2 else None) for i in range(5)]
    start_clients(group, launch, targets)
    assert [name for name, _, _ in group.commands] == ["clients 0,2,4", "clients 1,3"]
    _, command, env = group.commands[1]
    assert command[1:3] == ["-m", "geofl.client.pool"]
    clients = [command[i + 1] for i, arg in enumerate(command) if arg == "--client"]
    assert clients == ["1,127.0.0.1:6001,eu", "3,127.0.0.1:6003,eu"]
    assert command[command.index("--num-partitions") + 1] == "5"
    assert command[command.index("--node-config") + 1 :] == ["flag=true"]
    assert env["OMP_NUM_THREADS"] == "2" and env["PATH"] == "/bin"


def test_unpooled_launch_starts_one_geofl_client_per_client() -> None:
    group = RecordingGroup()
    start_clients(group, ClientLaunch(app="pkg.mod:app", clients=3, pooled=False), _targets(3))
    assert [name for name, _, _ in group.commands] == ["client 0", "client 1", "client 2"]
    assert all(command[1:3] == ["-m", "geofl.client"] for _, command, _ in group.commands)
    assert all(env["OMP_NUM_THREADS"] == "1" for _, _, env in group.commands)


def test_pool_client_arguments_parse_and_bad_ones_say_what_is_wrong() -> None:
    assert parse_client("3,127.0.0.1:5000") == PooledClient(3, "127.0.0.1:5000", None)
    assert parse_client("0,h:1,eu") == PooledClient(0, "h:1", "eu")
    for bad, message in [
        ("x,h:1", "not an integer"),
        ("-1,h:1", ">= 0"),
        ("3", "INDEX,HOST:PORT"),
        ("3,", "INDEX,HOST:PORT"),
    ]:
        with pytest.raises(ValueError, match=message):
            parse_client(bad)


def test_a_pool_whose_server_is_unreachable_exits_as_a_client_would() -> None:
    # Nothing listens on port 1: every client gives up, and the worker's exit code says so.
    code = run_pool(
        lambda context: pytest.fail("no client is built without a session"),
        [PooledClient(0, "127.0.0.1:1"), PooledClient(1, "127.0.0.1:1")],
        num_partitions=2,
        node_config={},
        reconnect_for_s=0.0,
    )
    assert code == 6  # EXIT_UNREACHABLE, as `geofl client` exits
