"""geofl client app for the secure-aggregation benchmark: echo plus a constant, with dropouts.

:class:`~benchmarks.apps.geofl_echo.EchoPlusConstant` with the Flower app's constant,
``0.001 * (1 + partition-id)`` (weight 1), so that both systems aggregate the same values and
one correctness tolerance fits both; except in the rounds in which this client is drawn to
drop out: its fit then raises after the model arrived. The runtime reports the error, so in a
secure round the server sees a client that shared its secrets but uploaded nothing and must
remove the masks it left in its neighbours' uploads; the client stays connected and takes
part again in the next round. That is what the Flower app's ``dropout_mod`` does in Flower's
``collect_masked_vectors`` stage, and the draw is the same: a fresh seeded choice of
``round(fraction * clients)`` partitions per round.

Node config: ``partition-id``, ``num-partitions`` (the number of clients), ``drop-fraction``
and ``drop-seed`` (absent: nobody drops). Kept free of the benchmark harness's imports: every
client process loads this module.
"""

from __future__ import annotations

import numpy as np

from benchmarks.apps.geofl_echo import EchoPlusConstant
from geofl.client.app import Client, ClientContext
from geofl.protocols.types import Config, Metrics, Scalar, Weights, WeightsView

__all__ = [
    "ClientDropoutError",
    "DroppingEcho",
    "client_app",
    "client_shift",
    "dropped_partitions",
]


class ClientDropoutError(RuntimeError):
    """Raised by a client playing a dropout; geofl records the fit as failed."""


def client_shift(partition_id: int) -> float:
    """What client ``partition_id`` adds to every parameter (the Flower app's constant)."""
    if partition_id < 0:
        raise ValueError(f"partition_id must be >= 0, got {partition_id}")
    return 0.001 * (1 + partition_id)


def dropped_partitions(
    clients: int, fraction: float, server_round: int, seed: int
) -> frozenset[int]:
    """The partitions that drop out in ``server_round``: ``round(fraction * clients)`` of them.

    The same seeded draw as the Flower app's, so both systems lose the same clients.
    """
    if clients < 1:
        raise ValueError(f"clients must be >= 1, got {clients}")
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"dropout fraction must be in [0, 1), got {fraction}")
    if server_round < 1:
        raise ValueError(f"server_round must be >= 1, got {server_round}")
    count = round(fraction * clients)
    if count == 0:
        return frozenset()
    rng = np.random.default_rng([seed, server_round])
    return frozenset(int(p) for p in rng.choice(clients, size=count, replace=False))


class DroppingEcho(EchoPlusConstant):
    """Echo plus :func:`client_shift`; raises in the rounds this partition drops out."""

    def __init__(self, partition_id: int, clients: int, fraction: float, seed: int) -> None:
        super().__init__(client_shift(partition_id))
        self.partition_id = partition_id
        self.clients = clients
        self.fraction = fraction
        self.seed = seed

    def fit(self, parameters: Weights, config: Config) -> tuple[WeightsView, int, Metrics]:
        """The echo, with ``partition-id`` in the clear (the benchmark checks the model by it)."""
        server_round = config.get("server_round")
        if not isinstance(server_round, int) or isinstance(server_round, bool):
            raise ValueError(f"fit config lacks an integer server_round: {config!r}")
        if self.partition_id in dropped_partitions(
            self.clients, self.fraction, server_round, self.seed
        ):
            raise ClientDropoutError(
                f"partition {self.partition_id} drops out in round {server_round}"
            )
        weights, examples, _ = super().fit(parameters, config)
        return weights, examples, {"partition-id": self.partition_id}


def _int(config: dict[str, Scalar], key: str, default: int | None = None) -> int:
    raw = config.get(key, default)
    if not isinstance(raw, int) or isinstance(raw, bool):
        raise ValueError(f"node config {key!r} must be an integer, got {raw!r}")
    return raw


def client_app(context: ClientContext) -> Client:
    """Build this node's client from its node config (see the module docstring)."""
    config = context.node_config
    raw_fraction = config.get("drop-fraction", 0.0)
    if not isinstance(raw_fraction, int | float) or isinstance(raw_fraction, bool):
        raise ValueError(f"node config 'drop-fraction' must be a number, got {raw_fraction!r}")
    return DroppingEcho(
        partition_id=_int(config, "partition-id"),
        clients=_int(config, "num-partitions"),
        fraction=float(raw_fraction),
        seed=_int(config, "drop-seed", 0),
    )
