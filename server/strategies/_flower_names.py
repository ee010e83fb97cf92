"""What a run may name under ``strategy.flower``, and the error when it is wrong.

Part of :mod:`geofl.server.strategies.flower` (which exports these names), kept apart so
that the Flower-importing :mod:`~geofl.server.strategies._flower_bridge` can use them
without importing that module back.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from geofl.protocols.errors import GeoflError

__all__ = ["FLOWER_STRATEGIES", "FLOWER_WRAPPERS", "SAMPLING_ARGS", "FlowerConfigError"]

#: Flower's differential-privacy wrappers: they take the strategy they wrap (``wraps``).
FLOWER_WRAPPERS = frozenset(
    {
        "DifferentialPrivacyServerSideFixedClipping",
        "DifferentialPrivacyClientSideFixedClipping",
        "DifferentialPrivacyServerSideAdaptiveClipping",
        "DifferentialPrivacyClientSideAdaptiveClipping",
    }
)
#: Class names from ``flwr.serverapp.strategy`` a run may name under ``strategy.flower``.
FLOWER_STRATEGIES: tuple[str, ...] = (
    "FedAvg",
    "FedAvgM",
    "FedProx",
    "FedAdagrad",
    "FedAdam",
    "FedYogi",
    "FedMedian",
    "FedTrimmedAvg",
    "Krum",
    "MultiKrum",
    "Bulyan",
    "QFedAvg",
    *sorted(FLOWER_WRAPPERS),
)
#: Flower's cohort-sampling arguments, refused, with the geofl settings that replace them.
SAMPLING_ARGS: Mapping[str, str] = MappingProxyType(
    {
        "fraction_train": "strategy.clients_per_round (times schedule.over_select)",
        "min_train_nodes": "strategy.min_clients",
        "min_available_nodes": "strategy.min_clients",
        "fraction_evaluate": "evaluation.clients (evaluation.every: 0 turns it off)",
        "min_evaluate_nodes": "evaluation.clients",
    }
)


class FlowerConfigError(GeoflError, ValueError):
    """A Flower strategy's configuration is wrong.

    Attributes
    ----------
    path
        Key path below the ``strategy`` section, e.g. ``("args", "eta")``.
    message
        What is wrong there.
    """

    def __init__(self, path: tuple[str, ...], message: str) -> None:
        super().__init__(f"{'.'.join(path)}: {message}" if path else message)
        self.path = path
        self.message = message
