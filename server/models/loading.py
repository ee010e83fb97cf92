"""Import user code named as ``module:attr`` and turn models into weights."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import numpy as np

from geofl.protocols.errors import GeoflError
from geofl.protocols.tensors import spec_of
from geofl.protocols.types import Scalar, Weights, WeightsView


class UserCodeError(GeoflError):
    """User code named in the configuration cannot be loaded or misbehaves."""


def import_object(spec: str) -> Any:
    """The object ``attr`` of ``module`` for ``"module:attr"``."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise UserCodeError(f"{spec!r} is not of the form 'module:attr'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UserCodeError(f"cannot import module {module_name!r} (from {spec!r}): {exc}") from exc
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise UserCodeError(f"module {module_name!r} has no attribute {attr!r}") from None
    return obj


def as_weights(model: Any, source: str) -> Weights:
    """Weights from a ``dict`` of arrays or a torch module's ``state_dict``."""
    state = model.state_dict() if hasattr(model, "state_dict") else model
    if not isinstance(state, dict) or not state:
        raise UserCodeError(
            f"{source} must return a non-empty dict of arrays or a torch nn.Module, "
            f"got {type(model).__name__}"
        )
    weights: Weights = {}
    for name, value in state.items():
        if hasattr(value, "detach"):
            value = value.detach().cpu().numpy()
        weights[str(name)] = np.array(value, copy=True)
    spec_of(weights)  # rejects unsupported dtypes with a clear message
    return weights


def load_initial_weights(spec: str) -> Weights:
    """Call the ``model`` factory of the configuration."""
    factory = import_object(spec)
    if not callable(factory):
        raise UserCodeError(f"model {spec!r} is not callable")
    return as_weights(factory(), f"model {spec!r}")


def load_server_evaluate(spec: str) -> Callable[[WeightsView], tuple[float, dict[str, Scalar]]]:
    """The optional server-side evaluation callable."""
    function = import_object(spec)
    if not callable(function):
        raise UserCodeError(f"evaluation.server {spec!r} is not callable")
    return function  # type: ignore[no-any-return]


__all__ = [
    "UserCodeError",
    "as_weights",
    "import_object",
    "load_initial_weights",
    "load_server_evaluate",
]
