"""Flower 1.42 strategies (``flwr.serverapp.strategy``) aggregating inside geofl's rounds.

A run configured with ``strategy: {flower: FedAdam, args: {eta: 0.01}}`` keeps geofl's
round engine, scheduler, transport and records; only the aggregation is Flower's, through
the strategy's own hooks:

* ``configure_fit`` / ``configure_evaluate`` call ``configure_train`` /
  ``configure_evaluate`` with the global model and geofl's round config, and send the
  config Flower puts in its messages (``server-round``, FedProx's ``proximal-mu``, the DP
  wrappers' ``clipping_norm``...). geofl's scheduler has already chosen the cohort; Flower
  samples from a stand-in grid holding just enough node ids for its ``min_*_nodes``, so its
  sampling picks everyone and changes nothing. Flower's sampling arguments
  (``fraction_*``, ``min_*_nodes``) are refused: ``clients_per_round``, ``min_clients`` and
  ``evaluation.clients`` decide.
* Each update arrives as a delta against the global model; :class:`FlowerReplies` keeps
  it, zero-copy, as delivered (a view of the upload's staging buffer or of its memory-mapped
  spool file), then rebuilds every client's arrays (global + delta, in the model's dtypes)
  into a Flower reply ``Message`` (ArrayRecord ``arrays``; MetricRecord ``metrics`` with
  ``num-examples`` and the client's numeric metrics) and calls ``aggregate_train`` once
  with all of them. Flower's arrays, cast back to the model's dtypes, become the new
  global model: :meth:`FlowerStrategy.apply` returns them untouched.
* ``aggregate_metrics`` goes through ``aggregate_evaluate`` (for train metrics too: both
  default to the same example-weighted mean in Flower, and YAML cannot set another).

Memory: Flower needs every reply at once (FedMedian, Krum and Bulyan compare them), so a
round holds O(clients x model): the kept updates (in staging memory, or in the page cache
when spooled to disk; ``server.upload_buffer_bytes`` no longer bounds them once handed
over) and, while ``aggregate_train`` runs, one full model per client in Flower's records.

State: FedAdam/FedYogi/FedAdagrad's moments, FedAvgM's momentum and the adaptive-clipping
wrappers' clipping norm are published by :meth:`FlowerStrategy.state` and restored by
:meth:`FlowerStrategy.load_state`, so checkpoints resume them bit for bit. A round that
fails inside Flower, or whose result is refused, leaves the state as it was.

Client metrics: the engine hands ``add`` only the update and its weight; the fit metrics
reach the strategy when the engine aggregates them, after the last update and before
``mean`` (as ``engine.py`` does). :meth:`FlowerReplies.attach_metrics` pairs them with the
updates when their weights match one for one; otherwise replies carry ``num-examples``
only, and strategies that read client metrics (QFedAvg's ``train_loss``, client-side
adaptive clipping's ``norm_bit``) fail the round with Flower's error.

Not supported: ``FedXgbBagging``/``FedXgbCyclic`` (tree models as bytes; Cyclic trains one
node at a time, which needs Flower's own node choice), and arguments holding Python
objects: the DP wrappers' ``accountant``, Bulyan's ``selection_rule``, custom metric
aggregation functions.
"""

from __future__ import annotations

import importlib
import logging
import warnings
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar

from geofl.protocols.errors import GeoflError
from geofl.protocols.types import Config, Metrics, Scalar, Weights, WeightsView
from geofl.server.strategies._flower_replies import FlowerAggregate, FlowerReplies, common_metrics
from geofl.server.strategies._flower_state import Snapshot, StateSlots, restore, snapshot
from geofl.server.strategies.base import Strategy
from geofl.server.strategies.errors import StrategyError

if TYPE_CHECKING:
    from flwr.app import Message

__all__ = [
    "FLOWER_STRATEGIES",
    "FLOWER_WRAPPERS",
    "SAMPLING_ARGS",
    "FlowerAggregate",
    "FlowerConfigError",
    "FlowerReplies",
    "FlowerStrategy",
    "check_flower_strategy",
]

log = logging.getLogger(__name__)

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
_INSTALL_HINT = "pip install 'flwr>=1.42,<1.43'"


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


def _import_bridge() -> None:
    """Import Flower (once), turning its absence into a clear configuration error."""
    try:
        with warnings.catch_warnings():  # flwr's import chain trips DeprecationWarnings (click)
            warnings.simplefilter("ignore", DeprecationWarning)
            importlib.import_module("geofl.server.strategies._flower_bridge")
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] != "flwr":
            raise
        raise FlowerConfigError(("flower",), f"needs Flower 1.42: {_INSTALL_HINT}") from exc


def check_flower_strategy(
    flower: str, args: Mapping[str, object], wraps: Mapping[str, Any] | None = None
) -> None:
    """Construct the Flower strategy once, to validate a configuration.

    Raises
    ------
    FlowerConfigError
        Naming the key (``flower``, ``args.<name>``, ``wraps...``) that is wrong.
    """
    _import_bridge()
    from geofl.server.strategies import _flower_bridge as bridge

    bridge.build(flower, args, wraps)


class FlowerStrategy(Strategy):
    """A Flower 1.42 strategy behind geofl's streaming :class:`Strategy` interface.

    See the module docstring for how each hook maps and what it costs.

    Parameters
    ----------
    flower
        Class name in ``flwr.serverapp.strategy``, one of :data:`FLOWER_STRATEGIES`.
    args
        Its keyword arguments (YAML scalars).
    wraps
        For the DP wrappers: ``{"flower": name, "args": {...}}`` of the wrapped strategy.

    Raises
    ------
    FlowerConfigError
        If Flower is not installed, or a name or argument is wrong (the message names it).
    """

    name: ClassVar[str] = "flower"

    def __init__(
        self,
        flower: str,
        args: Mapping[str, object] | None = None,
        wraps: Mapping[str, Any] | None = None,
    ) -> None:
        _import_bridge()
        from geofl.server.strategies import _flower_bridge as bridge

        self.flower = flower
        self.args = dict(args or {})
        self.wraps = dict(wraps) if wraps is not None else None
        self.flower_strategy = bridge.build(flower, self.args, self.wraps)
        self._slots = StateSlots(self.flower_strategy)
        self._weight_key = bridge.weighted_by_key(self.flower_strategy)
        self._global: WeightsView = {}
        self._round = 0
        self._train_round: int | None = None
        self._replies: FlowerReplies | None = None
        self._rollback: Snapshot | None = None

    def __repr__(self) -> str:
        wraps = f", wraps={self.wraps!r}" if self.wraps is not None else ""
        return f"FlowerStrategy({self.flower!r}, args={self.args!r}{wraps})"

    def begin_round(self, global_weights: WeightsView) -> FlowerReplies:
        """Return the round's reply collector; remembers ``global_weights`` by reference."""
        self._undo_unapplied()
        self._slots.bind(list(global_weights))
        self._global = global_weights
        self._train_round = None
        self._replies = FlowerReplies(global_weights, self._aggregate, self._weight_key)
        return self._replies

    def configure_fit(self, server_round: int, base_config: Mapping[str, Scalar]) -> Config:
        """Flower's ``configure_train`` config for this round (call after begin_round).

        Raises
        ------
        StrategyError
            If no round was begun, or Flower's config cannot be sent as a geofl config.
        """
        from geofl.server.strategies import _flower_bridge as bridge

        if self._replies is None:
            raise StrategyError("configure_fit needs the round's global model: call begin_round")
        arrays = bridge.array_record(self._global.items())
        config = bridge.configure(self.flower_strategy, "train", server_round, arrays, base_config)
        self._round = self._train_round = server_round
        return config

    def configure_evaluate(self, server_round: int, base_config: Mapping[str, Scalar]) -> Config:
        """Flower's ``configure_evaluate`` config (its messages' arrays are not needed)."""
        from geofl.server.strategies import _flower_bridge as bridge

        config = bridge.configure(
            self.flower_strategy, "evaluate", server_round, bridge.array_record(()), base_config
        )
        self._round = server_round
        return config

    def aggregate_metrics(self, results: Sequence[tuple[int, Mapping[str, Scalar]]]) -> Metrics:
        """Flower's ``aggregate_evaluate`` of the clients' numeric metrics.

        While a round's updates await :meth:`FlowerReplies.mean`, matching results are
        also attached to them as the replies' metrics.

        Raises
        ------
        StrategyError
            If a ``num_examples`` is negative or not an integer.
        """
        from geofl.server.strategies import _flower_bridge as bridge

        _check_counts(results)
        if self._replies is not None:
            self._replies.attach_metrics(results)
        if sum(n for n, _ in results) == 0:
            return {}
        metrics = common_metrics([m for _, m in results], len(results), self._weight_key)
        replies = [
            bridge.metric_reply(index, {**metrics[index], self._weight_key: n})
            for index, (n, _) in enumerate(results)
        ]
        try:
            return bridge.metrics_of(self.flower_strategy.aggregate_evaluate(self._round, replies))
        except Exception as exc:  # metrics are a report: a failure here must not end the run
            log.warning("Flower %s.aggregate_evaluate failed: %s", self.flower, exc)
            return {}

    def apply(
        self, global_weights: WeightsView, mean_delta: WeightsView, server_round: int
    ) -> Weights:
        """Return Flower's new model, which :meth:`FlowerReplies.mean` computed.

        Raises
        ------
        StrategyError
            If ``mean_delta`` is not that round's :class:`FlowerAggregate` or does not
            match ``global_weights``; the strategy's state then goes back to before the
            round.
        """
        try:
            _check_aggregate(global_weights, mean_delta, server_round)
        except StrategyError:
            self._undo_unapplied()
            raise
        self._rollback = None
        self._replies = None
        return dict(mean_delta)

    def state(self) -> Weights:
        """Copies of the Flower strategy's state tensors (``{}`` for stateless ones)."""
        return self._slots.export(list(self._global))

    def load_state(self, state: WeightsView) -> None:
        """Restore state saved by :meth:`state`; ``{}`` resets it.

        Raises
        ------
        StrategyError
            If a key is not one this strategy keeps, or a value is not finite.
        """
        self._slots.load(state)

    def _aggregate(self, replies: list[Message]) -> FlowerAggregate:
        """Run ``aggregate_train``; on any failure put the strategy's state back."""
        from geofl.server.strategies import _flower_bridge as bridge

        server_round = self._train_round
        if server_round is None:
            raise StrategyError("aggregate needs configure_fit to have run in this round")
        saved = snapshot(self.flower_strategy)
        try:
            arrays, _ = self.flower_strategy.aggregate_train(server_round, replies)
            if arrays is None:
                raise StrategyError(
                    f"Flower {self.flower} produced no model in round {server_round} "
                    "(Flower's log says why; e.g. Bulyan needs 4 * num_malicious_nodes + 3 "
                    "updates)"
                )
            result = bridge.weights_of(arrays, self._global)
        except StrategyError:
            restore(saved)
            raise
        except Exception as exc:  # Flower's own errors fail this round, not the coordinator
            restore(saved)
            raise StrategyError(
                f"Flower {self.flower}.aggregate_train failed in round {server_round}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        self._rollback = saved
        return FlowerAggregate(result, server_round)

    def _undo_unapplied(self) -> None:
        """Forget an aggregate that was computed but never applied."""
        if self._rollback is not None:
            restore(self._rollback)
            self._rollback = None


def _check_aggregate(
    global_weights: WeightsView, aggregate: WeightsView, server_round: int
) -> None:
    """Refuse anything but this round's Flower model, shaped like ``global_weights``."""
    if not isinstance(aggregate, FlowerAggregate):
        raise StrategyError("FlowerStrategy.apply takes the model its FlowerReplies.mean returned")
    if aggregate.server_round != server_round:
        raise StrategyError(
            f"the Flower aggregate is of round {aggregate.server_round}, not {server_round}"
        )
    if list(aggregate) != list(global_weights):
        raise StrategyError(
            f"the Flower aggregate holds {list(aggregate)}, the model {list(global_weights)}"
        )
    for name, reference in global_weights.items():
        array = aggregate[name]
        if array.shape != reference.shape or array.dtype != reference.dtype:
            raise StrategyError(
                f"tensor {name!r}: aggregate {array.dtype}{list(array.shape)} differs from "
                f"the model's {reference.dtype}{list(reference.shape)}"
            )


def _check_counts(results: Sequence[tuple[int, Mapping[str, Scalar]]]) -> None:
    for num_examples, _ in results:
        if isinstance(num_examples, bool) or not isinstance(num_examples, int) or num_examples < 0:
            raise StrategyError(f"num_examples must be an integer >= 0, got {num_examples!r}")
