"""geofl client app and model factory for the ``cnn-fashion`` workload.

A thin adapter, as :mod:`benchmarks.apps.geofl_digits` is for the digits MLP: training,
data and the initial model are :mod:`benchmarks.apps.fashion_cnn`, the same code the
Flower ClientApp calls; the server's ``server_round`` seeds the client's shuffling.
"""

from __future__ import annotations

from benchmarks.apps import fashion_cnn
from benchmarks.apps.geofl_digits import int_value
from geofl.client.app import Client, ClientContext
from geofl.protocols.types import Config, Metrics, Weights, WeightsView

__all__ = ["FashionCnnClient", "client_app", "make_model"]


class FashionCnnClient(Client):
    """Train :mod:`fashion_cnn`'s CNN on one IID partition; evaluate on the test images."""

    def __init__(self, partition_id: int, num_partitions: int) -> None:
        fashion_cnn.partition_indices(partition_id, num_partitions)  # fail at start, not in fit
        self.partition_id = partition_id
        self.num_partitions = num_partitions

    def fit(self, parameters: Weights, config: Config) -> tuple[WeightsView, int, Metrics]:
        """One local training of ``fashion_cnn.LOCAL_EPOCHS`` epoch(s) from ``parameters``."""
        weights, examples, loss = fashion_cnn.train(
            parameters, self.partition_id, self.num_partitions, int_value(config, "server_round")
        )
        return weights, examples, {"train_loss": loss}

    def evaluate(self, parameters: Weights, config: Config) -> tuple[float, int, Metrics]:
        """Loss and accuracy on the test images (the benchmark does not evaluate on clients)."""
        loss, share = fashion_cnn.evaluate(parameters)
        return loss, 1, {"accuracy": share}


def client_app(context: ClientContext) -> Client:
    """The client for node config ``partition-id`` of ``num-partitions``."""
    return FashionCnnClient(
        int_value(context.node_config, "partition-id"),
        int_value(context.node_config, "num-partitions"),
    )


def make_model() -> Weights:
    """The seeded initial model, identical to the Flower ServerApp's."""
    return dict(fashion_cnn.initial_weights())
