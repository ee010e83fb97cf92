"""Server-side state of Flower strategies as named tensors, for geofl's checkpoints.

Flower 1.42 keeps a strategy's state in plain attributes, and only a few strategies have
any: FedAdam, FedYogi and FedAdagrad keep moments ``m_t``/``v_t`` (dicts keyed by tensor
name), FedAvgM a momentum buffer ``momentum_vector`` (a list in model order), and the
adaptive-clipping DP wrappers a ``clipping_norm`` that moves every round. Everything else a
strategy remembers (``current_arrays``) is the global model, which geofl checkpoints anyway
and hands back in ``configure_train``.

A state key is the attribute path, then ``/`` and the tensor name for per-tensor slots:
``m_t/fc.weight``; a wrapped strategy's attributes sit under ``strategy.``
(``strategy.v_t/fc.weight``); a scalar is a 0-d float64 tensor (``clipping_norm``). Values
keep Flower's dtypes, so a resumed run continues bit for bit.

Flower replaces these attributes on every step instead of writing into the arrays, so a
shallow copy of each strategy's ``__dict__`` (:func:`snapshot`) is enough to roll back a
round that failed halfway through Flower's code.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from geofl.protocols.types import Weights, WeightsView
from geofl.server.strategies.errors import StrategyError

__all__ = ["Snapshot", "StateSlots", "restore", "snapshot"]

SlotKind = Literal["named", "ordered", "scalar"]
#: Attribute holding the strategy a Flower DP wrapper wraps.
WRAPPED = "strategy"

_SLOTS: Mapping[str, tuple[tuple[str, SlotKind], ...]] = {
    "FedAdam": (("m_t", "named"), ("v_t", "named")),
    "FedYogi": (("m_t", "named"), ("v_t", "named")),
    "FedAdagrad": (("m_t", "named"), ("v_t", "named")),
    "FedAvgM": (("momentum_vector", "ordered"),),
    "DifferentialPrivacyServerSideAdaptiveClipping": (("clipping_norm", "scalar"),),
    "DifferentialPrivacyClientSideAdaptiveClipping": (("clipping_norm", "scalar"),),
}

#: Shallow copies of the ``__dict__`` of a strategy and of the one it wraps.
Snapshot = list[tuple[Any, dict[str, Any]]]


def _chain(strategy: Any) -> list[tuple[str, Any]]:
    """``(key prefix, strategy)`` for ``strategy`` and every strategy it wraps."""
    found: list[tuple[str, Any]] = []
    prefix = ""
    while strategy is not None:
        found.append((prefix, strategy))
        strategy = getattr(strategy, WRAPPED, None)
        prefix += WRAPPED + "."
    return found


def snapshot(strategy: Any) -> Snapshot:
    """Capture every attribute of ``strategy`` (and of what it wraps) for :func:`restore`."""
    return [(item, dict(item.__dict__)) for _, item in _chain(strategy)]


def restore(saved: Snapshot) -> None:
    """Put back the attributes captured by :func:`snapshot`."""
    for item, attributes in saved:
        item.__dict__.clear()
        item.__dict__.update(attributes)


@dataclass(frozen=True)
class _Slot:
    """One state attribute of one strategy in the chain."""

    owner: Any
    key: str  # attribute path, e.g. "strategy.m_t"
    attribute: str
    kind: SlotKind
    initial: Any  # the value right after construction, restored by an empty state


class StateSlots:
    """Reads and writes the state attributes of one Flower strategy (and what it wraps).

    Parameters
    ----------
    strategy
        A freshly built Flower strategy: the current values become the "no state yet"
        values that loading an empty state resets to.
    """

    def __init__(self, strategy: Any) -> None:
        self._slots = [
            _Slot(item, prefix + attribute, attribute, kind, getattr(item, attribute))
            for prefix, item in _chain(strategy)
            for attribute, kind in _SLOTS.get(type(item).__name__, ())
        ]
        self._pending: dict[str, dict[str, npt.NDArray[Any]]] = {}

    @property
    def keys(self) -> tuple[str, ...]:
        """Attribute paths of the state, e.g. ``("m_t", "v_t")``; ``()`` when stateless."""
        return tuple(slot.key for slot in self._slots)

    def export(self, model_order: Sequence[str]) -> Weights:
        """Return copies of the state tensors (``{}`` before the first aggregation).

        ``model_order`` names the model's tensors in order: it labels FedAvgM's momentum
        list, which Flower keeps in model order without names.
        """
        state: Weights = {}
        for slot in self._slots:
            value = getattr(slot.owner, slot.attribute)
            if slot.kind == "scalar":
                state[slot.key] = np.asarray(float(value), dtype=np.float64)
            elif value is not None:
                state.update(_export_tensors(slot, value, model_order))
        return state

    def load(self, state: WeightsView) -> None:
        """Replace the state with copies of ``state``; ``{}`` resets it.

        FedAvgM's momentum is held back until :meth:`bind` learns the model's order.

        Raises
        ------
        StrategyError
            If a key belongs to no slot of this strategy, or a value is not a finite
            number array; nothing is changed then.
        """
        grouped = self._group(state)
        for slot in self._slots:
            values = grouped.get(slot.key)
            if values is None:
                setattr(slot.owner, slot.attribute, slot.initial)
                self._pending.pop(slot.key, None)
            elif slot.kind == "scalar":
                setattr(slot.owner, slot.attribute, float(values[""]))
            elif slot.kind == "named":
                setattr(slot.owner, slot.attribute, values)
            else:
                setattr(slot.owner, slot.attribute, slot.initial)
                self._pending[slot.key] = values

    def bind(self, model_order: Sequence[str]) -> None:
        """Check the per-tensor state against the model; order loaded FedAvgM momentum.

        Raises
        ------
        StrategyError
            If per-tensor state covers other tensors than the model's.
        """
        for slot in self._slots:
            values = self._pending.pop(slot.key, None)
            if values is None and slot.kind == "named":
                values = getattr(slot.owner, slot.attribute) or None
            if values is None:
                continue
            if sorted(values) != sorted(model_order):
                raise StrategyError(
                    f"state {slot.key!r} covers tensors {sorted(values)}, "
                    f"the model has {sorted(model_order)}"
                )
            if slot.kind == "ordered":
                setattr(slot.owner, slot.attribute, [values[name] for name in model_order])

    def _group(self, state: WeightsView) -> dict[str, dict[str, npt.NDArray[Any]]]:
        """Checked copies of ``state``, grouped by slot key, then tensor name."""
        kinds = {slot.key: slot.kind for slot in self._slots}
        grouped: dict[str, dict[str, npt.NDArray[Any]]] = {}
        for key, value in state.items():
            path, sep, tensor = key.partition("/")
            kind = kinds.get(path)
            if kind is None or (kind == "scalar") == bool(sep):
                raise StrategyError(
                    f"unexpected state key {key!r}; this Flower strategy keeps "
                    f"{list(kinds) or 'no state'}"
                )
            grouped.setdefault(path, {})[tensor] = _checked_copy(key, value)
        return grouped


def _export_tensors(slot: _Slot, value: Any, model_order: Sequence[str]) -> Weights:
    """Copies of one per-tensor slot, keyed ``"<slot>/<tensor>"``."""
    if slot.kind == "ordered":
        if len(value) != len(model_order):
            raise StrategyError(
                f"state {slot.key!r} holds {len(value)} tensors, the model {len(model_order)}"
            )
        value = dict(zip(model_order, value, strict=True))
    return {f"{slot.key}/{name}": np.array(array, copy=True) for name, array in value.items()}


def _checked_copy(key: str, value: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """A copy of one saved state tensor; refuses non-numeric or non-finite values."""
    array = np.array(value, copy=True)
    if array.dtype.kind not in "fiu":
        raise StrategyError(f"state {key!r}: expected a number array, got dtype {array.dtype}")
    if array.dtype.kind == "f" and not bool(np.isfinite(array).all()):
        raise StrategyError(f"state {key!r}: expected finite values")
    return array
