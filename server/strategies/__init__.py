"""Server strategies: streaming aggregation of client deltas and server-side optimizers.

A round folds each client's delta into a :class:`StreamingMean` as it arrives (memory
O(model), never O(clients x model)), then :meth:`Strategy.apply` takes the server step.
Build strategies by name with :func:`make_strategy`. Flower 1.42's strategies run through
:class:`FlowerStrategy` (Flower is imported only when one is built).
"""

from geofl.server.strategies.adamw import AdamW
from geofl.server.strategies.base import Strategy, weighted_metrics
from geofl.server.strategies.checks import UpdateCheck
from geofl.server.strategies.errors import StrategyError, UpdateRejected
from geofl.server.strategies.fedavg import FedAvg, FedAvgM, FedProx
from geofl.server.strategies.fedopt import FedAdagrad, FedAdam, FedOpt, FedYogi
from geofl.server.strategies.flower import (
    FLOWER_STRATEGIES,
    FlowerAggregate,
    FlowerConfigError,
    FlowerReplies,
    FlowerStrategy,
)
from geofl.server.strategies.registry import STRATEGIES, make_strategy
from geofl.server.strategies.server_opt import ServerOptStrategy
from geofl.server.strategies.streaming import StreamingMean, TensorSpecLike

__all__ = [
    "FLOWER_STRATEGIES",
    "STRATEGIES",
    "AdamW",
    "FedAdagrad",
    "FedAdam",
    "FedAvg",
    "FedAvgM",
    "FedOpt",
    "FedProx",
    "FedYogi",
    "FlowerAggregate",
    "FlowerConfigError",
    "FlowerReplies",
    "FlowerStrategy",
    "ServerOptStrategy",
    "Strategy",
    "StrategyError",
    "StreamingMean",
    "TensorSpecLike",
    "UpdateCheck",
    "UpdateRejected",
    "make_strategy",
    "weighted_metrics",
]
