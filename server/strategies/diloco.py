"""DiLoCo's outer optimizer (Douillard et al., 2023): Nesterov momentum on the pseudo-gradient.

Clients run H inner steps (``local_steps`` in the round config) from the global model; the
server treats the averaged change as a pseudo-gradient ``g = -mean_delta`` and takes one
outer SGD step with Nesterov momentum, in PyTorch's formulation::

    v = mu * v + g
    w = w - lr * (g + mu * v)

Written in geofl's sign convention (``mean_delta = client - global``), with ``u = -v``::

    u = mu * u + mean_delta
    w = w + lr * (mean_delta + mu * u)

With ``mu = 0`` and ``lr = 1`` this is FedAvg.

With a :class:`~geofl.server.scheduling.partial_sync.LayerSyncPlanner` the rounds are
partially synchronized: each round's config names the layer groups the clients send
after each segment of their local steps (:mod:`geofl.protocols.partial_sync`), and every
outer step tells the planner how far each layer moved.

With a :class:`~geofl.server.scheduling.streaming.FragmentSchedule` it is Streaming
DiLoCo (Douillard et al., 2025): each round synchronizes one fragment of the model
(:mod:`geofl.protocols.streaming`); the clients upload that fragment only (the other
tensors arrive as zeros), and the outer step changes that fragment's weights and
momentum only, so each fragment has its own outer optimizer that steps every P rounds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import numpy as np

from geofl.protocols.tensors import ModelSpec, spec_of
from geofl.protocols.types import Config, Scalar, Weights, WeightsView
from geofl.server.scheduling.partial_sync import LayerSyncPlanner
from geofl.server.scheduling.streaming import FragmentSchedule
from geofl.server.strategies._numeric import F64Array
from geofl.server.strategies.fedavg import FedAvg
from geofl.server.strategies.server_opt import check_range
from geofl.server.strategies.streaming import StreamingMean

__all__ = ["DiLoCo"]


class DiLoCo(FedAvg):
    """Outer Nesterov SGD on the averaged pseudo-gradient.

    Parameters
    ----------
    outer_lr
        Outer learning rate (DiLoCo uses 0.7), > 0.
    outer_momentum
        Nesterov momentum in [0, 1) (DiLoCo uses 0.9).
    layer_sync
        Plans partially synchronized rounds; None sends the whole model after the last step.
    streaming
        Streaming DiLoCo's fragments, one synchronized per round; None syncs the whole model.
    """

    name: ClassVar[str] = "diloco"
    slots: ClassVar[tuple[str, ...]] = ("momentum",)

    def __init__(
        self,
        outer_lr: float = 0.7,
        outer_momentum: float = 0.9,
        layer_sync: LayerSyncPlanner | None = None,
        streaming: FragmentSchedule | None = None,
    ) -> None:
        super().__init__(server_lr=outer_lr)
        self.outer_momentum = check_range(
            "outer_momentum", outer_momentum, 0.0, 1.0, low_open=False, high_open=True
        )
        if layer_sync is not None and streaming is not None:
            raise ValueError("partial sync and Streaming DiLoCo cannot be combined")
        self.layer_sync = layer_sync
        self.streaming = streaming
        self._spec: ModelSpec | None = None

    def begin_round(self, global_weights: WeightsView) -> StreamingMean:
        """Remember the model's layout (the round's groups are planned over it)."""
        self._spec = spec_of(global_weights)
        return super().begin_round(global_weights)

    def configure_fit(self, server_round: int, base_config: Mapping[str, Scalar]) -> Config:
        """Add this round's layer groups (partial sync) or fragment (Streaming DiLoCo)."""
        config = super().configure_fit(server_round, base_config)
        if self.layer_sync is not None and self._spec is not None:
            config.update(self.layer_sync.round_config(self._spec, config))
        if self.streaming is not None and self._spec is not None:
            config.update(self.streaming.round_config(self._spec, server_round))
        return config

    def apply(
        self, global_weights: WeightsView, mean_delta: WeightsView, server_round: int
    ) -> Weights:
        """The outer step; the layer planner learns how far each layer moved.

        In a streaming round only the round's fragment steps: the other tensors keep
        their weights and momentum (their mean delta is zero, but momentum alone would
        still move them).
        """
        if self.streaming is not None:
            return self._apply_fragment(global_weights, mean_delta, server_round)
        new = super().apply(global_weights, mean_delta, server_round)
        if self.layer_sync is not None:
            self.layer_sync.observe(global_weights, new)
        return new

    def _apply_fragment(
        self, global_weights: WeightsView, mean_delta: WeightsView, server_round: int
    ) -> Weights:
        assert self.streaming is not None
        fragment = set(self.streaming.fragment(spec_of(global_weights), server_round))
        before = self.state()
        stepped = super().apply(global_weights, mean_delta, server_round)
        after = self.state()
        kept = {
            key: before.get(key, value)
            for key, value in after.items()
            if key.partition("/")[2] not in fragment
        }
        self.load_state({**after, **kept})
        return {
            name: stepped[name] if name in fragment else np.array(value, copy=True)
            for name, value in global_weights.items()
        }

    def hyperparameters(self) -> Config:
        """Return ``{"outer_lr": ..., "outer_momentum": ...}``."""
        return {"outer_lr": self.server_lr, "outer_momentum": self.outer_momentum}

    def _step(
        self, delta: F64Array, state: Mapping[str, F64Array], server_round: int
    ) -> tuple[F64Array, dict[str, F64Array]]:
        """Nesterov look-ahead: step along the delta plus the updated momentum."""
        velocity = self.outer_momentum * state["momentum"] + delta
        return self.server_lr * (delta + self.outer_momentum * velocity), {"momentum": velocity}
