"""A robust rule in front of a server optimizer: FedAvg, FedAvgM, FedAdam, FedYogi, ...

The rule replaces the plain weighted mean of the round's deltas (:meth:`begin_round`
returns its accumulator); the wrapped optimizer takes the server step from the robust
aggregate exactly as it would from the mean. So ``robust: {rule: median}`` composes with
every native optimizer, and the optimizer's state and the rule's both checkpoint.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar

from geofl.protocols.types import Config, Metrics, Scalar, Weights, WeightsView
from geofl.server.strategies.base import Strategy
from geofl.server.strategies.robust.rule import RobustRule
from geofl.server.strategies.server_opt import ServerOptStrategy
from geofl.server.strategies.streaming import StreamingMean

__all__ = ["STATE_PREFIX", "RobustStrategy"]

#: State keys of the rule start with this (the optimizer's are ``slot/tensor``).
STATE_PREFIX = "robust:"


class RobustStrategy(Strategy):
    """``optimizer``'s server step from ``rule``'s aggregate of each round.

    Parameters
    ----------
    optimizer
        The server optimizer (its ``name`` is the strategy's).
    rule
        How a round's updates are aggregated.
    """

    name: ClassVar[str] = "robust"

    def __init__(self, optimizer: ServerOptStrategy, rule: RobustRule) -> None:
        self.optimizer = optimizer
        self.rule = rule

    def __repr__(self) -> str:
        return f"RobustStrategy({self.optimizer!r}, {self.rule!r})"

    def configure_fit(self, server_round: int, base_config: Mapping[str, Scalar]) -> Config:
        """The optimizer's fit config (e.g. FedProx's ``proximal_mu``)."""
        return self.optimizer.configure_fit(server_round, base_config)

    def configure_evaluate(self, server_round: int, base_config: Mapping[str, Scalar]) -> Config:
        """The optimizer's evaluation config."""
        return self.optimizer.configure_evaluate(server_round, base_config)

    def aggregate_metrics(self, results: Sequence[tuple[int, Mapping[str, Scalar]]]) -> Metrics:
        """The optimizer's metric aggregation."""
        return self.optimizer.aggregate_metrics(results)

    def begin_round(self, global_weights: WeightsView) -> StreamingMean:
        """The rule's accumulator for this round."""
        return self.rule.accumulator(global_weights)

    def apply(
        self, global_weights: WeightsView, mean_delta: WeightsView, server_round: int
    ) -> Weights:
        """The optimizer's step from the robust aggregate; then the rule takes the round in
        (only after the step succeeded, so a failed round changes neither)."""
        new_weights = self.optimizer.apply(global_weights, mean_delta, server_round)
        self.rule.commit(mean_delta)
        return new_weights

    def state(self) -> Weights:
        """The optimizer's state, and the rule's under :data:`STATE_PREFIX`."""
        state = self.optimizer.state()
        state.update({f"{STATE_PREFIX}{key}": value for key, value in self.rule.state().items()})
        return state

    def load_state(self, state: WeightsView) -> None:
        """Restore both from :meth:`state`'s keys."""
        ours = {
            key.removeprefix(STATE_PREFIX): value
            for key, value in state.items()
            if key.startswith(STATE_PREFIX)
        }
        theirs = {k: v for k, v in state.items() if not k.startswith(STATE_PREFIX)}
        self.rule.load_state(ours)
        self.optimizer.load_state(theirs)
