"""One fit or evaluation of a client app, independent of how the task arrived.

Shared by the networked runtime (:mod:`geofl.client.runtime`) and the simulator's
virtual clients (:mod:`geofl.server.simulation.workers`), so both run user code the same
way and check its output with the same rules.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from geofl.client.app import Client
from geofl.protocols.tensors import Difference, check_matches, spec_of
from geofl.protocols.types import Config, Metrics, Weights

__all__ = ["Evaluation", "FitUpdate", "evaluate_model", "fit_update", "reported_loss"]


@dataclass
class FitUpdate:
    """A local training result: the difference to the global model, lazily computed."""

    delta: dict[str, Difference]
    num_examples: int
    metrics: Metrics


@dataclass
class Evaluation:
    """A local evaluation result."""

    loss: float
    num_examples: int
    metrics: Metrics


def fit_update(client: Client, global_weights: Weights, config: Config) -> FitUpdate:
    """Train from ``global_weights`` and return the update.

    The client gets a copy (it may train in place); its output must match the global
    model's names, shapes and dtypes (:class:`geofl.protocols.errors.TensorError` if not).
    """
    params = {name: value.copy() for name, value in global_weights.items()}
    new, num_examples, metrics = client.fit(params, config)
    arrays = {name: np.asarray(value) for name, value in new.items()}
    check_matches(spec_of(global_weights), arrays)
    # Differences are computed piece by piece where they are consumed: no third copy.
    delta = {name: Difference(arrays[name], base) for name, base in global_weights.items()}
    return FitUpdate(delta, int(num_examples), dict(metrics))


def evaluate_model(client: Client, global_weights: Weights, config: Config) -> Evaluation:
    """Evaluate ``global_weights`` on the client's data."""
    params = {name: value.copy() for name, value in global_weights.items()}
    loss, num_examples, metrics = client.evaluate(params, config)
    return Evaluation(float(loss), int(num_examples), dict(metrics))


def reported_loss(metrics: Metrics) -> float | None:
    """The training loss a fit reported, as ``train_loss`` or ``loss`` (None if neither)."""
    loss = metrics.get("train_loss", metrics.get("loss"))
    if isinstance(loss, (int, float)) and not isinstance(loss, bool):
        return float(loss)
    return None
