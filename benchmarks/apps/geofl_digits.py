"""geofl client app and model factory for the ``mlp-digits`` workload.

A thin adapter: training, data and the initial model are :mod:`benchmarks.apps.digits_mlp`,
the same code the Flower ClientApp calls. The server's config carries the round number
(``server_round``), which seeds the client's shuffling as Flower's ``server-round`` does.
"""

from __future__ import annotations

from benchmarks.apps import digits_mlp
from geofl.client.app import Client, ClientContext
from geofl.protocols.types import Config, Metrics, Scalar, Weights, WeightsView

__all__ = ["DigitsMlpClient", "client_app", "int_value", "make_model"]


class DigitsMlpClient(Client):
    """Train :mod:`digits_mlp`'s MLP on one IID partition; evaluate on the shared test split."""

    def __init__(self, partition_id: int, num_partitions: int) -> None:
        digits_mlp.partition_indices(partition_id, num_partitions)  # fail at start, not in fit
        self.partition_id = partition_id
        self.num_partitions = num_partitions

    def fit(self, parameters: Weights, config: Config) -> tuple[WeightsView, int, Metrics]:
        """One local training of ``digits_mlp.LOCAL_EPOCHS`` epochs from ``parameters``."""
        server_round = int_value(config, "server_round")
        weights, examples, loss = digits_mlp.train(
            parameters, self.partition_id, self.num_partitions, server_round
        )
        return weights, examples, {"train_loss": loss}

    def evaluate(self, parameters: Weights, config: Config) -> tuple[float, int, Metrics]:
        """Loss and accuracy on the held-out split (the benchmark does not evaluate on clients)."""
        loss, share = digits_mlp.evaluate(parameters)
        return loss, 1, {"accuracy": share}


def int_value(values: dict[str, Scalar], key: str) -> int:
    """``values[key]`` as an integer (the apps' node config and round number)."""
    raw = values.get(key)
    if isinstance(raw, bool) or not isinstance(raw, int | str):
        raise ValueError(f"expected an integer {key!r}, got {raw!r}")
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"expected an integer {key!r}, got {raw!r}") from None


def client_app(context: ClientContext) -> Client:
    """The client for node config ``partition-id`` of ``num-partitions``."""
    return DigitsMlpClient(
        int_value(context.node_config, "partition-id"),
        int_value(context.node_config, "num-partitions"),
    )


def make_model() -> Weights:
    """The seeded initial model, identical to the Flower ServerApp's."""
    return dict(digits_mlp.initial_weights())
