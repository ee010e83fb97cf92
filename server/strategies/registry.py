"""Strategy registry: the names a run's YAML may use, and a factory.

``make_strategy("flower", flower=..., args=..., wraps=...)`` builds a
:class:`~geofl.server.strategies.flower.FlowerStrategy` (Flower 1.42's strategies run
through an adapter, so they are not listed in :data:`STRATEGIES`).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from geofl.server.strategies.adamw import AdamW
from geofl.server.strategies.base import Strategy
from geofl.server.strategies.fedavg import FedAvg, FedAvgM, FedProx
from geofl.server.strategies.fedopt import FedAdagrad, FedAdam, FedYogi
from geofl.server.strategies.flower import FlowerStrategy

__all__ = ["STRATEGIES", "make_strategy"]

#: Registry name -> strategy class (read-only).
STRATEGIES: Mapping[str, type[Strategy]] = MappingProxyType(
    {cls.name: cls for cls in (FedAvg, FedAvgM, FedProx, FedAdam, FedYogi, FedAdagrad, AdamW)}
)


def make_strategy(name: str, **params: Any) -> Strategy:
    """Build the strategy registered as ``name`` with keyword hyperparameters.

    ``name="flower"`` builds a Flower strategy from ``flower``, ``args`` and ``wraps``.

    Raises
    ------
    ValueError
        If ``name`` is unknown, or a hyperparameter is unknown, missing or out of range;
        the message names the strategy and the parameter.
    """
    if name == FlowerStrategy.name:
        try:
            return FlowerStrategy(**params)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"strategy {name!r}: {exc}") from exc
    try:
        cls = STRATEGIES[name]
    except KeyError:
        raise ValueError(
            f"unknown strategy {name!r}; known strategies: {sorted(STRATEGIES)}"
        ) from None
    try:
        return cls(**params)
    except TypeError as exc:
        raise ValueError(f"strategy {name!r}: {exc}") from exc
    except ValueError as exc:
        raise ValueError(f"strategy {name!r}: {exc}") from exc
