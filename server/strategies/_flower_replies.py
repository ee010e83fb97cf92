"""The round's updates, kept whole for a Flower strategy, and the replies built from them.

Every update is a delta against the global model. It is validated in full when it
arrives and then kept as delivered, without a copy: a view of the upload's staging buffer,
or of its memory-mapped spool file. When the round closes, each client's arrays are
rebuilt (global + delta, in the model's dtypes) into the reply ``Message`` a Flower
ClientApp would have sent, one client at a time, releasing each delta once converted.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from geofl.protocols.types import Scalar, Weights, WeightsView
from geofl.server.strategies._numeric import blocks, flat, to_dtype
from geofl.server.strategies.errors import StrategyError, UpdateRejected
from geofl.server.strategies.streaming import StreamingMean

if TYPE_CHECKING:
    from flwr.app import Message

__all__ = ["FlowerAggregate", "FlowerReplies", "common_metrics"]


class FlowerAggregate(dict[str, npt.NDArray[Any]]):
    """Flower's new global model for one round, as :meth:`FlowerReplies.mean` returns it.

    Not a mean delta: Flower's strategies are not linear in the updates, so
    :meth:`FlowerStrategy.apply` takes these arrays over as they are.
    """

    def __init__(self, weights: Weights, server_round: int) -> None:
        super().__init__(weights)
        self.server_round = server_round


class FlowerReplies(StreamingMean):
    """One round's updates, kept whole for a Flower strategy (not a running mean).

    A :class:`StreamingMean` by interface only: :meth:`add` validates an update in full
    (names, shapes, numeric dtypes, and global + delta finite in the model's dtype) and
    keeps references to its arrays, without copying; callers must not modify them
    afterwards (the engine never does). :meth:`mean` builds Flower's replies and returns
    the strategy's new global model as a :class:`FlowerAggregate`.

    Parameters
    ----------
    global_weights
        The model the deltas are against (kept by reference, not copied).
    aggregate
        Called once with the replies; returns the new model.
    weight_key
        Metric key Flower reads each reply's weight from.
    """

    def __init__(
        self,
        global_weights: WeightsView,
        aggregate: Callable[[list[Message]], FlowerAggregate],
        weight_key: str,
    ) -> None:
        super().__init__({})  # no float64 sums: Flower aggregates the whole replies
        self._global = global_weights
        self._aggregate = aggregate
        self._weight_key = weight_key
        self._updates: list[dict[str, npt.NDArray[Any]] | None] = []
        self._weights: list[float] = []
        self._metrics: list[Mapping[str, Scalar]] | None = None
        self._taken = False

    @property
    def names(self) -> tuple[str, ...]:
        """Tensor names in model order."""
        return tuple(self._global)

    def add(self, update: WeightsView, weight: float) -> None:
        """Validate one client delta and keep it for the round's replies.

        Raises
        ------
        UpdateRejected
            If the weight is not finite and positive, the names differ from the model's,
            or a tensor has the wrong shape, a non-numeric dtype, or a sum with the global
            tensor that is not finite in its dtype. Nothing is kept then.
        StrategyError
            If :meth:`mean` was already taken.
        """
        factor = _positive_weight(weight)
        arrays = _checked_update(self._global, update)
        with self._lock:
            if self._taken:
                raise StrategyError("this round's updates were already aggregated")
            self._updates.append(arrays)
            self._weights.append(factor)
            self._metrics = None  # metrics attached so far no longer pair up
            self.count += 1
            self.total_weight += factor

    def attach_metrics(self, results: Sequence[tuple[int, Mapping[str, Scalar]]]) -> bool:
        """Pair the round's fit metrics with the updates; ``False`` if they do not match.

        They match when ``results`` lists one ``(num_examples, metrics)`` per update, in
        the order the updates were added, with ``num_examples`` equal to each weight.
        """
        with self._lock:
            if self._taken or [float(n) for n, _ in results] != self._weights:
                return False
            self._metrics = [metrics for _, metrics in results]
            return True

    def mean(self) -> Weights:
        """Run the Flower strategy on every kept update; return its new global model.

        Raises
        ------
        StrategyError
            If there are no updates, the mean was already taken, or Flower failed.
        """
        with self._lock:
            if self._taken:
                raise StrategyError("this round's updates were already aggregated")
            if not self._updates:
                raise StrategyError("cannot aggregate zero updates")
            self._taken = True
        return self._aggregate(self._replies())

    def _replies(self) -> list[Message]:
        """One Flower reply per update, each kept delta released once it is converted."""
        from geofl.server.strategies import _flower_bridge as bridge

        metrics = common_metrics(self._metrics, len(self._weights), self._weight_key)
        replies: list[Message] = []
        for index, weight in enumerate(self._weights):
            delta = self._updates[index]
            self._updates[index] = None
            if delta is None:
                raise StrategyError("an update was released before it was aggregated")
            arrays = bridge.array_record(_rebuilt(self._global, delta))
            reply_metrics = {**metrics[index], self._weight_key: _as_number(weight)}
            replies.append(bridge.train_reply(index, arrays, reply_metrics))
        return replies


def _positive_weight(weight: float) -> float:
    """``weight`` as a float, or reject it unless it is finite and positive."""
    if isinstance(weight, bool) or not isinstance(weight, int | float | np.number):
        raise UpdateRejected(f"weight must be a positive number, got {weight!r}")
    factor = float(weight)
    if not (math.isfinite(factor) and factor > 0.0):
        raise UpdateRejected(f"weight must be finite and > 0, got {weight!r}")
    return factor


def _as_number(weight: float) -> int | float:
    """A weight as Flower's ``num-examples``: an int when it is whole."""
    return int(weight) if weight.is_integer() else weight


def _checked_update(global_weights: WeightsView, update: WeightsView) -> dict[str, Any]:
    """The update's arrays (as delivered, not copied), once every one passed its checks."""
    if set(update) != set(global_weights):
        missing = sorted(set(global_weights) - set(update))
        unexpected = sorted(set(update) - set(global_weights))
        raise UpdateRejected(
            f"update tensor names differ from the model: missing {missing}, unexpected {unexpected}"
        )
    arrays: dict[str, Any] = {}
    for name, reference in global_weights.items():
        array = np.asarray(update[name])
        if array.dtype.kind not in "fiu":
            raise UpdateRejected(
                f"tensor {name!r}: expected a float or integer dtype, got {array.dtype}"
            )
        if array.shape != reference.shape:
            raise UpdateRejected(
                f"tensor {name!r}: expected shape {reference.shape}, got {array.shape}"
            )
        try:
            for _ in _sums(name, reference, array):
                pass
        except StrategyError as exc:
            raise UpdateRejected(f"global + update: {exc}") from exc
        arrays[name] = array
    return arrays


def _sums(
    name: str, reference: npt.NDArray[Any], delta: npt.NDArray[Any]
) -> Iterator[tuple[slice, npt.NDArray[Any]]]:
    """``reference + delta`` block by block, in ``reference``'s dtype.

    Float sums are taken in float64 and rounded once, which for float32 and float16 is the
    correctly rounded sum (the same as adding in that dtype); integer tensors add the
    rounded delta, as geofl's own strategies do.

    Raises
    ------
    StrategyError
        If a sum is not finite, or overflows a float dtype.
    """
    base, step = flat(reference), flat(delta)
    integer = reference.dtype.kind in "iu"
    for part in blocks(base.size):
        increment = step[part].astype(np.float64)
        total = base[part].astype(np.float64) + (np.rint(increment) if integer else increment)
        yield part, to_dtype(total, reference.dtype, name)


def _rebuilt(
    global_weights: WeightsView, delta: Mapping[str, npt.NDArray[Any]]
) -> Iterator[tuple[str, npt.NDArray[Any]]]:
    """The client's tensors, global + delta, one at a time (each freed after use)."""
    for name, reference in global_weights.items():
        out = np.empty(reference.shape, dtype=reference.dtype)
        target = out.reshape(-1)
        for part, values in _sums(name, reference, delta[name]):
            target[part] = values
        yield name, out


def common_metrics(
    metrics: Sequence[Mapping[str, Scalar]] | None, count: int, weight_key: str
) -> list[dict[str, int | float]]:
    """Per client, the metrics every client reported as a number (Flower needs equal keys).

    Booleans, strings and bytes are left out, as is ``weight_key``, which carries the
    update's weight.
    """
    if not metrics:
        return [{} for _ in range(count)]
    numeric = [
        {key: number for key, value in row.items() if (number := _number(value)) is not None}
        for row in metrics
    ]
    keys = [key for key in numeric[0] if key != weight_key and all(key in n for n in numeric)]
    return [{key: row[key] for key in keys} for row in numeric]


def _number(value: object) -> int | float | None:
    """``value`` as a Python int or float, or None if it is not a number (bools are not)."""
    if isinstance(value, bool) or not isinstance(value, int | float | np.number):
        return None
    if isinstance(value, int | np.integer):
        return int(value)
    return float(value)
