"""ServerApps for the parity tests (tests/integration/test_flower_parity.py)."""

import time

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.common import ndarrays_to_parameters
from flwr.server import ServerAppComponents, ServerConfig
from flwr.server.strategy import FedAvg as LegacyFedAvg
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg


def _arrays() -> ArrayRecord:
    return ArrayRecord({"w": Array(np.zeros((2, 2), dtype=np.float32))})


def _train_all(grid: Grid, node_ids: list[int], sleep_s: float = 0.0) -> list[Message]:
    content = RecordDict({"arrays": _arrays(), "config": ConfigRecord({"sleep-s": sleep_s})})
    return [Message(content, node, "train", group_id="1") for node in node_ids]


# ---------------------------------------------------------------- waiting for nodes

snapshot_app = ServerApp()


@snapshot_app.main()
def snapshot(grid: Grid, context: Context) -> None:
    """Round 1 trains the nodes connected when the ServerApp starts, with no waiting."""
    node_ids = list(grid.get_node_ids())
    grid.send_and_receive(_train_all(grid, node_ids))


# ---------------------------------------------------------------- a failing ServerApp

raising_app = ServerApp()


@raising_app.main()
def raising(grid: Grid, context: Context) -> None:
    """Sends every node a long train message, then fails while they work on it."""
    grid.push_messages(_train_all(grid, list(grid.get_node_ids()), sleep_s=60.0))
    time.sleep(0.5)
    raise ValueError("deliberate ServerApp failure")


# ---------------------------------------------------------------- server-side results


class CustomAggregation(FedAvg):
    """FedAvg whose aggregate_train adds a metric of its own."""

    def aggregate_train(self, server_round, replies):  # type: ignore[no-untyped-def]
        arrays, metrics = super().aggregate_train(server_round, replies)
        extra = MetricRecord({**(metrics or {}), "custom-train": 40.0 + server_round})
        return arrays, extra


def central_evaluation(server_round: int, arrays: ArrayRecord) -> MetricRecord:
    """The global model's mean weight, as a server-side evaluation would report it."""
    w_mean = float(arrays["w"].numpy().mean())
    return MetricRecord({"central-w-mean": w_mean, "loss": 1.0 / (server_round + 1)})


metrics_app = ServerApp()


@metrics_app.main()
def metrics(grid: Grid, context: Context) -> None:
    """Two FedAvg rounds with central evaluation, then a final evaluation of its own."""
    strategy = CustomAggregation(fraction_evaluate=1.0, min_available_nodes=1)
    result = strategy.start(
        grid=grid,
        initial_arrays=_arrays(),
        num_rounds=int(context.run_config["num-server-rounds"]),
        evaluate_fn=central_evaluation,
    )
    content = RecordDict({"arrays": result.arrays, "config": ConfigRecord({})})
    final = [Message(content, node, "evaluate", group_id="final") for node in grid.get_node_ids()]
    grid.send_and_receive(final)


# ---------------------------------------------------------------- the legacy API


def legacy_central_evaluation(server_round, parameters, config):  # type: ignore[no-untyped-def]
    """The legacy evaluate_fn: (loss, metrics) of the global model."""
    return 1.0 / (server_round + 1), {"central-w-mean": float(parameters[0].mean())}


def legacy_server_fn(context: Context) -> ServerAppComponents:
    """Legacy FedAvg on every node, with central evaluation and custom fit metrics."""
    strategy = LegacyFedAvg(
        fraction_evaluate=1.0,
        min_fit_clients=3,
        min_evaluate_clients=3,
        min_available_clients=3,
        initial_parameters=ndarrays_to_parameters([np.zeros((2, 2), dtype=np.float32)]),
        evaluate_fn=legacy_central_evaluation,
        fit_metrics_aggregation_fn=lambda results: {"custom-fit": 7.0},
    )
    rounds = int(context.run_config["num-server-rounds"])
    return ServerAppComponents(strategy=strategy, config=ServerConfig(num_rounds=rounds))


legacy_app = ServerApp(server_fn=legacy_server_fn)
